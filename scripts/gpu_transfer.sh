#!/usr/bin/env bash
# The runtime's copy path on a CUDA machine (issue 19 items 2/3), in one short device call:
# the copy path's tests on CUDA (tests/runtime/test_memory_copies.py and the runtime tests
# that restore and back up pages: tests/runtime on CPU and CUDA), the bench section
# `transfer`, and, unless COPIES=0, the page-size-16 copy-path diagnostic (scripts/gpu_copies.sh).
# Usage (on the device machine, from the repository root): OUT=... bash scripts/gpu_transfer.sh
# Writes under $OUT: machine.txt, tests.log (+ tests.xml), transfer.log, transfer.json, and with
# COPIES=1 copies/ (copypaths.log, copypaths.json, its profiler traces) packed into copies.tar.gz.
# Exit status: 0 if the tests and the section ran (a missed target is a row, not a failure).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="${OUT:?set OUT}"
mkdir -p "$ROOT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
{
  date -u '+%Y-%m-%d %H:%M:%S UTC'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  "$PY" -c 'import torch, platform; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", platform.python_version())'
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(git status --porcelain 2>/dev/null | wc -l | tr -d ' ') changed files"
  "$PY" -c 'import torch; from cacheruntime.runtime.device import cudart; print("libcudart 2D copy:", "reachable" if cudart.load(torch.cuda.current_device()) else "NOT reachable")'
} >"$ROOT/machine.txt" 2>&1
cat "$ROOT/machine.txt"
"$PY" -m pytest -p no:cacheprovider --confcutdir=tests/runtime -o addopts="" -m "not slow" tests/runtime -q -rs --durations=5 \
  --junitxml="$ROOT/tests.xml" >"$ROOT/tests.log" 2>&1
tests=$?
tail -n 12 "$ROOT/tests.log"
"$PY" -m cacheruntime.cli bench --device cuda --only transfer --json "$ROOT/transfer.json" 2>&1 | tee "$ROOT/transfer.log"
bench=${PIPESTATUS[0]}
if [[ "${COPIES:-1}" != 0 ]]; then
  mkdir -p "$ROOT/copies"
  OUT="$ROOT/copies" bash scripts/gpu_copies.sh >/dev/null 2>&1 || echo "copypaths failed (see copies/copypaths.log)"
  tail -n 40 "$ROOT/copies/copypaths.log"
  tar -czf "$ROOT/copies.tar.gz" -C "$ROOT" copies && rm -rf "$ROOT/copies"
fi
echo "tests rc=$tests, transfer rc=$bench"
[[ $tests -eq 0 && $bench -eq 0 ]]
