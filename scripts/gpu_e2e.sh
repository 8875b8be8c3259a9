#!/usr/bin/env bash
# The end-to-end section on a GPU (issue 19): a multi-turn workload served through the
# Scheduler on the Llama runner (Llama-3-8B's shape), recompute / L1 / L1+L2 two-phase /
# L1+L2 one-phase, and the idle TTFT probe (`benchmarks/e2e.py`). One device call.
# Run from the repository root: OUT=/some/dir bash scripts/gpu_e2e.sh
# Writes: $OUT/e2e.log, $OUT/e2e.json. Options (environment): E2E_ARGS (extra
# `cacheruntime bench` options, e.g. --quick or --e2e-conversations 8).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:?set OUT}"
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/machine.txt" 2>&1
# shellcheck disable=SC2086
timeout "${E2E_TIMEOUT:-470}" "$PY" -m cacheruntime.cli bench --device cuda --only e2e --json "$OUT/e2e.json" ${E2E_ARGS:-} 2>&1 | tee "$OUT/e2e.log"
status=${PIPESTATUS[0]}
echo "e2e bench exit $status"
exit "$status"
