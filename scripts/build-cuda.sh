#!/usr/bin/env bash
# Build the CUDA 13 ggml runtime with NVIDIA's compiler packages from PyPI (no system CUDA, no GPU)
# and check the result without a GPU:
#   - the library exports ggml's CUDA backend and every symbol it needs resolves at load time
#     (against the toolchain's libcudart/cuBLAS and a stub libcuda: ldd -r);
#   - it links libcudart.so.13 and libcublas.so.13 by name and the wheel carries neither;
#   - cuobjdump (from the build's own toolchain) lists exactly the SASS and PTX the build promises
#     (the manifest properties sm/ptx of its build record);
#   - CMake compiled with the toolchain's nvcc (recorded in the build record from CMakeCache.txt).
# Prints the wall time, the compile time and the sizes.
#
# usage: scripts/build-cuda.sh [--arch 90] [--all] [--out DIR] [--timeout SECONDS] [--jobs N]
#   --arch N   one architecture (compute capability without the dot; default 90 = H100/H200)
#   --all      every architecture the CUDA 13 build supports (75 80 86 89 90 100 120; hours on 2 cores)
#   --out DIR  where the wheel and its build record go (default dist/cuda13)
#   --timeout  the compile's limit (default: accelstack's, 4 h for each architecture compiled)
# The first build of one architecture takes about an hour on 2 cores (docs/builds.md); a repeated
# run is a cache hit and only checks.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
ACCELSTACK=${ACCELSTACK:-"$ROOT/.venv/bin/accelstack"}
[ -x "$ACCELSTACK" ] || ACCELSTACK=accelstack
PYTHON=${PYTHON:-"$ROOT/.venv/bin/python"}
[ -x "$PYTHON" ] || PYTHON=python3
ARCH=90
ALL=0
OUT="$ROOT/dist/cuda13"
TIMEOUT=""
JOBS=0

while [ $# -gt 0 ]; do
    case "$1" in
        --arch) ARCH=${2:?--arch needs a value}; shift 2 ;;
        --arch=*) ARCH=${1#--arch=}; shift ;;
        --all) ALL=1; shift ;;
        --out) OUT=${2:?--out needs a directory}; shift 2 ;;
        --timeout) TIMEOUT=${2:?--timeout needs seconds}; shift 2 ;;
        --jobs) JOBS=${2:?--jobs needs a number}; shift 2 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) echo "build-cuda.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

ARCH=${ARCH#sm_}
ARCH=${ARCH//./}
if [ "$ALL" = 1 ]; then
    unset ACCELSTACK_CUDA_ARCHS
    echo "building the cuda variant for every CUDA 13 architecture"
else
    export ACCELSTACK_CUDA_ARCHS="$ARCH"
    echo "building the cuda variant for sm_$ARCH only"
fi

mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)
args=(build ggml --backend cuda --out "$OUT")
[ -n "$TIMEOUT" ] && args+=(--timeout "$TIMEOUT")
[ "$JOBS" != 0 ] && args+=(--jobs "$JOBS")
rm -f "$OUT"/*.whl.build.json
if ! "$ACCELSTACK" "${args[@]}"; then
    echo "FAIL: the build failed (its log: the build cache slot's build.log, named above)" >&2
    exit 1
fi
wall=$(( $(date +%s) - start ))
RECORD=$(ls -t "$OUT"/*.whl.build.json | head -n 1)

# Everything below reads the result line and the wheel; a failed check exits 1 with FAIL lines.
"$PYTHON" - "$WORK" "$wall" "$RECORD" <<'EOF'
import json, os, re, shutil, subprocess, sys, zipfile
from pathlib import Path

work, wall = Path(sys.argv[1]), int(sys.argv[2])
result = json.loads(Path(sys.argv[3]).read_text())  # the build record beside the exported wheel
failed = []

def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failed.append(what)

wheel = Path(result["wheel"])
tc = result.get("toolchain") or {}
root = Path(tc.get("root", ""))
print(f"wheel {wheel}")
print(f"  toolchain CUDA {tc.get('cuda')} from {tc.get('source')}")
check(str(tc.get("cmake_cuda_compiler", "")).startswith(str(root)) and "/usr/local/cuda" not in tc.get("cmake_cuda_compiler", ""),
      f"CMake compiled CUDA with the PyPI toolchain's nvcc ({tc.get('cmake_cuda_compiler', 'not recorded')})")
libs = tc.get("cmake_cuda_libraries") or {}
check(bool(libs) and all(str(v).startswith(str(root)) for v in libs.values()),
      "CMake linked cudart, cuBLAS and the driver stub from the PyPI toolchain: "
      + ", ".join(f"{k}={Path(v).name}" for k, v in sorted(libs.items())))

unpacked = work / "wheel"
with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    z.extractall(unpacked)
nvidia = [n for n in names if re.search(r"(^|/)(lib)?(cudart|cublas|cublasLt|nvblas)[^/]*\.(so|dll)", n)]
check(not nvidia, f"the wheel carries no cudart/cuBLAS ({', '.join(nvidia) or 'none'})")
sos = sorted(p for p in unpacked.rglob("*.so*") if p.is_file())
check(bool(sos), f"the wheel has its own libraries: {', '.join(p.name for p in sos)}")

def run(cmd, env=None):
    return subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)

exporting = [p for p in sos if "ggml_backend_cuda_init" in run(["nm", "-D", "--defined-only", str(p)]).stdout]
check(bool(exporting), "a library exports ggml_backend_cuda_init: " + ", ".join(p.name for p in exporting))
lib = exporting[0] if exporting else sos[0]
needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run(["readelf", "-d", str(lib)]).stdout)
print(f"  {lib.name} needs {', '.join(needed)}")
for soname in ("libcudart.so.13", "libcublas.so.13"):
    check(soname in needed, f"{lib.name} links {soname} by name")

# load-time resolution without a GPU: the toolchain's runtime libraries, and the stub libcuda
# under the name the driver's library has (libcuda.so.1)
stubs = work / "stubs"
stubs.mkdir()
(stubs / "libcuda.so.1").symlink_to(root / "lib" / "stubs" / "libcuda.so")
env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join([str(lib.parent), str(root / "lib"), str(stubs)]))
ldd = run(["ldd", "-r", str(lib)], env=env)
bad = [l.strip() for l in (ldd.stdout + ldd.stderr).splitlines() if "not found" in l or "undefined symbol" in l]
check(ldd.returncode == 0 and not bad, f"every symbol of {lib.name} resolves at load time (ldd -r)"
      + (": " + "; ".join(bad[:5]) if bad else ""))

props = result.get("properties", {})
def arch_names(ccs, prefix):
    return sorted({prefix + cc.replace(".", "") for cc in ccs})
want_sass, want_ptx = arch_names(props.get("sm", []), "sm_"), arch_names(props.get("ptx", []), "sm_")
cuobjdump = (tc.get("tools") or {}).get("cuobjdump") or shutil.which("cuobjdump")
if not cuobjdump:
    check(False, "cuobjdump is in the toolchain")
else:
    elf = run([cuobjdump, "--list-elf", str(lib)]).stdout
    ptx = run([cuobjdump, "--list-ptx", str(lib)]).stdout
    got_sass = sorted(set(re.findall(r"\.(sm_\d+[af]?)\.cubin", elf)))
    got_ptx = sorted(set(re.findall(r"\.(sm_\d+[af]?)\.ptx", ptx)))
    kernels = len(re.findall(r"^ELF file", elf, re.M))
    check(got_sass == want_sass, f"SASS in the library {got_sass} == promised sm {want_sass} ({kernels} cubins)")
    check(got_ptx == want_ptx, f"PTX in the library {got_ptx} == promised ptx {want_ptx}")
print(f"  manifest requires: cuda {props.get('cuda')}, sm {props.get('sm')}, ptx {props.get('ptx')}")
for libw in result.get("cuda_libs", []):
    print(f"  runtime wheel {libw['name']} ({libw['size'] / 1e6:.1f} MB) {libw['url']}")
check(sorted(l["name"].split("-")[0] for l in result.get("cuda_libs", [])) == ["nvidia_cublas", "nvidia_cuda_runtime"],
      "the build record lists the cudart and cuBLAS wheels it links")

print()
how = "reused from the build cache" if result.get("cache_hit") else "compiled now"
print(f"compile time    {result.get('seconds', 0):.0f} s ({result['seconds'] / 60:.1f} min; {how})")
print(f"script wall     {wall} s")
print(f"wheel size      {result['size'] / 1e6:.1f} MB")
print(f"installed size  {result.get('installed_size', 0) / 1e6:.1f} MB")
for p in sos:
    print(f"  {p.relative_to(unpacked)}  {p.stat().st_size / 1e6:.1f} MB")
runtime = sum(l["size"] for l in result.get("cuda_libs", []))
print(f"runtime wheels  {runtime / 1e6:.1f} MB (shared, fetched once per home)")
if failed:
    print(f"\n{len(failed)} check(s) failed", file=sys.stderr)
    sys.exit(1)
print("\nall checks passed")
EOF
