"""Offline bundles: one file that installs a ggml runtime on a machine with no network.

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
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Dict, List, Optional, Sequence, Set, Tuple

from ..detect.report import HardwareReport
from ..errors import AccelstackError, Action, UsageError
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..installer.transaction import Verifier
from ..limits import MAX_ARTIFACT_BYTES, MAX_JSON_BYTES, MAX_SIGNATURE_BYTES, MalformedInput, parse_json
from ..manifests.ggml_manifest import GgmlManifest
from ..manifests.resolve import Manifests
from ..refs import ArtifactRef
from ..settings import Channel, Settings
from .detection import detect
from .planning import LoadedManifest, TrustedSet, active_channels, configured_channels, plan, remembered_channels

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


# -- create ----------------------------------------------------------------------------------------


def _one_channel(s: Settings) -> Channel:
    from .lifecycle import NoChannelError

    channels = active_channels(s)
    if not channels:
        raise NoChannelError("no channel is configured: a bundle is made from a channel's signed manifest",
                             "configure a channel (its manifest URL and publisher's key) or name a manifest")
    if len(channels) > 1:
        raise UsageError(f"{len(channels)} channels are configured ({', '.join(c.name for c in channels)}); "
                         "a bundle holds one channel's manifest", "choose one channel")
    return channels[0]


def create_bundle(out: Path, *, settings: Optional[Settings] = None, stack: str = "ggml", backends: Sequence[str] = (),
                  targets: Sequence[str] = (), all_targets: bool = False, report: Optional[HardwareReport] = None,
                  on_progress: Optional[ProgressCallback] = None) -> BundleSummary:
    """Write the bundle ``out`` for ``stack`` from the active channel: the targets named by id,
    every target of ``backends``, every target (``all_targets``), or else the one this machine
    (``report``) would install."""
    from ..artifacts import Cache, fetch
    from ..manifests.channels import trust_for
    from .planning import _fetch_channel

    s = settings or Settings.resolve()
    progress = on_progress or null_progress
    if stack != "ggml":
        raise UsageError(f"bundles of the {stack} stack are not supported yet", "make a ggml bundle")
    t0 = time.perf_counter()
    channel = _one_channel(s)
    data, sig, url = _fetch_channel(channel, progress)
    if sig is None:
        raise BundleError(f"the manifest {url} is not signed; a bundle carries only signed manifests",
                          "ask the publisher for the signature", action=Action.ALLOW_UNSIGNED)
    verified = trust_for(channel, s).verify(data, sig, url, expect="ggml", record=False)
    manifest = verified.manifest
    assert isinstance(manifest, GgmlManifest)
    chosen = _choose(manifest, s, backends, targets, all_targets, report)
    refs: Dict[str, ArtifactRef] = {}
    for t in chosen:
        for a in t.artifacts:
            refs.setdefault(a.sha256, a)
    timings = {"manifest": time.perf_counter() - t0}
    t0 = time.perf_counter()
    # re-hashed in full: a bundle travels to machines that cannot re-download a damaged blob
    paths = fetch(list(refs.values()), cache=Cache(s.cache), progress=progress, offline=s.offline, deep=True)
    timings["download"] = time.perf_counter() - t0
    index = {"format": FORMAT, "version": FORMAT_VERSION, "stack": stack,
             "channel": {"name": channel.name, "url": channel.url},
             "source": manifest.envelope.source, "manifest_version": manifest.envelope.version,
             "targets": [t.id for t in chosen],
             "artifacts": [{"name": r.name, "sha256": r.sha256, "size": r.size} for r in refs.values()]}
    t0 = time.perf_counter()
    out = Path(out)
    progress(ProgressEvent("message", "bundle", message=f"writing {out}"))
    size = _write_tar(out, [(INDEX, (json.dumps(index, indent=2) + "\n").encode()), (MANIFEST, data), (SIGNATURE, sig)],
                      [(f"artifacts/{sha}", paths[sha]) for sha in refs])
    timings["write"] = time.perf_counter() - t0
    return BundleSummary(str(out), stack, channel.name, manifest.envelope.source, manifest.envelope.version,
                         [t.id for t in chosen], [r.name for r in refs.values()], size, timings)


def _choose(manifest: GgmlManifest, s: Settings, backends: Sequence[str], targets: Sequence[str], all_targets: bool,
            report: Optional[HardwareReport]) -> list:
    if all_targets:
        chosen = list(manifest.targets)
    elif targets or backends:
        chosen = [t for t in manifest.targets if t.id in targets or t.backend in backends]
        missing = [x for x in targets if x not in {t.id for t in manifest.targets}]
        if missing:
            raise UsageError(f"the manifest has no target {', '.join(missing)}",
                             f"its targets: {', '.join(t.id for t in manifest.targets)}")
    else:
        report = report if report is not None else detect(settings=s)
        knowledge = Manifests.builtin()
        knowledge.add(manifest)
        p = plan(report, "ggml", settings=s, manifests=knowledge)
        if not p.ok:
            raise BundleError(f"the channel has no build for this machine: {p.summary}",
                              "choose the targets of the machine the bundle is for (by backend or target id)",
                              action=Action.EXPLAIN_PLAN)
        chosen = [t for t in manifest.targets if t.id == p.variant]
    if not chosen:
        raise BundleError("no target of the manifest was chosen", f"its targets: {', '.join(t.id for t in manifest.targets)}")
    return chosen


def _write_tar(out: Path, documents: Sequence[Tuple[str, bytes]], files: Sequence[Tuple[str, Path]]) -> int:
    """The tar at ``out``, complete or absent (written beside it, then renamed)."""
    import io

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=str(out.parent))
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w|", format=tarfile.PAX_FORMAT) as tf:
            for name, data in documents:
                tf.addfile(_info(name, len(data)), io.BytesIO(data))
            for name, path in files:
                with open(path, "rb") as fh:
                    tf.addfile(_info(name, os.fstat(fh.fileno()).st_size), fh)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out.stat().st_size


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.type = size, 0o644, int(time.time()), tarfile.REGTYPE
    return info


# -- read ------------------------------------------------------------------------------------------


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
        raise BundleError(f"cannot open the bundle {path} ({exc.strerror or exc})", "give the path of a bundle file") from None
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
    missing = [n for n in (INDEX, MANIFEST) if n not in docs]
    if missing:
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
    return OpenedBundle(root, index, docs[MANIFEST], docs.get(SIGNATURE), artifacts)


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


# -- install ---------------------------------------------------------------------------------------


def bundle_channel(index: dict, s: Settings) -> Channel:
    """The channel whose keys verify the bundle's manifest: the configured (or remembered) channel of
    the bundle's channel name, with any ``--trusted-key``; else ``--trusted-key`` (or the global keys)."""
    from .planning import _with_keys

    raw = index.get("channel")
    info: dict = raw if isinstance(raw, dict) else {}
    name = info.get("name") if isinstance(info.get("name"), str) else ""
    known = next((c for c in [*configured_channels(s), *remembered_channels(s)] if c.name == name), None) if name else None
    if known is not None:
        return _with_keys(known, s.trusted_keys)
    return Channel(name or "bundle", str(info.get("url", "")) or "bundle", [], list(s.trusted_keys))


def install_bundle(path: Path, *, settings: Optional[Settings] = None, report: Optional[HardwareReport] = None,
                   backend: Optional[str] = None, verifier: Optional[Verifier] = None, force: bool = False,
                   on_progress: Optional[ProgressCallback] = None):
    """Install the runtime for this machine from the bundle ``path``, with no network: the
    manifest's signature, envelope, expiry and rollback checked as online, every artifact hashed
    into the download cache, then the usual transaction (verify before activate)."""
    from ..artifacts import Cache, fetch
    from ..manifests.channels import trust_for
    from .lifecycle import home_of, plan_and_install

    s = settings or Settings.resolve()
    progress = on_progress or null_progress
    report = report if report is not None else detect(settings=s)
    home_of(s).ensure()
    s.cache.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=".bundle-", dir=str(s.cache)))
    try:
        progress(ProgressEvent("message", "bundle", message=f"reading bundle {path}"))
        opened = read_bundle(Path(path), root)
        if opened.index.get("stack", "ggml") != "ggml":
            raise BundleError(f"{path} is a bundle of the {opened.index.get('stack')} stack; only ggml bundles install here")
        channel = bundle_channel(opened.index, s)
        verified = trust_for(channel, s).verify(opened.manifest, opened.signature, f"bundle {path}", expect="ggml",
                                                record=True)
        manifest = verified.manifest
        assert isinstance(manifest, GgmlManifest)
        present = [t for t in manifest.targets if t.artifacts and all(a.sha256 in opened.artifacts for a in t.artifacts)]
        if not present:
            raise BundleError(f"{path} holds no complete target of its manifest", "make the bundle again")
        refs = {a.sha256: ArtifactRef(a.name, a.sha256, a.size, [opened.artifacts[a.sha256].as_uri()])
                for t in present for a in t.artifacts}
        fetch(list(refs.values()), cache=Cache(s.cache), progress=progress, offline=False)  # local files, hashed as downloads are
        knowledge = Manifests.builtin()
        knowledge.add(dataclasses.replace(manifest, targets=present))
        trusted = TrustedSet(knowledge, [LoadedManifest(f"bundle:{path}", manifest.envelope.source,
                                                        manifest.envelope.version, channel.name)], [channel], remember=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    offline = s.replace(offline=True, allow_build=False)
    return plan_and_install(report, "ggml", backend=backend, settings=offline, verifier=verifier, force=force,
                            trusted=trusted, on_progress=progress)
