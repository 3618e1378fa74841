#!/usr/bin/env bash
# The project's dependencies that ../shared/tools/gpu-bundle does not pack (tenacity, cmaes, fastapi-offline),
# as one archive DEST/x.tar.xz of unpacked pure-Python wheels for the GPU machine, which reaches no registry.
# Run here (where pip reaches an index): bash benchmarks/h200/extras_bundle.sh .gpux
# There, after unpacking the gpu-bundle archive into an empty /tmp/site: tar -xJf .gpux/x.tar.xz -C /tmp/site
set -euo pipefail
DEST=${1:?usage: extras_bundle.sh DEST_DIR}
PY=${PYTHON:-python3}
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
mkdir -p "$W/wheels" "$W/site" "$DEST"
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$W/wheels" tenacity cmaes fastapi-offline
for f in "$W"/wheels/*.whl; do "$PY" -m zipfile -e "$f" "$W/site"; done
tar -cJf "$DEST/x.tar.xz" -C "$W/site" .
ls -la "$DEST/x.tar.xz"
