#!/usr/bin/env bash
# The cacheruntime gate, locally, as .github/workflows/cacheruntime-gate.yml runs it on a
# PR of an SGLang fork: a fresh venv with cacheruntime, the SGLang under test installed
# into it, then `cacheruntime check` holding the SGLang adapter to the contract with the
# adapter's expected-failures file.
#
# Usage: scripts/gate_local.sh [SGLANG_SOURCE]
#   SGLANG_SOURCE  a path to an SGLang checkout (its python/ package is installed with
#                  --no-deps) or a pip requirement; default: the pinned sglang==0.5.23.
# Env: GATE_VENV (default .venv-sglang).
# Needs: python3.11 and pip access to torch==2.13.0 (CPU) and sglang==0.5.23 wheels; Java
# on PATH for the TLC stage. Writes out/cacheruntime-gate.xml (JUnit, one case per stage).
#
# The gate is `cacheruntime check` (src/cacheruntime/gate.py): traceability, TLC, Z3
# (`z3 --mutants`) and the conformance suite on the SGLang adapter with
# `--expected` (passed on to the suite, which names it the same). The suite runs in the
# default `ci` profile (derandomized) without shrinking (the gate's default: shrinking has a
# wall-clock limit of its own); each new failure comes with the command that shrinks it.
# Every check keeps going past each violation it finds, so every known one is named.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ADAPTER="$REPO/conformance/adapters/sglang"
export SGLANG_VENV="${GATE_VENV:-$REPO/.venv-sglang}"
SOURCE="${1:-}"
start=$(date +%s)

echo "== 1. environment: torch (CPU), sglang, its import deps, cacheruntime"
bash "$ADAPTER/install.sh"

if [[ -n "$SOURCE" ]]; then
  echo "== 2. the SGLang under test: $SOURCE"
  if [[ -d "$SOURCE/python" ]]; then SOURCE="$SOURCE/python"; fi
  "$SGLANG_VENV/bin/python" -m pip install --quiet --no-deps --force-reinstall -c "$SGLANG_VENV/sglang-constraints.txt" "$SOURCE" \
    || "$SGLANG_VENV/bin/python" -m pip install --quiet --no-deps --force-reinstall "$SOURCE"
else
  echo "== 2. the SGLang under test: the pinned sglang==0.5.23"
fi

echo "== 3. the gate"
export PYTHONPATH="$REPO:$ADAPTER/stubs${PYTHONPATH:+:$PYTHONPATH}"
cd "$REPO"
command -v java >/dev/null || echo "warning: no java on PATH: the tlc stage will fail"
gate_start=$(date +%s)
status=0
"$SGLANG_VENV/bin/cacheruntime" check \
  --runtime conformance.adapters.sglang.adapter:make_runtime \
  --expected "$ADAPTER/expected-failures.toml" \
  --junitxml "$REPO/out/cacheruntime-gate.xml" || status=$?
end=$(date +%s)
echo "gate: exit $status; install $(( gate_start - start )) s + check $(( end - gate_start )) s = $(( end - start )) s"
exit $status
