#!/usr/bin/env bash
# Every GPU run of the project in one call on the device machine: the runtime check
# (scripts/gpu_check.sh: runtime tests on CUDA, race tests, the main job with --device cuda,
# the conformance suite on CUDA) and the benchmark (scripts/gpu_bench.sh), then ProcessGPURuntime's
# runs into $OUT/process: the main job with --device cuda (process_job.log) and the bench section
# `process` (process-bench.json, copied beside results.tar.gz, and process-bench.log).
#
# The device tool brings back at most 8 files, so the two scripts write into sub-folders
# that are packed into results.tar.gz; the files the record quotes are copied beside it.
# Usage (on the device machine, from the repository root): OUT=... bash scripts/gpu_all.sh
# scripts/gpu_model.sh (the Llama runner's tests on CUDA and the bench section `model`) runs
# after them into $OUT/model (MODEL=0 skips it), and scripts/gpu_e2e.sh (the bench section
# `e2e`: the multi-turn workload end to end on the real model) into $OUT/e2e (E2E=0 skips it).
# The whole script is longer than one device call: run its parts in separate calls
# (BENCH=0 MODEL=0 E2E=0 for the check alone, and so on), each into its own $OUT.
# Options (environment): CHECK=0 skips the runtime check; BENCH=0 skips the benchmark (the check
# alone fits one short call); PROCESS=0 skips ProcessGPURuntime's runs; DEEP_TOOLS=DIR runs the
# deep TLC model on the machine's cores (scripts/gpu_tlc_deep.sh: DIR holds the carried JRE
# package and tla2tools.jar) into $OUT/tlc_deep.log;
# L3=0 skips the bench section `l3` (issue 21 item 6: the L3 tier's fetch and persist through the
# runtime against raw reads and writes of the same objects, warm and cold, and the store I/O's
# exposed time), run on CUDA with the file store in a temporary folder beside $OUT (never under it:
# only results go there; removed after) into $OUT/l3 (l3.json, copied beside results.tar.gz, and l3.log);
# L3_STORES=file,mooncake adds Mooncake where its extra is importable; L3_DEVICE=cpu L3_ARGS=--quick
# runs the same section on a machine without a GPU (how it is tested: CHECK=0 BENCH=0 PROCESS=0 MODEL=0 E2E=0);
# CPU_AB_BASE=DIR also measures the CPU cost per decode step of the checkout DIR against
# this tree, in alternating processes (scripts/cpu_ab.py), on CPU and CUDA, into $OUT/cpu_ab_*.json.
# ProcessGPURuntime (issue 20: the bench section `process`, the main job with --runtime process)
# needs the standard library only. PROCESS_WHEELS=DIR still unpacks wheels carried in DIR (outside
# $OUT) onto PYTHONPATH, e.g. msgspec for benchmarks/diagnostics/wireformat.py; the device
# machine's Python is 3.12, so they must be cp312 manylinux x86_64 ones.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="${OUT:?set OUT}"
export PYTHON=python3
if [[ -n "${PROCESS_WHEELS:-}" ]]; then
  wheels=$(mktemp -d)
  for wheel in "$PROCESS_WHEELS"/*.whl; do "$PYTHON" -m zipfile -e "$wheel" "$wheels"; done
  export PYTHONPATH="$wheels${PYTHONPATH:+:$PYTHONPATH}"
fi

check=0
if [[ "${CHECK:-1}" != 0 ]]; then
  OUT="$ROOT/check" bash scripts/gpu_check.sh >"$ROOT/gpu_check.log" 2>&1
  check=$?
fi
bench=0
if [[ "${BENCH:-1}" != 0 ]]; then
  OUT="$ROOT/bench" bash scripts/gpu_bench.sh >"$ROOT/gpu_bench.log" 2>&1
  bench=$?
fi
process=0
mkdir -p "$ROOT/process"
if [[ "${PROCESS:-1}" == 0 ]]; then
  echo "skipped (PROCESS=0)" >"$ROOT/process/process_job.log"
else
  # The main job with the runtime (torch, CUDA) in a runtime process; control imports no torch.
  PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c "import sys; from cacheruntime.cli import main; rc = main(['run', '--runtime', 'process', '--device', 'cuda', '--quiet']); print('control imported torch:', 'torch' in sys.modules); sys.exit(rc or ('torch' in sys.modules))" >"$ROOT/process/process_job.log" 2>&1
  process=$?
  PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m cacheruntime.cli bench --device cuda --only process --json "$ROOT/process/process-bench.json" >"$ROOT/process/process-bench.log" 2>&1 || process=1
fi
model=0
if [[ "${MODEL:-1}" != 0 ]]; then
  OUT="$ROOT/model" bash scripts/gpu_model.sh >"$ROOT/gpu_model.log" 2>&1
  model=$?
fi
e2e=0
if [[ "${E2E:-1}" != 0 ]]; then
  OUT="$ROOT/e2e" bash scripts/gpu_e2e.sh >"$ROOT/gpu_e2e.log" 2>&1
  e2e=$?
fi
l3=0
if [[ "${L3:-1}" != 0 ]]; then
  mkdir -p "$ROOT/l3"
  store=$(mktemp -d "$(dirname "$ROOT")/l3-store.XXXXXX" 2>/dev/null || mktemp -d -t l3-store.XXXXXX)
  PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m cacheruntime.cli bench --device "${L3_DEVICE:-cuda}" --only l3 --l3-stores "${L3_STORES:-file}" \
    --l3-dir "$store" ${L3_ARGS:-} --json "$ROOT/l3/l3.json" >"$ROOT/l3/l3.log" 2>&1
  l3=$?
  df -h "$store" >>"$ROOT/l3/l3.log" 2>&1  # which disk the file store was on
  rm -rf "$store"
fi
[[ "${COPIES:-0}" != 0 ]] && { OUT="$ROOT" bash scripts/gpu_copies.sh >"$ROOT/gpu_copies.log" 2>&1 || bench=1; }  # page-size-16 copy paths (COPIES=1; carry .whl: scripts/gpu_copies.sh)
deep=0
if [[ -n "${DEEP_TOOLS:-}" ]]; then
  OUT="$ROOT" bash scripts/gpu_tlc_deep.sh >"$ROOT/gpu_tlc_deep.log" 2>&1
  deep=$?
fi
if [[ -n "${CPU_AB_BASE:-}" ]]; then
  for device in cpu cuda; do
    "$PYTHON" scripts/cpu_ab.py --base "$CPU_AB_BASE" --new . --reps 7 --device $device --json "$ROOT/cpu_ab_$device.json" >>"$ROOT/cpu_ab.log" 2>&1 || bench=1
  done
  cat "$ROOT/cpu_ab.log"
fi

cp "$ROOT/check/summary.txt" "$ROOT/bench/bench.json" "$ROOT/bench/timeline-h200.png" "$ROOT/bench/hostprof.json" "$ROOT/bench/itlvariants.json" "$ROOT/model/model.json" "$ROOT/e2e/e2e.json" "$ROOT/process/process-bench.json" "$ROOT/l3/l3.json" "$ROOT/" 2>/dev/null
tar czf "$ROOT/results.tar.gz" -C "$ROOT" $(cd "$ROOT" && ls -d check bench model e2e process l3 2>/dev/null) && rm -rf "$ROOT/check" "$ROOT/bench" "$ROOT/model" "$ROOT/e2e" "$ROOT/process" "$ROOT/l3"
echo "gpu_check exit $check, gpu_bench exit $bench, gpu_model exit $model, gpu_e2e exit $e2e, process job exit $process, l3 bench exit $l3, deep TLC exit $deep"
tail -n 12 "$ROOT/summary.txt" 2>/dev/null
[[ $check -eq 0 && $bench -eq 0 && $model -eq 0 && $e2e -eq 0 && $process -eq 0 && $l3 -eq 0 && $deep -eq 0 ]]
