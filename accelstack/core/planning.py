"""Detect and plan: the machine, the trusted manifests, and the decision.

Manifests named in the settings are fetched here (the artifacts layer), verified by
``TrustedManifests`` (signature, envelope, expiry, rollback) and handed to the resolver. When no
published ggml build fits, the plan says ``needs-build``; the build itself happens in ``install``
so that planning stays fast and a dry run never compiles.
"""
from __future__ import annotations

import hashlib
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from ..detect.report import HardwareReport
from ..domain import STACKS
from ..errors import Action, UsageError
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..manifests.plan import Plan, Request
from ..manifests.resolve import Manifests, resolve
from ..settings import Settings
from .detection import detect

log = logging.getLogger(__name__)
LOCAL_SOURCE = "local-build"


def hardware_fingerprint(report: HardwareReport) -> str:
    """What, if it changes, may make the installed runtime the wrong one (GPU, driver, OS, CPU)."""
    material = {
        "os": [report.os.name, report.os.arch],
        "cpu": report.cpu.features,
        "gpus": [[g.vendor, g.pci_device_id or g.name, g.driver_version, g.compute_capability, g.gfx_target] for g in report.gpus],
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class LoadedManifest:
    url: str
    source: str
    version: int


@dataclass
class TrustedSet:
    """What ``load_manifests`` verified: the knowledge for the resolver, and where each part came from."""

    manifests: Manifests
    loaded: List[LoadedManifest]


def remembered_manifests(settings: Settings) -> List[str]:
    try:
        data = json.loads(settings.remembered.read_text(encoding="utf-8"))
        urls = data.get("manifests", []) if isinstance(data, dict) else []
        return [u for u in urls if isinstance(u, str)]
    except (OSError, ValueError):
        return []


def remember_manifests(settings: Settings, urls: Sequence[str]) -> None:
    from ..installer.records import atomic_write

    if urls:
        atomic_write(settings.remembered, json.dumps({"manifests": list(urls)}, indent=2))


def manifest_urls(settings: Settings) -> List[str]:
    """The manifests to use: the settings' own, else the ones the last install used."""
    return list(settings.manifests) or remembered_manifests(settings)


def load_manifests(settings: Settings, *, record: bool = True, progress: ProgressCallback = null_progress) -> TrustedSet:
    """The builtin torch matrix plus every ggml manifest in ``settings``, each verified before use.

    ``record=False`` checks rollback without raising the watermark (status, dry runs)."""
    from ..artifacts import FetchError
    from ..artifacts.documents import fetch_document, fetch_optional_document
    from ..manifests.trust import TrustedManifests

    manifests = Manifests.builtin()
    loaded: List[LoadedManifest] = []
    urls = manifest_urls(settings)
    if not urls:
        return TrustedSet(manifests, loaded)
    trusted = TrustedManifests.from_settings(settings)  # a check with record=False only reads
    for url in urls:
        progress(ProgressEvent("message", "plan", message=f"reading manifest {url}"))
        try:
            data = fetch_document(url)
            sig = fetch_optional_document(url + ".sig")
        except FetchError as exc:
            raise FetchError(f"cannot get the manifest {url}: {exc.message}", hint="check the address and the network; "
                             "nothing was changed", action=Action.CHECK_NETWORK) from None
        verified = trusted.verify(data, sig, url, expect="ggml", record=record)
        manifests.add(verified.manifest)
        loaded.append(LoadedManifest(url, verified.envelope.source, verified.envelope.version))
    return TrustedSet(manifests, loaded)


def target_interpreter(settings: Settings, *, create: bool) -> str:
    """The torch target's interpreter: the venv's (created when ``create``), the one named, or this one."""
    from ..installer.torch import ensure_venv, venv_python

    if settings.torch_venv is not None:
        return ensure_venv(settings.torch_venv, settings.timeouts.venv) if create else str(venv_python(settings.torch_venv))
    python = settings.torch_python or sys.executable
    if not Path(python).exists():
        raise UsageError(f"the target interpreter {python} does not exist")
    return python


def target_version(settings: Settings) -> str:
    """The torch target's Python version ("3.11"); a venv not created yet will be made from this interpreter."""
    from ..installer.torch import python_version

    python = target_interpreter(settings, create=False)
    if python == sys.executable or not Path(python).exists():
        return "%d.%d" % sys.version_info[:2]
    return python_version(python, settings.timeouts.probe)


def plan(report: Optional[HardwareReport] = None, stack: str = "ggml", *, requirements: Sequence[str] = (),
         backend: Optional[str] = None, python: Optional[str] = None, settings: Optional[Settings] = None,
         manifests: Optional[Manifests] = None, on_progress: Optional[ProgressCallback] = None) -> Plan:
    """The plan for ``stack`` on the machine ``report`` describes (detected when not given).

    ``python`` is the torch target's version ("3.11"; default: the target environment's).
    ``manifests`` skips loading them from the settings (already verified by the caller)."""
    s = settings or Settings.resolve()
    progress = on_progress or null_progress
    report = report if report is not None else detect(settings=s)
    if stack not in STACKS:
        raise UsageError(f"unknown stack {stack!r}: choose one of {', '.join(STACKS)}")
    if stack == "torch" and python is None:
        python = target_version(s)
    if manifests is None:
        manifests = load_manifests(s, record=False, progress=progress).manifests if stack == "ggml" else Manifests.builtin()
    request = Request(stack=stack, requirements=list(requirements), backend=s.backend if backend is None else backend,
                      python=python or "")
    return resolve(report, request, manifests)
