"""Checking torch builds against the machine: each release line of each variant, on each device.

A candidate is one variant (``cu128``, ``rocm6.4``, ``cpu``...) on one device; for it every torch
release line that published the variant is checked, newest first, in this order — platform,
glibc, OS version, kernels for the GPU, driver, Python, the user's requirements — and the newest
line that passes is what the candidate would install. Checking hardware before the request means
a line rejected "only" by the request is a line that would work: that is how an impossible request
("torch<2.7 on an RTX 5090") is recognised and answered with what would work instead.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ..domain import Backend
from .hw_rules import COMPAT_MARK, branch_note, cuda_driver_check, jetson_text
from .machine import Device, Machine, cuda_kernels_for, kind_rank, sm_name, version_of
from .plan import Candidate, Request
from .request import TORCH_PACKAGE, Requirements
from .torch_matrix import CudaToolkit, PlatformBuild, Release, TorchMatrix, Variant

__all__ = ["BACKEND_TEXT", "REQUEST_CODES", "LineOk", "TorchChecks", "TorchEval", "format_range"]

REQUEST_CODES = ("python", "requirement")
BACKEND_TEXT = {"cuda": "CUDA", "rocm": "ROCm", "xpu": "XPU", "mps": "MPS", "directml": "DirectML", "cpu": "CPU"}


@functools.lru_cache(maxsize=512)
def _line_versions(line: str, known: Tuple[str, ...] = ()) -> Tuple[Version, ...]:
    """Versions a release line may hold: the known ones and patch numbers 0-9 (for pins such as ==2.6.3)."""
    base = version_of(line)
    probes = {Version(f"{base.major}.{base.minor}.{p}") for p in range(10)}
    probes.update(version_of(k) for k in known)
    return tuple(sorted(probes))


def _allows(spec: SpecifierSet, versions: Tuple[Version, ...]) -> bool:
    return any(spec.contains(v, prereleases=True) for v in versions)


@functools.lru_cache(maxsize=256)
def _python_ok(spec_text: str, py: str) -> bool:
    return SpecifierSet(spec_text).contains(Version(py), prereleases=True)


def _python_text(spec_text: str, py: Version) -> str:
    """Why ``py`` is outside ``spec_text``, as a person says it."""
    spec = SpecifierSet(spec_text)
    for s in spec:
        bound = version_of(s.version)
        if s.operator in (">=", ">") and not s.contains(py):
            return f"needs Python >= {bound}"
        if s.operator in ("<", "<=") and not s.contains(py):
            top = bound if s.operator == "<=" else Version(f"{bound.major}.{bound.minor - 1}") if bound.minor else bound
            return f"supports Python up to {top}"
    return f"needs Python {spec_text}"


@dataclass
class LineOk:
    release: Release
    variant: Variant
    build: PlatformBuild
    env: Dict[str, str]
    how: str

    @property
    def via_compat(self) -> bool:
        """Runs only through NVIDIA's minor-version compatibility (the driver's CUDA is older)."""
        return COMPAT_MARK in self.how


@dataclass
class TorchEval:
    """One candidate's evaluation: which lines passed, which failed and why."""

    name: str
    backend: Backend
    device: Optional[Device]
    tier: int
    order: int  # position of the variant in the matrix's newest-first order
    oks: List[LineOk] = field(default_factory=list)
    fails: List[Tuple[str, str, str]] = field(default_factory=list)  # (line, code, template with {rng})
    universe: List[str] = field(default_factory=list)  # lines that publish this variant here, oldest first
    collapsed: Optional[Tuple[str, str]] = None  # (code, reason) for a rejection before any line was checked
    covers: List[Device] = field(default_factory=list)
    candidate: Optional[Candidate] = None
    # ROCm ranking on one GPU (see _TorchResolver.rank_native_first): 0 first; 1 needs HSA_OVERRIDE_GFX_VERSION
    # where AMD's index runs the target's own code; 2 defers to a build that holds the target natively
    rank: int = 0
    rank_why: str = ""  # why the rank put it behind, for its "not chosen" text

    @property
    def best(self) -> Optional[LineOk]:
        return self.oks[0] if self.oks else None

    @property
    def top(self) -> LineOk:
        """The best line of an accepted evaluation (one with a line that passed)."""
        if not self.oks:
            raise ValueError(f"{self.name}: no torch line passed")
        return self.oks[0]

    @property
    def cand(self) -> Candidate:
        """The candidate made of this evaluation (once the resolver has made it)."""
        if self.candidate is None:
            raise ValueError(f"{self.name}: no candidate yet")
        return self.candidate

    @property
    def request_blocked(self) -> List[Tuple[str, str, str]]:
        return [f for f in self.fails if f[1] in REQUEST_CODES]

    def sort_key(self) -> tuple:
        if self.best:
            rel = self.best.release.version
            # same torch line: a build whose publication is confirmed first, then one the driver runs natively
            # before one that relies on minor-version compatibility
            unverified = bool(self.best.build.unverified or self.best.variant.unverified)
            return (0, self.rank, -rel.major, -rel.minor, unverified, self.best.via_compat, -len(self.covers), self.order)
        return (1, self.order)


def format_range(lines: Sequence[str], universe: Sequence[str]) -> str:
    """Release lines as compact text: ["2.7", "2.8", "2.9"] -> "2.7–2.9" (runs within ``universe``)."""
    pos = {line: i for i, line in enumerate(universe)}
    items = sorted(set(lines), key=lambda s: pos.get(s, 1 << 30))
    runs: List[List[str]] = []
    for line in items:
        if runs and pos.get(line, -5) == pos.get(runs[-1][-1], -9) + 1:
            runs[-1].append(line)
        else:
            runs.append([line])
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}\u2013{r[-1]}" for r in runs)


class TorchChecks:
    """Checks of torch builds against one machine; :class:`_TorchResolver` ranks and explains them."""

    def __init__(self, machine: Machine, request: Request, reqs: Requirements, matrix: TorchMatrix) -> None:
        self.m = machine
        self.request = request
        self.reqs = reqs
        self.matrix = matrix
        self.forced = request.backend.strip().lower()
        self.notes: List[str] = []
        self._checked: Dict[tuple, Tuple[Optional[Tuple[str, str]], Dict[str, str], str]] = {}

    # -- which backends a device could use ---------------------------------------------------
    def backends_for(self, dev: Optional[Device]) -> List[str]:
        if dev is None:
            return ["cpu"]
        os_name, vendor = self.m.os, dev.vendor
        out = []
        if os_name in ("linux", "windows"):
            out.append({"nvidia": "cuda", "amd": "rocm", "intel": "xpu"}.get(vendor, ""))
        if os_name == "macos":
            out.append("mps")
        if (os_name == "windows" or self.m.report.os.wsl) and vendor != "apple":
            out.append("directml")
        return [b for b in out if b]

    def device_problem(self, dev: Device, backend: str) -> Optional[Tuple[str, str]]:
        """Why ``backend`` cannot use ``dev`` at all (before any build is looked at)."""
        g, m = dev.first, self.m
        if backend == "cuda" and dev.jetson:
            return ("device", f"{dev.label} is a Jetson (Tegra) GPU: the aarch64 CUDA wheels on PyTorch's index and PyPI are built "
                              f"for ARM servers (SBSA) and have no kernels for it; {jetson_text(dev)}")
        if backend == "cuda":
            usable = m.api_usable("cuda", g.index)
            if usable is True or (usable is None and (dev.cuda_max or dev.driver)):
                return None
            if g.driver == "nouveau":
                return ("api", f"{dev.label} runs the open-source nouveau driver; CUDA needs NVIDIA's driver{branch_note(dev.cc)} "
                               "(install it, then run accelstack again)")
            evidence = m.api_evidence("cuda", g)
            if evidence and "installed" in evidence:
                # driver present, version unknown: not the same as no driver (the user need not install one)
                return ("api", f"CUDA could not be checked on {dev.label}: {evidence}; run nvidia-smi so its CUDA version is known")
            if not g.cuda_driver_version and not g.driver_version:
                return ("api", f"no working NVIDIA driver answered for {dev.label} (nvidia-smi missing or failing); install or repair the NVIDIA driver{branch_note(dev.cc)}")
            return ("api", f"CUDA is not usable on {dev.label}: {m.api_evidence('cuda', g) or 'the driver did not report a CUDA version'}")
        if backend == "rocm":
            if m.os not in ("linux", "windows"):
                return None  # the platform check explains it
            if not dev.gfx:
                why = "no KFD topology or rocminfo answer" if m.os == "linux" else "its PCI device id is not in accelstack's AMD table"
                return ("device", f"the gfx target of {dev.label} is unknown ({why}), so no ROCm build can be matched to it")
            if m.os == "linux" and m.api_usable("rocm", g.index) is False:
                ev = m.api_evidence("rocm", g)
                return ("api", f"ROCm cannot reach {dev.label}{' (' + ev + ')' if ev else ''}: the user needs the render and video groups, a container needs /dev/kfd and /dev/dri")
            return None
        if backend == "xpu":
            text = f"{g.name} {g.intel_generation}".lower()
            if not any(p.lower() in text for p in self.matrix.xpu_match):
                gen = f" ({g.intel_generation})" if g.intel_generation else ""
                return ("device", f"{dev.label}{gen} is not supported by PyTorch XPU builds (supported: {self.matrix.xpu_supported_text or ', '.join(self.matrix.xpu_match)})")
            if m.api_usable("xpu", g.index) is False:
                return ("api", f"XPU cannot reach {dev.label}: install Intel's GPU driver with Level Zero")
            return None
        if backend == "mps":
            if dev.vendor not in ("apple", "amd"):
                return ("device", f"torch's MPS backend runs on Apple silicon and AMD GPUs, not on {dev.label}")
            return None
        return None

    # -- one release line of one variant -------------------------------------------------------
    def check(self, dev: Optional[Device], rel: Release, var: Variant, build: PlatformBuild) -> Tuple[Optional[Tuple[str, str]], Dict[str, str], str]:
        """The first check this release line fails on ``dev`` (or None), the env it needs, and how it runs."""
        key = (dev.rank if dev is not None else -1, rel.torch, var.name)
        hit = self._checked.get(key)
        if hit is None:
            hit = self._checked[key] = self._check(dev, rel, var, build)
        return hit

    def _check(self, dev: Optional[Device], rel: Release, var: Variant, build: PlatformBuild) -> Tuple[Optional[Tuple[str, str]], Dict[str, str], str]:
        m = self.m
        env: Dict[str, str] = {}
        how = ""
        if m.os == "linux":
            if m.musl:
                return ("glibc", "PyTorch publishes no wheels for musl libc (Alpine); use a glibc-based system or container"), env, how
            floor = build.glibc or var.glibc or rel.glibc
            if floor and m.glibc is not None and m.glibc < version_of(floor):
                return ("glibc", f"torch {{rng}} {var.name} wheels need glibc >= {floor}; this system has glibc {m.report.os.libc_version}"), env, how
        if build.macos_min and m.macos is not None and m.macos < version_of(build.macos_min):
            what = "MPS builds need" if var.backend == "mps" else "wheels need"
            return ("os-version", f"torch {{rng}} {what} macOS {build.macos_min} or newer; this Mac runs macOS {m.report.os.version}"), env, how
        if build.windows_min_build and m.windows_build is not None and m.windows_build < build.windows_min_build:
            return ("os-version", f"{var.name} needs Windows build {build.windows_min_build} or newer; this Windows is build {m.windows_build}"), env, how
        if dev is not None and var.backend == "cuda":
            native = False
            if dev.cc:
                kernels = cuda_kernels_for(dev.cc, build.sm, build.ptx)
                if kernels is None:
                    return ("kernels", f"torch {{rng}} {var.name} builds have no kernels for {sm_name(dev.cc)} ({dev.name})"), env, how
                native = not kernels.startswith("compute_")
                how = f"it has {kernels} kernels for {dev.name}"
            else:
                how = f"the compute capability of {dev.name} is unknown, so its kernels could not be checked"
            fail, runs = self.driver_fail(dev, self.matrix.toolkit(var.cuda), var.name, native=native)
            if fail:
                return fail, env, how
            how += f"; {runs}"
        elif dev is not None and var.backend == "rocm":
            gfx = dev.gfx
            if gfx in var.broken_gfx:
                return ("kernels", f"{var.name} does not work on {gfx} ({dev.name}): {var.broken_gfx[gfx]}"), env, how
            if gfx in build.gfx:
                how = f"{gfx} ({dev.name}) is compiled in"
            elif gfx in build.gfx_build_only:
                how = f"{gfx} ({dev.name}) is built, but not release-tested by AMD on this OS"
            elif m.os == "windows":
                # HSA_OVERRIDE_GFX_VERSION is Linux-only: on Windows a target is built or it is not
                return ("kernels", f"{gfx} ({dev.name}) is not among the targets torch {{rng}} {var.name} is built for on Windows"), env, how
            else:
                refused = self.matrix.gfx_override_refused.get(gfx)
                override = self.matrix.gfx_overrides.get(gfx)
                if refused:
                    return ("kernels", f"{gfx} ({dev.name}) is not supported by torch {{rng}} {var.name}; {refused}"), env, how
                if override is None or override.target not in build.gfx:
                    return ("kernels", f"{gfx} ({dev.name}) is not supported by torch {{rng}} {var.name} (built for {', '.join(build.gfx)})"), env, how
                if not var.gfx_override:
                    return ("kernels", f"{gfx} ({dev.name}) is not in torch {{rng}} {var.name}, and this ROCm fails when HSA_OVERRIDE_GFX_VERSION is set"), env, how
                env = {"HSA_OVERRIDE_GFX_VERSION": override.value}
                how = f"{gfx} ({dev.name}) runs its {override.target} code with HSA_OVERRIDE_GFX_VERSION={override.value}"
            have = dev.first.hip_runtime
            if var.hip_runtime and m.os == "windows" and have != var.hip_runtime:
                what = f"HIP runtime {have} (amdhip64_{have}.dll)" if have else "no HIP runtime (amdhip64_*.dll)"
                return ("driver", f"torch {{rng}} {var.name} loads HIP {var.hip_runtime} (amdhip64_{var.hip_runtime}.dll); "
                                  f"the installed AMD driver has {what}: {var.driver_update}"), env, how
        elif dev is not None:
            how = f"it runs on {dev.name}"
        spec_text = var.python or rel.python
        if m.python is not None and not _python_ok(spec_text, m.python_text):
            return ("python", f"torch {{rng}} {_python_text(var.python or rel.python, m.python)}; the target environment has Python {m.python_text}"), env, how
        for name, s in self.reqs.specs.items():
            text = self.reqs.texts[name]
            if name == TORCH_PACKAGE:
                versions = (version_of(var.pins),) if var.pins else _line_versions(rel.torch, tuple(rel.versions))
                if not _allows(s, versions):
                    if var.pins:
                        return ("requirement", f"{var.package.split('=')[0]} pins torch {var.pins}, which your requirement {text} excludes"), env, how
                    return ("requirement", f"your requirement {text} excludes torch {{rng}}"), env, how
            else:
                line = rel.companions.get(name)
                if not line:
                    # no known companion (none published yet, as for torch 2.15): pip could not satisfy both
                    return ("requirement", f"you asked for {name}, and no {name} is known for torch {{rng}}"), env, how
                if not _allows(s, _line_versions(line)):
                    return ("requirement", f"your requirement {text} excludes the {name} that goes with torch {{rng}}"), env, how
        return None, env, how

    def driver_fail(self, dev: Device, tk: Optional[CudaToolkit], vname: str, *, native: bool = False) -> Tuple[Optional[Tuple[str, str]], str]:
        """Whether the driver runs ``vname``: NVIDIA's minor-version rule unless the request says strict.

        Without a known compute capability (``native`` False) the full toolkit version is required:
        whether the wheel has native code for the GPU cannot be checked.
        """
        if tk is None:
            return ("driver", f"the matrix has no driver minimums for {vname}"), ""
        why, how = cuda_driver_check(dev, tk.cuda, tk.driver.get(self.m.driver_os, ""), native=native,
                                     os_name=self.m.driver_os, what=vname, policy=self.request.cuda_driver)
        return (("driver", why) if why else None), how

    # -- a candidate ---------------------------------------------------------------------------
    def published_here(self, var: Optional[Variant]) -> bool:
        """Whether ``var`` (of some release line) has a build for one of this machine's platforms."""
        return var is not None and any(p in var.platforms for p in self.m.platforms)

    def evaluate(self, dev: Optional[Device], backend: Backend, name: str, tier: int, order: int) -> TorchEval:
        ev = TorchEval(name=name, backend=backend, device=dev, tier=tier, order=order)
        for rel in reversed(self.matrix.releases):
            if self.published_here(rel.variant(name)):
                ev.universe.append(rel.torch)
        if not ev.universe:
            ev.collapsed = ("platform", f"{name} is not published for {self.m.platform}")
            return ev
        for rel in self.matrix.releases:
            var = rel.variant(name)
            if var is None:
                continue
            build = next((var.platforms[p] for p in self.m.platforms if p in var.platforms), None)
            if build is None:
                continue
            fail, env, how = self.check(dev, rel, var, build)
            if fail is None:
                ev.oks.append(LineOk(rel, var, build, env, how))
            else:
                ev.fails.append((rel.torch, fail[0], fail[1]))
        # the newest line whose publication is confirmed goes first; an unconfirmed one only when no
        # confirmed line passes (a requirement that asks for it, or a fallback: the plan says which)
        ev.oks.sort(key=lambda ok: bool(ok.build.unverified or ok.variant.unverified))
        return ev

    def render_fails(self, ev: TorchEval, fails: List[Tuple[str, str, str]]) -> str:
        groups: Dict[Tuple[str, str], List[str]] = {}
        for line, code, template in fails:
            groups.setdefault((code, template), []).append(line)
        return "; ".join(t.replace("{rng}", format_range(lines, ev.universe)) for (_, t), lines in groups.items())

    def covers(self, ev: TorchEval) -> List[Device]:
        """The devices the candidate's best build runs on: its own, and same-vendor GPUs it also suits."""
        best, dev = ev.best, ev.device
        if best is None or dev is None:
            return []
        out = [dev]
        for other in self.m.devices:
            # an integrated GPU next to a discrete one would become device 0 as often as not
            if other is dev or other.vendor != dev.vendor or kind_rank(other) != kind_rank(dev):
                continue
            if self.device_problem(other, ev.backend):
                continue
            fail, env, _ = self.check(other, best.release, best.variant, best.build)
            if fail is not None:
                continue
            # HSA_OVERRIDE_GFX_VERSION is process-wide: another GPU shares the process only if it
            # needs the same override, or natively is the target the override maps to.
            override = self.matrix.gfx_overrides.get(dev.gfx) if best.env else None
            if env == best.env or (not env and override is not None and other.gfx == override.target):
                out.append(other)
        return out
