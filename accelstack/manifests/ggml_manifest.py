"""The ggml variant manifest (``kind: "ggml"``): published builds of stable-diffusion.cpp.

Besides the envelope (:mod:`accelstack.manifests.envelope`)::

    {"package": "stable-diffusion.cpp", "release": "master-97d2990",
     "backend_tiers": [["cuda", "rocm", "metal", "sycl"], ["vulkan"], ["cpu"]],   (optional)
     "sources": {"KEY": "where a fact came from"},                                (optional)
     "targets": [
       {"id": "linux-x64-cuda12", "os": "linux", "arch": "x86_64", "backend": "cuda",
        "priority": 10,                        (higher wins among targets of one backend)
        "requires": {"cuda": "12.8",           (CUDA version the driver must report)
                     "nvidia_driver": {"linux": "570.26", "windows": "570.65"},
                     "sm": ["7.5", "8.6", "12.0a"], "ptx": ["9.0"],   (real / virtual archs)
                     "gfx": ["gfx1100"], "cpu_features": ["avx2", "fma"],
                     "macos_min": "13.3", "vulkan": "1.2", "glibc": "2.28"},
        "artifacts": [{"name": "...", "sha256": "<64 hex>", "size": 123,
                       "url": "https://..." | "urls": ["https://...", "https://mirror/..."]}]}]}

The body is checked before the resolver trusts it: every hash is exactly 64 lowercase hex digits,
every backend known, and a requirement this accelstack does not understand is refused rather
than ignored. Target ids (and the envelope's ``source``) match ``^[a-z0-9][a-z0-9._+-]{0,127}$``
(:data:`~accelstack.manifests.fields.ID`); artifact names are one plain file name of at most 256
characters; sizes are positive and at most :data:`~accelstack.limits.MAX_ARTIFACT_BYTES`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple, cast

from ..domain import Backend, Stack
from ..errors import Action
from ..limits import MAX_ARTIFACT_BYTES
from ..refs import ArtifactRef
from .envelope import Envelope
from .fields import (
    CC,
    FEATURE,
    GFX,
    SHA256,
    check_file_name,
    check_id,
    describe,
    fail,
    get,
    get_str,
    get_str_list,
    get_str_map,
    get_tiers,
    get_version,
    join,
    parse_version,
    quote,
)

GGML_BACKENDS: Tuple[Backend, ...] = ("cpu", "cuda", "vulkan", "rocm", "metal", "sycl")
OS_NAMES = ("linux", "windows", "macos")
ARCHS = ("x86_64", "arm64")
DEFAULT_GGML_TIERS = [["cuda", "rocm", "metal", "sycl"], ["vulkan"], ["cpu"]]


@dataclass
class GgmlRequirements:
    """What a ggml build needs from the machine; empty fields need nothing."""

    cuda: str = ""  # CUDA version the NVIDIA driver must report (nvidia-smi "CUDA Version")
    nvidia_driver: Dict[str, str] = field(default_factory=dict)  # os -> minimum driver version
    sm: List[str] = field(default_factory=list)  # real (SASS) archs: "8.6" runs on 8.6+ of major 8; "12.0a" on 12.0 only
    ptx: List[str] = field(default_factory=list)  # virtual archs: JIT-compiled on any GPU of that CC or newer
    gfx: List[str] = field(default_factory=list)  # AMD targets compiled in
    cpu_features: List[str] = field(default_factory=list)  # every one must be present ("avx2", "fma", "neon")
    macos_min: str = ""
    vulkan: str = ""  # minimum Vulkan API version
    glibc: str = ""


@dataclass
class GgmlTarget:
    id: str
    os: str
    arch: str
    backend: Backend
    requires: GgmlRequirements
    artifacts: List[ArtifactRef]
    priority: int = 0
    description: str = ""


@dataclass
class GgmlManifest:
    envelope: Envelope
    package: str
    release: str
    targets: List[GgmlTarget]
    backend_tiers: List[List[str]] = field(default_factory=lambda: [list(t) for t in DEFAULT_GGML_TIERS])
    sources: Dict[str, str] = field(default_factory=dict)
    stale: bool = False  # expired, but accepted on purpose (bundled data): the plan says so

    @property
    def kind(self) -> Stack:
        return "ggml"


def parse_artifact(obj: Any, path: str) -> ArtifactRef:
    if not isinstance(obj, dict):
        raise fail(path, f"expected an object, got {describe(obj)}")
    name = check_file_name(get_str(obj, "name", path), join(path, "name"))
    sha = get(obj, "sha256", path, str)
    if not SHA256.match(sha):
        # Strict: no surrounding spaces, no upper case. Whatever is accepted here becomes a cache
        # file name and is compared with real digests verbatim.
        raise fail(join(path, "sha256"), f"{quote(sha)} is not 64 lowercase hex digits")
    size = get(obj, "size", path, int)
    if not 0 < size <= MAX_ARTIFACT_BYTES:
        raise fail(join(path, "size"), f"must be a positive number of bytes up to {MAX_ARTIFACT_BYTES}, got {size}")
    urls: List[str] = []
    if "url" in obj:
        urls.append(get_str(obj, "url", path))
    urls.extend(get_str_list(obj, "urls", path))
    if not urls:
        raise fail(join(path, "urls"), "missing (give 'url' or a non-empty 'urls' list)")
    for i, u in enumerate(urls):
        if not u.startswith(("https://", "http://", "file://")):
            raise fail(join(join(path, "urls"), i), f"{quote(u)} is not an http(s) or file URL")
    return ArtifactRef(name=name, sha256=sha, size=size, urls=urls)


def _parse_requirements(obj: dict, path: str) -> GgmlRequirements:
    req = GgmlRequirements(
        cuda=get_version(obj, "cuda", path, required=False),
        nvidia_driver=get_str_map(obj, "nvidia_driver", path),
        sm=get_str_list(obj, "sm", path, pattern=CC),
        ptx=get_str_list(obj, "ptx", path, pattern=CC),
        gfx=get_str_list(obj, "gfx", path, pattern=GFX),
        cpu_features=get_str_list(obj, "cpu_features", path, pattern=FEATURE),
        macos_min=get_version(obj, "macos_min", path, required=False),
        vulkan=get_version(obj, "vulkan", path, required=False),
        glibc=get_version(obj, "glibc", path, required=False),
    )
    for os_name, drv in req.nvidia_driver.items():
        p = join(join(path, "nvidia_driver"), os_name)
        if os_name not in OS_NAMES:
            raise fail(p, f"unknown OS {os_name!r} (known: {', '.join(OS_NAMES)})")
        parse_version(drv, p)
    unknown = set(obj) - {f for f in GgmlRequirements.__dataclass_fields__}
    if unknown:
        # A requirement this accelstack does not understand must not be silently ignored:
        # the build would be chosen for machines that do not meet it.
        name = sorted(unknown)[0]
        raise fail(join(path, name), "unknown requirement", "upgrade accelstack to read this manifest",
                   action=Action.UPDATE_ACCELSTACK)
    return req


def parse_ggml_manifest(doc: dict, envelope: Envelope) -> GgmlManifest:
    targets_raw = get(doc, "targets", "", list)
    targets: List[GgmlTarget] = []
    ids = set()
    for i, t in enumerate(targets_raw):
        p = join("targets", i)
        if not isinstance(t, dict):
            raise fail(p, f"expected an object, got {describe(t)}")
        tid = check_id(get_str(t, "id", p), join(p, "id"), "target id")
        if tid in ids:
            raise fail(join(p, "id"), f"duplicate target id {tid!r}")
        ids.add(tid)
        arts = get(t, "artifacts", p, list)
        if not arts:
            raise fail(join(p, "artifacts"), "must list at least one artifact")
        requires = get(t, "requires", p, dict, required=False, default={})
        targets.append(
            GgmlTarget(
                id=tid,
                os=get_str(t, "os", p, choices=OS_NAMES),
                arch=get_str(t, "arch", p, choices=ARCHS),
                backend=cast(Backend, get_str(t, "backend", p, choices=GGML_BACKENDS)),
                requires=_parse_requirements(requires, join(p, "requires")),
                artifacts=[parse_artifact(a, join(join(p, "artifacts"), j)) for j, a in enumerate(arts)],
                priority=get(t, "priority", p, int, required=False, default=0),
                description=get_str(t, "description", p, required=False),
            )
        )
    return GgmlManifest(
        envelope=envelope,
        package=get_str(doc, "package", ""),
        release=get_str(doc, "release", "", required=False),
        targets=targets,
        backend_tiers=get_tiers(doc, "", GGML_BACKENDS, DEFAULT_GGML_TIERS),
        sources=get_str_map(doc, "sources", ""),
    )
