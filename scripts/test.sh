#!/usr/bin/env bash
# Install the project into .venv and run the whole test suite on a machine without a GPU.
# Everything the tests need is installed or started here: torch (CPU build, before the project so that pip
# does not fetch a CUDA build), the project with its dev extras, the local PostgreSQL server, and the
# browser of the page tests (Debian's chromium and chromium-driver; the emoji font the pages' ratios use).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[dev]'
# The store suite runs against PostgreSQL too (127.0.0.1:5432, trust auth): start it if it is not running.
if command -v pg_isready >/dev/null && ! pg_isready -q -h 127.0.0.1 -p 5432; then
  if command -v pg_ctlcluster >/dev/null; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
  fi
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
# tests/ui drive headless Chromium through chromedriver; they skip (saying why) only where neither is installable.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    { apt-get update -qq && apt-get install -y -qq chromium chromium-driver fonts-noto-color-emoji; } >/dev/null \
      || echo "scripts/test.sh: could not install chromium; the browser tests will be skipped" >&2
  fi
fi
exec .venv/bin/python -m pytest "$@"
