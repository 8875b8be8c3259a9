#!/usr/bin/env bash
# Install SGLang from a source checkout into the SGLang venv, over the wheel: the gate's
# `--sglang-source DIR` (scripts/gate_sglang.sh) and a PR's CI use it.
#
# Usage: install_source.sh DIR [VENV]
#   DIR   an SGLang checkout as SGLang's repository lays it out: DIR/python/pyproject.toml
#         and DIR/python/sglang/ (the package). VENV defaults to <repo>/.venv-sglang.
#
# How, and why:
#   - `pip install --no-deps --no-build-isolation -e DIR/python`: editable, so the checkout
#     itself is what imports (no copy of the package), with the venv's own setuptools (no
#     build environment to fetch). --no-deps on purpose, as install.sh installs the wheel:
#     SGLang's declared dependencies pin its own CUDA torch (0.5.23: torch==2.14.1), which
#     would replace the CPU torch 2.13.0 the adapter runs on.
#   - the version is the checkout's (pyproject.toml), printed after the install;
#   - Rust extensions are not built by this script. The adapter's `tree=radix` (legacy
#     RadixCache) and `tree=unified-python` configurations import none; `tree=unified-rust`
#     (the gate's TREE_CONFIGS) loads the Rust TreeCore, `sglang.srt.mem_cache.rust_tree_core`,
#     through SGLang's own loader and fallback policy (0.5.23: tree_core_registry.
#     _rust_fallback_reason): a checkout that carries the built extension (as a tree made from
#     the wheel does, source_tree.py) uses it; one with the Rust sources and a cargo toolchain
#     has SGLang build it; otherwise SGLang falls back to the Python TreeCore, which stack.py
#     refuses, so that configuration fails in the gate rather than testing another core.
# The shared .venv-sglang is changed by this (the wheel is replaced); `install.sh --force`
# puts the pinned wheel back.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"
SRC="${1:?usage: install_source.sh DIR [VENV]}"
VENV="${2:-${SGLANG_VENV:-$REPO/.venv-sglang}}"
PKG="$SRC/python"
if [[ ! -f "$PKG/pyproject.toml" || ! -f "$PKG/sglang/__init__.py" ]]; then
  echo "install_source.sh: $SRC is not laid out as SGLang's repository (python/pyproject.toml, python/sglang/__init__.py)" >&2
  exit 2
fi
start=$(date +%s)
"$VENV/bin/python" -m pip install --disable-pip-version-check --quiet --no-deps --no-build-isolation -e "$PKG"
version="$(cd / && "$VENV/bin/python" -c 'import importlib.metadata as m, sglang, os; print(m.version("sglang"), os.path.dirname(sglang.__file__))')"
echo "sglang from source: $version ($(( $(date +%s) - start )) s)"
