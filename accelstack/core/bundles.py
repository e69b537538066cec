"""Offline bundles: one file that installs a ggml runtime (or a torch build) on a machine with no network.

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

import dataclasses
import hashlib
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
from typing import IO, Any, Dict, List, Optional, Sequence, Set, Tuple

from ..hardware.report import HardwareReport
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
    sha256: str = ""  # of the bundle file: compare it on the other side when the copy is not trusted
    python: str = ""  # torch: the target's Python version the wheels are for


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
                  requirements: Sequence[str] = (), python_version: str = "", platforms: Sequence[str] = (),
                  on_progress: Optional[ProgressCallback] = None) -> BundleSummary:
    """Write the bundle ``out`` for ``stack``. ggml, from the active channel: the targets named by
    id, every target of ``backends``, every target (``all_targets``), or else the one this machine
    (``report``) would install. torch: the wheels of the torch plan for ``report`` (``requirements``,
    at most one of ``backends``) for the target's Python (``python_version``, default: the torch
    target's) and ``platforms`` (pip platform tags, default: this machine's)."""
    from ..artifacts import Cache, fetch
    from ..manifests.channels import trust_for
    from .planning import _fetch_channel

    s = settings or Settings.resolve()
    progress = on_progress or null_progress
    if stack == "torch":
        if targets or all_targets:
            raise UsageError("a torch bundle holds one torch plan: choose it with --backend and requirements, not targets")
        return _create_torch(Path(out), s, backends, report, requirements, python_version, platforms, progress)
    if stack != "ggml":
        raise UsageError(f"unknown stack {stack!r}", "make a ggml or a torch bundle")
    if requirements or python_version or platforms:
        raise UsageError("requirements, a Python version and platforms are for torch bundles", "add --stack torch")
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
        for a in list(t.artifacts) + list(t.cuda_libs):  # a CUDA target's shared cudart/cuBLAS wheels travel too
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
    size, digest = _write_tar(out, [(INDEX, (json.dumps(index, indent=2) + "\n").encode()), (MANIFEST, data), (SIGNATURE, sig)],
                              [(f"artifacts/{sha}", paths[sha]) for sha in refs])
    timings["write"] = time.perf_counter() - t0
    return BundleSummary(str(out), stack, channel.name, manifest.envelope.source, manifest.envelope.version,
                         [t.id for t in chosen], [r.name for r in refs.values()], size, timings, digest)


def _create_torch(out: Path, s: Settings, backends: Sequence[str], report: Optional[HardwareReport],
                  requirements: Sequence[str], python_version: str, platforms: Sequence[str],
                  progress: ProgressCallback) -> BundleSummary:
    """The torch plan's wheels, downloaded with pip for the target, hashed into the index."""
    from ..installer.torch import download_commands, hashed_requirements, run_pip, wheel_pin
    from .planning import target_version

    if len(backends) > 1:
        raise UsageError("a torch bundle holds one torch build", "give at most one --backend (or variant, such as cu126)")
    t0 = time.perf_counter()
    report = report if report is not None else detect(settings=s)
    version = python_version or target_version(s)
    if not re.match(r"^3\.[0-9]{1,2}\Z", version):
        raise UsageError(f"{version!r} is not a Python version such as 3.11")
    p = plan(report, "torch", requirements=requirements, backend=backends[0] if backends else None, python=version,
             settings=s)
    if not p.ok:
        raise BundleError(f"no torch build fits: {p.summary}", "; ".join(p.conflicts) or "choose the backend of the machine "
                          "the bundle is for (--backend)", action=Action.EXPLAIN_PLAN)
    timings = {"plan": time.perf_counter() - t0}
    s.cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".bundle-wheels-", dir=str(s.cache)))
    try:
        t0 = time.perf_counter()
        for argv in download_commands(p, work, version, platforms, index_url=s.index_url,
                                      extra_index_urls=s.extra_index_urls):
            # offline: only the wheels pip's find-links directories hold (a local mirror)
            run_pip(argv + (["--no-index"] if s.offline else []), s.timeouts.pip, progress, "nothing was written",
                    stage="bundle")
        timings["download"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        wheels: List[Dict[str, Any]] = []
        for f in sorted(work.iterdir()):
            wheel_pin(f.name)  # pip with --only-binary writes wheels only; anything else is refused here
            wheels.append({"name": f.name, "sha256": _sha256(f), "size": f.stat().st_size})
        if not wheels or len(wheels) >= MAX_BUNDLE_MEMBERS or len({w["sha256"] for w in wheels}) != len(wheels):
            raise BundleError(f"pip downloaded {len(wheels)} files for the plan, which a bundle cannot hold "
                              "(none, too many, or two with the same bytes)", "run the plan's pip command by hand to see why",
                              action=Action.REPORT_BUG)
        hashed_requirements([(w["name"], w["sha256"]) for w in wheels])  # one version per project, or refuse now
        timings["hash"] = time.perf_counter() - t0
        index = {"format": FORMAT, "version": FORMAT_VERSION, "stack": "torch",
                 "plan": {"summary": p.summary, "backend": p.backend, "variant": p.variant, "torch_version": p.torch_version,
                          "packages": list(p.packages), "index_url": p.index_url,
                          "requirements": list(p.request.requirements)},
                 "python": version, "platforms": list(platforms), "wheels": wheels}
        t0 = time.perf_counter()
        progress(ProgressEvent("message", "bundle", message=f"writing {out}"))
        size, digest = _write_tar(out, [(INDEX, (json.dumps(index, indent=2) + "\n").encode())],
                                  [(f"artifacts/{w['sha256']}", work / w["name"]) for w in wheels])
        timings["write"] = time.perf_counter() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return BundleSummary(str(out), "torch", "", "pip", 0, [p.variant], [w["name"] for w in wheels], size, timings, digest,
                         version)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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


class _Hashing:
    """A write-only file that hashes what passes through it (the bundle's sha256 at no extra read)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.hash = hashlib.sha256()

    def write(self, data: Any) -> int:
        self.hash.update(data)
        return self.raw.write(data)


def _write_tar(out: Path, documents: Sequence[Tuple[str, bytes]], files: Sequence[Tuple[str, Path]]) -> Tuple[int, str]:
    """The tar at ``out``, complete or absent (written beside it, then renamed); its size and sha256."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=str(out.parent))
    try:
        with os.fdopen(fd, "wb") as raw:
            hashing = _Hashing(raw)
            _write_members(hashing, documents, files)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out.stat().st_size, hashing.hash.hexdigest()


def _write_members(fileobj: Any, documents: Sequence[Tuple[str, bytes]], files: Sequence[Tuple[str, Path]]) -> None:
    import io

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
    if index.get("stack", "ggml") != "torch" and MANIFEST not in docs:  # a torch bundle has no manifest
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
    """Install from the bundle ``path``, with no network. ggml: the runtime for this machine, the
    manifest's signature, envelope, expiry and rollback checked as online, every artifact hashed
    into the download cache, then the usual transaction (verify before activate). torch: the
    bundled wheels into the torch target (see the module docstring), checked and recorded as online."""
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
        t0 = time.perf_counter()
        opened = read_bundle(Path(path), root)
        stack = opened.index.get("stack", "ggml")
        if stack == "torch":
            if backend:
                raise UsageError("a torch bundle installs the build it holds", "leave out --backend")
            return _install_torch(opened, str(path), report, s, verifier, progress, time.perf_counter() - t0)
        if stack != "ggml":
            raise BundleError(f"{path} is a bundle of the {str(stack)[:40]!r} stack, which this accelstack does not install",
                              "update accelstack", action=Action.UPDATE_ACCELSTACK)
        channel = bundle_channel(opened.index, s)
        verified = trust_for(channel, s).verify(opened.manifest, opened.signature, f"bundle {path}", expect="ggml",
                                                record=True)
        manifest = verified.manifest
        assert isinstance(manifest, GgmlManifest)
        present = [t for t in manifest.targets if t.artifacts and all(a.sha256 in opened.artifacts
                                                                      for a in list(t.artifacts) + list(t.cuda_libs))]
        if not present:
            raise BundleError(f"{path} holds no complete target of its manifest", "make the bundle again")
        refs = {a.sha256: ArtifactRef(a.name, a.sha256, a.size, [opened.artifacts[a.sha256].as_uri()])
                for t in present for a in list(t.artifacts) + list(t.cuda_libs)}
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


@dataclass
class _TorchIndex:
    """The parts of a torch bundle's index the install uses, checked (the index is hostile input)."""

    variant: str
    torch_version: str
    requirements: List[str]
    python: str
    wheels: List[Tuple[str, str, int]]  # file name, sha256, size


def _torch_index(index: dict, what: str) -> _TorchIndex:
    from ..installer.torch import TorchInstallError, wheel_pin

    def bad(why: str) -> BundleError:
        return BundleError(f"{what}: the torch bundle's index is not valid ({why})", "make the bundle again")

    raw_plan = index.get("plan")
    plan_doc: dict = raw_plan if isinstance(raw_plan, dict) else {}
    texts = {k: plan_doc.get(k) for k in ("variant", "torch_version")}
    if not all(isinstance(v, str) and 0 < len(v) <= 64 for v in texts.values()):
        raise bad("no plan variant or torch version")
    reqs = plan_doc.get("requirements", [])
    if not isinstance(reqs, list) or len(reqs) > 64 or not all(isinstance(r, str) and len(r) <= 200 for r in reqs):
        raise bad("requirements")
    python = index.get("python")
    if not isinstance(python, str) or not re.match(r"^3\.[0-9]{1,2}\Z", python):
        raise bad("python version")
    raw = index.get("wheels")
    if not isinstance(raw, list) or not raw or len(raw) > MAX_BUNDLE_MEMBERS:
        raise bad("no wheels")
    wheels: List[Tuple[str, str, int]] = []
    for w in raw:
        if not isinstance(w, dict) or not isinstance(w.get("name"), str) or not isinstance(w.get("sha256"), str) \
                or not re.match(r"^[0-9a-f]{64}\Z", w["sha256"]) or not isinstance(w.get("size"), int) or w["size"] < 0:
            raise bad("a wheel entry")
        try:
            wheel_pin(w["name"])
        except TorchInstallError as exc:
            raise bad(exc.message) from None
        wheels.append((w["name"], w["sha256"], w["size"]))
    if len({w[0] for w in wheels}) != len(wheels) or len({w[1] for w in wheels}) != len(wheels):
        raise bad("a wheel is listed twice")
    return _TorchIndex(str(texts["variant"]), str(texts["torch_version"]), list(reqs), python, wheels)


def _install_torch(opened: OpenedBundle, what: str, report: HardwareReport, s: Settings, verifier: Optional[Verifier],
                   progress: ProgressCallback, read_seconds: float):
    """A torch bundle into the torch target: plan again here (it must be the bundle's variant), every
    wheel's sha256 checked, then pip with no index and ``--require-hashes``, checked as online."""
    from ..artifacts import HashMismatchError
    from ..installer.torch import PipCommands, TorchEnvironment, hashed_requirements, local_install_command, receipt_id
    from ..installer.transaction import Provenance
    from ..installer.transaction import install as run_transaction
    from .lifecycle import InstallSummary, _prepare, recover
    from .planning import hardware_fingerprint, target_interpreter, target_version
    from .verifiers import default_verifier

    ti = _torch_index(opened.index, what)
    here = target_version(s)
    if here != ti.python:
        raise BundleError(f"{what} holds wheels for Python {ti.python}; the torch target here is Python {here}",
                          f"install into a Python {ti.python} environment (--venv made with Python {ti.python}, or --python), "
                          f"or make the bundle with --python-version {here}", action=Action.FIX_INPUT)
    p = plan(report, "torch", requirements=ti.requirements, backend=ti.variant, python=ti.python, settings=s)
    if not p.ok or p.variant != ti.variant or p.torch_version != ti.torch_version:
        raise BundleError(f"{what} holds torch {ti.torch_version} ({ti.variant}), which does not fit here: {p.summary}",
                          "make a bundle for this machine (bundle create --backend ...)", action=Action.EXPLAIN_PLAN)
    t0 = time.perf_counter()
    wheels = opened.root / "wheels"
    wheels.mkdir()
    for name, sha, size in ti.wheels:
        src = opened.artifacts.get(sha)
        if src is None:
            raise BundleError(f"{what} lacks the wheel {name}", "make the bundle again")
        actual = _sha256(src)
        if actual != sha or src.stat().st_size != size:
            raise HashMismatchError(f"the bundled wheel {name} does not hash to the sha256 its index gives",
                                    expected=sha, actual=actual, hint="the bundle was damaged or altered; make it again")
        os.replace(src, wheels / name)
    requirements = opened.root / "requirements.txt"
    requirements.write_text(hashed_requirements([(n, sha) for n, sha, _ in ti.wheels]), encoding="utf-8")
    command = local_install_command(wheels, requirements)
    p = dataclasses.replace(p, commands=[command], uv_commands=[],
                            notes=[*p.notes, f"installed from the offline bundle {what}"])
    checked = time.perf_counter() - t0
    python = target_interpreter(s, create=True)
    home, lock = _prepare(s, "install torch")
    with lock:
        recovered = recover(home)
        rid = receipt_id(p, python)
        dest = TorchEnvironment(home, python, s.timeouts.pip, s.timeouts.probe)
        outcome = run_transaction(p, PipCommands([command]), dest, verifier or default_verifier(s), home=home,
                                  runtime_id=rid, provenance=Provenance(f"bundle:{Path(what).name}", 0,
                                                                        hardware_fingerprint(report)), progress=progress)
    timings = {"bundle read": read_seconds, "bundle check": checked, **outcome.timings}
    return InstallSummary("torch", rid, True, p, outcome.receipt, outcome.previous, timings, recovered)
