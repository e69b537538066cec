"""From facts to usable APIs and an ordered preference, each with its evidence and reason.

Still facts, not install decisions: "CUDA is usable on GPU 0 because driver 550 reports CUDA
12.4" — the resolver later decides which build that allows.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..domain import ApiName
from . import tables
from .common import NVIDIA_NO_DEVICES
from .report import GPU, AcceleratorAPI, HardwareReport, Preference

__all__ = ["add_gpu_apis", "cpu_problems", "order_preference"]

GiB = 1024 ** 3


def _api(report: HardwareReport, name: ApiName) -> AcceleratorAPI:
    api = report.api(name)
    if api is None:
        api = AcceleratorAPI(name=name, usable=False)
        report.apis.append(api)
    return api


def add_gpu_apis(report: HardwareReport, *, kfd_ok: Optional[bool], vulkan_icds: List[str], level_zero: str) -> None:
    """Decide which APIs each GPU can use, from what detection found."""
    os_name = report.os.name
    # a loaded kernel module that differs from the user-space driver makes cuInit fail
    mismatch = "nvidia_driver_library_mismatch" in report.problem_codes()
    # a loaded driver that initialized no GPU (nvidia-smi: "No devices were found"): cuInit finds none either
    uninitialized = NVIDIA_NO_DEVICES in report.problem_codes()
    directml_ok = os_name != "windows" or not report.os.version or _vkey(report.os.version) >= (10, 0, 16299)
    for g in report.gpus:
        if g.vendor == "nvidia" and g.cuda_driver_version and g.driver not in ("nouveau", "") and mismatch:
            _api(report, "cuda").evidence.append(
                f"GPU {g.index} {g.name}: kernel module {g.driver_version} does not match the installed NVIDIA user-space driver"
            )
        elif g.vendor == "nvidia" and g.driver not in ("nouveau", "basic-display", "") and uninitialized:
            _api(report, "cuda").evidence.append(
                f"GPU {g.index} {g.name}: the NVIDIA driver{' ' + g.driver_version if g.driver_version else ''} is loaded but could not "
                "initialize this GPU (nvidia-smi: No devices were found; `sudo dmesg | grep NVRM` says why)"
            )
        elif g.vendor == "nvidia" and g.cuda_driver_version and g.driver not in ("nouveau", ""):
            api = _api(report, "cuda")
            api.usable = True
            api.version = max(api.version, g.cuda_driver_version, key=_vkey) if api.version else g.cuda_driver_version
            api.gpus.append(g.index)
            api.evidence.append(f"GPU {g.index} {g.name}: driver {g.driver_version} reports CUDA {g.cuda_driver_version}")
        elif g.vendor == "nvidia" and not g.cuda_driver_version:
            _api(report, "cuda").evidence.append(f"GPU {g.index} {g.name}: " + _no_cuda_why(g))
        if g.vendor == "amd" and os_name == "linux" and g.gfx_target and g.driver in ("amdgpu", ""):
            api = _api(report, "rocm")
            if kfd_ok:
                api.usable = True
                api.gpus.append(g.index)
                api.evidence.append(f"GPU {g.index} {g.name}: {g.gfx_target}, /dev/kfd is accessible")
            else:
                api.evidence.append(f"GPU {g.index} {g.name}: {g.gfx_target}, but /dev/kfd is not accessible")
            api.version = report.rocm_version
        if g.vendor == "amd" and os_name == "windows" and g.gfx_target in tables.amd_hip_runtime_windows()["targets"]:
            # AMD's Windows ROCm (TheRock) loads the HIP runtime the Adrenalin driver installs
            hip = tables.amd_hip_runtime_windows()
            api, needed = _api(report, "rocm"), hip["needed"]
            if g.hip_runtime == needed:
                api.usable = True
                api.gpus.append(g.index)
                api.evidence.append(f"GPU {g.index} {g.name}: {g.gfx_target}, the driver's HIP runtime {needed} (amdhip64_{needed}.dll)")
            else:
                have = f"HIP runtime {g.hip_runtime}" if g.hip_runtime else "no HIP runtime"
                api.evidence.append(f"GPU {g.index} {g.name}: {g.gfx_target}, but the driver has {have} (ROCm on Windows needs HIP {needed}: {hip['update']})")
        if g.vendor == "intel" and (g.kind == "discrete" or any(x in g.intel_generation for x in ("Xe-LPG", "Xe2", "Xe3"))):
            api = _api(report, "xpu")
            if os_name == "windows" or level_zero or os_name == "linux" and g.driver in ("i915", "xe"):
                api.usable = True
                api.gpus.append(g.index)
                api.evidence.append(f"GPU {g.index} {g.name}: {g.intel_generation}" + (f", Level Zero at {level_zero}" if level_zero else ""))
        if g.vendor == "apple" or (os_name == "macos" and g.metal_support):
            api = _api(report, "metal")
            api.usable = bool(g.metal_support) or g.vendor == "apple"
            api.version = g.metal_support
            api.gpus.append(g.index)
            api.evidence.append(f"GPU {g.index} {g.name}: {g.metal_support or 'Apple GPU'}")
        if os_name == "windows" and not directml_ok:
            _api(report, "directml").evidence.append(f"GPU {g.index} {g.name}: DirectML needs Windows 10 1709 (build 16299) or newer, this is {report.os.version}")
        elif os_name == "windows":
            api = _api(report, "directml")
            api.usable = True
            api.gpus.append(g.index)
            api.evidence.append(f"GPU {g.index} {g.name}: DirectX 12 adapter on Windows")
        # an NVIDIA GPU its loaded driver could not initialize runs no Vulkan either (the same driver)
        blocked = g.vendor == "nvidia" and uninitialized and g.driver not in ("nouveau", "")
        if os_name in ("linux", "windows") and (report.vulkan_loader or os_name == "windows") and g.vendor != "other" and not blocked:
            if _vulkan_driver_for(g, vulkan_icds, os_name):
                api = _api(report, "vulkan")
                api.usable = True
                api.gpus.append(g.index)
                api.evidence.append(f"GPU {g.index} {g.name}: Vulkan driver present")
    cpu = _api(report, "cpu")
    cpu.usable = True
    cpu.evidence = [f"{report.cpu.model or 'CPU'}: {report.cpu.logical_cores or '?'} threads, {', '.join(f for f in report.cpu.features if f.startswith(('avx', 'neon', 'sve'))) or 'no SIMD extensions found'}"]


def _no_cuda_why(g: GPU) -> str:
    if g.driver in ("nouveau", "basic-display", ""):
        return "no NVIDIA driver is loaded" + (" (nouveau drives it)" if g.driver == "nouveau" else "")
    if not g.driver_version:
        return "NVIDIA's driver is installed, but its version (and so its CUDA version) is unknown"
    return f"driver {g.driver_version} does not report a CUDA version" + (f" (L4T {g.l4t_version})" if g.l4t_version else "")


def _vulkan_driver_for(g: GPU, icds: List[str], os_name: str) -> bool:
    if os_name == "windows":
        return True  # every WDDM GPU driver ships its Vulkan ICD
    if g.vendor == "nvidia" and g.driver == "nouveau":
        return any("nouveau" in i for i in icds)
    names = {"nvidia": ("nvidia",), "amd": ("radeon", "amd"), "intel": ("intel",)}.get(g.vendor, ())
    return any(any(n in i.lower() for n in names) for i in icds)


def _vkey(v: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in v.split(".") if p.isascii() and p.isdigit())


# Base scores: higher is preferred. Ties break on VRAM, then GPU index.
_SCORES: Dict[Tuple[str, str], int] = {
    ("cuda", "discrete"): 100,
    ("metal", "integrated"): 95,
    ("metal", "discrete"): 94,
    ("rocm", "discrete"): 90,
    ("cuda", "integrated"): 88,
    ("xpu", "discrete"): 80,
    ("rocm", "integrated"): 45,
    ("vulkan", "discrete"): 60,
    ("directml", "discrete"): 50,
    ("xpu", "integrated"): 42,
    ("vulkan", "integrated"): 40,
    ("directml", "integrated"): 30,
}
_WHY = {
    "cuda": "CUDA on a {kind} NVIDIA GPU is the fastest, best-supported path",
    "rocm": "ROCm/HIP runs natively on {gfx}",
    "metal": "Metal is the native GPU API on macOS",
    "xpu": "Intel XPU (Level Zero/SYCL) drives the Intel GPU natively",
    "vulkan": "Vulkan works with the vendor's driver, slower than the native API",
    "directml": "DirectML works on any DirectX 12 GPU but is no longer developed and is slower",
}


def order_preference(report: HardwareReport) -> List[Preference]:
    entries: List[Tuple[int, int, int, Preference]] = []
    for api in report.apis:
        if not api.usable or api.name == "cpu":
            continue
        for idx in api.gpus:
            g = report.gpu(idx)
            if g is None:
                continue
            kind = g.kind if g.kind != "unknown" else "discrete"
            score = _SCORES.get((api.name, kind), 20)
            if api.name == "metal" and kind == "integrated" and g.vendor != "apple":
                score = 70  # an Intel Mac's iGPU: after its discrete GPU (Apple silicon's GPU is the fast one)
            reason = _WHY.get(api.name, api.name).format(kind=kind, gfx=g.gfx_target or "this GPU")
            if api.name == "rocm" and report.os.name != "windows" and not tables.rocm_supports(g.gfx_target):
                score = min(score, 35)
                reason = f"ROCm does not list {g.gfx_target or 'this GPU'} as supported; it may work only with HSA_OVERRIDE_GFX_VERSION"
            if kind == "integrated" and (api.name not in ("metal", "cuda") or g.vendor not in ("apple", "nvidia")):
                reason += "; integrated GPU, after any discrete one"
            vram = g.vram_total or 0
            entries.append((-score, -vram, idx, Preference(api=api.name, gpu=idx, reason=f"{g.name}: {reason}")))
    entries.sort(key=lambda e: (e[0], e[1], e[2]))
    prefs = [e[3] for e in entries]
    cpu_reason = "always available; the slowest choice"
    if report.os.arch == "x86_64" and report.cpu.features and not report.cpu.has("avx2"):
        cpu_reason += " (no AVX2: needs a build without AVX2)"
    prefs.append(Preference(api="cpu", gpu=None, reason=f"CPU: {cpu_reason}"))
    return prefs


def cpu_problems(report: HardwareReport, add) -> None:
    if report.os.arch == "x86_64" and report.cpu.features and not report.cpu.has("avx2"):
        add(
            "no_avx2",
            f"the CPU ({report.cpu.model or 'unknown model'}) has no AVX2",
            "CPU generation will be slow and needs a build without AVX2; prefer a GPU runtime",
            "warning",
        )
    if report.memory.ram_total and report.memory.ram_total < 8 * GiB:
        add("low_ram", f"only {report.memory.ram_total / GiB:.1f} GiB of RAM", "image generation needs 8 GiB or more; close other programs or use a GPU with enough VRAM", "warning")
