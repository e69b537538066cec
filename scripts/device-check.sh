#!/usr/bin/env bash
# The CUDA runtime on a machine with an NVIDIA GPU and no network: install, verify, time.
#
# usage: scripts/device-check.sh DIR [--steps N] [--size PX] [--keep]
#   DIR holds what was built elsewhere (scripts/build-cuda.sh, `accelstack build ggml`):
#     DIR/cuda*/<wheel> and <wheel>.build.json   the CUDA build and its build record
#     DIR/cpu/<wheel> and <wheel>.build.json     the CPU build (the reference)
#     DIR/**/nvidia_cuda_runtime-*.whl, nvidia_cublas-*.whl
#                                                the runtime wheels the CUDA build record names
#                                                (its cuda_libs; sha256 and size are checked)
#   $OUT (optional): a copy of every --json result goes there (detect, install, verify, generate,
#   summary.json with every figure).
#
# It makes a local signed manifest (manifest keygen + manifest build, the runtime wheels' URLs
# rewritten to the carried files), then runs: accelstack detect; install --backend cuda and
# --backend cpu from that manifest (each into its own home, no build from source); verify of the
# CUDA runtime with --cpu-runtime (GPU vs CPU agreement); and a timed generate (default 512x512,
# 20 steps, same seed) on the CUDA runtime and on the CPU runtime, with the synthesized probe
# model (no download). Every figure is printed. Nothing needs the network.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=""
STEPS=20
SIZE=512
KEEP=0
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) STEPS=${2:?}; shift 2 ;;
        --size) SIZE=${2:?}; shift 2 ;;
        --keep) KEEP=1; shift ;;
        -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
        -*) echo "device-check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) DIR=$1; shift ;;
    esac
done
[ -n "$DIR" ] && [ -d "$DIR" ] || { echo "usage: scripts/device-check.sh DIR (see --help)" >&2; exit 2; }
DIR=$(cd "$DIR" && pwd)

if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY=$(command -v python3); fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
acc() { "$PY" -m accelstack "$@"; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/device-check.XXXXXX")
if [ "$KEEP" = 0 ]; then trap 'rm -rf "$WORK"' EXIT; else echo "work folder (kept): $WORK"; fi
# everything accelstack writes stays in the work folder; the probe model may be shared
export ACCELSTACK_CACHE="$WORK/cache" ACCELSTACK_CONFIG_DIR="$WORK/config"
export ACCELSTACK_CONFIG_FILE="$WORK/config/config.yaml" ACCELSTACK_BUILD_CACHE="$WORK/builds"
export ACCELSTACK_PROBE_CACHE="${ACCELSTACK_PROBE_CACHE:-$WORK/probe}"
RESULTS="$WORK/results"
mkdir -p "$RESULTS"

# Run an accelstack command with --json; keep its final line as $RESULTS/NAME.json; print its time.
step() {
    local name=$1; shift
    local start end rc=0
    start=$(date +%s.%N)
    acc "$@" --json > "$RESULTS/$name.jsonl" || rc=$?
    end=$(date +%s.%N)
    tail -n 1 "$RESULTS/$name.jsonl" > "$RESULTS/$name.json"
    "$PY" -c 'import sys; print(f"{sys.argv[1]}: exit {sys.argv[2]}, {float(sys.argv[4]) - float(sys.argv[3]):.1f} s wall")' \
        "$name" "$rc" "$start" "$end"
    if [ -n "${OUT:-}" ]; then mkdir -p "$OUT"; cp "$RESULTS/$name.json" "$OUT/$name.json"; fi
    return "$rc"
}
# say STEP [NAME [HOME]]: one line with the figures of a step's result (or its error); "runtime"
# prints only the runtime folder the install NAME made in HOME
cat > "$WORK/say.py" <<'EOF'
import json, os, sys

name, path = sys.argv[1], sys.argv[2]
try:
    line = json.loads(open(path).read())
except (OSError, ValueError):
    line = {}
r = line.get("result") or {}
e = line if line.get("event") == "error" else {}  # the error line: code, message, hint at the top
if name == "runtime":  # the runtime folder an install made: <home>/<its receipt's path>
    path = (r.get("receipt") or {}).get("path", "")
    print(os.path.join(sys.argv[3], path) if path else "")
    sys.exit(0)
if not r:
    print(f"  FAILED: {e.get('message', 'no result')} ({e.get('hint', '')})")
    sys.exit(0)


def dev(d):
    return d.get("name") if isinstance(d, dict) else d


if name == "manifest":
    print(f"  targets: {', '.join(r.get('targets', []))}")
elif name == "detect":
    for g in r.get("gpus", []):
        print(f"  GPU {g.get('index')}: {g.get('name')}, compute capability {g.get('compute_capability')}, driver "
              f"{g.get('driver_version')} (CUDA {g.get('cuda_driver_version')}), VRAM {(g.get('vram_total') or 0) / 2**30:.0f} GiB")
    if not r.get("gpus"):
        print("  no GPU detected")
elif name.startswith("install"):
    print(f"  runtime {r.get('runtime')}; timings {r.get('timings')}")
elif name == "verify":
    print(f"  {r.get('verdict')}: {r.get('reason')}; device {dev(r.get('device'))}; load {r.get('load_seconds')} s, "
          f"step {r.get('step_seconds')} s, {r.get('its_per_second')} it/s; vs CPU: mean diff {r.get('cpu_mean_diff')}, "
          f"max diff {r.get('cpu_max_diff')}; total {r.get('total_seconds')} s")
elif name.startswith("generate"):
    print(f"  device {dev(r.get('device'))}; {r.get('width')}x{r.get('height')}, {r.get('steps')} steps: load "
          f"{r.get('load_seconds')} s, generate {r.get('generate_seconds')} s, {r.get('its_per_second')} it/s, "
          f"total {r.get('total_seconds')} s")
EOF
say() { "$PY" "$WORK/say.py" "$1" "$RESULTS/${2:-$1}.json" "${3:-}" || true; }

echo "== the carried builds -> a local signed manifest"
"$PY" - "$DIR" "$WORK/site" <<'EOF'
import hashlib, json, shutil, sys
from pathlib import Path

src, site = Path(sys.argv[1]), Path(sys.argv[2])
records = sorted(src.rglob("*.whl.build.json"))
by_variant = {}
for rec in records:
    data = json.loads(rec.read_text())
    by_variant.setdefault(data["variant"], []).append(rec)
cuda = [r for v in ("cuda", "cuda12") for r in by_variant.get(v, [])]
if not cuda or "cpu" not in by_variant:
    sys.exit(f"FAIL: {src} needs a CUDA build and a CPU build (<wheel> and <wheel>.build.json each); "
             f"found: {', '.join(f'{k} ({len(v)})' for k, v in by_variant.items()) or 'none'}")
wheels = {p.name: p for p in src.rglob("nvidia_*.whl")}
for rec in [cuda[0], by_variant["cpu"][0]]:
    data = json.loads(rec.read_text())
    wheel = rec.with_name(rec.name[: -len(".build.json")])
    dest = site / rec.parent.name
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(wheel, dest / wheel.name)
    for lib in data.get("cuda_libs", []):
        carried = wheels.get(lib["name"])
        if carried is None:
            sys.exit(f"FAIL: {lib['name']} (named by {rec.name}) is not in {src}")
        sha = hashlib.sha256(carried.read_bytes()).hexdigest()
        if sha != lib["sha256"] or carried.stat().st_size != lib["size"]:
            sys.exit(f"FAIL: {carried} is not the file the build linked (sha256 {sha}, recorded {lib['sha256']})")
        lib["url"] = carried.resolve().as_uri()  # no network: the carried copy
        print(f"  runtime wheel {lib['name']} ({lib['size'] / 1e6:.1f} MB) checked")
    (dest / (wheel.name + ".build.json")).write_text(json.dumps(data, indent=2))
    print(f"  {data['variant']}: {wheel.name} ({wheel.stat().st_size / 1e6:.1f} MB), "
          f"sm {data['properties'].get('sm')}, ptx {data['properties'].get('ptx')}, cuda {data['properties'].get('cuda')}")
EOF
acc manifest keygen --out "$WORK/keys/local" > /dev/null
step manifest manifest build "$WORK/site" --base-url "$(cd "$WORK/site" && "$PY" -c 'import pathlib; print(pathlib.Path.cwd().as_uri())')" \
    --key "$WORK/keys/local.key" --source device-check --version 1
say manifest
SRC=(--manifest "$WORK/site/ggml-manifest.json" --trusted-key "$WORK/keys/local.pub" --no-build)

echo "== detect"
step detect detect || true
say detect
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader | sed 's/^/  nvidia-smi: /' || true

echo "== install --backend cuda (from the local manifest, no network)"
status=0
step install-cuda install --backend cuda --home "$WORK/home-cuda" "${SRC[@]}" || status=1
RT_CUDA=$(say runtime install-cuda "$WORK/home-cuda")
say install-cuda
echo "== install --backend cpu (the reference)"
step install-cpu install --backend cpu --home "$WORK/home-cpu" "${SRC[@]}" || status=1
RT_CPU=$(say runtime install-cpu "$WORK/home-cpu")
say install-cpu
du -sh "$RT_CUDA" "$RT_CPU" "$WORK/home-cuda/shared" 2>/dev/null | sed 's/^/  installed: /' || true

if [ -n "$RT_CUDA" ] && [ -n "$RT_CPU" ]; then
    echo "== verify the CUDA runtime against the CPU build"
    step verify verify --runtime "$RT_CUDA" --backend cuda --cpu-runtime "$RT_CPU" || status=1
    say verify

    echo "== generate ${SIZE}x${SIZE}, $STEPS steps: CUDA vs CPU"
    PROBE=$("$PY" -c 'from accelstack.engine.probes.model import ensure_probe_model; print(ensure_probe_model(keep=True).path)')
    for which in cuda cpu; do
        rt=$RT_CUDA; [ "$which" = cpu ] && rt=$RT_CPU
        step "generate-$which" generate --runtime "$rt" --backend "$which" --model "$PROBE" --prompt "a lighthouse at dusk" \
            --width "$SIZE" --height "$SIZE" --steps "$STEPS" --seed 42 --output "$WORK/generate-$which.png" || status=1
        say "generate-$which"
    done
fi

"$PY" - "$RESULTS" "${OUT:-}" <<'EOF'
import json, sys
from pathlib import Path

results, out = Path(sys.argv[1]), sys.argv[2]
def result(name):
    try:
        return json.loads((results / f"{name}.json").read_text()).get("result") or {}
    except (OSError, ValueError):
        return {}
verify, gpu, cpu = result("verify"), result("generate-cuda"), result("generate-cpu")
summary = {
    "verify": {k: verify.get(k) for k in ("verdict", "reason", "load_seconds", "step_seconds", "its_per_second",
                                          "cpu_mean_diff", "cpu_max_diff", "total_seconds")},
    "generate_cuda": {k: gpu.get(k) for k in ("width", "steps", "load_seconds", "generate_seconds", "its_per_second")},
    "generate_cpu": {k: cpu.get(k) for k in ("width", "steps", "load_seconds", "generate_seconds", "its_per_second")},
}
if gpu.get("generate_seconds") and cpu.get("generate_seconds"):
    summary["speedup"] = round(cpu["generate_seconds"] / gpu["generate_seconds"], 1)
print("== summary")
print(json.dumps(summary, indent=2))
if out:
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "summary.json").write_text(json.dumps(summary, indent=2))
EOF
exit "$status"
