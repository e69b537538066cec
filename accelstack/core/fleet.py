"""A machine's facts as the fleet tools that already exist read them (issue 28).

Sites with many machines schedule on Kubernetes node labels (Node Feature Discovery's ``local``
feature files) and watch them in Prometheus (the node exporter's textfile collector): accelstack
feeds those instead of inventing an inventory of its own. This module maps a
:class:`HardwareReport` and the installed runtimes to ordered label and metric records; the CLI
renders them (``accelstack detect --format nfd|prometheus``, docs/fleet.md names every one).

Labels go in NFD's own namespace, ``feature.node.kubernetes.io``: the one nfd-master always accepts
(``-deny-label-ns`` cannot deny it), so the file works without any NFD configuration; accelstack
owns no domain to put them under. Every name after the prefix starts ``accelstack.``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..hardware.report import GPU, HardwareReport, Problem
from ..settings import Settings
from .status_check import status

__all__ = ["LABEL_PREFIX", "VRAM_CLASSES", "RuntimeFact", "NodeLabel", "Sample", "MetricFamily", "installed_runtimes",
           "primary_gpu", "gpu_arch", "vram_class", "label_value", "node_labels", "node_metrics"]

LABEL_PREFIX = "feature.node.kubernetes.io/accelstack."
GiB = 1024 ** 3
# VRAM classes, in GiB: the sizes cards are sold in, so one class holds the cards a workload can
# count on alike (8g: every 8 GB card; 24g: a 4090, a 3090, an A10...). A class means "at least
# this much": a card counts as a size when it reports 95% of it, since drivers report a little less
# than the nominal size (the replayed captures: an H100 80GB 79.65 GiB, a 4090 23.99, a Titan X
# 11.91, 99.3% at worst; 95% leaves room for others). Below the smallest: "under4g".
VRAM_CLASSES: Tuple[int, ...] = (4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 128)
_REPORTED = 0.95
# Kubernetes label values (and the name part after the prefix): at most 63 characters,
# alphanumerics with '-', '_' or '.' between them (k8s.io/docs/concepts/overview/working-with-objects/labels/)
_NOT_IN_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")
_VALUE_MAX = 63


@dataclass
class RuntimeFact:
    """The active runtime of one stack, and its last verify verdict as its receipt keeps it."""

    stack: str
    runtime: str  # the runtime id
    backend: str
    verdict: str  # "pass" | "fail" | "unverified" (installed but never verified)
    check: str = ""  # what the verdict ran: "verify", "torch", "import"
    healthy: bool = False  # its files are there and unchanged, and it still fits this machine


@dataclass
class NodeLabel:
    """One node label: ``name`` with its namespace prefix, ``value`` a valid label value."""

    name: str
    value: str


@dataclass
class Sample:
    labels: Dict[str, str]
    value: float


@dataclass
class MetricFamily:
    """One Prometheus metric: its name, help text, type (always ``gauge``: these are states) and samples."""

    name: str
    help: str
    type: str = "gauge"
    samples: List[Sample] = field(default_factory=list)


def installed_runtimes(report: HardwareReport, settings: Optional[Settings] = None) -> List[RuntimeFact]:
    """The active runtime of each stack in the home of ``settings``, read without the lock and
    without asking the channels for upgrades (a label job must not wait on the network)."""
    out = []
    for st in status(report=report, settings=settings, check_upgrades=False):
        r = st.receipt
        if not st.active or r is None:
            continue
        verdict = "pass" if r.verification.ok else "fail" if r.verified_at else "unverified"
        out.append(RuntimeFact(st.stack, r.id, r.backend, verdict, r.verification.check, st.healthy))
    return out


def primary_gpu(report: HardwareReport) -> Optional[GPU]:
    """The GPU work goes to: the one the first GPU entry of the preference names, else the first GPU."""
    for pref in report.preference:
        g = report.gpu(pref.gpu)
        if g is not None:
            return g
    return report.gpus[0] if report.gpus else None


def gpu_arch(g: GPU) -> str:
    """The architecture a build must target, in the vendor's own words: ``sm_89`` (NVIDIA compute
    capability 8.9), ``gfx1100`` (AMD), ``Xe-HPG (Alchemist)`` (Intel), ``M3 Pro`` (Apple); "" when unknown."""
    if g.compute_capability:
        return "sm_" + g.compute_capability.replace(".", "")
    return g.gfx_target or g.intel_generation or g.apple_family


def vram_class(size: Optional[int]) -> str:
    """The :data:`VRAM_CLASSES` class of ``size`` bytes ("24g"), "under4g", or "" when unknown."""
    if not size:
        return ""
    fits = [c for c in VRAM_CLASSES if size >= c * GiB * _REPORTED]
    return f"{fits[-1]}g" if fits else f"under{VRAM_CLASSES[0]}g"


def label_value(text: str) -> str:
    """``text`` as a valid label value: runs of other characters become '-', the ends alphanumeric,
    at most 63 characters ("Xe-HPG (Alchemist)" -> "Xe-HPG-Alchemist")."""
    value = _NOT_IN_VALUE.sub("-", text).strip("-_.")
    return value[:_VALUE_MAX].rstrip("-_.")


def _usable_apis(report: HardwareReport) -> List[str]:
    return [a.name for a in report.apis if a.usable]


def node_labels(report: HardwareReport, runtimes: Sequence[RuntimeFact] = ()) -> List[NodeLabel]:
    """The node's labels, in a fixed order: usable APIs, the preferred one, the GPUs, the NPUs, the runtimes.

    A fact that is unknown or absent has no label (a selector on it then matches no node)."""
    facts: List[Tuple[str, str]] = [(f"api.{name}", "true") for name in _usable_apis(report)]
    if report.preference:
        facts.append(("api.preferred", report.preference[0].api))
    facts.append(("gpu.count", str(len(report.gpus))))
    g = primary_gpu(report)
    if g is not None:
        size = g.vram_total or g.vram_at_least  # a lower bound still says which class it is at least
        facts += [("gpu.vendor", g.vendor), ("gpu.kind", g.kind), ("gpu.arch", gpu_arch(g)),
                  ("gpu.vram-class", vram_class(size)),
                  ("gpu.vram-gib", str(round(g.vram_total / GiB)) if g.vram_total else "")]
    facts.append(("npu.count", str(len(report.npus))))
    if report.npus:  # the driver bound to it: no label when none is (the NPU is then not usable)
        facts += [("npu.vendor", report.npus[0].vendor), ("npu.driver", report.npus[0].driver)]
    for r in runtimes:
        facts += [(f"runtime.{r.stack}", r.backend), (f"runtime.{r.stack}.verify", r.verdict)]
    labels = [NodeLabel(LABEL_PREFIX + name, label_value(value)) for name, value in facts]
    return [label for label in labels if label.value]


def _family(name: str, help: str, samples: List[Sample]) -> MetricFamily:
    return MetricFamily(f"accelstack_{name}", help, "gauge", samples)


def node_metrics(report: HardwareReport, runtimes: Sequence[RuntimeFact] = ()) -> List[MetricFamily]:
    """The same facts as Prometheus gauges: ``*_info`` gauges (value 1) carry the string facts as
    labels, the others a number. Families with no sample are left out."""
    gpus = report.gpus
    families = [
        _family("api_usable", "1 when the accelerator API is usable on this machine, 0 when detected but not usable",
                [Sample({"api": a.name}, 1.0 if a.usable else 0.0) for a in report.apis]),
        _family("api_preference_rank", "the order to use the usable APIs in (1 first); gpu is the GPU index, empty for the CPU",
                [Sample({"api": p.api, "gpu": "" if p.gpu is None else str(p.gpu)}, float(i))
                 for i, p in enumerate(report.preference, 1)]),
        _family("gpus", "number of GPUs detected", [Sample({}, float(len(gpus)))]),
        _family("gpu_info", "one GPU: vendor, name, kind, architecture (sm_89, gfx1100, ...) and driver version",
                [Sample({"gpu": str(g.index), "vendor": g.vendor, "name": g.name, "kind": g.kind, "arch": gpu_arch(g),
                         "driver_version": g.driver_version, "vram_class": vram_class(g.vram_total or g.vram_at_least)}, 1.0)
                 for g in gpus]),
        _family("gpu_vram_bytes", "the GPU's total memory in bytes (GPUs whose size is unknown have no sample)",
                [Sample({"gpu": str(g.index)}, float(g.vram_total)) for g in gpus if g.vram_total]),
        _family("npus", "number of NPUs (neural processing units) detected", [Sample({}, float(len(report.npus)))]),
        _family("npu_info", "one NPU: vendor, name and the kernel driver bound to it (empty: none, so not usable)",
                [Sample({"npu": str(n.index), "vendor": n.vendor, "name": n.name, "driver": n.driver}, 1.0)
                 for n in report.npus]),
        _family("runtime_info", "the active runtime of a stack: its id, backend and last verify verdict",
                [Sample({"stack": r.stack, "runtime": r.runtime, "backend": r.backend, "verdict": r.verdict}, 1.0)
                 for r in runtimes]),
        _family("runtime_verified", "1 when the active runtime of the stack passed its last verify, else 0",
                [Sample({"stack": r.stack}, 1.0 if r.verdict == "pass" else 0.0) for r in runtimes]),
        _family("runtime_healthy", "1 when the active runtime's files are unchanged and it still fits this machine, else 0",
                [Sample({"stack": r.stack}, 1.0 if r.healthy else 0.0) for r in runtimes]),
        _family("problem_info", "a problem detection found (see `accelstack detect` for what to do)",
                [Sample({"code": p.code, "severity": p.severity}, 1.0) for p in _unique_problems(report)]),
        _family("detect_duration_seconds", "how long detection took",
                [Sample({}, round(report.duration_ms / 1000.0, 6))]),
    ]
    return [f for f in families if f.samples]


def _unique_problems(report: HardwareReport) -> List[Problem]:
    """One sample per (code, severity): two samples may not share a label set."""
    seen: Dict[Tuple[str, str], Problem] = {}
    for p in report.problems:
        seen.setdefault((p.code, p.severity), p)
    return list(seen.values())
