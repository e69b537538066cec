"""Manifest bodies: their schema, checked on load, with the path of the offending field.

Every manifest is a JSON object with the agreed envelope::

    {"format": "accelstack-manifest", "format_version": 1, "source": "official",
     "version": 42, "expires": "2027-06-01T00:00:00Z", "kind": "ggml" | "torch", ...body}

``signing.verify_manifest`` checks signatures, expiry and rollback; this module checks that the
body means something (every hash is a hash, every backend is known) before the resolver trusts
it. A manifest is often hand-edited by a publisher, so every error names its field:
``targets[2].artifacts[0].sha256: missing``.

The ggml body (``kind: "ggml"``)::

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

The torch body is described in :mod:`accelstack.manifests.torch_matrix`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from packaging.version import InvalidVersion, Version

from ..artifacts.refs import ArtifactRef
from .errors import ManifestError, ManifestExpiredError, ManifestFormatError

MANIFEST_FORMAT = "accelstack-manifest"
SUPPORTED_FORMAT_VERSIONS = (1,)
KINDS = ("ggml", "torch")
GGML_BACKENDS = ("cpu", "cuda", "vulkan", "rocm", "metal", "sycl")
OS_NAMES = ("linux", "windows", "macos")
ARCHS = ("x86_64", "arm64")
DEFAULT_GGML_TIERS = [["cuda", "rocm", "metal", "sycl"], ["vulkan"], ["cpu"]]

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_ISO = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d+)?)?(Z|[+-]\d{2}:\d{2})$")
_CC = re.compile(r"^\d{1,2}\.\d[a-z]?$")  # "8.6", "12.0a"
_GFX = re.compile(r"^gfx[0-9a-f]{3,4}$")
_FEATURE = re.compile(r"^[a-z0-9_.]+$")


class ExpiredManifestFormatError(ManifestExpiredError, ManifestFormatError):
    """An expired manifest: both a format problem of its ``expires`` field and an expiry.

    Callers catching either ``ManifestExpiredError`` or ``ManifestFormatError`` see it.
    """


# -- field-path checks ---------------------------------------------------------------------
def fail(path: str, message: str, hint: Optional[str] = None) -> ManifestFormatError:
    """The error for field ``path`` (raise it)."""
    return ManifestFormatError(f"{path}: {message}" if path else message, hint)


def join(path: str, key: Union[str, int]) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


_TYPE_NAMES = {str: "a string", int: "an integer", list: "a list", dict: "an object", bool: "true or false"}


def _describe(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def get(obj: dict, key: str, path: str, kind: type, *, required: bool = True, default: Any = None) -> Any:
    """``obj[key]`` checked to be of ``kind``; missing and required -> error naming the field."""
    p = join(path, key)
    if key not in obj or obj[key] is None:
        if required:
            raise fail(p, "missing")
        return default
    value = obj[key]
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        raise fail(p, f"expected {_TYPE_NAMES.get(kind, kind.__name__)}, got {_describe(value)}")
    return value


def get_str(obj: dict, key: str, path: str, *, required: bool = True, default: str = "",
            choices: Optional[Sequence[str]] = None, pattern: Optional[re.Pattern] = None) -> str:
    value = get(obj, key, path, str, required=required, default=default)
    p = join(path, key)
    if required and not value.strip():
        raise fail(p, "must not be empty")
    if value and choices is not None and value not in choices:
        raise fail(p, f"unknown value {value!r} (known: {', '.join(choices)})")
    if value and pattern is not None and not pattern.match(value):
        raise fail(p, f"{value!r} is not of the expected form")
    return value


def get_version(obj: dict, key: str, path: str, *, required: bool = True) -> str:
    """A dotted version string ("12.8", "570.26"), checked to parse."""
    value = get_str(obj, key, path, required=required)
    if value:
        parse_version(value, join(path, key))
    return value


def parse_version(text: str, path: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise fail(path, f"{text!r} is not a version number") from None


def get_str_list(obj: dict, key: str, path: str, *, required: bool = False,
                 pattern: Optional[re.Pattern] = None, choices: Optional[Sequence[str]] = None) -> List[str]:
    values = get(obj, key, path, list, required=required, default=[])
    p = join(path, key)
    for i, v in enumerate(values):
        if not isinstance(v, str) or not v:
            raise fail(join(p, i), f"expected a non-empty string, got {_describe(v)}")
        if pattern is not None and not pattern.match(v):
            raise fail(join(p, i), f"{v!r} is not of the expected form")
        if choices is not None and v not in choices:
            raise fail(join(p, i), f"unknown value {v!r} (known: {', '.join(choices)})")
    return list(values)


def get_str_map(obj: dict, key: str, path: str, *, required: bool = False) -> Dict[str, str]:
    values = get(obj, key, path, dict, required=required, default={})
    for k, v in values.items():
        if not isinstance(v, str):
            raise fail(join(join(path, key), k), f"expected a string, got {_describe(v)}")
    return dict(values)


# -- the envelope ----------------------------------------------------------------------------
@dataclass
class Envelope:
    """What every manifest says about itself."""

    source: str
    version: int
    expires: str
    kind: str
    format_version: int = 1

    @property
    def label(self) -> str:
        return f"{self.kind} manifest '{self.source}' version {self.version}"


def parse_expires(value: str, path: str = "expires") -> datetime:
    """An ISO-8601 date-time with a zone (``Z`` or ``+hh:mm``) as an aware UTC datetime."""
    if not _ISO.match(value):
        raise fail(path, f"{value!r} is not an ISO-8601 date-time with a time zone, e.g. 2027-06-01T00:00:00Z")
    text = value[:-1] + "+00:00" if value.endswith("Z") else value
    try:
        return datetime.fromisoformat(text).astimezone(timezone.utc)
    except ValueError:
        raise fail(path, f"{value!r} is not a valid date-time") from None


def is_expired(envelope: Envelope, now: Optional[datetime] = None) -> bool:
    now = now or datetime.now(timezone.utc)
    if now.tzinfo is None:
        now = now.replace(tzinfo=timezone.utc)
    return now >= parse_expires(envelope.expires)


def check_envelope(doc: Any, *, now: Optional[datetime] = None, check_expiry: bool = True) -> Envelope:
    """The envelope of ``doc``; raise for a wrong format, unknown format version, bad or past expiry."""
    if not isinstance(doc, dict):
        raise fail("", f"a manifest must be a JSON object, got {type(doc).__name__}")
    fmt = get_str(doc, "format", "")
    if fmt != MANIFEST_FORMAT:
        raise fail("format", f"expected {MANIFEST_FORMAT!r}, got {fmt!r}")
    fv = get(doc, "format_version", "", int)
    if fv not in SUPPORTED_FORMAT_VERSIONS:
        newer = fv > max(SUPPORTED_FORMAT_VERSIONS)
        raise fail(
            "format_version",
            f"unknown format version {fv} (this accelstack reads {', '.join(map(str, SUPPORTED_FORMAT_VERSIONS))})",
            "upgrade accelstack to read this manifest" if newer else "the manifest is malformed; get it again from its publisher",
        )
    env = Envelope(
        source=get_str(doc, "source", ""),
        version=get(doc, "version", "", int),
        expires=get_str(doc, "expires", ""),
        kind=get_str(doc, "kind", "", choices=KINDS),
        format_version=fv,
    )
    if env.version < 0:
        raise fail("version", f"must be >= 0, got {env.version}")
    parse_expires(env.expires)
    if check_expiry and is_expired(env, now):
        raise ExpiredManifestFormatError(
            f"expires: {env.label} expired on {env.expires}",
            "fetch a current manifest from its publisher (an expired one may list known-bad files); check the system clock",
        )
    return env


# -- ggml ------------------------------------------------------------------------------------
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
    backend: str
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
    def kind(self) -> str:
        return "ggml"


def parse_artifact(obj: Any, path: str) -> ArtifactRef:
    if not isinstance(obj, dict):
        raise fail(path, f"expected an object, got {_describe(obj)}")
    name = get_str(obj, "name", path)
    if "/" in name or "\\" in name or name in (".", ".."):
        raise fail(join(path, "name"), f"{name!r} must be a plain file name")
    sha = get(obj, "sha256", path, str)
    if not _SHA256.match(sha):
        raise fail(join(path, "sha256"), f"{sha!r} is not 64 lowercase hex digits")
    size = get(obj, "size", path, int)
    if size <= 0:
        raise fail(join(path, "size"), f"must be a positive number of bytes, got {size}")
    urls: List[str] = []
    if "url" in obj:
        urls.append(get_str(obj, "url", path))
    urls.extend(get_str_list(obj, "urls", path))
    if not urls:
        raise fail(join(path, "urls"), "missing (give 'url' or a non-empty 'urls' list)")
    for i, u in enumerate(urls):
        if not u.startswith(("https://", "http://", "file://")):
            raise fail(join(join(path, "urls"), i), f"{u!r} is not an http(s) or file URL")
    return ArtifactRef(name=name, sha256=sha, size=size, urls=urls)


def _parse_requirements(obj: dict, path: str) -> GgmlRequirements:
    req = GgmlRequirements(
        cuda=get_version(obj, "cuda", path, required=False),
        nvidia_driver=get_str_map(obj, "nvidia_driver", path),
        sm=get_str_list(obj, "sm", path, pattern=_CC),
        ptx=get_str_list(obj, "ptx", path, pattern=_CC),
        gfx=get_str_list(obj, "gfx", path, pattern=_GFX),
        cpu_features=get_str_list(obj, "cpu_features", path, pattern=_FEATURE),
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
        raise fail(join(path, name), "unknown requirement", "upgrade accelstack to read this manifest")
    return req


def _parse_tiers(doc: dict, path: str, backends: Sequence[str]) -> List[List[str]]:
    raw = get(doc, "backend_tiers", path, list, required=False, default=None)
    if raw is None:
        return [list(t) for t in DEFAULT_GGML_TIERS]
    tiers: List[List[str]] = []
    seen = set()
    for i, tier in enumerate(raw):
        p = join(join(path, "backend_tiers"), i)
        if not isinstance(tier, list) or not tier:
            raise fail(p, f"expected a non-empty list of backends, got {_describe(tier)}")
        for j, b in enumerate(tier):
            if b not in backends:
                raise fail(join(p, j), f"unknown backend {b!r} (known: {', '.join(backends)})")
            if b in seen:
                raise fail(join(p, j), f"backend {b!r} is listed twice")
            seen.add(b)
        tiers.append(list(tier))
    return tiers


def parse_ggml_manifest(doc: dict, envelope: Envelope) -> GgmlManifest:
    targets_raw = get(doc, "targets", "", list)
    targets: List[GgmlTarget] = []
    ids = set()
    for i, t in enumerate(targets_raw):
        p = join("targets", i)
        if not isinstance(t, dict):
            raise fail(p, f"expected an object, got {_describe(t)}")
        tid = get_str(t, "id", p)
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
                backend=get_str(t, "backend", p, choices=GGML_BACKENDS),
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
        backend_tiers=_parse_tiers(doc, "", GGML_BACKENDS),
        sources=get_str_map(doc, "sources", ""),
    )


# -- entry points ----------------------------------------------------------------------------
AnyManifest = Any  # GgmlManifest | TorchMatrix (torch_matrix imports this module)


def parse_manifest(doc: Any, *, now: Optional[datetime] = None, check_expiry: bool = True) -> AnyManifest:
    """Check the envelope and body of an already-decoded manifest; return its typed form."""
    env = check_envelope(doc, now=now, check_expiry=check_expiry)
    if env.kind == "ggml":
        return parse_ggml_manifest(doc, env)
    from .torch_matrix import parse_torch_matrix

    return parse_torch_matrix(doc, env)


def decode(data: Union[bytes, str], what: str = "manifest") -> Any:
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise fail("", f"{what} is not UTF-8 ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise fail("", f"{what} is not valid JSON ({exc})") from None


def load_manifest(data: Union[bytes, str], *, now: Optional[datetime] = None, check_expiry: bool = True) -> AnyManifest:
    """Parse and check manifest bytes (no signature check: see :func:`load_verified`)."""
    return parse_manifest(decode(data), now=now, check_expiry=check_expiry)


def load_manifest_file(path: Union[str, Path], *, now: Optional[datetime] = None, check_expiry: bool = True) -> AnyManifest:
    """A manifest file the user pointed at; errors say which file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {p} ({exc.strerror or exc})", "check the path") from None
    try:
        return load_manifest(data, now=now, check_expiry=check_expiry)
    except ManifestFormatError as exc:
        exc.message = f"{p}: {exc.message}"
        exc.args = (exc.message,)
        raise


def load_verified(data: bytes, signature: Optional[bytes], *, trust: Any, rollback: Any = None,
                  insecure_unsigned: bool = False, now: Optional[datetime] = None) -> AnyManifest:
    """Signature, envelope, expiry and rollback (``signing.verify_manifest``), then the body."""
    from .signing import verify_manifest

    doc = verify_manifest(data, signature, trust=trust, rollback=rollback,
                          insecure_unsigned=insecure_unsigned, now=now)
    return parse_manifest(doc, now=now)


def cc_tuple(cc: str) -> Tuple[int, int, bool]:
    """"12.0a" -> (12, 0, True); raises ValueError on anything else."""
    arch_specific = cc.endswith("a")
    major, minor = cc.rstrip("a").split(".")
    return int(major), int(minor), arch_specific
