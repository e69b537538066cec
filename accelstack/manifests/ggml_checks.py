"""Checking ggml builds against the machine: one published target, or a local build, on one device.

:class:`GgmlChecks` says why a backend cannot reach a device (``device_problem``), why a target
cannot run on it (``check``: libc, OS version, CPU features, kernels, driver) and why a local build
never could (``build_problem``); ``ggml_resolve`` ranks what passes and explains the choice, as
``torch_checks`` and ``torch_resolve`` do for torch.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from packaging.version import Version

from ..domain import ApiName
from ..hardware.cpu import normalize_features
from .ggml_manifest import GgmlTarget
from .hw_rules import branch_note, cuda_driver_check, driver_floor, driver_hint, driver_unread, hw_rules, unread_driver_check
from .machine import Device, Machine, cc_parts, cuda_kernels_for, sm_name, version_of, version_or_none
from .plan import Request

__all__ = ["API_OF", "BACKEND_TEXT", "GgmlChecks"]

#: The accelerator API (detection's name) each ggml backend runs on.
API_OF: Dict[str, ApiName] = {"cuda": "cuda", "rocm": "rocm", "vulkan": "vulkan", "metal": "metal", "sycl": "xpu", "cpu": "cpu"}
BACKEND_TEXT = {"cuda": "CUDA", "rocm": "ROCm", "vulkan": "Vulkan", "metal": "Metal", "sycl": "SYCL", "cpu": "CPU"}


def _feature(name: str) -> str:
    """A feature a manifest requires, in detection's spelling ("sse4_2" -> "sse4.2"); unknown names stay as written."""
    found = normalize_features([name])
    return found[0] if found else name


class GgmlChecks:
    """Checks of ggml builds against one machine; :class:`~.ggml_resolve` ranks and explains them."""

    def __init__(self, machine: Machine, request: Request) -> None:
        self.m = machine
        self.request = request
        self.targets: List[GgmlTarget] = []  # the manifests' targets for this OS and architecture
        self._lowest: Dict[int, Optional[Tuple[Version, str]]] = {}

    def device_problem(self, dev: Device, backend: str) -> Optional[Tuple[str, str]]:
        m, g = self.m, dev.first
        usable = m.api_usable(API_OF[backend], g.index)
        if backend == "cuda":
            if usable is True or (usable is None and (dev.cuda_max or dev.driver)):
                return None
            if driver_unread(dev) and self.lowest_floor(dev) is not None:
                return None  # planned for by driver_fail, as the torch plan does (hw_rules.unread_driver_check)
            if g.driver == "nouveau":
                return ("api", f"{dev.label} runs the open-source nouveau driver; CUDA needs NVIDIA's driver{branch_note(dev.cc)}")
            return ("api", f"CUDA is not usable on {dev.label}: {m.api_evidence('cuda', g) or 'no working NVIDIA driver answered'}")
        if backend == "rocm":
            if not dev.gfx:
                return ("device", f"the gfx target of {dev.label} is unknown, so no ROCm build can be matched to it")
            if usable is False:
                return ("api", f"ROCm/HIP cannot reach {dev.label}: {m.api_evidence('rocm', g) or 'no HIP runtime'}")
            return None
        if backend == "vulkan":
            if usable:
                return None
            return ("api", f"no Vulkan driver was found for {dev.label} (install the GPU driver with Vulkan support)")
        if backend == "metal":
            return None if usable is not False else ("api", f"Metal is not usable on {dev.label}")
        if backend == "sycl":
            if usable:
                return None
            return ("api", f"SYCL needs Intel's Level Zero driver for {dev.label}, which was not found")
        return None

    # -- one target on one device ----------------------------------------------------------------
    def check(self, dev: Optional[Device], t: GgmlTarget) -> Tuple[Optional[Tuple[str, str]], str]:
        m, req = self.m, t.requires
        if m.os == "linux":
            if m.musl:
                return ("glibc", f"{t.id} is built for glibc; this system uses musl libc"), ""
            if req.glibc and m.glibc is not None and m.glibc < version_of(req.glibc):
                return ("glibc", f"{t.id} needs glibc >= {req.glibc}; this system has glibc {m.report.os.libc_version}"), ""
        if req.macos_min and m.macos is not None and m.macos < version_of(req.macos_min):
            return ("os-version", f"{t.id} needs macOS {req.macos_min} or newer; this Mac runs macOS {m.report.os.version}"), ""
        missing = [f for f in req.cpu_features if _feature(f) not in m.report.cpu.features]
        if missing:
            if not m.report.cpu.features:
                return ("cpu-features", f"{t.id} needs CPU features {', '.join(req.cpu_features)}, and this CPU's features are unknown"), ""
            cpu = m.report.cpu.model or "this CPU"
            return ("cpu-features", f"{t.id} needs CPU features {', '.join(req.cpu_features)}; {cpu} lacks {', '.join(missing)}"), ""
        how = ""
        if dev is not None and t.backend == "cuda" and dev.jetson:
            return ("device", f"{t.id} is built for discrete NVIDIA GPUs and ARM servers, not for the Tegra GPU of {dev.name} (Jetson)"), ""
        if dev is not None and t.backend == "cuda":
            native = False
            if req.sm or req.ptx:
                if dev.cc:
                    kernels = cuda_kernels_for(dev.cc, req.sm, req.ptx)
                    if kernels is None:
                        built = ", ".join(req.sm + [p + " (PTX)" for p in req.ptx])
                        return ("kernels", f"{t.id} has no kernels for {sm_name(dev.cc)} ({dev.name}); it is built for {built}"), ""
                    native = not kernels.startswith("compute_")
                    how = f"{kernels} kernels for {dev.name}"
                else:
                    how = f"compute capability of {dev.name} unknown; kernels not checked"
            fail = self.driver_fail(dev, t, native)
            if fail:
                return fail, ""
            lowest = self.lowest_floor(dev) if driver_unread(dev) else None
            if lowest is not None:
                how = unread_driver_check(dev, t.id, self.floor_of(t, native), lowest)[1]
        elif dev is not None and t.backend == "rocm" and req.gfx:
            if dev.gfx not in req.gfx:
                return ("kernels", f"{dev.gfx} ({dev.name}) is not among the targets of {t.id} ({', '.join(req.gfx)})"), ""
            how = f"{dev.gfx} is compiled in"
        elif dev is not None and t.backend == "vulkan" and req.vulkan:
            api = m.report.api("vulkan")
            have = api.version if api else ""
            offered = version_or_none(have)  # the driver's own text: may carry more than a version
            if offered is not None and offered < version_of(req.vulkan):
                return ("driver", f"{t.id} needs Vulkan {req.vulkan}; the driver offers Vulkan {have}"), ""
        return None, how or (f"runs on {dev.name}" if dev is not None else "")

    def driver_fail(self, dev: Device, t: GgmlTarget, native: bool = False) -> Optional[Tuple[str, str]]:
        """The driver rule of torch (NVIDIA's minor-version compatibility) applied to a ggml CUDA target."""
        req, g = t.requires, dev.first
        min_drv = req.nvidia_driver.get(self.m.driver_os, "")
        lowest = self.lowest_floor(dev) if driver_unread(dev) else None
        if lowest is not None:
            why, _how = unread_driver_check(dev, t.id, self.floor_of(t, native), lowest)
            return ("driver", why) if why else None
        if req.cuda:
            why, _how = cuda_driver_check(dev, req.cuda, min_drv, native=native, os_name=self.m.driver_os,
                                          what=t.id, policy=self.request.cuda_driver)
            return ("driver", why) if why else None
        if min_drv:
            if dev.driver is None:
                return ("driver", f"the NVIDIA driver version is unknown; {t.id} needs driver >= {min_drv}")
            if dev.driver < version_of(min_drv):
                return ("driver", f"NVIDIA driver {g.driver_version} is older than {min_drv}, which {t.id} needs; {driver_hint(dev.cc, min_drv)}")
        return None

    def floor_of(self, t: GgmlTarget, native: bool) -> str:
        """The oldest driver that runs CUDA target ``t`` here, by the rule :meth:`driver_fail` applies."""
        min_drv = t.requires.nvidia_driver.get(self.m.driver_os, "")
        if not t.requires.cuda:
            return min_drv
        return driver_floor(t.requires.cuda, min_drv, native=native, os_name=self.m.driver_os, policy=self.request.cuda_driver)[0]

    def lowest_floor(self, dev: Device) -> Optional[Tuple[Version, str]]:
        """(driver floor, target) of the CUDA target that runs on ``dev`` with the oldest driver (cached)."""
        if dev.rank in self._lowest:
            return self._lowest[dev.rank]
        best: Optional[Tuple[Version, str]] = None
        for t in self.targets:
            if t.backend != "cuda":
                continue
            kernels = cuda_kernels_for(dev.cc, t.requires.sm, t.requires.ptx) if dev.cc and (t.requires.sm or t.requires.ptx) else ""
            if kernels is None:
                continue
            floor = self.floor_of(t, bool(kernels) and not kernels.startswith("compute_"))
            if floor and (best is None or version_of(floor) < best[0]):
                best = (version_of(floor), t.id)
        self._lowest[dev.rank] = best
        return best

    # -- can a local build work at all? -----------------------------------------------------------
    def build_problem(self, dev: Optional[Device], backend: str) -> Optional[Tuple[str, str]]:
        """Why a local ``backend`` build for ``dev`` could never run (the published builds' rules, applied
        to what a current toolchain can still build): None when it can."""
        if dev is None:
            return None
        rules = hw_rules()
        g = dev.first
        if backend == "cuda":
            parts = cc_parts(dev.cc)
            if parts is not None and parts < rules.ggml_min_cc:
                arch = rules.architecture(dev.cc)
                era = f"{arch.name}, " if arch else ""
                return ("kernels", f"{dev.name} ({era}compute capability {dev.cc}) is older than any CUDA toolkit that can build ggml "
                                   f"supports: ggml's CUDA backend starts at compute capability {'.'.join(map(str, rules.ggml_min_cc))}")
            major = rules.ggml_min_cuda_major
            floor = rules.floor(major, self.m.driver_os)
            need = f"a driver of the CUDA {major} family or newer" + (f" (>= {floor} on {'Windows' if self.m.driver_os == 'windows' else 'Linux'})" if floor and not dev.jetson else "")
            hint = "" if dev.jetson else f"; {driver_hint(dev.cc, floor)}"
            if dev.cuda_max is not None:
                if dev.cuda_max.major < major:
                    return ("driver", f"the driver of {dev.name} supports CUDA up to {g.cuda_driver_version}; the CUDA toolkits that can build "
                                      f"ggml (CUDA {major} and newer) need {need}{hint}")
            elif dev.driver is not None:
                if floor and dev.driver < version_of(floor):
                    return ("driver", f"NVIDIA driver {g.driver_version} is older than {floor}; the CUDA toolkits that can build ggml need {need}{hint}")
            elif not driver_unread(dev):  # unread: the install's device check decides, as for a published build
                return ("driver", f"the driver of {dev.name} reported no CUDA version; a local ggml CUDA build needs {need}")
            return None
        if backend == "rocm":
            if self.m.os == "windows":
                # Vulkan is ggml's default on AMD Windows (issue 27): a ROCm build there is used only when a
                # published one lists the target, since building it needs AMD's HIP SDK (hipcc), which a first
                # run does not have and a Vulkan build does not need
                return ("no-local-build", f"a local ROCm build for {dev.name} on Windows needs AMD's HIP SDK; "
                                          f"on Windows ggml uses ROCm only from a published build that lists {dev.gfx or 'its target'}, "
                                          "and Vulkan otherwise")
            if dev.gfx and dev.gfx not in rules.rocm_build_gfx:
                return ("kernels", f"{dev.gfx} ({dev.name}) is a target of no current ROCm release, so no local ROCm build can run on it "
                                   f"(current ROCm compiles for {rules.rocm_build_gfx[0]} to {rules.rocm_build_gfx[-1]})")
            return None
        if backend == "vulkan":
            api = self.m.report.api("vulkan")
            have = version_or_none(api.version) if api else None
            if have is not None and have < rules.vulkan_min:
                return ("driver", f"ggml's Vulkan backend needs Vulkan {rules.vulkan_min}; the driver of {dev.name} offers Vulkan {api.version if api else ''}")
            return None
        return None
