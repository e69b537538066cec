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
# The status page of `accelstack serve` is tested in a real headless browser: Debian's chromium and
# its chromedriver (tests/service/test_page.py). Installed once, when missing, where apt can run.
if ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo -n"; fi
  echo "== installing chromium and chromium-driver"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
    && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null \
    || echo "   could not install them: the browser test will be skipped"
fi
# zsh and fish check the completion scripts `accelstack completion` generates (tests/test_completion.py);
# and the linter ShellCheck checks the project's own shell scripts (tests/test_workflows.py)
if ! { command -v zsh && command -v fish && command -v shellcheck; } >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo -n"; fi
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zsh fish shellcheck >/dev/null 2>&1 \
    || echo "   could not install zsh, fish and shellcheck: their checks will be skipped"
fi
# Vulkan on lavapipe (Mesa's CPU Vulkan driver): loader, driver, glslc and Vulkan 1.4 headers for the
# vulkan variant, which the Vulkan tests build once and cache (docs/builds.md). Where the system's
# lavapipe is Debian 12's Mesa 22 (it crashes in stable-diffusion.cpp's UNet), the tests use a newer one
# extracted from bookworm-backports into the build cache, never installed (docs/engine.md, "Vulkan");
# ACCELSTACK_NEWER_LAVAPIPE=0 keeps the system's.
export ACCELSTACK_NEWER_LAVAPIPE=${ACCELSTACK_NEWER_LAVAPIPE:-1}
if command -v apt-get >/dev/null 2>&1; then
  scripts/setup-vulkan.sh >/dev/null || echo "   could not set up Vulkan: the Vulkan tests will be skipped"
fi
echo "== ruff"
.venv/bin/ruff check accelstack tests benchmarks
echo "== mypy"
.venv/bin/mypy accelstack
echo "== pytest"
exec .venv/bin/python -m pytest -q "$@"
