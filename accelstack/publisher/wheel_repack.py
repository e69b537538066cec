"""Lean packaging of a compiled wheel: what a runtime never loads is left out.

scikit-build-core puts CMake's whole install tree into the bindings' wheel beside the package
(headers, CMake package files, static archives, a second copy of every shared library), and a CUDA
build would carry NVIDIA's runtime libraries, which come from NVIDIA's own wheels instead. The
lean wheel keeps each shared library once, stripped, with a rewritten RECORD; the same input gives
the same bytes. Its version (:data:`PACKAGING_VERSION`) is not part of the build's cache key: a
newer packaging repackages a cached compile instead of compiling again.
"""
from __future__ import annotations

import base64
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import asdict
from pathlib import Path
from typing import List

from ..errors import Action
from ..fsio import staging_dir
from ..serde import size_text
from .build_cache import BuildResult, cached_sha256
from .errors import BuildError

__all__ = ["PACKAGING_VERSION", "is_nvidia_runtime", "lean_wheel", "package_build"]

log = logging.getLogger(__name__)

PACKAGING_VERSION = 1  # the packaging lean_wheel applies; bump when it changes


def package_build(result: BuildResult, slot: Path) -> BuildResult:
    """The lean wheel of a compiled one (see :func:`lean_wheel`), kept beside it in the cache slot."""
    compiled = Path(result.compiled_wheel or result.wheel)
    dest = slot / f"lean{PACKAGING_VERSION}" / compiled.name
    installed = lean_wheel(compiled, dest)
    log.info("packaged %s: %s wheel -> %s, %s installed", result.variant, size_text(compiled.stat().st_size),
             size_text(dest.stat().st_size), size_text(installed))
    return BuildResult(**{**asdict(result), "wheel": str(dest), "sha256": cached_sha256(dest),
                          "size": dest.stat().st_size, "installed_size": installed, "packaging": PACKAGING_VERSION,
                          "compiled_wheel": str(compiled)})


_INSTALL_TREE = ("include/", "lib/cmake/", "lib/pkgconfig/", "bin/")  # CMake's install tree at the wheel root


def lean_wheel(src: Path, dest: Path) -> int:
    """Write ``src`` without what a runtime never loads; return the bytes its files take installed.

    scikit-build-core puts CMake's whole install tree into the bindings' wheel beside the package:
    headers, CMake package files, ggml's static archives and a second copy of every shared
    library (the bindings load theirs from ``<package>/lib``). Each shared library is kept once
    (the package's copy), no static archive, no header, and symbols are stripped where ``strip``
    exists. RECORD is rewritten; entry times are kept, so the same input gives the same bytes.
    """
    try:
        return _lean_wheel(src, dest)
    except (zipfile.BadZipFile, StopIteration) as exc:
        raise BuildError(f"{src} is not a wheel with a RECORD ({exc or 'no RECORD'})",
                         hint="delete it from the build cache and build again", action=Action.RETRY) from exc


def _lean_wheel(src: Path, dest: Path) -> int:
    # streamed into a private staging folder beside ``dest`` (removed on failure), then renamed whole
    with staging_dir(dest.parent, prefix=f".{dest.name}.") as stage:
        tmp = stage / dest.name
        installed = _write_lean(src, tmp)
        os.replace(tmp, dest)
    return installed


def _write_lean(src: Path, tmp: Path) -> int:
    with zipfile.ZipFile(src) as zin:
        infos = [i for i in zin.infolist() if not i.is_dir()]
        in_package = {Path(i.filename).name for i in infos if "/" in i.filename and _is_package_file(i.filename)}
        kept: List[zipfile.ZipInfo] = []
        for info in infos:
            name = info.filename
            if name.endswith(".dist-info/RECORD"):
                continue
            if name.endswith(".a") or name.startswith(_INSTALL_TREE):
                continue
            if not _is_package_file(name) and _is_shared_library(name) and Path(name).name in in_package:
                continue  # the install tree's copy of a library the package carries
            if is_nvidia_runtime(name):
                continue  # NVIDIA's own libraries come from their wheels (the manifest's cuda_libs)
            kept.append(info)
        record_name = next(i.filename for i in infos if i.filename.endswith(".dist-info/RECORD"))
        rows: List[str] = []
        installed = 0
        with tempfile.TemporaryDirectory(prefix="lean-") as work, \
                zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zout:
            for info in kept:
                data = zin.read(info)
                if _is_shared_library(info.filename) and data[:4] == b"\x7fELF":
                    data = _stripped(data, Path(work))
                out = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                out.external_attr = info.external_attr
                out.compress_type = zipfile.ZIP_DEFLATED
                zout.writestr(out, data)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                rows.append(f"{info.filename},sha256={digest},{len(data)}")
                installed += len(data)
            record = ("\n".join(rows + [f"{record_name},,"]) + "\n").encode()
            out = zipfile.ZipInfo(record_name, date_time=zin.getinfo(record_name).date_time)
            out.external_attr = zin.getinfo(record_name).external_attr
            out.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(out, record)
            installed += len(record)
    return installed


# NVIDIA's runtime libraries a CUDA build links: loaded from NVIDIA's wheels, never carried.
_NVIDIA_RUNTIME = re.compile(r"^(lib)?(cudart|cublas|cublasLt|nvblas|nvrtc|nvJitLink|cudadevrt|cuda)"
                             r"((64)?_\d+)?(_static)?\.(so(\.\d+)*|dll|a|lib)$", re.IGNORECASE)


def is_nvidia_runtime(name: str) -> bool:
    """Whether a wheel entry is one of NVIDIA's runtime libraries (libcudart.so.13, cublas64_12.dll,
    the driver's libcuda.so.1) rather than the build's own."""
    return _NVIDIA_RUNTIME.match(Path(name).name) is not None


def _is_package_file(name: str) -> bool:
    """A file of an importable package or of the wheel's metadata (not CMake's install tree)."""
    return "/" in name and name.split("/", 1)[0] not in ("lib", "include", "bin", "share")


def _is_shared_library(name: str) -> bool:
    base = Path(name).name
    return base.endswith((".so", ".dylib", ".dll")) or ".so." in base


def _stripped(data: bytes, work: Path) -> bytes:
    """``data`` (an ELF shared library) without symbols a loader does not need; as is without ``strip``."""
    tool = shutil.which("strip")
    if tool is None:
        return data
    path = work / "lib.so"
    path.write_bytes(data)
    try:
        done = subprocess.run([tool, "--strip-unneeded", str(path)], capture_output=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("strip failed (%s); keeping the library's symbols", exc)
        return data
    if done.returncode != 0:
        log.info("strip failed (%s); keeping the library's symbols", done.stderr.decode(errors="replace").strip())
        return data
    return path.read_bytes()
