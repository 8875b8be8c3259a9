#!/usr/bin/env bash
# The page-size-16 copy paths side by side (benchmarks/diagnostics/copypaths.py, issue 19 item 3)
# into $OUT/copypaths.log and $OUT/copypaths.json, with the machine into $OUT/machine.txt.
# cudaMemcpyBatchAsync and cudaMemcpy2DAsync come from cuda-bindings, which the device machine
# cannot install: carry its wheel and cuda-pathfinder's (cp312 manylinux x86_64, CUDA 13) in
# .whl/ of the checkout (run with carry [".whl"]); they are unpacked into a temporary folder
# (outside $OUT) and put on PYTHONPATH. Without them the diagnostic says so and measures the rest.
# Usage (on the device machine, from the repository root): OUT=... bash scripts/gpu_copies.sh
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="${OUT:?set OUT}"
PYTHON="${PYTHON:-python3}"
WHEELS="${COPIES_WHEELS:-.whl}"
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  unpacked=$(mktemp -d)
  for wheel in "$WHEELS"/*.whl; do "$PYTHON" -m zipfile -e "$wheel" "$unpacked"; done
  export PYTHONPATH="$unpacked${PYTHONPATH:+:$PYTHONPATH}"
fi
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; "$PYTHON" -c "import sys, torch; print(torch.__version__, torch.version.cuda, sys.version.split()[0])"; } >"$ROOT/machine.txt" 2>&1
PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m benchmarks.diagnostics.copypaths --json "$ROOT/copypaths.json" --trace-dir "$ROOT" 2>&1 | tee "$ROOT/copypaths.log"
exit "${PIPESTATUS[0]}"
