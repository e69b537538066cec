"""Knowledge about GPUs kept as data (``detect/data/*.json``) and the lookups over it.

The tables say what a GPU *is* (its compute capability, gfx target, generation, what CUDA its
driver speaks); they never say what to install — that is the resolver's job.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import re
import sqlite3
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..domain import GPU_KINDS, GpuKind, Vendor
from ..limits import MAX_NAME_LENGTH

__all__ = ["PCI_VENDORS", "amd_gfx_target", "amd_hip_runtime_windows", "amd_is_integrated", "apple_chip_key", "apple_metal", "apple_metal3_gpu",
           "cuda_for_driver", "gfx_from_target_version", "gpu_kind", "intel_generation", "intel_generation_for",
           "intel_is_discrete_id", "intel_name", "intel_platform", "is_npu", "jetson_cuda", "jetson_l4t_from_openrm", "jetson_soc",
           "npu_name", "nvidia_chip_by_device_id", "nvidia_compute_capability", "nvidia_is_integrated", "nvidia_os_limit", "nvidia_support", "parse_version", "pci_lookup",
           "pretty_pci_name", "rocm_supports", "DriverVersion"]

PCI_VENDORS: Dict[str, Vendor] = {"10de": "nvidia", "1002": "amd", "1022": "amd", "8086": "intel", "106b": "apple"}
# The tables ship beside this module (package data of a directory install, as the Vulkan probe's
# source is): read by path, without importlib.resources (2 ms of imports on every detect).
DATA = Path(__file__).with_name("data")
TORCHRUNTIME_PCI_DB = "gpu_pci_ids.db"


@functools.cache
def _data(name: str) -> dict:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


@functools.cache
def _rules(name: str, key: str) -> List[Tuple[re.Pattern, tuple]]:
    return [(re.compile(r[0], re.IGNORECASE), tuple(r[1:])) for r in _data(name)[key]["rules"]]


def _first(name: str, key: str, text: str) -> Optional[tuple]:
    text = text[:MAX_NAME_LENGTH]  # a name read from a 4 MB file made every rule scan 4 MB (~7 s; issue 10)
    for pattern, values in _rules(name, key):
        if pattern.search(text):
            return values
    return None


class DriverVersion(Tuple[int, ...]):
    """A driver or OS version, "550.54.14" or "10.0.19045": its numbers, compared as numbers with
    trailing zeros ignored ("525.60" == "525.60.0"), as ``packaging.version`` compares releases.

    Drivers and Windows write plain dotted numbers; this replaces ``packaging`` on the detection
    path, whose import costs more than the whole detection on a machine without a GPU."""

    @property
    def major(self) -> int:
        return self[0]

    def _key(self) -> Tuple[int, ...]:
        release = tuple(self)
        while len(release) > 1 and release[-1] == 0:
            release = release[:-1]
        return release

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DriverVersion) and self._key() == other._key()

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self._key())

    def __lt__(self, other: Tuple[int, ...]) -> bool:
        return self._key() < DriverVersion(other)._key()

    def __le__(self, other: Tuple[int, ...]) -> bool:
        return self._key() <= DriverVersion(other)._key()

    def __gt__(self, other: Tuple[int, ...]) -> bool:
        return self._key() > DriverVersion(other)._key()

    def __ge__(self, other: Tuple[int, ...]) -> bool:
        return self._key() >= DriverVersion(other)._key()


def parse_version(text: str) -> Optional[DriverVersion]:
    """``text`` as a :class:`DriverVersion` ("v550.1" too), None when it is not dotted numbers."""
    if not isinstance(text, str):
        return None
    m = re.fullmatch(r"\s*v?(\d+(?:\.\d+)*)\s*", text)
    return DriverVersion(int(n) for n in m.group(1).split(".")) if m else None


def _version(text: str) -> DriverVersion:
    """A version written in the tables (always dotted numbers)."""
    found = parse_version(text)
    if found is None:
        raise ValueError(f"not a version in a table: {text!r}")
    return found


def cuda_for_driver(driver_version: str, os_name: str) -> str:
    """The highest CUDA version an NVIDIA driver supports ("" when unknown or too old)."""
    v = parse_version(driver_version)
    if v is None:
        return ""
    table = _data("nvidia.json")["cuda_by_driver"]["windows" if os_name == "windows" else "linux"]
    for cuda, minimum in table:
        if v >= _version(minimum):
            return cuda
    return ""


def nvidia_compute_capability(name: str) -> str:
    hit = _first("nvidia.json", "compute_capability_by_name", name)
    return hit[0] if hit else ""


def nvidia_chip_by_device_id(device_id: str) -> Tuple[str, str]:
    """(chip, compute capability) of an NVIDIA PCI device id from the id ranges of each chip (envytools'
    PCI id database): what decides for parts no name rule lists (a GK107 Quadro K600); ("", "") if unknown."""
    try:
        value = int(device_id, 16)
    except ValueError:
        return "", ""
    for first, last, chip, cc in _data("nvidia.json")["compute_capability_by_device_id"]["rules"]:
        if int(first, 16) <= value <= int(last, 16):
            return chip, cc
    return "", ""


def nvidia_is_integrated(name: str) -> bool:
    """An NVIDIA GPU that shares the system's memory (Jetson, the DGX Spark's GB10), by its name."""
    return _first("nvidia.json", "integrated_by_name", name) is not None


def amd_gfx_target(device_id: str = "", name: str = "") -> str:
    gfx = _data("amd.json")["gfx_by_device_id"].get(device_id.lower(), "") if device_id else ""
    if not gfx and name:
        hit = _first("amd.json", "gfx_by_name", name)
        gfx = hit[0] if hit else ""
    return gfx


def amd_is_integrated(gfx: str) -> bool:
    return gfx in _data("amd.json")["integrated_gfx"]


def amd_hip_runtime_windows() -> dict:
    """What Windows detection needs about the driver's HIP runtime: the majors to look for (newest
    first), the one AMD's ROCm builds of PyTorch load, the gfx targets those builds exist for, and the
    driver update that brings it."""
    return dict(_data("amd.json")["hip_runtime_windows"])


def gfx_from_target_version(value: int) -> str:
    """kfd's ``gfx_target_version`` (e.g. 110000, 90010) -> "gfx1100", "gfx90a"."""
    if value <= 0:
        return ""
    major, minor, step = value // 10000, (value // 100) % 100, value % 100
    return f"gfx{major}{minor:x}{step:x}"


def intel_generation(name: str) -> Tuple[str, GpuKind]:
    """(generation, kind) for an Intel GPU name; ("", "unknown") when not recognised."""
    hit = _first("intel.json", "generation_by_name", name)
    return (hit[0], gpu_kind(hit[1])) if hit else ("", "unknown")


def gpu_kind(value: str) -> GpuKind:
    """A kind read from the data files; anything unexpected is "unknown"."""
    return value if value in GPU_KINDS else "unknown"


@functools.cache
def _intel_ids() -> Dict[str, Tuple[str, str, GpuKind]]:
    return {i: (plat, gen, gpu_kind(kind)) for plat, gen, kind, ids in _data("intel.json")["generation_by_device_id"]["platforms"] for i in ids}


def intel_platform(device_id: str) -> Optional[Tuple[str, str, GpuKind]]:
    """(platform, generation, kind) of an Intel GPU PCI device id from the kernel's id list, else None."""
    return _intel_ids().get(device_id.lower()) if device_id else None


def intel_name(device_id: str) -> str:
    """The product name of an Intel GPU PCI id the PCI databases may lack ("Intel Data Center GPU Max 1100"), else ''."""
    name = _data("intel.json")["names_by_device_id"]["names"].get(device_id.lower(), "") if device_id else ""
    return f"Intel {name}" if name else ""


def intel_generation_for(device_id: str, name: str) -> Tuple[str, GpuKind]:
    """(generation, kind): the PCI device id decides when the table knows it, else the marketing name.

    Names are ambiguous across generations ("Intel(R) UHD Graphics" is a Comet Lake Gen9.5 and an
    Alder Lake Xe-LP); device ids are not."""
    known = intel_platform(device_id)
    if known:
        return known[1], known[2]
    return intel_generation(name) if name else ("", "unknown")


def intel_is_discrete_id(device_id: str, bus_id: str = "") -> bool:
    """Whether an Intel display device is a discrete GPU, from the platform alone: the kernel's id list,
    then the bus position of the processor's integrated function, then the discrete id prefixes.
    Never from a marketing name or a database's flag: "Arc Graphics" is Meteor Lake's iGPU."""
    known = intel_platform(device_id)
    if known:
        return known[2] == "discrete"
    if bus_id and bus_id.lower().startswith(tuple(_data("intel.json")["integrated_bus_position"]["prefixes"])):
        return False
    return any(device_id.lower().startswith(p) for p in _data("intel.json")["discrete_device_ids"]["prefixes"])


def npu_name(vendor_id: str, device_id: str) -> str:
    """The name of an NPU the kernel's accel drivers list by PCI id ('' when not listed)."""
    for vendor, device, name in _data("npu.json")["device_ids"]["ids"]:
        if (vendor, device) == (vendor_id.lower(), device_id.lower()):
            return str(name)
    return ""


def is_npu(pci_class: str, vendor_id: str, device_id: str, driver: str) -> bool:
    """Whether a PCI function is an NPU, never a GPU: bound to an NPU driver (intel_vpu, amdxdna), listed
    by id, or a processing accelerator (class 0x12) that is no GPU: AMD's and NVIDIA's compute GPUs carry
    class 0x12 too, as does an Intel GPU of the kernel's id list."""
    data = _data("npu.json")
    if driver in data["drivers"]["names"] or npu_name(vendor_id, device_id):
        return True
    if not pci_class.lower().startswith(tuple(data["classes"]["prefixes"])):
        return False
    if vendor_id.lower() in ("10de", "1002"):
        return False
    return not (vendor_id.lower() == "8086" and (intel_platform(device_id) or driver in ("i915", "xe")))


def _distribution_folders() -> List[str]:
    """The installed torchruntime distribution's package folder, whatever ``sys.modules`` calls torchruntime."""
    from importlib import metadata  # only when the database is first read

    try:
        return [str(metadata.distribution("torchruntime").locate_file("torchruntime"))]
    except metadata.PackageNotFoundError:
        return []


@functools.lru_cache(maxsize=1)
def _pci_db() -> Dict[Tuple[str, str], Tuple[str, bool]]:
    """torchruntime's PCI-ID database (NVIDIA, AMD, discrete Intel), loaded once; {} if absent."""
    try:
        spec = importlib.util.find_spec("torchruntime")  # where it is, without importing it
        folders = list(spec.submodule_search_locations or []) if spec is not None else []
        folders += _distribution_folders()  # accelstack's compat package may answer to the name torchruntime
        db_path = next(p for p in (Path(f, TORCHRUNTIME_PCI_DB) for f in folders) if p.is_file())
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        try:
            rows = conn.execute("SELECT vendor_id, device_id, device_name, is_discrete FROM pci_ids").fetchall()
        finally:
            conn.close()
    except Exception:  # torchruntime missing or its db unreadable: names fall back to ids
        return {}
    return {(v.lower(), d.lower()): (name, bool(disc)) for v, d, name, disc in rows}


def pci_lookup(vendor_id: str, device_id: str) -> Optional[Tuple[str, bool]]:
    """(marketing name, is_discrete) for a PCI id pair, when the database knows it."""
    return _pci_db().get((vendor_id.lower(), device_id.lower()))


def pretty_pci_name(vendor: str, raw: str) -> str:
    """pci.ids style 'AD104 [GeForce RTX 4070]' -> 'NVIDIA GeForce RTX 4070'.

    A list of products sharing one id ('Radeon 740M / 760M / 780M Graphics') is kept whole:
    picking one would name the wrong chip (a 780M reported as a 740M).
    """
    m = re.search(r"\[([^\]]+)\]\s*$", raw)
    name = (m.group(1) if m else raw).strip()
    prefix = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel"}.get(vendor, "")
    if prefix and not name.lower().startswith(prefix.lower()):
        name = f"{prefix} {name}"
    return name


def _prefixed(version: str, prefix: str) -> bool:
    """'36.4.3' starts with the version prefix '36.4' (and with '36'), but not '36.40' with '36.4'."""
    return version == prefix or version.startswith(prefix + ".")


def jetson_cuda(l4t_version: str) -> str:
    """The CUDA version a Jetson's libcuda supports, from its L4T release ("" when unknown)."""
    rules = _data("nvidia.json")["jetson_l4t_cuda"]["rules"]
    hits = [(prefix, cuda) for prefix, cuda in rules if _prefixed(l4t_version, prefix)]
    return max(hits, key=lambda h: len(h[0]))[1] if hits else ""


def jetson_soc(compatible: str) -> Tuple[str, str]:
    """(GPU family, compute capability) from the device tree's NUL-separated ``compatible`` list."""
    entries = {c.strip() for c in compatible.split("\x00")}
    for soc, family, cc in _data("nvidia.json")["jetson_soc"]["rules"]:
        if soc in entries:
            return family, cc
    return "", ""


def jetson_l4t_from_openrm(driver_version: str) -> str:
    """JetPack 6's OpenRM module version ('540.4.0') -> the L4T release it shipped with ('36.4')."""
    for prefix, l4t in _data("nvidia.json")["jetson_openrm_l4t"]["rules"]:
        if _prefixed(driver_version, prefix):
            return l4t
    return ""


def rocm_supports(gfx: str) -> bool:
    return gfx in _data("amd.json")["rocm_supported_gfx"]["targets"]


def apple_chip_key(key: str) -> str:
    """The readable name of a known system_profiler chip key ('kHW_AppleM1Item' -> 'Apple M1'), else ''."""
    return str(_data("apple.json")["chip_keys"]["names"].get(key, ""))


@functools.cache
def _metal_rules() -> List[Tuple[re.Pattern, str]]:
    return [(re.compile(r[0], re.IGNORECASE), r[1]) for r in _data("apple.json")["metal_values"]["rules"]]


def apple_metal(entry: Dict[str, str]) -> str:
    """Metal support of one system_profiler GPU entry, read from whichever field its macOS era writes.

    "Metal 3"/"Metal 4"; "Metal 2 (Apple7)", "Metal 2 (macOS GPUFamily2 v1)" for the families of
    macOS 10.13-12; "Metal" when only "supported" is said; "" when not supported or not said."""
    fields = _data("apple.json")["metal_fields"]
    for key in fields["json"] + fields["text"]:
        value = str(entry.get(key) or "").strip()
        if not value:
            continue
        for pattern, template in _metal_rules():
            m = pattern.fullmatch(value)
            if m:
                out = template
                for i, group in enumerate(m.groups(), 1):
                    out = out.replace("{%d}" % i, group or "")
                return out
        return value  # an unknown wording: keep what macOS said
    return ""


def apple_metal3_gpu(name: str) -> bool:
    """Whether a Mac GPU is in the Metal3 family (on macOS 13+)."""
    return any(re.search(r, name, re.IGNORECASE) for r in _data("apple.json")["metal3_gpus"]["rules"])


def _cc_key(cc: str) -> Tuple[int, int]:
    major, _, minor = cc.partition(".")
    return (int(major), int(minor or 0)) if cc.isascii() and major.isdigit() and (minor or "0").isdigit() else (-1, -1)


def nvidia_support(cc: str) -> Optional[Tuple[str, str, str]]:
    """(architecture, last driver branch, highest CUDA) for an architecture that current drivers dropped
    or will drop after a known branch; None for architectures still supported (or an unknown cc)."""
    key = _cc_key(cc)
    if key < (0, 0):
        return None
    for lo, hi, arch, branch, cuda in _data("nvidia.json")["architecture_support"]["rules"]:
        if _cc_key(lo) <= key <= _cc_key(hi):
            return arch, branch, cuda
    return None


def nvidia_os_limit(os_name: str, os_version: str) -> Optional[Tuple[str, str, str]]:
    """(last driver branch, highest CUDA, why) when the OS itself caps NVIDIA's drivers (Windows 7/8.1: R470)."""
    v = parse_version(os_version.split(" ")[0]) if os_version else None
    for name, below, branch, cuda, why in _data("nvidia.json")["os_support"]["rules"]:
        if os_name == name and v is not None and v < _version(below):
            return branch, cuda, why
    return None
