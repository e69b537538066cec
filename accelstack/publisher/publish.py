"""Publisher side: turn a directory of ggml builds into a signed manifest for a static host.

``accelstack build ggml --out DIR`` leaves ``<wheel>.build.json`` beside each wheel; this module
collects them into one ``kind: ggml`` manifest (targets described by properties, artifacts with
sha256/size/URL), writes it and signs it. Upload the directory as-is to any static host.
"""
from __future__ import annotations

import json
import platform
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..errors import AccelstackError
from .build import BuildResult

MANIFEST_NAME = "ggml-manifest.json"


class PublishError(AccelstackError):
    """The build directory cannot be turned into a manifest."""


def _os_arch() -> Dict[str, str]:
    system = {"Linux": "linux", "Windows": "windows", "Darwin": "macos"}.get(platform.system(), platform.system().lower())
    machine = {"amd64": "x86_64", "aarch64": "arm64"}.get(platform.machine().lower(), platform.machine().lower())
    return {"os": system, "arch": machine}


def target_for(build: BuildResult, url: str, glibc: str = "") -> Dict[str, Any]:
    props = dict(build.properties)
    backend = str(props.pop("backend", build.variant))
    requires: Dict[str, Any] = {}
    if props.get("cpu_features"):
        requires["cpu_features"] = list(props["cpu_features"])  # type: ignore[arg-type]
    if props.get("sm"):
        requires["sm"] = [f"{s[:-1]}.{s[-1]}" if "." not in s else s for s in props["sm"]]  # type: ignore[union-attr]
    if props.get("gfx"):
        requires["gfx"] = list(props["gfx"])  # type: ignore[arg-type]
    if glibc:
        requires["glibc"] = glibc
    where = _os_arch()
    return {
        "id": f"{where['os']}-{where['arch']}-{build.variant}",
        "os": where["os"],
        "arch": where["arch"],
        "backend": backend,
        "priority": 10 if build.variant == "cpu" else 0,
        "requires": requires,
        "build": {"variant": build.variant, "cmake_args": build.cmake_args, "source_sha256": build.source_sha256},
        "artifacts": [{"name": Path(build.wheel).name, "sha256": build.sha256, "size": build.size, "url": url}],
    }


def build_manifest(
    directory: Path,
    base_url: str,
    *,
    source: str,
    version: int,
    expires_days: int = 180,
    release: str = "",
    now: Optional[datetime] = None,
) -> Dict[str, Any]:
    """The manifest document for every ``*.build.json`` under ``directory``."""
    directory = Path(directory)
    records = sorted(directory.rglob("*.whl.build.json"))
    if not records:
        raise PublishError(f"no builds found in {directory}", hint="run `accelstack build ggml --backend cpu --out DIR` first")
    base = base_url.rstrip("/") + "/"
    targets: List[Dict[str, Any]] = []
    glibc = platform.libc_ver()[1] if platform.system() == "Linux" else ""
    for rec in records:
        try:
            build = BuildResult(**json.loads(rec.read_text()))
        except (ValueError, TypeError) as exc:
            raise PublishError(f"{rec} is not a build record ({exc})") from None
        wheel = rec.with_name(rec.name[: -len(".build.json")])
        if not wheel.is_file():
            raise PublishError(f"{rec} names {wheel.name}, which is missing")
        rel = wheel.relative_to(directory).as_posix()
        targets.append(target_for(build, base + rel, glibc))
    now = now or datetime.now(timezone.utc)
    return {
        "format": "accelstack-manifest",
        "format_version": 1,
        "source": source,
        "version": version,
        "expires": (now + timedelta(days=expires_days)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "kind": "ggml",
        "package": "stable-diffusion-cpp-python",
        "release": release or "0.4.7",
        "targets": targets,
    }


def write_signed_manifest(directory: Path, doc: Dict[str, Any], private_pem: Optional[bytes]) -> Path:
    """Write ``ggml-manifest.json`` (and its ``.sig`` when a key is given) into ``directory``."""
    from ..manifests.signing import sign_manifest, signature_path

    path = Path(directory) / MANIFEST_NAME
    data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    path.write_bytes(data)
    if private_pem is not None:
        signature_path(path).write_bytes(sign_manifest(data, private_pem))
    return path
