"""Helpers of the resolver tests: a HardwareReport factory, the manifests, the replay captures.

Reports are built directly (``machine(...)``) for rules that need a precise machine; the replay
captures under ``tests/fixtures/captures`` give the table-driven tests real detection output.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Dict, List, Optional

from accelstack.hardware.report import GPU, AcceleratorAPI, CPUInfo, HardwareReport, MemoryInfo, OSInfo
from accelstack.manifests import Manifests, Plan, Request, load_manifest_file, resolve

GiB = 1024 ** 3
REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO / "tests" / "fixtures" / "captures"
EXAMPLE_GGML = REPO / "accelstack" / "manifests" / "data" / "ggml-example.json"
AVX2 = ["sse4.2", "avx", "avx2", "fma", "f16c", "bmi2"]  # detection's normalized names
AVX512 = AVX2 + ["avx512f", "avx512bw", "avx512vl"]


def nvidia(index: int = 0, name: str = "NVIDIA GeForce RTX 4090", cc: str = "8.9", cuda: str = "13.0",
           driver: str = "580.82.09", vram: int = 24, kind: str = "discrete", **kw) -> GPU:
    return GPU(index=index, vendor="nvidia", name=name, kind=kind, compute_capability=cc, cuda_driver_version=cuda,
               driver_version=driver, driver=kw.pop("driver_name", "nvidia"), vram_total=vram * GiB if vram else None,
               pci_vendor_id="10de", **kw)


def amd(index: int = 0, name: str = "AMD Radeon RX 7900 XTX", gfx: str = "gfx1100", vram: int = 24,
        kind: str = "discrete", **kw) -> GPU:
    return GPU(index=index, vendor="amd", name=name, kind=kind, gfx_target=gfx, driver="amdgpu",
               vram_total=vram * GiB if vram else None, pci_vendor_id="1002", **kw)


def intel(index: int = 0, name: str = "Intel Arc A770", generation: str = "Xe-HPG (Alchemist)", kind: str = "discrete",
          vram: Optional[int] = 16, **kw) -> GPU:
    return GPU(index=index, vendor="intel", name=name, kind=kind, intel_generation=generation, driver="i915",
               vram_total=vram * GiB if vram else None, pci_vendor_id="8086", **kw)


def apple(index: int = 0, name: str = "Apple M3", **kw) -> GPU:
    return GPU(index=index, vendor="apple", name=name, kind="integrated", metal_support="Metal 3", apple_family=name, **kw)


def machine(*gpus: GPU, os: str = "linux", arch: str = "x86_64", python: str = "3.11", version: str = "",
            glibc: str = "2.35", libc: str = "", wsl: bool = False, features: Optional[List[str]] = None,
            apis: Optional[Dict[str, List[int]]] = None, unusable: tuple = (), cpu_model: str = "") -> HardwareReport:
    """A HardwareReport as detection would write it; ``apis`` defaults to what the GPUs imply."""
    if features is None:
        features = list(AVX2) if arch == "x86_64" else ["neon", "asimd"]
    if not version:
        version = {"windows": "10.0.22631", "macos": "14.4.1", "linux": "Ubuntu 24.04"}.get(os, "")
    report = HardwareReport(
        os=OSInfo(name=os, arch=arch, python_version=python, version=version, wsl=wsl,
                  libc=libc or ("glibc" if os == "linux" else ""), libc_version=glibc if os == "linux" else ""),
        cpu=CPUInfo(model=cpu_model, features=sorted(features)),
        memory=MemoryInfo(ram_total=32 * GiB),
        gpus=list(gpus),
    )
    if apis is None:
        apis = {}
        for g in gpus:
            if g.vendor == "nvidia" and g.cuda_driver_version and g.driver != "nouveau" and os != "macos":
                apis.setdefault("cuda", []).append(g.index)
            if g.vendor == "amd" and g.gfx_target and os in ("linux", "windows"):
                apis.setdefault("rocm", []).append(g.index)
            if g.vendor == "intel" and os != "macos":
                apis.setdefault("xpu", []).append(g.index)
            if os == "macos":
                apis.setdefault("metal", []).append(g.index)
            if os in ("linux", "windows"):
                apis.setdefault("vulkan", []).append(g.index)
            if os == "windows" or wsl:
                apis.setdefault("directml", []).append(g.index)
    for name, idx in apis.items():
        report.apis.append(AcceleratorAPI(name=name, usable=name not in unusable, gpus=list(idx),
                                          version="1.3" if name == "vulkan" else ""))
    report.apis.append(AcceleratorAPI(name="cpu", usable=True))
    return report


@functools.lru_cache(maxsize=1)
def loaded_manifests() -> Manifests:
    """The built-in torch matrix plus the example ggml manifest, loaded once."""
    m = Manifests.builtin()
    m.add(load_manifest_file(EXAMPLE_GGML))
    return m


def plan_of(report: HardwareReport, stack: str = "torch", *requirements: str, backend: str = "", python: str = "",
            manifests: Optional[Manifests] = None) -> Plan:
    return resolve(report, Request(stack=stack, requirements=list(requirements), backend=backend, python=python),
                   manifests or loaded_manifests())


def candidate(plan: Plan, name: str, gpu: Optional[int] = None):
    """The first candidate called ``name`` (on GPU ``gpu`` when given)."""
    for c in plan.candidates:
        if c.name == name and (gpu is None or gpu in c.gpus):
            return c
    raise AssertionError(f"no candidate {name!r} in {[c.name for c in plan.candidates]}")


def fixture_names() -> List[str]:
    if not CAPTURES.is_dir():
        return []
    return sorted(p.name for p in CAPTURES.iterdir() if (p / "capture.json").is_file())


@functools.cache
def replay(name: str) -> HardwareReport:
    from accelstack.hardware import detect
    from accelstack.hardware.system import ReplaySystem

    return detect(ReplaySystem(str(CAPTURES / name)), home=Path("/nonexistent/accelstack-test-home"))
