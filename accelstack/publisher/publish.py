"""Publisher side: turn a directory of ggml builds into a signed manifest for a static host.

A build exported to a directory (``build_ggml(..., out_dir=DIR)``) leaves ``<wheel>.build.json``
beside its wheel; this module collects them into one ``kind: ggml`` manifest (targets described by
properties, artifacts with sha256/size/URL), writes it and signs it. Upload the directory as-is to any static host.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import platform
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..artifacts.cache import hash_file
from ..errors import Action
from ..fsio import write_bytes
from ..limits import MAX_JSON_BYTES, MalformedInput, parse_json, sizes_apart
from ..manifests.signing import sign_manifest, signature_path
from ..serde import plural
from .build_cache import BuildResult
from .errors import PublishError
from .sdist import SDIST_PACKAGE, SDIST_VERSION

__all__ = ["MANIFEST_NAME", "PublishError", "build_manifest", "flat_assets", "flat_name", "manifest_of", "target_for",
           "write_signed_manifest"]

log = logging.getLogger(__name__)

MANIFEST_NAME = "ggml-manifest.json"


_TAG_OS = (("manylinux", "linux"), ("musllinux", "linux"), ("linux", "linux"), ("win", "windows"), ("macosx", "macos"))
_TAG_ARCH = {"amd64": "x86_64", "aarch64": "arm64", "x86_64": "x86_64", "arm64": "arm64", "universal2": "arm64"}


def _os_arch(platform_tag: str = "") -> Dict[str, str]:
    """The os and arch a build runs on: from its wheel's platform tag (``linux_x86_64``,
    ``win_amd64``, ``macosx_14_0_arm64``), so that a manifest written on one machine describes
    builds made on others; this machine's own for a record without a tag."""
    tag = platform_tag.lower()
    for prefix, os_name in _TAG_OS:
        if tag.startswith(prefix + "_"):
            arch = tag.split("_", 1)[1]
            for key, value in _TAG_ARCH.items():
                if arch == key or arch.endswith("_" + key):
                    return {"os": os_name, "arch": value}
            raise PublishError(f"unknown architecture in the wheel platform tag {platform_tag!r}", action=Action.FIX_INPUT)
    if tag:
        raise PublishError(f"unknown wheel platform tag {platform_tag!r}", action=Action.FIX_INPUT)
    system = {"Linux": "linux", "Windows": "windows", "Darwin": "macos"}.get(platform.system(), platform.system().lower())
    machine = {"amd64": "x86_64", "aarch64": "arm64"}.get(platform.machine().lower(), platform.machine().lower())
    return {"os": system, "arch": machine}


_X86_FEATURES = {"sse3", "ssse3", "sse4.1", "sse4.2", "avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw",
                 "avx512vl", "avx512vnni", "avx_vnni", "amx_int8"}


def _strings(value: object) -> List[str]:
    """A list property of a build record (JSON: a list of strings); anything else is empty."""
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


def target_for(build: BuildResult, url: str, glibc: str = "", label: str = "") -> Dict[str, Any]:
    props = dict(build.properties)
    backend = str(props.pop("backend", build.variant))
    requires: Dict[str, Any] = {}
    features, sms, ptx, gfx = (_strings(props.get(name)) for name in ("cpu_features", "sm", "ptx", "gfx"))
    where = _os_arch(build.platform_tag)
    if where["arch"] != "x86_64":
        # a variant's properties name the x86 instructions its x86 build needs; an arm64 build of
        # the same variant needs none of them (and no arm64 machine would ever be offered it)
        features = [f for f in features if f.lower() not in _X86_FEATURES]
    if features:
        requires["cpu_features"] = features
    if props.get("cuda"):
        requires["cuda"] = str(props["cuda"])
    if sms:
        requires["sm"] = [_cc(s) for s in sms]
    if ptx:
        requires["ptx"] = [_cc(p) for p in ptx]
    if gfx:
        requires["gfx"] = gfx
    if glibc and where["os"] == "linux":
        requires["glibc"] = glibc
    target: Dict[str, Any] = {
        "id": f"{where['os']}-{where['arch']}-{label or build.variant}",
        "os": where["os"],
        "arch": where["arch"],
        "backend": backend,
        "priority": 10 if build.variant == "cpu" else 0,
        "requires": requires,
        "build": {"variant": build.variant, "cmake_args": build.cmake_args, "source_sha256": build.source_sha256},
        "artifacts": [{"name": Path(build.wheel).name, "sha256": build.sha256, "size": build.size, "url": url}],
    }
    if backend == "cuda" and build.cuda_libs:
        target["cuda_libs"] = [_cuda_lib(lib) for lib in build.cuda_libs]
    return target


def _cc(arch: str) -> str:
    """A compute capability as manifests write it: "86" -> "8.6", "120a" -> "12.0a" ("8.6" as is)."""
    if "." in arch:
        return arch
    m = re.match(r"^(\d+)(\d)([af]?)$", arch)
    if not m:
        raise PublishError(f"{arch!r} is not a CUDA architecture", action=Action.FIX_INPUT)
    return f"{m.group(1)}.{m.group(2)}{m.group(3)}"


def _cuda_lib(lib: object) -> Dict[str, Any]:
    """A build record's runtime wheel as a manifest's ``cuda_libs`` entry (name, sha256, size, url)."""
    if not isinstance(lib, dict) or not all(k in lib for k in ("name", "sha256", "size", "url")):
        raise PublishError(f"a build record lists a CUDA library without name, sha256, size and url: {lib!r}",
                           hint="build the variant again with this accelstack", action=Action.FIX_INPUT)
    return {"name": str(lib["name"]), "sha256": str(lib["sha256"]), "size": int(lib["size"]), "url": str(lib["url"])}


def build_manifest(
    directory: Path,
    base_url: str,
    *,
    source: str,
    version: int,
    expires_days: int = 180,
    release: str = "",
    now: Optional[datetime] = None,
    changed: Optional[List[str]] = None,
    flat: bool = False,
) -> Dict[str, Any]:
    """The manifest document for every ``*.build.json`` under ``directory``.

    Every wheel is hashed as it is now; ``changed``, when given, receives a line for each wheel
    whose bytes differ from its build record (rebuilt or repacked since). ``flat``: each URL names
    the wheel by its :func:`flat_name` (for a GitHub release, whose assets have no folders).
    """
    directory = Path(directory)
    records = sorted(directory.rglob("*.whl.build.json"))
    if not records:
        raise PublishError(f"no builds found in {directory}",
                           hint="build at least one variant into this directory first; each build leaves a "
                                "<wheel>.build.json record beside its wheel", action=Action.FIX_INPUT)
    base = base_url.rstrip("/") + "/"
    builds: List[Tuple[BuildResult, str]] = []
    labels: List[str] = []
    for rec in records:
        wheel = rec.with_name(rec.name[: -len(".build.json")])
        if not wheel.is_file():
            raise PublishError(f"{rec} names {wheel.name}, which is missing")
        recorded = _read_record(rec)
        build = _as_published(recorded, wheel)
        if changed is not None and (build.sha256, build.size) != (recorded.sha256, recorded.size):
            changed.append(f"{wheel.relative_to(directory).as_posix()} changed since its build record "
                           f"(recorded sha256 {recorded.sha256}, now {build.sha256})")
        rel = wheel.relative_to(directory).as_posix()
        builds.append((build, base + (flat_name(rel) if flat else rel)))
        labels.append(_label(build, wheel))
    log.info("manifest of %s: %s", directory, plural(len(builds), "build"))
    doc = manifest_of(builds, source=source, version=version, expires_days=expires_days, release=release, now=now,
                      labels=labels)
    seen: Dict[str, str] = {}
    for target, (_build, url) in zip(doc["targets"], builds):
        if target["id"] in seen:
            raise PublishError(f"two builds would both be target {target['id']}: {seen[target['id']]} and {url}",
                               hint="export each build of one variant into its own directory named after the "
                                    "variant plus a suffix (e.g. cuda12/ and cuda13/)", action=Action.FIX_INPUT)
        seen[target["id"]] = url
    return doc


_LABEL = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}\Z")


def _label(build: BuildResult, wheel: Path) -> str:
    """The last part of a build's target id: its directory's name when that is the variant's name
    plus a suffix (``cuda12``, ``cuda13``: two builds of one variant), else the variant."""
    name = wheel.parent.name
    return name if name.startswith(build.variant) and _LABEL.match(name) else build.variant


def flat_name(rel: str) -> str:
    """The one-level name a file at ``rel`` (a path under the published directory) gets on a host
    without folders, such as the assets of a GitHub release: ``linux-x86_64/cpu/x.whl`` ->
    ``linux-x86_64--cpu--x.whl``. Wheels of several variants share a file name, so the path stays in it."""
    return rel.replace("/", "--")


def flat_assets(directory: Path) -> List[Tuple[Path, str]]:
    """Each published wheel under ``directory`` and its :func:`flat_name`."""
    directory = Path(directory)
    out = []
    for rec in sorted(directory.rglob("*.whl.build.json")):
        wheel = rec.with_name(rec.name[: -len(".build.json")])
        out.append((wheel, flat_name(wheel.relative_to(directory).as_posix())))
    return out


def _read_record(rec: Path) -> BuildResult:
    """The build record ``<wheel>.build.json`` (bounded parse; unknown fields are refused)."""
    try:
        doc = parse_json(rec.read_bytes(), what=str(rec), max_bytes=MAX_JSON_BYTES)
        if not isinstance(doc, dict):
            raise TypeError("not a JSON object")
        return BuildResult(**doc)
    except (OSError, MalformedInput, ValueError, TypeError) as exc:
        raise PublishError(f"{rec} is not a build record ({exc})", action=Action.FIX_INPUT) from None


def _as_published(build: BuildResult, wheel: Path) -> BuildResult:
    """``build`` with the sha256 and size of the wheel file as it is now.

    The record remembers the wheel as the build wrote it; a wheel rebuilt, repacked or re-signed
    since then would otherwise be published with a hash no download can match.
    """
    try:
        size = wheel.stat().st_size
        sha = hash_file(wheel).hexdigest()
    except OSError as exc:
        raise PublishError(f"cannot read {wheel} ({exc.strerror or exc})", action=Action.FIX_INPUT) from None
    if sha != build.sha256 or size != build.size:
        now, recorded = sizes_apart(size, build.size)
        log.warning("%s changed since its build record (sha256 %s, %s; recorded %s, %s): "
                    "publishing the file as it is", wheel.name, sha, now, build.sha256, recorded)
    return dataclasses.replace(build, sha256=sha, size=size)


def manifest_of(builds: List[Tuple[BuildResult, str]], *, source: str, version: int, expires_days: int = 180,
                release: str = "", now: Optional[datetime] = None, labels: Optional[List[str]] = None) -> Dict[str, Any]:
    """The manifest document for ``builds``, each a build and the URL its wheel is served from
    (the core offers a local build to the resolver this way, with its wheel's ``file:`` URL)."""
    glibc = platform.libc_ver()[1] if platform.system() == "Linux" else ""
    now = now or datetime.now(timezone.utc)
    return {
        "format": "accelstack-manifest",
        "format_version": 1,
        "source": source,
        "version": version,
        "expires": (now + timedelta(days=expires_days)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "kind": "ggml",
        "package": SDIST_PACKAGE,
        "release": release or SDIST_VERSION,
        "targets": [target_for(build, url, glibc, label=labels[i] if labels else "") for i, (build, url) in enumerate(builds)],
    }


def write_signed_manifest(directory: Path, doc: Dict[str, Any], private_pem: Optional[bytes]) -> Path:
    """Write ``ggml-manifest.json`` (and its ``.sig`` when a key is given) into ``directory``.

    Each file is replaced atomically; an unsigned manifest removes a stale ``.sig`` of an earlier
    one, which would no longer match.
    """
    path = Path(directory) / MANIFEST_NAME
    data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    sig = signature_path(path)
    write_bytes(path, data)
    if private_pem is not None:
        write_bytes(sig, sign_manifest(data, private_pem))
    else:
        try:
            sig.unlink()
        except FileNotFoundError:
            pass
    log.info("wrote %s (%d targets, %s)", path, len(doc.get("targets", [])), "signed" if private_pem else "unsigned")
    return path
