"""Unpack a runtime wheel into a directory with PyPA's ``installer`` library.

Why not ``pip install --target``: pip writes a ``direct_url.json`` naming its random temp path
and a ``RECORD`` that hashes it, so two installs of the same wheel differ and ``repair`` cannot
restore those files. ``installer`` writes exactly what the wheel holds (plus a fixed
``INSTALLER``), in process, without a subprocess or a network: the tree is deterministic, so every
file of a runtime has one right hash.
"""
from __future__ import annotations

import logging
import os
import platform
import shutil
import stat
import sys
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator, List

from installer import install
from installer.destinations import SchemeDictionaryDestination
from installer.sources import WheelFile

from ..artifacts.cache import hash_file
from ..errors import Action
from .errors import InstallError
from .home import OWNER_MARK
from .records import InstalledFile

__all__ = ["checked_wheel", "install_wheel", "extract_wheel_files", "hash_tree"]

log = logging.getLogger(__name__)


def _script_kind() -> str:
    if os.name != "nt":
        return "posix"
    return "win-arm64" if platform.machine().lower() in ("arm64", "aarch64") else "win-amd64"


@contextmanager
def checked_wheel(wheel: Path, name: str, verb: str, changed: str, broken: str) -> Iterator[Path]:
    """``wheel`` (a blob stored by hash) under its real file name ``name``, which carries its
    distribution and tags, for the duration of the block; what goes wrong in the block becomes an
    :class:`InstallError`: a full disk, another I/O error, or a wheel that is not valid (its RECORD
    does not match its files, a malformed archive, an unsafe member name). ``changed`` says what
    state that leaves ("nothing was changed"); ``broken`` who is to blame for a broken wheel."""
    def hint(text: str) -> str:
        return "; ".join(t for t in (text, changed) if t)

    with tempfile.TemporaryDirectory(prefix="accelstack-wheel-") as tmp:
        link = Path(tmp) / name
        try:
            os.link(wheel, link)
        except OSError:
            shutil.copyfile(wheel, link)
        try:
            yield link
        except OSError as exc:
            if getattr(exc, "errno", None) == 28:  # ENOSPC
                raise InstallError(f"the disk is full while {verb}ing {name}", hint=hint("free some disk space and try "
                                   "again"), action=Action.FREE_DISK) from None
            raise InstallError(f"could not {verb} {name}: {exc}", hint=changed or "try again", action=Action.RETRY) from None
        except Exception as exc:
            raise InstallError(f"{name} is not a valid wheel: {exc}", hint="; ".join(t for t in (changed, broken) if t),
                               action=Action.REPORT_BUG) from None


def install_wheel(wheel: Path, target: Path, name: str) -> None:
    """Install the wheel file ``wheel`` (stored under any name; ``name`` is its real file name)
    into ``target`` as a flat import root, like ``pip install --target --no-deps``."""
    t = str(target)
    scheme = {"purelib": t, "platlib": t, "headers": os.path.join(t, "include"), "scripts": os.path.join(t, "bin"),
              "data": os.path.join(t, "data")}
    dest = SchemeDictionaryDestination(scheme, interpreter=sys.executable, script_kind=_script_kind(),  # type: ignore[arg-type]
                                       bytecode_optimization_levels=())
    with checked_wheel(wheel, name, "install", "nothing was changed", "the published build is broken") as link:
        with WheelFile.open(link) as source:
            source.validate_record()
            install(source, dest, {"INSTALLER": b"accelstack\n"})
    log.info("installed %s into %s", name, target)


def extract_wheel_files(wheel: Path, target: Path, name: str, wanted: Callable[[str], bool]) -> List[str]:
    """Unpack only the members of wheel ``wheel`` (real file name ``name``) that ``wanted`` accepts
    into ``target``, after checking every member against the wheel's RECORD; returns their paths.

    Why not :func:`install_wheel`: NVIDIA's runtime wheels carry headers and static archives
    (hundreds of MB for cuBLAS) that nothing loads; a shared copy keeps only the libraries."""
    out: List[str] = []
    with checked_wheel(wheel, name, "unpack", "", "the published library wheel is broken") as link:
        with WheelFile.open(link) as source:
            source.validate_record()
        with zipfile.ZipFile(link) as zf:
            for info in zf.infolist():
                member = info.filename
                if info.is_dir() or not wanted(member):
                    continue
                if stat.S_ISLNK(info.external_attr >> 16):
                    continue  # wheels hold no links; one is never followed or made
                parts = PurePosixPath(member).parts
                if member.startswith("/") or "\\" in member or ":" in member or ".." in parts or not parts:
                    raise ValueError(f"unsafe member name {member!r}")
                dest = target.joinpath(*parts)
                dest.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(dest, "xb") as fh:
                    shutil.copyfileobj(src, fh, 1 << 20)
                os.chmod(dest, 0o755 if member.endswith((".so", ".dll", ".dylib")) or ".so." in member else 0o644)
                out.append("/".join(parts))
    return sorted(out)


def hash_tree(root: Path) -> List[InstalledFile]:
    """Every regular file under ``root`` with its hash, skipping caches and our ownership mark."""
    out: List[InstalledFile] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for fn in filenames:
            p = Path(dirpath) / fn
            if p.is_symlink() or (fn == OWNER_MARK and Path(dirpath) == root):
                continue
            out.append(InstalledFile(path=p.relative_to(root).as_posix(), sha256=hash_file(p).hexdigest(), size=p.stat().st_size))
    return sorted(out, key=lambda f: f.path)
