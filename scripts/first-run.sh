#!/usr/bin/env bash
# First run on a fresh machine: set up accelstack in a virtual environment and run the main job.
# Today the main job is detection: what this machine has and which accelerator to use.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
exec .venv/bin/accelstack detect "$@"
