"""The offline bundle file: one tar that installs a ggml runtime (or a torch build) on a machine with no network.

``create_bundle`` (on a machine with network access) reads a channel's signed manifest, fetches
the artifacts of the chosen targets, and writes one tar file::

    accelstack-bundle.json        what is inside: stack, channel, the artifacts by sha256
    ggml-manifest.json            the channel's manifest, byte for byte as signed
    ggml-manifest.json.sig        its signature
    artifacts/<sha256>            each chosen target's files

``install_bundle`` treats the file as hostile input, read once as a stream: only regular members
with exactly those names, each size-capped (documents as online, artifacts as manifests allow,
the whole within ``MAX_BUNDLE_BYTES``), no duplicates, at most ``MAX_BUNDLE_MEMBERS``. Then the
same checks as online: the manifest's signature by the channel's keys (the bundle carries no
trust of its own: the key comes from the configured channel or ``--trusted-key``), envelope,
expiry and rollback; each artifact is taken into the download cache through the same verified
fetch (sha256 and size) as a download; the install itself runs offline.

A torch bundle holds no manifest: its index names the torch plan it was made from and each wheel
``pip download`` fetched for it (file name, sha256, size), stored as ``artifacts/<sha256>``. The
install plans torch again for this machine (it must choose the bundle's variant), checks every
wheel's sha256 before pip runs, then installs with ``pip --no-index --require-hashes``, so pip can
install those bytes or nothing. The hashes prove the wheels are the ones the index names, not who
made the bundle: compare the bundle's sha256 (printed by ``bundle create``) out of band.
"""
from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import tarfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Dict, List, Optional, Sequence, Set, Tuple

from ..errors import AccelstackError, Action
from ..fsio import replacing
from ..limits import MAX_ARTIFACT_BYTES, MAX_JSON_BYTES, MAX_SIGNATURE_BYTES, MalformedInput, parse_json
from .stacks import STACKS, default_stack

__all__ = ["FORMAT", "FORMAT_VERSION", "INDEX", "MANIFEST", "SIGNATURE", "MAX_BUNDLE_MEMBERS", "MAX_BUNDLE_BYTES",
           "BundleError", "BundleSummary", "OpenedBundle", "read_bundle", "write_tar", "sha256_of"]

FORMAT = "accelstack-bundle"


FORMAT_VERSION = 1


INDEX = "accelstack-bundle.json"


MANIFEST = "ggml-manifest.json"


SIGNATURE = MANIFEST + ".sig"


MAX_BUNDLE_MEMBERS = 1024  # a manifest, its signature, an index and the artifacts of every variant


MAX_BUNDLE_BYTES = 1 << 40  # 1 TiB: every variant of every OS is a few GB


_ARTIFACT = re.compile(r"^artifacts/([0-9a-f]{64})\Z")


_DOCUMENT_LIMITS = {INDEX: MAX_JSON_BYTES, MANIFEST: MAX_JSON_BYTES, SIGNATURE: MAX_SIGNATURE_BYTES}


class BundleError(AccelstackError):
    """A bundle file is not one accelstack wrote, is unsafe, or holds nothing for this machine."""

    default_action = Action.FIX_INPUT


@dataclass
class BundleSummary:
    """What ``create_bundle`` wrote."""

    path: str
    stack: str
    channel: str
    source: str
    version: int
    targets: List[str]
    artifacts: List[str]  # file names
    bytes: int = 0
    timings: Dict[str, float] = field(default_factory=dict)
    sha256: str = ""  # of the bundle file: compare it on the other side when the copy is not trusted
    python: str = ""  # torch: the target's Python version the wheels are for
    # ggml: the public keys (base64) that verify its manifest, each a --trusted-key of the offline install
    trusted_keys: List[str] = field(default_factory=list)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _Hashing:
    """A write-only file that hashes what passes through it (the bundle's sha256 at no extra read)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.hash = hashlib.sha256()

    def write(self, data: Any) -> int:
        self.hash.update(data)
        return self.raw.write(data)


def write_tar(out: Path, documents: Sequence[Tuple[str, bytes]], files: Sequence[Tuple[str, Path]]) -> Tuple[int, str]:
    """The tar at ``out``, complete or absent (written beside it, then renamed); its size and sha256."""
    with replacing(out, make_parents=True) as raw:
        hashing = _Hashing(raw)
        _write_members(hashing, documents, files)
    return out.stat().st_size, hashing.hash.hexdigest()


def _write_members(fileobj: Any, documents: Sequence[Tuple[str, bytes]], files: Sequence[Tuple[str, Path]]) -> None:
    with tarfile.open(fileobj=fileobj, mode="w|", format=tarfile.PAX_FORMAT) as tf:
        for name, data in documents:
            tf.addfile(_info(name, len(data)), io.BytesIO(data))
        for name, path in files:
            with open(path, "rb") as fh:
                tf.addfile(_info(name, os.fstat(fh.fileno()).st_size), fh)


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.type = size, 0o644, int(time.time()), tarfile.REGTYPE
    return info


@dataclass
class OpenedBundle:
    """A bundle's members, extracted into ``root`` (the caller removes it)."""

    root: Path
    index: dict
    manifest: bytes
    signature: Optional[bytes]
    artifacts: Dict[str, Path]  # sha256 -> extracted file


def read_bundle(path: Path, root: Path) -> OpenedBundle:
    """Extract the bundle ``path`` into the empty directory ``root``, checking every member (see the module docstring)."""
    path = Path(path)
    try:
        fd = os.open(str(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as exc:
        err = BundleError(f"cannot open the bundle {path} ({exc.strerror or exc})", "give the path of a bundle file")
        err.exit_code = 2  # a missing input file is a usage error, as everywhere
        raise err from None
    with os.fdopen(fd, "rb") as raw:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise BundleError(f"{path} is not a regular file; not a bundle")
        try:
            docs, artifacts = _extract(raw, root, str(path))
        except (tarfile.TarError, EOFError, zlib.error, ValueError) as exc:
            raise BundleError(f"{path} is not a complete accelstack bundle ({exc})", "copy the bundle again") from None
        except OSError as exc:
            raise BundleError(f"cannot read the bundle {path} ({exc.strerror or exc})", "check the disk and the file",
                              action=Action.RETRY) from None
    if INDEX not in docs:
        missing = [n for n in (INDEX, MANIFEST) if n not in docs]
        raise BundleError(f"{path} is not an accelstack bundle: {', '.join(missing)} missing", "copy the bundle again")
    try:
        index = parse_json(docs[INDEX], what=f"{path}: {INDEX}")
    except MalformedInput as exc:
        raise BundleError(exc.message, "copy the bundle again") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT or not isinstance(index.get("version"), int):
        raise BundleError(f"{path} is not an accelstack bundle", "give a file written by `bundle create`")
    if index["version"] > FORMAT_VERSION:
        raise BundleError(f"{path} is a bundle of format {index['version']}, newer than this accelstack reads",
                          "update accelstack", action=Action.UPDATE_ACCELSTACK)
    known = STACKS.get(str(index.get("stack", default_stack())))
    if (known is None or known.reads_channels) and MANIFEST not in docs:  # a torch bundle has no manifest
        raise BundleError(f"{path} is not an accelstack bundle: {MANIFEST} missing", "copy the bundle again")
    return OpenedBundle(root, index, docs.get(MANIFEST, b""), docs.get(SIGNATURE), artifacts)


def _extract(raw: IO[bytes], root: Path, what: str) -> Tuple[Dict[str, bytes], Dict[str, Path]]:
    docs: Dict[str, bytes] = {}
    artifacts: Dict[str, Path] = {}
    seen: Set[str] = set()
    total = 0
    with tarfile.open(fileobj=raw, mode="r|*") as tf:
        for count, member in enumerate(tf, 1):
            name = member.name
            if count > MAX_BUNDLE_MEMBERS:
                raise BundleError(f"{what} has more than {MAX_BUNDLE_MEMBERS} members; not a bundle accelstack writes")
            if name in seen:
                raise BundleError(f"{what}: the member {name!r} appears twice", "copy the bundle again")
            seen.add(name)
            match = _ARTIFACT.match(name)
            if name not in _DOCUMENT_LIMITS and not match:
                raise BundleError(f"{what}: unexpected member {name[:200]!r}; a bundle holds only its index, manifest, "
                                  "signature and artifacts/<sha256>", "give a file written by `bundle create`")
            if not member.isreg():
                raise BundleError(f"{what}: the member {name!r} is not a regular file", "give a file written by `bundle create`")
            limit = _DOCUMENT_LIMITS.get(name, MAX_ARTIFACT_BYTES)
            total += member.size
            if member.size > limit or total > MAX_BUNDLE_BYTES:
                raise BundleError(f"{what}: the member {name!r} is {member.size} bytes, more than accepted")
            src = tf.extractfile(member)
            assert src is not None  # a regular member
            if match:
                dest = root / match.group(1)
                with open(dest, "xb") as fh:
                    _copy(src, fh, member.size, what)
                artifacts[match.group(1)] = dest
            else:
                data = src.read(member.size + 1)
                if len(data) != member.size:
                    raise BundleError(f"{what}: the member {name!r} is truncated", "copy the bundle again")
                docs[name] = data
    return docs, artifacts


def _copy(src: IO[bytes], dest: IO[bytes], size: int, what: str) -> None:
    left = size
    while left:
        chunk = src.read(min(left, 1 << 20))
        if not chunk:
            raise BundleError(f"{what} is truncated", "copy the bundle again")
        dest.write(chunk)
        left -= len(chunk)
