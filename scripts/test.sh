#!/usr/bin/env bash
# Set up a virtual environment with the package and its test extras, check code health (ruff,
# mypy), then run the whole test suite. Extra arguments go to pytest.
#
# The system packages some tests need (chromium, zsh, fish, ShellCheck, Vulkan on lavapipe) are
# installed with apt-get when missing: each apt step waits up to APT_LOCK_TIMEOUT seconds (300)
# for another apt or dpkg to finish, and runs its own `apt-get update` first. Under CI (CI set, as
# every CI service does) a step that still cannot set up fails the run with apt's reason: a green
# run never hides skipped GPU-path tests. Elsewhere the tests that need it are skipped, and the
# reasons are printed again at the end of the run, after pytest's summary.
# Sourced (`source scripts/test.sh`), it only defines its functions (tests/test_home_files_hangs.py).
set -euo pipefail

APT_LOCK_TIMEOUT=${APT_LOCK_TIMEOUT:-300}
SKIPPED=()

under_ci() {
  case "${CI:-}" in
    "" | 0 | false | False | FALSE) return 1 ;;
    *) return 0 ;;
  esac
}

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi
}

# apt-get as root, waiting for the package manager's lock instead of failing at once.
apt_get() {
  as_root env DEBIAN_FRONTEND=noninteractive apt-get -o "DPkg::Lock::Timeout=$APT_LOCK_TIMEOUT" "$@"
}

# A setup step failed: $1 what failed (with apt's reason), $2 what is skipped because of it.
could_not() {
  if under_ci; then
    echo "error: $1; under CI this fails the run ($2 otherwise)" >&2
    exit 1
  fi
  echo "   $1: $2" >&2
  SKIPPED+=("$1: $2")
}

# The last line apt printed, as the reason a step failed.
reason_of() {
  local text=$1
  text=$(printf '%s\n' "$text" | grep -v '^[[:space:]]*$' | tail -n 1)
  echo "${text:-no message}"
}

# install_packages WHAT SKIPPED COMMAND... -- PACKAGE...: install the packages with apt-get unless
# every command is already on PATH (nothing to do where apt-get is not either).
install_packages() {
  local what=$1 skipped=$2 missing=0 out
  shift 2
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    command -v "$1" >/dev/null 2>&1 || missing=1
    shift
  done
  shift
  if [ "$missing" = 0 ]; then
    return 0
  fi
  if ! command -v apt-get >/dev/null 2>&1 && ! declare -F apt_get >/dev/null; then
    could_not "could not install $what (no apt-get on this machine)" "$skipped"
    return 0
  fi
  echo "== installing $what"
  if ! out=$(apt_get update -qq 2>&1); then
    could_not "could not install $what: apt-get update failed ($(reason_of "$out"))" "$skipped"
    return 0
  fi
  if ! out=$(apt_get install -y -qq "$@" 2>&1); then
    could_not "could not install $what: apt-get install failed ($(reason_of "$out"))" "$skipped"
  fi
}

setup_vulkan() {
  local out
  if ! command -v apt-get >/dev/null 2>&1; then
    return 0
  fi
  if ! out=$(APT_LOCK_TIMEOUT=$APT_LOCK_TIMEOUT scripts/setup-vulkan.sh 2>&1 >/dev/null); then
    could_not "could not set up Vulkan ($(reason_of "$out"))" "the Vulkan tests will be skipped"
  fi
}

print_skipped() {
  if [ ${#SKIPPED[@]} -gt 0 ]; then
    echo "== skipped setup steps (their tests were skipped; under CI this fails the run):"
    printf '   %s\n' "${SKIPPED[@]}"
  fi
}

main() {
  cd "$(dirname "$0")/.."
  local py=${PYTHON:-python3} rc=0
  if [ ! -x .venv/bin/python ]; then
    "$py" -m venv .venv
  fi
  .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test]'
  # The status page of `accelstack serve` is tested in a real headless browser: Debian's chromium and
  # its chromedriver (tests/service/test_page.py).
  install_packages "chromium and chromium-driver" "the browser test will be skipped" chromium chromedriver \
    -- chromium chromium-driver
  # zsh and fish check the completion scripts `accelstack completion` generates (tests/test_completion.py);
  # and the linter ShellCheck checks the project's own shell scripts (tests/test_workflows.py)
  install_packages "zsh, fish and ShellCheck" "their checks will be skipped" zsh fish shellcheck \
    -- zsh fish shellcheck
  # Vulkan on lavapipe (Mesa's CPU Vulkan driver): loader, driver, glslc and Vulkan 1.4 headers for the
  # vulkan variant, which the Vulkan tests build once and cache (docs/builds.md). Where the system's
  # lavapipe is Debian 12's Mesa 22 (it crashes in stable-diffusion.cpp's UNet), the tests use a newer one
  # extracted from bookworm-backports into the build cache, never installed (docs/engine.md, "Vulkan");
  # ACCELSTACK_NEWER_LAVAPIPE=0 keeps the system's.
  export ACCELSTACK_NEWER_LAVAPIPE=${ACCELSTACK_NEWER_LAVAPIPE:-1}
  setup_vulkan
  echo "== ruff"
  .venv/bin/ruff check accelstack tests benchmarks
  echo "== mypy"
  .venv/bin/mypy accelstack
  echo "== pytest"
  # the 15 slowest steps, so a run near its time limit says where the time went
  .venv/bin/python -m pytest -q --durations=15 "$@" || rc=$?
  print_skipped
  return "$rc"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
