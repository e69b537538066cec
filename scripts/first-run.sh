#!/usr/bin/env bash
# First run on a fresh machine: set up accelstack in a virtual environment, then
# detect the hardware, plan the runtime, and install it (transactionally).
# `accelstack install` verifies the runtime itself (a probe generation) before activating it,
# so no separate `accelstack verify` follows: the probe generation runs once.
# Extra arguments go to `accelstack install` (e.g. --manifest URL, --stack torch --venv DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e .
.venv/bin/accelstack detect
echo
.venv/bin/accelstack plan
echo
.venv/bin/accelstack install "$@"
