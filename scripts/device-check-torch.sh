#!/usr/bin/env bash
# The torch runtime on a machine with a GPU and a torch of its own, no network: detect, plan, verify,
# and a timed generate against diffusers driven directly (benchmarks/bench_torch_generate.py).
#
# usage: scripts/device-check-torch.sh RUNTIME [--size PX] [--steps N] [--images N]
#   RUNTIME   a virtual environment (or pip --target folder) with torch, diffusers, transformers and
#             safetensors: what `accelstack verify --backend torch --runtime` takes
#   $OUT (optional): each --json result (detect, plan-torch, plan-ggml, verify-torch), the figures
#   (bench-torch-generate.json) and the machine's capture (capture.tgz, for tests/fixtures/captures).
#
# accelstack runs from this checkout with the interpreter on PATH (python3), which needs the
# package's own dependencies; everything it writes goes to a temporary folder, removed at the end.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNTIME=""
BENCH=()
while [ $# -gt 0 ]; do
    case "$1" in
        --size|--steps|--images) BENCH+=("$1" "${2:?}"); shift 2 ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        -*) echo "device-check-torch.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) RUNTIME=$1; shift ;;
    esac
done
if [ -z "$RUNTIME" ] || [ ! -d "$RUNTIME" ]; then
    echo "usage: scripts/device-check-torch.sh RUNTIME (see --help)" >&2
    exit 2
fi
RUNTIME=$(cd "$RUNTIME" && pwd)
PY=${PYTHON:-python3}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/device-check-torch.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export ACCELSTACK_HOME="$WORK/home" ACCELSTACK_CACHE="$WORK/cache" ACCELSTACK_CONFIG_DIR="$WORK/config"
export ACCELSTACK_PROBE_CACHE="$WORK/probe"
OUTDIR=${OUT:-$WORK/results}
mkdir -p "$OUTDIR"

RESULTS="$WORK/results"
mkdir -p "$RESULTS"
# step NAME ARGS...: an accelstack command's --json result kept in $RESULTS (and $OUT), its time printed
# shellcheck source=SCRIPTDIR/device-check-step.sh
. "$ROOT/scripts/device-check-step.sh"

echo "== the machine"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader || true
fi
"$PY" -m accelstack detect --capture "$WORK/capture"
tar -C "$WORK" -czf "$OUTDIR/capture.tgz" capture
step detect detect || true
echo "== plans"
"$PY" -m accelstack plan --stack torch | sed -n '1,4p'
step plan-torch plan --stack torch || true
"$PY" -m accelstack plan --stack ggml | sed -n '1,3p'
step plan-ggml plan --stack ggml || true
echo "== verify the torch runtime (operations against the CPU, then a diffusers step on the probe model)"
step verify-torch verify --backend torch --runtime "$RUNTIME" || true
"$PY" - "$RESULTS/verify-torch.json" <<'PYEOF'
import json, sys
r = json.loads(open(sys.argv[1]).read()).get("result") or {}
d = r.get("diffusers") or {}
print(f"verdict {r.get('verdict')} on {r.get('device_kind')} {r.get('device_name')}, torch {r.get('torch_version')}; "
      f"diffusers step: load {d.get('load_seconds')} s, step {d.get('step_seconds')} s; total {r.get('seconds')} s")
PYEOF
echo "== generate: accelstack vs diffusers directly"
"$PY" "$ROOT/benchmarks/bench_torch_generate.py" --runtime "$RUNTIME" ${BENCH[@]+"${BENCH[@]}"}
