#!/usr/bin/env bash
# LocalGPURuntime on a real GPU: one run on the H200 machine, everything written under $OUT.
#
# Runs from the repository root with the tree on PYTHONPATH (no install, no network, no
# z3 needed): the runtime tests on CPU and CUDA, the ordering race tests (delay knob) a few
# times over on CUDA, the main job (`cacheruntime run --device cuda`) and the conformance
# suite on LocalGPURuntime with CUDA streams, and 200 recorded runtime traces for TLC.
#
# Usage: OUT=/some/dir scripts/gpu_check.sh
# Writes: $OUT/header.txt, $OUT/<step>.log, $OUT/<step>.xml (JUnit), $OUT/run.json,
#         $OUT/summary.txt (one line per step: name, exit status, seconds).
# Exit status: 0 if every step passed, else 1.
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
OUT="${OUT:?set OUT to the directory for results}"
mkdir -p "$OUT"
export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python}"
failed=0

{
  echo "cacheruntime gpu_check"
  echo "date:    $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host:    $(hostname)"
  echo "commit:  $(git rev-parse --short HEAD 2>/dev/null || echo unknown) $(git status --porcelain 2>/dev/null | wc -l | tr -d ' ') changed files"
  "$PY" - <<'EOF'
import platform, torch
print(f"python:  {platform.python_version()}")
print(f"torch:   {torch.__version__} (cuda {torch.version.cuda})")
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        print(f"gpu {i}:   {p.name}, {p.total_memory / 2**30:.0f} GiB, {p.multi_processor_count} SMs")
else:
    print("gpu:     NONE (CUDA not available: the cuda tests will be skipped)")
EOF
  nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader 2>/dev/null \
    | sed 's/^/nvidia-smi: /'
} >"$OUT/header.txt" 2>&1
cat "$OUT/header.txt"

# step NAME COMMAND...: run, log to $OUT/NAME.log, record status and time in the summary.
step() {
  local name="$1"; shift
  local start=$SECONDS
  echo "== $name: $*"
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 15 "$OUT/$name.log"
  printf '%-22s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - start))" | tee -a "$OUT/summary.txt"
  [[ $rc -eq 0 ]] || failed=1
}

# The repository's root conftest loads Hypothesis profiles; the runtime tests need neither
# Hypothesis nor z3, so conftests above tests/runtime are not loaded (--confcutdir).
PYTEST=("$PY" -m pytest -p no:cacheprovider --confcutdir=tests/runtime -o addopts="")

step runtime_tests "${PYTEST[@]}" tests/runtime -v -rs --durations=10 --junitxml="$OUT/runtime_tests.xml"

# The race tests again, CUDA only, three times: a missing wait must be seen every time,
# and the correct ordering must never mismatch.
for round in 1 2 3; do
  step "race_cuda_$round" "${PYTEST[@]}" tests/runtime/test_runtime_race.py -v -m cuda -k cuda \
    --junitxml="$OUT/race_cuda_$round.xml"
done

step main_job "$PY" -m cacheruntime.cli run --device cuda --json "$OUT/run.json"

# The conformance suite (CI profile) on LocalGPURuntime with CUDA streams.
step conformance_cuda "$PY" -m cacheruntime.cli conformance \
  --runtime cacheruntime.runtime.factories:conformance --option device=cuda \
  --junitxml "$OUT/conformance_cuda.xml"

# The storage check (capability L3) on CUDA streams, both host modes: a fetch's H2D is issued
# by the storage step on a CUDA stream of its own (runtime/device/l3moves.py).
for mode in resident buffer_only; do
  step "storage_cuda_$mode" "$PY" -m cacheruntime.cli conformance \
    --runtime cacheruntime.runtime.factories:conformance_l3 --option device=cuda --option streams=threads \
    --option host_mode=$mode --check storage --junitxml "$OUT/storage_cuda_$mode.xml"
done

# The main job twice against one file store on CUDA, buffer_only: the second run serves prefix
# hits from L3 (hit_tokens_l3 > 0) with 0 output mismatches.
l3dir=$(mktemp -d)
l3_second_run() {
  "$PY" -m cacheruntime.cli run --device cuda --l3 "file:$l3dir" --host-mode buffer_only --quiet --json "$OUT/run_l3_first.json" &&
    "$PY" -m cacheruntime.cli run --device cuda --l3 "file:$l3dir" --host-mode buffer_only --json "$OUT/run_l3_second.json" &&
    "$PY" -c "import json, sys; s = json.load(open(sys.argv[1])); print('hit_tokens_l3', s['hit_tokens_l3'], 'output_mismatches', s['output_mismatches']); sys.exit(not (s['hit_tokens_l3'] > 0 and s['output_mismatches'] == 0))" "$OUT/run_l3_second.json"
}
step main_job_l3 l3_second_run
rm -rf "$l3dir"

# Executions of LocalGPURuntime on CUDA streams, recorded (gzip'd JSON lines) for the spec's
# trace check, which runs on CPU afterwards (this machine has no Java):
# `cacheruntime tlc --traces-from DIR` on the unpacked folder (tla/README.md).
step runtime_traces "$PY" -m cacheruntime.cli tlc --runtime-traces 200 --option device=cuda \
  --record-to "$OUT/runtime-traces" --record-only

echo "== summary"
cat "$OUT/summary.txt"
exit $failed
