"""ggml's part of offline bundles: a channel's signed manifest and the chosen targets' artifacts
(see :mod:`accelstack.core.bundle_file` for the file itself)."""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ...domain import Stack
from ...errors import Action, UsageError
from ...events import ProgressCallback, ProgressEvent
from ...hardware.report import HardwareReport
from ...limits import MalformedInput, parse_json
from ...manifests.channels import key_from_file, key_from_id, trust_for
from ...manifests.ggml_manifest import GgmlManifest
from ...manifests.resolver import Manifests
from ...manifests.rollback import RollbackStore
from ...refs import ArtifactRef
from ...settings import Channel, Settings
from ..bundle_file import (
    FORMAT,
    FORMAT_VERSION,
    INDEX,
    MANIFEST,
    SIGNATURE,
    BundleError,
    BundleSummary,
    OpenedBundle,
    write_bundle,
)
from ..context import InstallJob
from ..detection import detect
from ..local_build import NoChannelError
from ..options import NetworkFetcher
from ..planning import (
    LoadedManifest,
    TrustedSet,
    active_channels,
    configured_channels,
    fetch_channel,
    plan,
    remembered_channels,
    save_manifest,
    with_keys,
)
from ..results import InstallSummary
from .protocol import InstallEntry

__all__ = ["create", "install_from", "bundle_channel"]

STACK: Stack = "ggml"


def _one_channel(s: Settings) -> Channel:
    channels = active_channels(s)
    if not channels:
        raise NoChannelError("no channel is configured: a bundle is made from a channel's signed manifest",
                             "configure a channel (its manifest URL and publisher's key) or name a manifest")
    if len(channels) > 1:
        raise UsageError(f"{len(channels)} channels are configured ({', '.join(c.name for c in channels)}); "
                         "a bundle holds one channel's manifest", "choose one channel")
    return channels[0]


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
        p = plan(report, STACK, settings=s, manifests=knowledge)
        if not p.ok:
            raise BundleError(f"the channel has no build for this machine: {p.summary}",
                              "choose the targets of the machine the bundle is for (by backend or target id)",
                              action=Action.EXPLAIN_PLAN)
        chosen = [t for t in manifest.targets if t.id == p.variant]
    if not chosen:
        raise BundleError("no target of the manifest was chosen", f"its targets: {', '.join(t.id for t in manifest.targets)}")
    return chosen


def create(out: Path, s: Settings, report: Optional[HardwareReport], backends: Sequence[str], targets: Sequence[str],
           all_targets: bool, progress: ProgressCallback) -> BundleSummary:
    """The active channel's signed manifest and the chosen targets' artifacts, deep-hashed."""
    t0 = time.perf_counter()
    channel = _one_channel(s)
    fetcher = NetworkFetcher(s)
    data, sig, url = fetch_channel(channel, progress, fetcher)
    if sig is None:
        raise BundleError(f"the manifest {url} is not signed; a bundle carries only signed manifests",
                          "ask the publisher for the signature", action=Action.ALLOW_UNSIGNED)
    verified = trust_for(channel, s).verify(data, sig, url, expect=STACK, record=False)
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
    paths = fetcher.files(list(refs.values()), progress=progress, deep=True)
    timings["download"] = time.perf_counter() - t0
    index = {"format": FORMAT, "version": FORMAT_VERSION, "stack": STACK,
             "channel": {"name": channel.name, "url": channel.url},
             "source": manifest.envelope.source, "manifest_version": manifest.envelope.version,
             "targets": [t.id for t in chosen],
             "artifacts": [{"name": r.name, "sha256": r.sha256, "size": r.size} for r in refs.values()]}
    t0 = time.perf_counter()
    out = Path(out)
    progress(ProgressEvent("message", "bundle", message=f"writing {out}"))
    size, digest = write_bundle(out, [(INDEX, (json.dumps(index, indent=2) + "\n").encode()), (MANIFEST, data), (SIGNATURE, sig)],
                                [(f"artifacts/{sha}", paths[sha]) for sha in refs])
    timings["write"] = time.perf_counter() - t0
    return BundleSummary(str(out), STACK, channel.name, manifest.envelope.source, manifest.envelope.version,
                         [t.id for t in chosen], [r.name for r in refs.values()], size, timings, digest,
                         trusted_keys=_verifying_keys(channel, verified.keyid, s))


def _verifying_keys(channel: Channel, keyid: Optional[str], s: Settings) -> List[str]:
    """The keys the offline machine passes as --trusted-key: the channel's pinned keys, else the
    globally trusted key that signed the manifest."""
    if channel.keys:
        return list(dict.fromkeys(key_from_file(k) if k.endswith(".pub") else k for k in channel.keys))
    return [key_from_id(keyid, s)] if keyid else []


def bundle_channel(index: dict, s: Settings, manifest: bytes = b"") -> Channel:
    """The channel whose keys verify the bundle's manifest: the configured (or remembered) channel of
    the bundle's channel name, with any ``--trusted-key``; else ``--trusted-key`` (or the global keys),
    named by the manifest's own ``source`` (signed: checked next). The index is not signed (issue 47):
    its name only picks among channels this machine already knows, whose keys, watermark and bound
    source then apply; its URL is only where a later ``upgrade`` looks, for manifests that must verify
    with the same keys under the signed name's watermark."""
    raw = index.get("channel")
    found: dict = raw if isinstance(raw, dict) else {}
    name = found.get("name") if isinstance(found.get("name"), str) else ""
    known = next((c for c in [*configured_channels(s), *remembered_channels(s)] if c.name == name), None) if name else None
    if known is not None:
        return with_keys(known, s.trusted_keys)
    url = found.get("url") if isinstance(found.get("url"), str) else ""
    return Channel(_signed_source(manifest) or "bundle", url or "bundle", [], list(s.trusted_keys))


def _signed_source(manifest: bytes) -> str:
    """The ``source`` the manifest's bytes claim ("" when unreadable); its signature is checked next."""
    try:
        doc = parse_json(manifest, what="the bundle's manifest", max_depth=64)
    except MalformedInput:
        return ""
    source = doc.get("source") if isinstance(doc, dict) else None
    return source if isinstance(source, str) and source.isprintable() and 0 < len(source) <= 128 else ""


def install_from(opened: OpenedBundle, what: str, job: InstallJob, backend: Optional[str],
                 install: InstallEntry) -> InstallSummary:
    """The manifest's signature, envelope, expiry and rollback checked as online, then (only then)
    the artifacts it lists read from the bundle, every one hashed into the download cache, then the
    usual install (verify before activate), offline: the core's ``install``, handed down as ``install``."""
    s = job.settings
    channel = bundle_channel(opened.index, s, opened.manifest)
    trust = trust_for(channel, s)
    checked = trust.verify(opened.manifest, opened.signature, f"bundle {what}", expect=STACK, record=False)
    if checked.keyid is not None:  # whatever name the unsigned index gives: the signed source and key decide
        RollbackStore(s.rollback_state).refuse_older_signed(checked.manifest.envelope.source,
                                                            checked.manifest.envelope.version, [checked.keyid])
    verified = trust.verify(opened.manifest, opened.signature, f"bundle {what}", expect=STACK, record=True)
    manifest = verified.manifest
    assert isinstance(manifest, GgmlManifest)
    save_manifest(s, channel.name, opened.manifest, opened.signature)  # what an offline upgrade or status reads
    # only now, trusted, are artifacts written: those the signed manifest lists, each at its size
    opened.extract({a.sha256: a.size for t in manifest.targets for a in list(t.artifacts) + list(t.cuda_libs)})
    present = [t for t in manifest.targets if t.artifacts and all(a.sha256 in opened.artifacts
                                                                  for a in list(t.artifacts) + list(t.cuda_libs))]
    if not present:
        raise BundleError(f"{what} holds no complete target of its manifest", "make the bundle again")
    refs = {a.sha256: ArtifactRef(a.name, a.sha256, a.size, [opened.artifacts[a.sha256].as_uri()])
            for t in present for a in list(t.artifacts) + list(t.cuda_libs)}
    # local files, hashed into the download cache as downloads are
    NetworkFetcher(s).files(list(refs.values()), progress=job.progress, offline=False)
    for extracted in opened.artifacts.values():  # in the cache now: the copies go before the install needs the disk
        extracted.unlink(missing_ok=True)
    knowledge = Manifests.builtin()
    knowledge.add(dataclasses.replace(manifest, targets=present))
    loaded: List[LoadedManifest] = [LoadedManifest(f"bundle:{what}", manifest.envelope.source,
                                                   manifest.envelope.version, channel.name)]
    # remembered with its keys (a --trusted-key too), so that `upgrade` and `status` know the channel
    trusted = TrustedSet(knowledge, loaded, [channel], remember=channel.url not in ("", "bundle"))
    offline = s.replace(offline=True, allow_build=False)
    return install(None, stack=STACK, backend=backend, report=job.report, settings=offline, services=job.services,
                   on_progress=job.progress, **dataclasses.replace(job.options, trusted=trusted).keywords())
