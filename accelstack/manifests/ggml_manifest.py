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
                       "url": "https://..." | "urls": ["https://...", "https://mirror/..."]}],
        "cuda_libs": [{"name": "nvidia_cuda_runtime-13.0.96-py3-none-manylinux_2_27_x86_64.whl",
                       "sha256": ..., "size": ..., "urls": [...]}]}]}     (optional, cuda only)

``cuda_libs`` are NVIDIA's runtime wheels (``nvidia-cuda-runtime``, ``nvidia-cublas``; ``-cu12``
for CUDA 12) the build loads but does not bundle: the installer fetches each once into a shared,
content-addressed place in the runtime home (or reuses a torch environment's copy), and the
engine loads them before the runtime (:mod:`accelstack.installer.cuda_libs`). Each is a ``.whl``
artifact, listed at most once, only on a ``cuda`` target; a manifest without the field means none.

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
from ..serde import size_text
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

__all__ = ["ARCHS", "DEFAULT_GGML_TIERS", "GGML_BACKENDS", "MAX_CUDA_LIBS", "OS_NAMES", "GgmlManifest",
           "GgmlRequirements", "GgmlTarget", "parse_artifact", "parse_ggml_manifest"]

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
    cuda_libs: List[ArtifactRef] = field(default_factory=list)  # shared NVIDIA runtime wheels, not in the build


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
    if not 0 < size <= MAX_ARTIFACT_BYTES:  # the value as written, and what it comes to
        raise fail(join(path, "size"), f"must be a positive number of bytes up to {size_text(MAX_ARTIFACT_BYTES)}, "
                   f"got {size}" + (f" ({size_text(size)})" if size > 0 else ""))
    urls: List[str] = []
    if "url" in obj:
        urls.append(get_str(obj, "url", path))
    urls.extend(get_str_list(obj, "urls", path))
    if not urls:
        raise fail(join(path, "urls"), "missing (give 'url' or a non-empty 'urls' list)")
    for i, u in enumerate(urls):
        if not u.startswith(("https://", "http://", "file://")):
            raise fail(join(join(path, "urls"), i), f"{quote(u)} is not an http, https or file URL")
    return ArtifactRef(name=name, sha256=sha, size=size, urls=urls)


MAX_CUDA_LIBS = 16  # cudart, cuBLAS and a few more at most; a hostile list is refused, not fetched


def _parse_cuda_libs(t: dict, path: str, backend: str, artifacts: List[ArtifactRef]) -> List[ArtifactRef]:
    """The optional ``cuda_libs`` list: NVIDIA runtime wheels the build loads but does not carry."""
    raw = get(t, "cuda_libs", path, list, required=False, default=[])
    p = join(path, "cuda_libs")
    if raw and backend != "cuda":
        raise fail(p, f"only a cuda target may list CUDA libraries (this one is {backend})")
    if len(raw) > MAX_CUDA_LIBS:
        raise fail(p, f"lists {len(raw)} libraries, at most {MAX_CUDA_LIBS} are allowed")
    libs: List[ArtifactRef] = []
    seen = {a.sha256 for a in artifacts}
    for j, a in enumerate(raw):
        ref = parse_artifact(a, join(p, j))
        if not ref.name.endswith(".whl"):
            raise fail(join(join(p, j), "name"), f"{quote(ref.name)} is not a wheel (.whl)")
        if ref.sha256 in seen:
            raise fail(join(join(p, j), "sha256"), "listed twice (or also among the build's own artifacts)")
        seen.add(ref.sha256)
        libs.append(ref)
    return libs


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
        backend = cast(Backend, get_str(t, "backend", p, choices=GGML_BACKENDS))
        artifacts = [parse_artifact(a, join(join(p, "artifacts"), j)) for j, a in enumerate(arts)]
        targets.append(
            GgmlTarget(
                id=tid,
                os=get_str(t, "os", p, choices=OS_NAMES),
                arch=get_str(t, "arch", p, choices=ARCHS),
                backend=backend,
                requires=_parse_requirements(requires, join(p, "requires")),
                artifacts=artifacts,
                priority=get(t, "priority", p, int, required=False, default=0),
                description=get_str(t, "description", p, required=False),
                cuda_libs=_parse_cuda_libs(t, p, backend, artifacts),
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
