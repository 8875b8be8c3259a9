#!/usr/bin/env bash
# The SGLang-only gate: what an SGLang PR can change, and nothing of cacheruntime's own spec
# (no TLC, no Z3: an SGLang PR does not touch them; scripts/gate_local.sh runs the whole
# `cacheruntime check`).
#
# Usage: scripts/gate_sglang.sh [--sglang-source DIR] [--plugin MODULE:CLASS]... [--regressions] [--out DIR]
#   --sglang-source DIR  install SGLang from a source checkout (DIR/python/pyproject.toml,
#                        DIR/python/sglang/) over the wheel, --no-deps, before the gate
#   --plugin MODULE:CLASS  also check this HiCache storage backend or cache linker class
#                        (repeatable; the installed plugin distributions are found anyway)
#   --regressions        also print the kill table of the injected SGLang regressions
#                        (conformance/adapters/sglang/regressions.py; about 1 min each on 2 cores)
#   --out DIR            where the JUnit files go (default out/sglang-gate)
# Env: SGLANG_VENV (default .venv-sglang; built by conformance/adapters/sglang/install.sh if missing);
#      SGLANG_GATE_JOBS (default 2, the CI machine's cores): conformance configurations run at once.
#
# Stages, each with JUnit:
#   1. fit probe (conformance/adapters/sglang/fit.py): every SGLang constructor, method and
#      attribute the adapter uses. A misfit prints "the adapter does not fit this SGLang:
#      <name>" and the gate exits 3: an API change is not a contract violation.
#      (The plugin stage runs beside it: the two only read SGLang.)
#   2. plugin interfaces (conformance/adapters/sglang/plugins.py): third-party HiCache storage
#      backends and unified-cache linkers (installed distributions, and --plugin) against this
#      SGLang's ABCs: missing abstract methods, incompatible signatures, the loader's constructor
#      call. A misfit not listed in expected-plugin-misfits.toml fails the gate (exit 4) after
#      the conformance stage has run.
#   3. conformance, per adapter configuration (CONFIGS below, SGLANG_GATE_JOBS at a time, each its
#      own process and log, printed in order; the verdicts do not depend on the order), every check kept going past
#      each violation, with the adapter's expected-failures file: a violation whose
#      signature is not in it fails the gate (exit 1); a listed one that no longer occurs
#      is printed as XPASS (the file serves every configuration, so a signature only one
#      configuration reaches shows as XPASS in the other: information, not a failure).
# Exit: 0 passed; 1 a new violation (or a regression survived, with --regressions); 2 usage
# (or a --plugin that does not import); 3 no fit; 4 a plugin misfit (and no violation).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ADAPTER="$REPO/conformance/adapters/sglang"
VENV="${SGLANG_VENV:-$REPO/.venv-sglang}"
OUT="$REPO/out/sglang-gate"
SOURCE=""
REGRESSIONS=0
PLUGINS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --sglang-source) SOURCE="$2"; shift 2 ;;
    --plugin) PLUGINS+=(--plugin "$2"); shift 2 ;;
    --regressions) REGRESSIONS=1; shift ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "usage: $0 [--sglang-source DIR] [--plugin MODULE:CLASS]... [--regressions] [--out DIR]" >&2; exit 2 ;;
  esac
done
# Adapter configurations the gate holds SGLang to (factory options; one JUnit file each):
# CONFIGS, the legacy RadixCache with the host tier at the default sizes, and with small pools
# where running out is common (regressions.CONFIGURATIONS); TREE_CONFIGS, 0.5.23's default UnifiedRadixCache with
# the Rust TreeCore and with the Python TreeCore, without a host tier and with the tree's own
# HiCache (init_hicache, direct io on CPU), write-through on the Rust core, write-back on the
# Python one (each policy once: the tier code is the cache's, the cores differ below it). SGLang's
# own invariant checks run in each (adapter option sglang_checks, on by default): those the
# adapter's use of SGLang satisfies (checks.RUN: the request-pool check and the KV page
# invariants; not the pool conservation, which the adapter's overlapping extents fail).
# Stage times measured on 2 cores are in notes.md.
CONFIGS=("l1_pages=16 l2_pages=32 page_size=4" "l1_pages=6 l2_pages=6 max_requests=3")
TREE_CONFIGS=("tree=unified-rust l2_pages=0" "tree=unified-python l2_pages=0"
  "tree=unified-rust l2_pages=32 write_policy=write_through" "tree=unified-python l2_pages=32 write_policy=write_back")

start=$(date +%s)
if [[ ! -x "$VENV/bin/python" ]]; then
  SGLANG_VENV="$VENV" bash "$ADAPTER/install.sh"
fi
PY="$VENV/bin/python"
if [[ -n "$SOURCE" ]]; then
  echo "== SGLang from source: $SOURCE"
  bash "$ADAPTER/install_source.sh" "$SOURCE" "$VENV"
fi
export PYTHONPATH="$REPO/src:$REPO:$ADAPTER/stubs${PYTHONPATH:+:$PYTHONPATH}"
export RUST_BACKTRACE=0  # a Rust TreeCore panic (raised as RuntimeError) prints its message, not a backtrace
cd "$REPO"
mkdir -p "$OUT"
echo "== SGLang under test: $("$PY" -c 'import importlib.metadata as m; print(m.version("sglang"))' 2>/dev/null)"

echo "== 1. fit probe (2. plugin interfaces beside it)"
t=$(date +%s)
plugins_log="$OUT/plugins.log"
"$PY" -m conformance.adapters.sglang.plugins "${PLUGINS[@]}" --expected "$ADAPTER/expected-plugin-misfits.toml" \
  --junitxml "$OUT/plugins.xml" > "$plugins_log" 2> >(grep -v -i warn >&2) &
plugins_pid=$!
fit=0
"$PY" -m conformance.adapters.sglang.fit --junitxml "$OUT/fit.xml" 2> >(grep -v -i warn >&2) || fit=$?
echo "   fit: $(( $(date +%s) - t )) s"
plugins=0
wait "$plugins_pid" || plugins=$?
if [[ $fit -ne 0 ]]; then
  echo "gate: exit $fit (the adapter does not fit this SGLang; no conformance run)"
  exit "$fit"
fi
echo "== 2. plugin interfaces"
cat "$plugins_log"
echo "   fit and plugins: $(( $(date +%s) - t )) s"
if [[ $plugins -eq 2 ]]; then
  echo "gate: exit 2 (a --plugin that does not import)"
  exit 2
fi

status=0
JOBS="${SGLANG_GATE_JOBS:-2}"
FILTER="warn\|HiCache kv host pool\|torch.cpu.Event\|Rust TreeCore\|panicked at\|RUST_BACKTRACE\|Failed to detach storage backend\|storage_attachment.py\|enable_storage\|^Traceback\|^  *\^\|^RuntimeError: Rust"
conformance() {  # $1 the stage number, $2 the configuration: its log, rc and seconds in $OUT
  local n="$1" config="$2" t rc=0 options=()
  t=$(date +%s)
  for pair in $config; do options+=(--option "$pair"); done
  "$PY" -m cacheruntime.cli conformance --runtime conformance.adapters.sglang.adapter:make_runtime "${options[@]}" \
    --expected "$ADAPTER/expected-failures.toml" --no-shrink --junitxml "$OUT/conformance-$n.xml" \
    > "$OUT/conformance-$n.log" 2> >(grep -v -i "$FILTER" > "$OUT/conformance-$n.err") || rc=$?
  echo "$rc $(( $(date +%s) - t ))" > "$OUT/conformance-$n.rc"
}
ALL=("${CONFIGS[@]}" "${TREE_CONFIGS[@]}")
# Longest first (measured, notes.md "Gate time"): the legacy pair, then TREE_CONFIGS from the end
# (the host-tier ones run core and tiers, the others core only). Numbering stays the listing's.
ORDER=()
for i in "${!CONFIGS[@]}"; do ORDER+=("$i"); done
for ((i = ${#ALL[@]} - 1; i >= ${#CONFIGS[@]}; i--)); do ORDER+=("$i"); done
for i in "${ORDER[@]}"; do
  while [[ $(jobs -rp | wc -l) -ge $JOBS ]]; do wait -n || true; done
  conformance "$((i + 1))" "${ALL[$i]}" &
done
wait
for i in "${!ALL[@]}"; do
  n=$((i + 1))
  echo "== 3.$n conformance: ${ALL[$i]}"
  cat "$OUT/conformance-$n.log"
  cat "$OUT/conformance-$n.err" >&2
  read -r rc secs < "$OUT/conformance-$n.rc"
  [[ $rc -eq 0 ]] || status=1
  echo "   conformance (${ALL[$i]}): $secs s"
done

if [[ $REGRESSIONS -eq 1 ]]; then
  echo "== 4. injected SGLang regressions (kill table)"
  t=$(date +%s)
  "$PY" -m conformance.adapters.sglang.regressions 2> >(grep -v -i "warn\|HiCache kv host pool\|torch.cpu.Event" >&2) || status=1
  echo "   regressions: $(( $(date +%s) - t )) s"
fi

if [[ $status -eq 0 && $plugins -ne 0 ]]; then
  status=$plugins
fi
echo "gate: exit $status in $(( $(date +%s) - start )) s (JUnit in $OUT)"
exit $status
