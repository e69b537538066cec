#!/usr/bin/env bash
# Set up a virtual environment with the package and its test extras, check code health (ruff,
# mypy), then run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
echo "== ruff"
.venv/bin/ruff check accelstack tests benchmarks
echo "== mypy"
.venv/bin/mypy accelstack
echo "== pytest"
exec .venv/bin/python -m pytest -q "$@"
