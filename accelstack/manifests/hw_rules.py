"""Vendor rules both resolvers apply, kept as cited data (``data/hw-rules.json``).

NVIDIA's minor-version compatibility (a CUDA 12.x build runs on any R525+ driver when it has native
code for the GPU), how long each GPU architecture is supported (which driver branch a hint may
advise), what a local ggml build can still target, and Jetson's L4T -> JetPack names. Torch and
ggml plans must agree on these, so they live in one place rather than in either manifest.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Dict, List, Optional, Tuple

from packaging.version import Version

from .machine import Device, cc_parts, is_jetson, l4t_of

__all__ = ["HwRules", "branch_note", "cuda_driver_check", "driver_floor", "driver_hint", "driver_unread", "hw_rules", "is_jetson",
           "jetson_text", "l4t_of", "unread_driver_check", "unread_driver_note"]

BUILTIN = "hw-rules.json"
STRICT = "strict"  # policy: every CUDA build needs the driver of its full toolkit version
MINOR_VERSION = "minor-version"  # policy (default): NVIDIA's minor-version compatibility
CUDA_DRIVER_RULES = (MINOR_VERSION, STRICT)
COMPAT_MARK = "minor-version compatibility"  # in the "how" of a build that relies on it


@dataclass(frozen=True)
class Architecture:
    name: str
    cc_min: Tuple[int, int]
    cc_max: Tuple[int, int]
    last_cuda: int  # the last CUDA major that compiles for it
    last_branch: str  # the last driver branch that runs it ("470")


@dataclass
class HwRules:
    """The parsed rules; see the module docstring."""

    minor_floor: Dict[str, Dict[str, str]]  # CUDA major -> os -> minimum driver
    architectures: List[Architecture]
    ggml_min_cc: Tuple[int, int]
    ggml_min_cuda_major: int
    rocm_build_gfx: List[str]
    vulkan_min: Version
    jetson_wheels_url: str
    jetpack: Dict[str, str]
    jetpack_family: Dict[str, str]
    sources: Dict[str, str] = field(default_factory=dict)

    def floor(self, major: int, os_name: str) -> str:
        """The minimum driver of CUDA ``major``'s family on ``os_name`` ("" when unknown)."""
        return self.minor_floor.get(str(major), {}).get(os_name, "")

    def architecture(self, cc: str) -> Optional[Architecture]:
        parts = cc_parts(cc)
        if parts is None:
            return None
        return next((a for a in self.architectures if a.cc_min <= parts <= a.cc_max), None)

    def jetpack_of(self, l4t: str) -> str:
        """JetPack release of an L4T release: "5.1.1", or "6.x" (family only), or "" (unknown)."""
        l4t = (l4t or "").strip()
        if not l4t:
            return ""
        short = l4t[:-2] if l4t.endswith(".0") else l4t  # "36.3.0" is release 36.3; "36.4.7" is not 36.4
        exact = self.jetpack.get(l4t) or self.jetpack.get(short)
        if exact:
            return exact
        family = self.jetpack_family.get(l4t.split(".")[0])
        return f"{family}.x" if family else ""


def _parts(text: str) -> Tuple[int, int]:
    parts = cc_parts(text)
    if parts is None:
        raise ValueError(f"hw-rules: {text!r} is not a compute capability")
    return parts


def parse_hw_rules(doc: dict) -> HwRules:
    """The rules from their JSON form (the bundled file; tests pass their own)."""
    majors = {k: {o: v for o, v in d.items() if o in ("linux", "windows")}
              for k, d in doc["cuda_minor_compat"]["majors"].items()}
    archs = [Architecture(name=r["name"], cc_min=_parts(r["cc_min"]), cc_max=_parts(r["cc_max"]),
                          last_cuda=int(r["last_cuda"]), last_branch=str(r.get("last_branch", "")))
             for r in doc["nvidia_architectures"]["rows"]]
    ggml = doc["ggml_cuda_build"]
    jet = doc["jetson"]
    return HwRules(
        minor_floor=majors,
        architectures=archs,
        ggml_min_cc=_parts(ggml["min_cc"]),
        ggml_min_cuda_major=int(ggml["min_cuda_major"]),
        rocm_build_gfx=list(doc["rocm_build_gfx"]["targets"]),
        vulkan_min=Version(doc["vulkan_build"]["min_version"]),
        jetson_wheels_url=jet["wheels_url"],
        jetpack=dict(jet["jetpack"]),
        jetpack_family=dict(jet["jetpack_family"]),
        sources=dict(doc.get("sources", {})),
    )


@functools.lru_cache(maxsize=1)
def hw_rules() -> HwRules:
    """The rules shipped with accelstack (part of the installed package, like the torch matrix)."""
    data = resources.files("accelstack.manifests").joinpath("data").joinpath(BUILTIN).read_bytes()
    return parse_hw_rules(json.loads(data))


def driver_hint(cc: str, need: str = "") -> str:
    """What to do about a driver too old for a build that needs driver ``need``, for a GPU of compute
    capability ``cc``: never a driver branch the GPU cannot run (NV-DC-MATRIX: Kepler ends with R470;
    Maxwell, Pascal and Volta with R580)."""
    rules = hw_rules()
    parts = cc_parts(cc)
    first = rules.architectures[0].cc_min if rules.architectures else None
    if parts is not None and first is not None and parts < first:
        return "this GPU is past NVIDIA's driver support (older than Kepler): no current driver or CUDA build runs on it"
    arch = rules.architecture(cc)
    need_branch = int(need.split(".")[0]) if need and need.isascii() and need.split(".")[0].isdigit() else 0
    if arch is not None and arch.last_branch:
        last = int(arch.last_branch)
        if need_branch > last:
            return (f"no driver this GPU can run is new enough: {arch.name} GPUs are supported up to the R{last} driver branch "
                    f"(NVIDIA's architecture matrix)")
        target = f"{need} or newer" if need else "a newer one"
        return f"update the NVIDIA driver to {target}, at most the R{last} branch (the last for {arch.name} GPUs)"
    return f"update the NVIDIA driver to {need} or newer" if need else "update the NVIDIA driver"


def branch_note(cc: str) -> str:
    """" (R470 is the last driver branch for Kepler GPUs)" for a GPU whose support ends, else ""."""
    arch = hw_rules().architecture(cc)
    if arch is None or not arch.last_branch:
        return ""
    return f" (R{arch.last_branch} is the last driver branch for {arch.name} GPUs)"


def driver_floor(cuda: str, full_min: str, *, native: bool, os_name: str, policy: str = "") -> Tuple[str, bool]:
    """(the oldest driver that runs a CUDA ``cuda`` build on ``os_name``, whether that is the CUDA major's
    family floor): NVIDIA's minor-version compatibility (NV-MVC) for a build with native code for the GPU,
    else the full toolkit's Table-3 driver ``full_min`` (PTX is compiled by the driver, NV-PTX-JIT)."""
    floor = hw_rules().floor(Version(cuda).major, os_name)
    if policy != STRICT and native and floor:
        return floor, True
    return full_min, False


def cuda_driver_check(dev: Device, cuda: str, full_min: str, *, native: bool, os_name: str, what: str,
                      policy: str = "") -> Tuple[Optional[str], str]:
    """Whether the driver of ``dev`` runs a CUDA ``cuda`` build: (why not, or None; how it runs).

    NVIDIA's rule (NV-MVC): a build with native code (SASS) for the GPU needs only a driver of its
    CUDA major's family (R525+ for 12.x); PTX is JIT-compiled by the driver, which must know the
    build's full toolkit version (NV-PTX-JIT). ``policy`` "strict" applies the full version always.
    ``full_min`` is the Table-3 driver of the full toolkit version on ``os_name``.
    """
    tk = Version(cuda)
    os_text = "Windows" if os_name == "windows" else "Linux"
    need_drv, minor = driver_floor(cuda, full_min, native=native, os_name=os_name, policy=policy)
    g = dev.first
    if minor:
        need_cuda = Version(f"{tk.major}.0")
        rule = f"a CUDA {tk.major}.x driver (>= {need_drv} on {os_text}, NVIDIA minor-version compatibility)"
    else:
        need_cuda = tk
        rule = f"CUDA {cuda}" + (f" (driver >= {full_min} on {os_text})" if full_min else "")
        if policy != STRICT and not native:
            rule += ", because it reaches this GPU only through PTX, which an older driver cannot compile"
    who = f"NVIDIA driver {g.driver_version}" if dev.driver is not None else "The NVIDIA driver"
    hint = f"; {driver_hint(dev.cc, need_drv)}"
    if dev.cuda_max is not None:
        ok = dev.cuda_max >= need_cuda
        if ok and minor and dev.driver is not None and need_drv:
            ok = dev.driver >= Version(need_drv)
        if not ok:
            return f"{who} supports CUDA up to {g.cuda_driver_version}; {what} needs {rule}{hint}", ""
    elif dev.driver is not None:
        if not need_drv:
            return f"{who} reported no CUDA version, and NVIDIA publishes no {os_text} minimum for CUDA {cuda}", ""
        if dev.driver < Version(need_drv):
            return f"{who} is older than {need_drv}; {what} needs {rule}{hint}", ""
    else:
        return f"the CUDA version of the NVIDIA driver is unknown; {what} needs {rule}", ""
    have = dev.cuda_max
    if minor and have is not None and have < tk:
        return None, f"the driver runs CUDA {g.cuda_driver_version}: CUDA {cuda} builds run through NVIDIA's {COMPAT_MARK}"
    return None, f"the driver runs CUDA {g.cuda_driver_version or '>= ' + cuda}"


def driver_unread(dev: Device) -> bool:
    """NVIDIA's driver drives this GPU (Windows names the adapter with its WDDM driver), but neither
    its version nor its CUDA version could be read."""
    g = dev.first
    return g.vendor == "nvidia" and g.driver == "wddm" and not g.driver_version and not g.cuda_driver_version and not g.l4t_version


# -- an unread Windows driver: one reasoning for both stacks (issue 42) ------------------------------------
# NVIDIA's own driver is installed (Windows names the adapter with it) but its version could not be read:
# the CUDA build this GPU runs with the oldest driver is planned, by the torch and the ggml plan alike, and the
# install's device check confirms CUDA works; refusing CUDA would leave the NVIDIA card to DirectML or Vulkan.

def unread_driver_check(dev: Device, what: str, floor: str, lowest: Tuple[Version, str]) -> Tuple[Optional[str], str]:
    """(why not, or None; how it runs) for build ``what`` needing driver ``floor`` on a GPU whose driver
    version is unread, where ``lowest`` is (driver floor, build) of the build that runs with the oldest driver."""
    if not floor or Version(floor) > lowest[0]:
        return (f"the NVIDIA driver version of {dev.name} could not be read, so the CUDA build it runs with the oldest "
                f"driver ({lowest[1]}, driver >= {lowest[0]}) is planned, not {what} (driver >= {floor or 'unknown'})"), ""
    return None, (f"the NVIDIA driver version could not be read: {what} needs driver >= {floor}, the oldest of the CUDA builds "
                  "for this GPU; the install's device check confirms CUDA works")


def unread_driver_note(dev: Device, lowest: Optional[Tuple[Version, str]]) -> str:
    """The plan's note when it chose CUDA for a GPU whose driver version could not be read."""
    floor = f" (driver >= {lowest[0]})" if lowest else ""
    return (f"the NVIDIA driver version of {dev.label} could not be read (see accelstack detect): planned the CUDA build it runs "
            f"with the oldest driver{floor}; if the GPU is not seen after the install, update the NVIDIA driver "
            "or choose another backend")


def jetson_text(dev: Device) -> str:
    """Where a Jetson's CUDA-enabled torch comes from, in words (JetPack named when the L4T release says)."""
    rules = hw_rules()
    l4t = dev.l4t
    jp = rules.jetpack_of(l4t)
    which = f"JetPack {jp} (L4T {l4t})" if jp else (f"L4T {l4t} (JetPack unknown)" if l4t else "this board's JetPack release")
    return f"NVIDIA publishes torch wheels built for Jetson per JetPack: get the one for {which} from {rules.jetson_wheels_url}"
