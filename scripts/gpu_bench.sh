#!/usr/bin/env bash
# The boundary benchmark on a CUDA machine (issue 7). Run from the repository root:
#     bash scripts/gpu_bench.sh [extra `cacheruntime bench` options]
# The benchmark is benchmarks/ of this checkout (not part of the package); `cacheruntime
# bench` finds it from the working directory, and the diagnostics run as modules of it.
# Writes, under $OUT (default ./bench-out): machine.txt (nvidia-smi, date, torch),
# bench.log (header + the printed table), bench.json (every row with its details),
# timeline/trace-*.json (Chrome/Perfetto traces of a few two-phase batches) and
# timeline-h200.png (the compute/H2D/D2H timeline), diag.json (benchmarks/diagnostics/diag.py),
# hostprof.json/.txt (benchmarks/diagnostics/hostprof.py), itlvariants.json
# (benchmarks/diagnostics/itlvariants.py), whole-context.json/.log (overlap and ITL with the
# bench model's old context read). Needs torch with CUDA; no network.
set -uo pipefail
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
# src: the package under test (`python -m` puts the working directory, holding benchmarks/, first)
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
    echo "# cacheruntime bench — $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max,clocks.max.sm --format=csv 2>&1
    python3 -c 'import torch, platform; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", platform.python_version())'
    echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown) (working tree may be dirty)"
    echo "command: PYTHONPATH=src python3 -m cacheruntime.cli bench --device cuda --json \$OUT/bench.json --timeline \$OUT/timeline $*"
} | tee "$OUT/machine.txt"
python3 -m cacheruntime.cli bench --device cuda --json "$OUT/bench.json" --timeline "$OUT/timeline" "$@" 2>&1 | tee "$OUT/bench.log"
rc=${PIPESTATUS[0]}
if [ -f "$OUT/timeline/timeline.png" ]; then
    mv "$OUT/timeline/timeline.png" "$OUT/timeline-h200.png"
fi
# Diagnostics behind the overlap and write-back rows (restore alone vs under compute, DMA
# piece sizes, a small D2H read behind a backup, the UVA gather kernel): $OUT/diag.json.
python3 -m benchmarks.diagnostics.diag "$OUT/diag.json" >"$OUT/diag.log" 2>&1 || echo "diag failed (see diag.log)"
# The overlap and ITL sections with the bench model's context read as one growing gather
# (--context-chunk 0), whose allocations stall the device: $OUT/whole-context.json, .log.
python3 -m cacheruntime.cli bench --device cuda --only overlap,itl --overlap-ratios "" --steps 60 --context-chunk 0 \
    --json "$OUT/whole-context.json" >"$OUT/whole-context.log" 2>&1 || echo "whole-context run failed (see whole-context.log)"
# Where the boundary's host time goes (decode steps with the collector on and paused, their
# cProfile; the host cost of issuing a 384-page restore): $OUT/hostprof.json, hostprof.txt.
python3 -m benchmarks.diagnostics.hostprof "$OUT" cuda >"$OUT/hostprof.log" 2>&1 || echo "hostprof failed (see hostprof.log)"
# The ITL workload under each D2H issue point, throttle and copy path: $OUT/itlvariants.json.
python3 -m benchmarks.diagnostics.itlvariants "$OUT/itlvariants.json" >"$OUT/itlvariants.log" 2>&1 || echo "itlvariants failed (see itlvariants.log)"
exit "$rc"
