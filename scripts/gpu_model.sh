#!/usr/bin/env bash
# The Llama runner on a GPU (issue 18): its tests on CPU and CUDA (paged attention against
# dense attention in bf16, D1 through the runtime), then the bench section `model` (decode
# step against the HBM bound, prefill against the bf16 matmul throughput, both measured in
# the same run). Run from the repository root: OUT=/some/dir bash scripts/gpu_model.sh
# Writes: $OUT/model_tests.log, $OUT/model_tests.xml (JUnit), $OUT/model.log, $OUT/model.json.
# Options (environment): MODEL_ARGS (extra `cacheruntime bench` options, e.g. --model-batches 16).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:?set OUT}"
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
timeout 200 "$PY" -m pytest -p no:cacheprovider --confcutdir=tests/runtime -o addopts="" tests/runtime/test_llama.py -v -rs \
    --durations=10 --junitxml="$OUT/model_tests.xml" >"$OUT/model_tests.log" 2>&1
tests=$?
echo "model tests exit $tests"; tail -n 3 "$OUT/model_tests.log"
# shellcheck disable=SC2086
timeout 360 "$PY" -m cacheruntime.cli bench --device cuda --only model --json "$OUT/model.json" ${MODEL_ARGS:-} 2>&1 | tee "$OUT/model.log"
bench=${PIPESTATUS[0]}
echo "model bench exit $bench"
[[ $tests -eq 0 && $bench -eq 0 ]]
