#!/usr/bin/env bash
# The CUDA runtime on a machine with an NVIDIA GPU and no network: install, verify, time.
#
# usage: scripts/device-check.sh DIR [--steps N] [--size PX] [--keep] [--torch-venv VENV] [--vulkan]
#        scripts/device-check.sh --build SDIST [same options]   build the CUDA variant here first
#        scripts/device-check.sh --cpu [--vram SIZE]             CPU mode: what runs without a GPU (tests)
#   --build SDIST: stable_diffusion_cpp_python-*.tar.gz carried along; builds the CUDA variant for this GPU's
#     architecture only (nvidia-smi's compute capability) and the CPU variant into DIR, then goes on as below
#     (the CUDA record's runtime wheels, if it names any, must be carried in DIR too).
#   After the verify: verify --family sdxl flux, then timed 1024x1024 generations (--big-steps, default 20) of
#   full-size synthesized weights (scripts/device_check_models.py loadable: FLUX.1-dev's whole DiT; SDXL's
#   probe) with the planner's estimate (generate --dry-run) against the GPU's measured memory peak
#   (nvidia-smi, sampled every 100 ms); --torch-venv runs scripts/device-check-torch.sh at 1024x1024 on the
#   same GPU; --vulkan builds the Vulkan variant from SDIST and times the same generations with it.
#   CPU mode: detect, and the planner's decisions for full-size SDXL and FLUX.1-dev at 1024x1024 on a GPU of
#   --vram (default 80GiB), from header-only files; writes device-check.json like the GPU mode.
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
CPU_MODE=0
SDIST=""
TORCH_VENV=""
VULKAN=0
BIG_STEPS=20
VRAM=80GiB
while [ $# -gt 0 ]; do
    case "$1" in
        --steps) STEPS=${2:?}; shift 2 ;;
        --size) SIZE=${2:?}; shift 2 ;;
        --keep) KEEP=1; shift ;;
        --cpu) CPU_MODE=1; shift ;;
        --vram) VRAM=${2:?}; shift 2 ;;
        --build) SDIST=${2:?}; shift 2 ;;
        --torch-venv) TORCH_VENV=${2:?}; shift 2 ;;
        --vulkan) VULKAN=1; shift ;;
        --big-steps) BIG_STEPS=${2:?}; shift 2 ;;
        -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
        -*) echo "device-check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) DIR=$1; shift ;;
    esac
done
if [ "$CPU_MODE" = 0 ] && [ -z "$SDIST" ]; then
    if [ -z "$DIR" ] || [ ! -d "$DIR" ]; then echo "usage: scripts/device-check.sh DIR (see --help)" >&2; exit 2; fi
    DIR=$(cd "$DIR" && pwd)
fi
if [ -n "$SDIST" ]; then
    [ -f "$SDIST" ] || { echo "device-check.sh: --build $SDIST: no such file" >&2; exit 2; }
    SDIST=$(cd "$(dirname "$SDIST")" && pwd)/$(basename "$SDIST")
fi

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

# step NAME ARGS...: an accelstack command's --json result kept in $RESULTS (and $OUT), its time printed
# shellcheck source=SCRIPTDIR/device-check-step.sh
. "$ROOT/scripts/device-check-step.sh"
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

# estimate NAME ARGS...: the planner's decision (generate --dry-run --json) for the model arguments ARGS
estimate() {
    local name=$1; shift
    step "estimate-$name" generate "$@" --prompt "a lighthouse at dusk" --width 1024 --height 1024 --dry-run \
        --output "$WORK/$name.png" "${MACHINE[@]}" || true
    "$PY" - "$RESULTS/estimate-$name.json" <<'PYEOF'
import json, sys
r = json.loads(open(sys.argv[1]).read()).get("result") or {}
p = r.get("plan") or {}
print(f"  {r.get('family')} on {r.get('backend')}: fits {r.get('fits')}; VRAM {(p.get('vram_need') or 0) / 2**30:.2f} GiB, "
      f"RAM {(p.get('ram_need') or 0) / 2**30:.2f} GiB; {p.get('reason') or r.get('refusal')}")
PYEOF
}

# figures: the summary JSON of every result in $RESULTS ($OUT/device-check.json too)
figures() {
    "$PY" - "$RESULTS" "${OUT:-}" "$CPU_MODE" <<'PYEOF'
import json, sys
from pathlib import Path

results, out, cpu = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
def result(name):
    try:
        return json.loads((results / f"{name}.json").read_text()).get("result") or {}
    except (OSError, ValueError):
        return {}
def peak(name):
    try:
        vals = [int(x) for x in (results / f"{name}.vram").read_text().split() if x.strip().isdigit()]
        return (max(vals) - vals[0]) * 2**20 if vals else None  # MiB above the level before the run
    except OSError:
        return None
out_data = {"mode": "cpu" if cpu else "gpu", "models": {}}
for name in ("sdxl", "flux"):
    est = (result(f"estimate-{name}").get("plan") or {})
    row = {"estimate_vram": est.get("vram_need"), "estimate_ram": est.get("ram_need"), "settings": {
        k: est.get(k) for k in ("offload_to_cpu", "keep_clip_on_cpu", "vae_tiling", "vae_tile_size", "keep_vae_on_cpu",
                                "max_vram", "weight_type")}, "phases": est.get("phases")}
    for variant in ("cuda", "vulkan"):
        gen = result(f"big-{name}-{variant}")
        if gen:
            measured = peak(f"big-{name}-{variant}")
            row[variant] = {"its_per_second": gen.get("its_per_second"), "generate_seconds": gen.get("generate_seconds"),
                            "load_seconds": gen.get("load_seconds"), "vram_peak": measured,
                            "estimate_over_measured": round(est["vram_need"] / measured, 3)
                            if measured and est.get("vram_need") else None}
    out_data["models"][name] = row
fam = result("verify-families")
if fam:
    out_data["verify_families"] = {"verdict": fam.get("verdict"), "reason": fam.get("reason")}
print("== figures")
print(json.dumps(out_data, indent=2))
(results / "device-check.json").write_text(json.dumps(out_data, indent=2))
if out:
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "device-check.json").write_text(json.dumps(out_data, indent=2))
PYEOF
}

# big RUNTIME VARIANT: the timed 1024x1024 generations of $MODELS on RUNTIME, the GPU's memory sampled
big() {
    local rt=$1 variant=$2 name sampler
    for name in sdxl flux; do
        mapfile -t ARGS < <("$PY" -c 'import json, sys; print("\n".join(json.loads(sys.argv[1])[sys.argv[2]]))' "$MODELS" "$name")
        estimate "$name" "${ARGS[@]}" --runtime "$rt"
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$RESULTS/big-$name-$variant.vram" &
        sampler=$!
        step "big-$name-$variant" generate --runtime "$rt" --backend "$variant" "${ARGS[@]}" --prompt "a lighthouse at dusk" \
            --width 1024 --height 1024 --steps "$BIG_STEPS" --cfg-scale 1 --seed 42 --output "$WORK/big-$name-$variant.png" \
            || status=1
        kill "$sampler" 2>/dev/null || true
        say generate "big-$name-$variant"
    done
}

if [ "$CPU_MODE" = 1 ]; then
    MACHINE=(--vram "$VRAM" --ram 128GiB --backend cuda)
    echo "== detect"
    step detect detect || true
    say detect
    echo "== the planner on a ${VRAM} GPU, 1024x1024, full-size files (headers only)"
    MODELS=$("$PY" "$ROOT/scripts/device_check_models.py" headers "$WORK/models")
    for name in sdxl flux; do
        mapfile -t ARGS < <("$PY" -c 'import json, sys; print("\n".join(json.loads(sys.argv[1])[sys.argv[2]]))' "$MODELS" "$name")
        estimate "$name" "${ARGS[@]}"
    done
    figures
    exit 0
fi

if [ -n "$SDIST" ]; then
    ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
    echo "== build the CUDA variant for sm_$ARCH and the CPU variant from $(basename "$SDIST")"
    DIR="$WORK/carry"
    step build-cuda build ggml --backend cuda --cuda-arch "$ARCH" --sdist "$SDIST" --out "$DIR/cuda" || true
    step build-cpu build ggml --backend cpu --sdist "$SDIST" --out "$DIR/cpu" || true
fi

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
if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader | sed 's/^/  nvidia-smi: /' || true
fi

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

    echo "== verify --family sdxl flux"
    step verify-families verify --runtime "$RT_CUDA" --backend cuda --family sdxl flux || status=1
    say verify verify-families

    echo "== 1024x1024, $BIG_STEPS steps, full-size synthesized weights: estimate vs the GPU's measured peak"
    MODELS=$("$PY" "$ROOT/scripts/device_check_models.py" loadable "$WORK/models")
    MACHINE=(--backend cuda)
    big "$RT_CUDA" cuda
    if [ "$VULKAN" = 1 ] && [ -n "$SDIST" ]; then
        echo "== the Vulkan variant on the same GPU"
        step build-vulkan build ggml --backend vulkan --sdist "$SDIST" --out "$WORK/carry-vulkan" || true
        WHEEL=$(find "$WORK/carry-vulkan" -name '*.whl' | head -n 1)
        if [ -n "$WHEEL" ]; then
            "$PY" -m pip install -q --no-deps --target "$WORK/rt-vulkan" "$WHEEL" && big "$WORK/rt-vulkan" vulkan
        else
            echo "  no Vulkan build (see $RESULTS/build-vulkan.json)"
        fi
    fi
fi
if [ -n "$TORCH_VENV" ]; then
    echo "== the torch stack (diffusers) on the same GPU"
    OUT="${OUT:-$WORK/torch}/torch" "$ROOT/scripts/device-check-torch.sh" "$TORCH_VENV" --size 1024 --steps "$BIG_STEPS" \
        || status=1
fi
figures

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
