#!/usr/bin/env bash
# Source me: activates .venv-sglang (building it first if missing) and puts the adapter's
# paths on PYTHONPATH, so `cacheruntime conformance --runtime
# conformance.adapters.sglang.adapter:make_runtime` and `pytest tests/sglang` just work.
_SGL_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
_SGL_REPO="$(cd "$_SGL_HERE/../../.." && pwd)"
if [[ ! -x "$_SGL_REPO/.venv-sglang/bin/python" ]]; then
  bash "$_SGL_HERE/install.sh" || return 1 2>/dev/null || exit 1
fi
# shellcheck disable=SC1091
source "$_SGL_REPO/.venv-sglang/bin/activate"
export PYTHONPATH="$_SGL_REPO:$_SGL_HERE/stubs${PYTHONPATH:+:$PYTHONPATH}"
export SGLANG_ADAPTER_FACTORY="conformance.adapters.sglang.adapter:make_runtime"
unset _SGL_HERE _SGL_REPO
