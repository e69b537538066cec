#!/usr/bin/env bash
# First run on a fresh machine: set up accelstack in a virtual environment, put the `accelstack`
# command on PATH, then detect the hardware, and plan and install the runtime (transactionally).
# `accelstack install` verifies the runtime itself (a probe generation) before activating it,
# so no separate `accelstack verify` follows: the probe generation runs once.
# Extra arguments go to `accelstack install` (e.g. --manifest URL, --stack torch --venv DIR).
#
# The command: a symbolic link to .venv/bin/accelstack in $XDG_BIN_HOME, else ~/.local/bin (where
# uv's and pipx's installers put theirs). A link this script made (to some checkout's
# .venv/bin/accelstack) is replaced; any other file of that name is left alone, and said so.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e .

target="$(pwd -P)/.venv/bin/accelstack"
bin_dir="${XDG_BIN_HOME:-$HOME/.local/bin}"
link="$bin_dir/accelstack"
run="accelstack"
current=""
if [ -L "$link" ]; then current="$(readlink "$link")"; fi
if [ "$current" = "$target" ]; then
  echo "accelstack command: $link -> $target (already there)"
elif { [ -e "$link" ] || [ -L "$link" ]; } && [[ "$current" != */.venv/bin/accelstack ]]; then
  echo "accelstack command: $link is not a link this script made, so it was left alone; run $target"
  run="$target"
elif mkdir -p "$bin_dir" 2>/dev/null && ln -sfn "$target" "$link" 2>/dev/null; then
  echo "accelstack command: $link -> $target"
else
  echo "accelstack command: cannot write $link; run $target"
  run="$target"
fi
if [ "$run" = "accelstack" ]; then
  case ":$PATH:" in
    *":$bin_dir:"*) ;;
    *) echo "  $bin_dir is not on your PATH: add it (e.g. in ~/.profile): export PATH=\"$bin_dir:\$PATH\""
       run="$link" ;;
  esac
fi
echo

.venv/bin/accelstack detect
echo
# install says the plan it carries out (and its notes): a separate `accelstack plan` printed the same
# decision, features and channel note again (`accelstack plan` shows every candidate and why)
.venv/bin/accelstack install "$@"
echo
echo "next: $run generate -m MODEL.safetensors -p 'a lighthouse at dusk'   (writes output.png here)"
echo "      $run status   (what is installed; README.md has the rest)"
