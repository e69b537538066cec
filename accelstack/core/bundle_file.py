"""The offline bundle file: one tar that installs a ggml runtime (or a torch build) on a machine with no network.

``create_bundle`` (on a machine with network access) reads a channel's signed manifest, fetches
the artifacts of the chosen targets, and writes one tar file::

    accelstack-bundle.json        what is inside: stack, channel, the artifacts by sha256
    ggml-manifest.json            the channel's manifest, byte for byte as signed
    ggml-manifest.json.sig        its signature
    artifacts/<sha256>            each chosen target's files

``install_bundle`` treats the file as hostile input, read once as a stream, nothing written before
it is trusted: a regular file (checked before it is read), an uncompressed tar, only regular
members (not sparse) with exactly those names, no duplicates, at most ``MAX_BUNDLE_MEMBERS``. The
documents come first (``write_tar`` writes them first, as every accelstack has) and are read
alone, size-capped; then the same checks as online: the manifest's signature by the channel's
keys (the bundle carries no trust of its own: the key comes from the configured channel or
``--trusted-key``), envelope, expiry and rollback. Only then are the artifacts written
(:meth:`OpenedBundle.extract`): each one the signed manifest lists, of exactly the size it gives
(another size refuses the bundle; an artifact it does not list is passed over unwritten); each is then taken into the download cache through the same
verified fetch (sha256 and size) as a download; the install itself runs offline.

A torch bundle holds no manifest: its index names the torch plan it was made from and each wheel
``pip download`` fetched for it (file name, sha256, size), stored as ``artifacts/<sha256>``. The
install plans torch again for this machine (it must choose the bundle's variant), checks every
wheel's sha256 before pip runs, then installs with ``pip --no-index --require-hashes``, so pip can
install those bytes or nothing. The hashes prove the wheels are the ones the index names, not who
made the bundle: compare the bundle's sha256 (printed by ``bundle create``) out of band.
"""
from __future__ import annotations

import errno
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
from typing import IO, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from ..errors import AccelstackError, Action, UsageError
from ..fsio import replacing
from ..limits import MAX_ARTIFACT_BYTES, MAX_JSON_BYTES, MAX_SIGNATURE_BYTES, MalformedInput, parse_json
from ..serde import size_text
from .stacks import STACKS, default_stack

__all__ = ["cannot_write", "write_bundle", "FORMAT", "FORMAT_VERSION", "INDEX", "MANIFEST", "SIGNATURE", "MAX_BUNDLE_MEMBERS", "MAX_BUNDLE_BYTES",
           "BundleError", "BundleSummary", "OpenedBundle", "check_bundle_path", "read_bundle", "write_tar", "sha256_of"]

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
    # the documents first: a reader checks them before it writes any artifact (see read_bundle)
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
    """A bundle whose documents were read: its index, manifest and signature. Its artifacts are
    written into ``root`` (the caller removes it) only by :meth:`extract`, once the caller has
    checked the documents and knows which artifacts, of which sizes, it accepts."""

    root: Path
    index: dict
    manifest: bytes
    signature: Optional[bytes]
    artifacts: Dict[str, Path] = field(default_factory=dict)  # sha256 -> extracted file
    reader: Optional[_Reader] = field(default=None, repr=False)

    def extract(self, accepted: Mapping[str, int]) -> Dict[str, Path]:
        """Write the bundle's artifacts into ``root``: only those ``accepted`` names (sha256 -> the
        size the signed manifest, or the torch index, gives), each exactly that size: one of
        another size refuses the bundle before a byte of it is written, any other artifact is
        passed over unwritten."""
        if self.reader is None:
            return self.artifacts
        try:
            self.artifacts = self.reader.artifacts(self.root, accepted)
        finally:
            self.close()
        return self.artifacts

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None


_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


def _open(path: Path) -> int:
    """A descriptor of the regular file ``path``: checked before anything reads it (a directory,
    a FIFO or a device is refused; opening does not block on a FIFO)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(str(path), flags)
    except OSError as exc:
        err = BundleError(f"cannot open the bundle {path} ({exc.strerror or exc})", "give the path of a bundle file")
        err.exit_code = 2  # a missing input file is a usage error, as everywhere
        raise err from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        err = BundleError(f"{path} is {what}; not a bundle", "give the path of the bundle file `bundle create` wrote")
        err.exit_code = 2
        raise err
    return fd


def check_bundle_path(path: Path) -> None:
    """Refuse ``path`` now (before a home is made) unless it is a regular file that can be read."""
    os.close(_open(Path(path)))


def read_bundle(path: Path, root: Path) -> OpenedBundle:
    """The documents of the bundle ``path`` (see the module docstring): read first, every member
    checked; the artifacts after them are written only by :meth:`OpenedBundle.extract`."""
    path = Path(path)
    fd = _open(path)
    raw = os.fdopen(fd, "rb")
    magic = os.pread(fd, 8, 0)
    kind = next((k for m, k in _COMPRESSED.items() if magic.startswith(m)), None)
    if kind is not None:
        raw.close()
        raise BundleError(f"{path} is {kind}-compressed; a bundle is the uncompressed tar `bundle create` writes",
                          f"decompress it first (for example with `{'gunzip' if kind == 'gzip' else kind + ' -d'}`)")
    reader = _Reader(raw, str(path))
    try:
        docs = reader.documents()
        if reader.pending is not None and INDEX not in docs:
            raise BundleError(f"{path}: the artifact {reader.pending.name!r} comes before the bundle's index; a bundle's "
                              "index, manifest and signature come first", "make the bundle again with `bundle create`")
        opened = _opened(path, root, docs)
    except BaseException:
        reader.close()
        raise
    opened.reader = reader
    return opened


def _opened(path: Path, root: Path, docs: Dict[str, bytes]) -> OpenedBundle:
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
    return OpenedBundle(root, index, docs.get(MANIFEST, b""), docs.get(SIGNATURE))


class _Reader:
    """The tar, read once as a stream: the documents, then (when asked) the accepted artifacts."""

    def __init__(self, raw: IO[bytes], what: str) -> None:
        self.raw, self.what = raw, what
        self.tf: Optional[tarfile.TarFile] = None
        self.members: Optional[Iterator[tarfile.TarInfo]] = None
        self.pending: Optional[tarfile.TarInfo] = None  # the first artifact, met while reading documents
        self.seen: Set[str] = set()
        self.count = 0

    def close(self) -> None:
        if self.tf is not None:
            self.tf.close()
        self.raw.close()

    def _guard(self, step: Callable[..., Any], *args: Any) -> Any:
        try:
            return step(*args)
        except (tarfile.TarError, EOFError, zlib.error, ValueError) as exc:
            raise BundleError(f"{self.what} is not a complete accelstack bundle ({exc})", "copy the bundle again") from None
        except OSError as exc:
            raise BundleError(f"cannot read the bundle {self.what} ({exc.strerror or exc})", "check the disk and the file",
                              action=Action.RETRY) from None

    def _next(self) -> Optional[tarfile.TarInfo]:
        assert self.members is not None
        member = self._guard(next, self.members, None)
        if member is None:
            return None
        what, name = self.what, member.name
        self.count += 1
        if self.count > MAX_BUNDLE_MEMBERS:
            raise BundleError(f"{what} has more than {MAX_BUNDLE_MEMBERS} members; not a bundle accelstack writes")
        if name in self.seen:
            raise BundleError(f"{what}: the member {name!r} appears twice", "copy the bundle again")
        self.seen.add(name)
        if name not in _DOCUMENT_LIMITS and not _ARTIFACT.match(name):
            raise BundleError(f"{what}: unexpected member {name[:200]!r}; a bundle holds only its index, manifest, "
                              "signature and artifacts/<sha256>", "give a file written by `bundle create`")
        if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE) or member.issparse():
            # a sparse member expands to its full size from a few bytes of the file: never what accelstack writes
            raise BundleError(f"{what}: the member {name!r} is not a regular file"
                              f"{' (it is sparse)' if member.issparse() else ''}", "give a file written by `bundle create`")
        return member

    def documents(self) -> Dict[str, bytes]:
        """The index, manifest and signature: the members before the first artifact."""
        self.tf = self._guard(tarfile.open, None, "r|", self.raw)
        self.members = iter(self.tf)
        docs: Dict[str, bytes] = {}
        while True:
            member = self._next()
            if member is None or _ARTIFACT.match(member.name):
                self.pending = member
                return docs
            if member.size > _DOCUMENT_LIMITS[member.name]:
                raise BundleError(f"{self.what}: the member {member.name!r} is {size_text(member.size)}, more than accepted")
            docs[member.name] = self._guard(self._read_all, member)

    def _read_all(self, member: tarfile.TarInfo) -> bytes:
        assert self.tf is not None
        src = self.tf.extractfile(member)
        assert src is not None  # a regular member
        data = src.read(member.size + 1)
        if len(data) != member.size:
            raise BundleError(f"{self.what}: the member {member.name!r} is truncated", "copy the bundle again")
        return data

    def artifacts(self, root: Path, accepted: Mapping[str, int]) -> Dict[str, Path]:
        out: Dict[str, Path] = {}
        member, what, total = self.pending, self.what, 0
        while member is not None:
            match = _ARTIFACT.match(member.name)
            if not match:
                raise BundleError(f"{what}: the member {member.name!r} comes after the artifacts; a bundle's index, "
                                  "manifest and signature come first", "make the bundle again with `bundle create`")
            sha = match.group(1)
            size = accepted.get(sha)
            if size is None:  # not the manifest's: passed over unwritten (a file's bytes, neither sparse nor compressed)
                member = self._next()
                continue
            total += size
            if member.size != size or size > MAX_ARTIFACT_BYTES or total > MAX_BUNDLE_BYTES:
                raise BundleError(f"{what}: the artifact {sha} is {size_text(member.size)}, and its manifest (or "
                                  f"index) gives {size_text(size)}", "copy the bundle again")
            dest = root / sha
            self._guard(self._write, member, dest)
            out[sha] = dest
            member = self._next()
        return out

    def _write(self, member: tarfile.TarInfo, dest: Path) -> None:
        assert self.tf is not None
        src = self.tf.extractfile(member)
        assert src is not None
        with open(dest, "xb") as fh:
            left = member.size  # never more than the size the manifest gives: checked equal above
            while left:
                chunk = src.read(min(left, 1 << 20))
                if not chunk:
                    raise BundleError(f"{self.what} is truncated", "copy the bundle again")
                fh.write(chunk)
                left -= len(chunk)


def cannot_write(out: Path, reason: str, hint: str = "choose a file path in a folder you can write to") -> UsageError:
    return UsageError(f"cannot write the bundle to {out}: {reason}", hint, code="output-path")


def write_bundle(out: Path, documents: Sequence[Tuple[str, bytes]], files: Sequence[Tuple[str, Path]]) -> Tuple[int, str]:
    """:func:`~accelstack.core.bundle_file.write_tar` with its OSError as a typed error naming
    ``out`` (the bundle is then absent or as it was): a full disk a failure (exit 1, ``disk-full``),
    any other a path the bundle cannot be written to (exit 2, as :func:`check_bundle_output`)."""
    try:
        return write_tar(out, documents, files)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.filename is not None and str(exc.filename) in {str(path) for _, path in files}:  # reading, not writing
            raise BundleError(f"cannot read {exc.filename} to put it in the bundle: {reason}; no bundle was written",
                              "run the same command again (a download that went missing is fetched again)",
                              action=Action.RETRY) from None
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG):
            raise BundleError(f"cannot write the bundle to {out}: {reason}; no bundle was written",
                              "free some space on that disk, or write the bundle to another one",
                              action=Action.FREE_DISK, code="disk-full") from None
        raise cannot_write(out, f"{reason}; no bundle was written") from None
