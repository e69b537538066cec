"""The torch compatibility matrix: which PyTorch wheel runs where, as checked data.

The matrix (``data/torch.json``, ``kind: "torch"``) holds, besides the envelope::

    {"index_url": "https://download.pytorch.org/whl/{variant}",
     "pypi_url": "https://pypi.org/simple",
     "backend_tiers": [["cuda", "rocm", "xpu", "mps"], ["directml"], ["cpu"]],
     "cuda_toolkits": [{"cuda": "12.8", "driver": {"linux": "570.26", "windows": "570.65"}}],
     "gfx_overrides": {"gfx1031": {"target": "gfx1030", "value": "10.3.0"}},
     "gfx_override_refused": {"gfx1103": "why no override is used"},
     "xpu_devices": {"match": ["Arc", "Xe2", ...], "supported_text": "..."},
     "releases": [
       {"torch": "2.14", "versions": ["2.14.0"], "python": ">=3.10,<3.16", "glibc": "2.28",
        "companions": {"torchvision": "0.29", "torchaudio": "2.14"},
        "variants": [
          {"name": "cu130", "backend": "cuda", "cuda": "13.0",
           "platforms": {"linux-x86_64": {"sm": ["7.5", ...], "ptx": ["12.0"]}, ...}},
          {"name": "rocm7.2", "backend": "rocm", "rocm": "7.2", "gfx_override": true,
           "broken_gfx": {"gfx906": "why"}, "platforms": {"linux-x86_64": {"gfx": [...]}}},
          {"name": "rocm-amd", "backend": "rocm", "rocm": "7.14", "index": "https://repo.amd.com/rocm/whl-multi-arch/",
           "device_extra": "device-{gfx}", "hip_runtime": "7", "driver_update": "update the Adrenalin driver to 26.2.2 or newer",
           "platforms": {"windows-x86_64": {"gfx": [...], "gfx_build_only": ["gfx1200", "gfx1201"]},
                         "linux-x86_64": {"gfx": [...], "gfx_build_only": [...], "defer_to_native": "why"}}},
          {"name": "directml", "backend": "directml", "package": "torch-directml==0.2.5.dev240914",
           "pins": "2.4.1", "index": "pypi", "platforms": {"windows-x86_64": {"windows_min_build": 16299}}}],
        "extras": [{"package": "triton-windows", "spec": "<3.4", "install": "optional",
                    "backends": ["cuda"], "platforms": ["windows-x86_64"], "why": "..."}]}]}

Platform keys are ``<os>-<arch>`` (``linux-x86_64``, ``windows-x86_64``, ``macos-arm64``, ...);
``wsl-x86_64`` names builds that run only under WSL2 (the Linux keys apply there too). A
platform entry may override ``index`` (``"pypi"`` for wheels published on PyPI), ``glibc`` and
``macos_min``. Every value the resolver compares is parsed once here, so resolving is cheap.

The typed form is :mod:`.torch_types` (re-exported here, where the matrix has always been imported from).
"""
from __future__ import annotations

import functools
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional, cast

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from ..domain import Backend
from .envelope import Envelope, check_envelope, is_expired
from .fields import (
    CC,
    GFX,
    decode,
    fail,
    get,
    get_str,
    get_str_list,
    get_str_map,
    get_tiers,
    get_version,
    join,
    parse_version,
)
from .torch_types import (
    BUILTIN,
    COMPANIONS,
    DEFAULT_TORCH_TIERS,
    ENGINE_PACKAGES,
    PLATFORMS,
    TORCH_BACKENDS,
    CudaToolkit,
    Extra,
    GfxOverride,
    PlatformBuild,
    Release,
    TorchMatrix,
    Variant,
)

__all__ = ["BUILTIN", "COMPANIONS", "DEFAULT_TORCH_TIERS", "ENGINE_PACKAGES", "PLATFORMS", "TORCH_BACKENDS", "CudaToolkit",
           "Extra", "GfxOverride", "PlatformBuild", "Release", "TorchMatrix", "Variant", "builtin_torch_matrix",
           "load_torch_matrix", "parse_torch_matrix"]

DATA = Path(__file__).with_name("data")  # package data beside the module, read by path (no importlib.resources)

# -- parsing ---------------------------------------------------------------------------------
def _spec(text: str, path: str) -> SpecifierSet:
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise fail(path, f"{text!r} is not a version specifier such as '>=3.10,<3.15'") from None


def _parse_platform_build(obj: object, path: str, backend: str) -> PlatformBuild:
    if not isinstance(obj, dict):
        raise fail(path, "expected an object")
    build = PlatformBuild(
        sm=get_str_list(obj, "sm", path, pattern=CC),
        ptx=get_str_list(obj, "ptx", path, pattern=CC),
        gfx=get_str_list(obj, "gfx", path, pattern=GFX),
        gfx_build_only=get_str_list(obj, "gfx_build_only", path, pattern=GFX),
        defer_to_native=get_str(obj, "defer_to_native", path, required=False),
        macos_min=get_version(obj, "macos_min", path, required=False),
        windows_min_build=get(obj, "windows_min_build", path, int, required=False, default=0),
        glibc=get_version(obj, "glibc", path, required=False),
        index=get_str(obj, "index", path, required=False),
        unverified=get_str(obj, "unverified", path, required=False),
    )
    if backend == "cuda" and not (build.sm or build.ptx):
        raise fail(join(path, "sm"), "missing (a CUDA build must list the SM architectures compiled in)")
    if build.defer_to_native and backend != "rocm":
        raise fail(join(path, "defer_to_native"), "only a ROCm build can yield to builds that hold the GPU's gfx target natively")
    if backend == "rocm" and not build.gfx:
        raise fail(join(path, "gfx"), "missing (a ROCm build must list the gfx targets compiled in)")
    return build


def _parse_variant(obj: object, path: str, toolkits: Dict[str, CudaToolkit]) -> Variant:
    if not isinstance(obj, dict):
        raise fail(path, "expected an object")
    backend = cast(Backend, get_str(obj, "backend", path, choices=TORCH_BACKENDS))
    plats_raw = get(obj, "platforms", path, dict)
    if not plats_raw:
        raise fail(join(path, "platforms"), "must name at least one platform")
    platforms = {}
    for key, val in plats_raw.items():
        p = join(join(path, "platforms"), key)
        if key not in PLATFORMS:
            raise fail(p, f"unknown platform {key!r} (known: {', '.join(PLATFORMS)})")
        platforms[key] = _parse_platform_build(val, p, backend)
    v = Variant(
        name=get_str(obj, "name", path),
        backend=backend,
        platforms=platforms,
        cuda=get_version(obj, "cuda", path, required=backend == "cuda"),
        rocm=get_version(obj, "rocm", path, required=backend == "rocm"),
        gfx_override=get(obj, "gfx_override", path, bool, required=False, default=False),
        broken_gfx=get_str_map(obj, "broken_gfx", path),
        index=get_str(obj, "index", path, required=False),
        package=get_str(obj, "package", path, required=False),
        pins=get_version(obj, "pins", path, required=False),
        python=get_str(obj, "python", path, required=False),
        glibc=get_version(obj, "glibc", path, required=False),
        sources=get_str_list(obj, "sources", path),
        comment=get_str(obj, "comment", path, required=False),
        unverified=get_str(obj, "unverified", path, required=False),
        device_extra=get_str(obj, "device_extra", path, required=False),
        hip_runtime=get_str(obj, "hip_runtime", path, required=False),
        driver_update=get_str(obj, "driver_update", path, required=False),
    )
    if v.device_extra and "{gfx}" not in v.device_extra:
        raise fail(join(path, "device_extra"), f"{v.device_extra!r} must name the GPU's target as {{gfx}} (\"device-{{gfx}}\")")
    if v.hip_runtime and not v.driver_update:
        raise fail(join(path, "driver_update"), "missing (say which driver brings the HIP runtime the build needs)")
    if v.cuda:
        if v.cuda not in toolkits:
            raise fail(join(path, "cuda"), f"CUDA {v.cuda} is not in cuda_toolkits (add its driver minimums there)")
        v.cuda_version = Version(v.cuda)
    if v.python:
        v.python_spec = _spec(v.python, join(path, "python"))
    return v


def _parse_extra(obj: object, path: str) -> Extra:
    if not isinstance(obj, dict):
        raise fail(path, "expected an object")
    e = Extra(
        package=get_str(obj, "package", path),
        install=get_str(obj, "install", path, choices=("optional", "auto")),
        spec=get_str(obj, "spec", path, required=False),
        backends=get_str_list(obj, "backends", path, choices=TORCH_BACKENDS),
        platforms=get_str_list(obj, "platforms", path, choices=PLATFORMS),
        why=get_str(obj, "why", path, required=False),
        sources=get_str_list(obj, "sources", path),
    )
    if e.spec:
        _spec(e.spec, join(path, "spec"))
    return e


def _parse_release(obj: object, path: str, toolkits: Dict[str, CudaToolkit]) -> Release:
    if not isinstance(obj, dict):
        raise fail(path, "expected an object")
    line = get_version(obj, "torch", path)
    variants_raw = get(obj, "variants", path, list)
    if not variants_raw:
        raise fail(join(path, "variants"), "must list at least one variant")
    variants = [_parse_variant(v, join(join(path, "variants"), i), toolkits) for i, v in enumerate(variants_raw)]
    names = set()
    for i, v in enumerate(variants):
        if v.name in names:
            raise fail(join(join(join(path, "variants"), i), "name"), f"duplicate variant {v.name!r}")
        names.add(v.name)
    companions = get_str_map(obj, "companions", path)
    for name, cline in companions.items():
        parse_version(cline, join(join(path, "companions"), name))
    rel = Release(
        torch=line,
        versions=get_str_list(obj, "versions", path),
        python=get_str(obj, "python", path),
        variants=variants,
        companions=companions,
        glibc=get_version(obj, "glibc", path, required=False),
        extras=[_parse_extra(e, join(join(path, "extras"), i)) for i, e in enumerate(get(obj, "extras", path, list, required=False, default=[]))],
        sources=get_str_list(obj, "sources", path),
        comment=get_str(obj, "comment", path, required=False),
    )
    rel.version = Version(line)
    rel.by_name = {v.name: v for v in variants}
    rel.python_spec = _spec(rel.python, join(path, "python"))
    for i, text in enumerate(rel.versions):
        known = parse_version(text, join(join(path, "versions"), i))
        if (known.major, known.minor) != (rel.version.major, rel.version.minor):
            raise fail(join(join(path, "versions"), i), f"{text} is not in the {line} release line")
        rel.known_versions.append(known)
    return rel


def parse_torch_matrix(doc: dict, envelope: Envelope) -> TorchMatrix:
    toolkits: Dict[str, CudaToolkit] = {}
    for i, t in enumerate(get(doc, "cuda_toolkits", "", list)):
        p = join("cuda_toolkits", i)
        if not isinstance(t, dict):
            raise fail(p, "expected an object")
        tk = CudaToolkit(cuda=get_version(t, "cuda", p), driver=get_str_map(t, "driver", p, required=True),
                         sources=get_str_list(t, "sources", p))
        for os_name, drv in tk.driver.items():
            if os_name not in ("linux", "windows"):
                raise fail(join(join(p, "driver"), os_name), f"unknown OS {os_name!r} (known: linux, windows)")
            if drv:
                parse_version(drv, join(join(p, "driver"), os_name))
        tk.version = Version(tk.cuda)
        toolkits[tk.cuda] = tk
    releases = [_parse_release(r, join("releases", i), toolkits) for i, r in enumerate(get(doc, "releases", "", list))]
    if not releases:
        raise fail("releases", "must list at least one release")
    lines = set()
    for i, r in enumerate(releases):
        if r.torch in lines:
            raise fail(join(join("releases", i), "torch"), f"duplicate release line {r.torch}")
        lines.add(r.torch)
    releases.sort(key=lambda r: r.version, reverse=True)

    overrides: Dict[str, GfxOverride] = {}
    for gfx, o in get(doc, "gfx_overrides", "", dict, required=False, default={}).items():
        if gfx == "comment":
            continue
        p = join("gfx_overrides", gfx)
        if not GFX.match(gfx):
            raise fail(p, f"{gfx!r} is not a gfx target")
        if not isinstance(o, dict):
            raise fail(p, "expected an object")
        overrides[gfx] = GfxOverride(target=get_str(o, "target", p, pattern=GFX), value=get_version(o, "value", p),
                                     sources=get_str_list(o, "sources", p))
    refused = {k: v for k, v in get_str_map(doc, "gfx_override_refused", "").items() if k != "comment"}
    xpu = get(doc, "xpu_devices", "", dict, required=False, default={})
    return TorchMatrix(
        envelope=envelope,
        releases=releases,
        cuda_toolkits=sorted(toolkits.values(), key=lambda t: t.version),
        index_url=get_str(doc, "index_url", "", required=False, default="https://download.pytorch.org/whl/{variant}"),
        pypi_url=get_str(doc, "pypi_url", "", required=False, default="https://pypi.org/simple"),
        backend_tiers=get_tiers(doc, "", TORCH_BACKENDS, DEFAULT_TORCH_TIERS),
        gfx_overrides=overrides,
        gfx_override_refused=refused,
        xpu_match=get_str_list(xpu, "match", "xpu_devices"),
        xpu_supported_text=get_str(xpu, "supported_text", "xpu_devices", required=False),
        sources=get_str_map(doc, "sources", ""),
        snapshot=get_str(doc, "snapshot", "", required=False),
        engine_packages=_engine_packages(doc),
    )


def _engine_packages(doc: dict) -> List[str]:
    """The matrix's ``engine_packages`` (PEP 508 requirements), or the built-in list when it has none."""
    values = get_str_list(doc, "engine_packages", "")
    for i, text in enumerate(values):
        try:
            Requirement(text)
        except InvalidRequirement as exc:
            raise fail(join("engine_packages", i), f"{text!r} is not a requirement ({exc})") from None
    return values if "engine_packages" in doc else list(ENGINE_PACKAGES)


def load_torch_matrix(data: bytes, *, now: Optional[datetime] = None, check_expiry: bool = True) -> TorchMatrix:
    doc = decode(data, "torch matrix")
    env = check_envelope(doc, now=now, check_expiry=check_expiry, expect="torch")
    return parse_torch_matrix(doc, env)


@functools.lru_cache(maxsize=1)
def _builtin_bytes() -> bytes:
    return (DATA / BUILTIN).read_bytes()


def builtin_torch_matrix(now: Optional[datetime] = None) -> TorchMatrix:
    """The matrix shipped with accelstack.

    It arrives inside the installed package, so its integrity is the package's; its expiry only
    marks it stale (the plan then says to update accelstack) instead of refusing to work.
    """
    matrix = load_torch_matrix(_builtin_bytes(), check_expiry=False)
    matrix.stale = is_expired(matrix.envelope, now)
    return matrix
