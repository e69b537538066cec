"""Choosing the torch wheel: walk the matrix in preference order, check each build, explain.

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
from typing import Dict, List, Optional, Tuple

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .machine import Device, Machine, kind_rank, slots, sm_name, why_not_device, why_preferred
from .plan import PYTHON_PLACEHOLDER, Candidate, Command, Plan, Request
from .resolve import Requirements, cuda_kernels_for, format_range, visible_devices_env
from .torch_matrix import CudaToolkit, PlatformBuild, Release, TorchMatrix, Variant

REQUEST_CODES = ("python", "requirement")
_BACKEND_TEXT = {"cuda": "CUDA", "rocm": "ROCm", "xpu": "XPU", "mps": "MPS", "directml": "DirectML", "cpu": "CPU"}


@functools.lru_cache(maxsize=512)
def _v(text: str) -> Version:
    return Version(text)


@functools.lru_cache(maxsize=512)
def _line_versions(line: str, known: Tuple[str, ...] = ()) -> Tuple[Version, ...]:
    """Versions a release line may hold: the known ones and patch numbers 0-9 (for pins such as ==2.6.3)."""
    base = _v(line)
    probes = {Version(f"{base.major}.{base.minor}.{p}") for p in range(10)}
    probes.update(_v(k) for k in known)
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
        bound = _v(s.version)
        if s.operator in (">=", ">") and not s.contains(py):
            return f"needs Python >= {bound}"
        if s.operator in ("<", "<=") and not s.contains(py):
            top = bound if s.operator == "<=" else Version(f"{bound.major}.{bound.minor - 1}") if bound.minor else bound
            return f"supports Python up to {top}"
    return f"needs Python {spec_text}"


@dataclass
class _Ok:
    release: Release
    variant: Variant
    build: PlatformBuild
    env: Dict[str, str]
    how: str


@dataclass
class _Eval:
    """One candidate's evaluation: which lines passed, which failed and why."""

    name: str
    backend: str
    device: Optional[Device]
    tier: int
    order: int  # position of the variant in the matrix's newest-first order
    oks: List[_Ok] = field(default_factory=list)
    fails: List[Tuple[str, str, str]] = field(default_factory=list)  # (line, code, template with {rng})
    universe: List[str] = field(default_factory=list)  # lines that publish this variant here, oldest first
    collapsed: Optional[Tuple[str, str]] = None  # (code, reason) for a rejection before any line was checked
    covers: List[Device] = field(default_factory=list)
    candidate: Optional[Candidate] = None

    @property
    def best(self) -> Optional[_Ok]:
        return self.oks[0] if self.oks else None

    @property
    def request_blocked(self) -> List[Tuple[str, str, str]]:
        return [f for f in self.fails if f[1] in REQUEST_CODES]

    def sort_key(self) -> tuple:
        if self.best:
            rel = self.best.release.version
            return (0, -rel.major, -rel.minor, -len(self.covers), self.order)
        return (1, self.order)


class _TorchResolver:
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
        if backend == "cuda":
            usable = m.api_usable("cuda", g.index)
            if usable is True or (usable is None and (dev.cuda_max or dev.driver)):
                return None
            if g.driver == "nouveau":
                return ("api", f"{dev.label} runs the open-source nouveau driver; CUDA needs NVIDIA's driver (install it, then run accelstack again)")
            if not g.cuda_driver_version and not g.driver_version:
                return ("api", f"no working NVIDIA driver answered for {dev.label} (nvidia-smi missing or failing); install or repair the NVIDIA driver")
            return ("api", f"CUDA is not usable on {dev.label}: {m.api_evidence('cuda', g) or 'the driver did not report a CUDA version'}")
        if backend == "rocm":
            if m.os != "linux":
                return None  # the platform check explains it
            if not dev.gfx:
                return ("device", f"the gfx target of {dev.label} is unknown (no KFD topology or rocminfo answer), so no ROCm build can be matched to it")
            if m.api_usable("rocm", g.index) is False:
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
            if floor and m.glibc is not None and m.glibc < _v(floor):
                return ("glibc", f"torch {{rng}} {var.name} wheels need glibc >= {floor}; this system has glibc {m.report.os.libc_version}"), env, how
        if build.macos_min and m.macos is not None and m.macos < _v(build.macos_min):
            what = "MPS builds need" if var.backend == "mps" else "wheels need"
            return ("os-version", f"torch {{rng}} {what} macOS {build.macos_min} or newer; this Mac runs macOS {m.report.os.version}"), env, how
        if build.windows_min_build and m.windows_build is not None and m.windows_build < build.windows_min_build:
            return ("os-version", f"{var.name} needs Windows build {build.windows_min_build} or newer; this Windows is build {m.windows_build}"), env, how
        if dev is not None and var.backend == "cuda":
            if dev.cc:
                kernels = cuda_kernels_for(dev.cc, build.sm, build.ptx)
                if kernels is None:
                    return ("kernels", f"torch {{rng}} {var.name} builds have no kernels for {sm_name(dev.cc)} ({dev.name})"), env, how
                how = f"it has {kernels} kernels for {dev.name}"
            else:
                how = f"the compute capability of {dev.name} is unknown, so its kernels could not be checked"
            fail = self.driver_fail(dev, self.matrix.toolkit(var.cuda), var.name)
            if fail:
                return fail, env, how
            how += f"; the driver runs CUDA {dev.first.cuda_driver_version or '>= ' + var.cuda}"
        elif dev is not None and var.backend == "rocm":
            gfx = dev.gfx
            if gfx in var.broken_gfx:
                return ("kernels", f"{var.name} does not work on {gfx} ({dev.name}): {var.broken_gfx[gfx]}"), env, how
            if gfx in build.gfx:
                how = f"{gfx} ({dev.name}) is compiled in"
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
        elif dev is not None:
            how = f"it runs on {dev.name}"
        spec_text = var.python or rel.python
        if m.python is not None and not _python_ok(spec_text, m.python_text):
            return ("python", f"torch {{rng}} {_python_text(var.python or rel.python, m.python)}; the target environment has Python {m.python_text}"), env, how
        for name, s in self.reqs.specs.items():
            text = self.reqs.texts[name]
            if name == "torch":
                versions = (_v(var.pins),) if var.pins else _line_versions(rel.torch, tuple(rel.versions))
                if not _allows(s, versions):
                    if var.pins:
                        return ("requirement", f"{var.package.split('=')[0]} pins torch {var.pins}, which your requirement {text} excludes"), env, how
                    return ("requirement", f"your requirement {text} excludes torch {{rng}}"), env, how
            else:
                line = rel.companions.get(name)
                if line and not _allows(s, _line_versions(line)):
                    return ("requirement", f"your requirement {text} excludes the {name} that goes with torch {{rng}}"), env, how
        return None, env, how

    def driver_fail(self, dev: Device, tk: Optional[CudaToolkit], vname: str) -> Optional[Tuple[str, str]]:
        if tk is None:
            return ("driver", f"the matrix has no driver minimums for {vname}")
        os_text = "Windows" if self.m.driver_os == "windows" else "Linux"
        min_drv = tk.driver.get(self.m.driver_os, "")
        g = dev.first
        if dev.cuda_max is not None:
            if dev.cuda_max >= tk.version:
                return None
            who = f"NVIDIA driver {g.driver_version}" if g.driver_version else "The NVIDIA driver"
            tail = f" (driver >= {min_drv} on {os_text})" if min_drv else ""
            return ("driver", f"{who} supports CUDA up to {g.cuda_driver_version}; {vname} needs CUDA {tk.cuda}{tail}")
        if dev.driver is not None:
            if not min_drv:
                return ("driver", f"NVIDIA driver {g.driver_version} reported no CUDA version, and NVIDIA publishes no {os_text} minimum for CUDA {tk.cuda}")
            if dev.driver >= _v(min_drv):
                return None
            return ("driver", f"NVIDIA driver {g.driver_version} is older than {min_drv}, the minimum for CUDA {tk.cuda} ({vname}) on {os_text}")
        return ("driver", f"the CUDA version of the NVIDIA driver is unknown; {vname} needs CUDA {tk.cuda}")

    # -- a candidate ---------------------------------------------------------------------------
    def evaluate(self, dev: Optional[Device], backend: str, name: str, tier: int, order: int) -> _Eval:
        ev = _Eval(name=name, backend=backend, device=dev, tier=tier, order=order)
        for rel in reversed(self.matrix.releases):
            var = rel.variant(name)
            if var is not None and any(p in var.platforms for p in self.m.platforms):
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
                ev.oks.append(_Ok(rel, var, build, env, how))
            else:
                ev.fails.append((rel.torch, fail[0], fail[1]))
        return ev

    def render_fails(self, ev: _Eval, fails: List[Tuple[str, str, str]]) -> str:
        groups: Dict[Tuple[str, str], List[str]] = {}
        for line, code, template in fails:
            groups.setdefault((code, template), []).append(line)
        return "; ".join(t.replace("{rng}", format_range(lines, ev.universe)) for (_, t), lines in groups.items())

    def covers(self, ev: _Eval) -> List[Device]:
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

    # -- the whole resolution ------------------------------------------------------------------
    def run(self) -> Plan:
        m, matrix = self.m, self.matrix
        evals: List[_Eval] = []
        for dev in m.devices:
            if not self.backends_for(dev):
                self.notes.append(f"{dev.label}: torch has no GPU build for {dev.vendor} GPUs on {m.os}")
        for tier_i, dev, backend in slots(m.devices, matrix.backend_tiers):
            if backend in self.backends_for(dev):
                evals.extend(self.evaluate_backend(dev, backend, tier_i))
        chosen = next((e for e in evals if e.best), None)
        if chosen is not None and len(chosen.covers) > 1:
            # GPUs the chosen build also runs on are part of the choice, not rivals to it
            also = [d for d in chosen.covers if d is not chosen.device]
            evals = [e for e in evals if e.device not in also]
        for e in evals:
            e.candidate = self.candidate(e, chosen)
        if chosen is not None:
            chosen.candidate.chosen = True
        self.polish_reasons(evals, chosen)
        plan = Plan(stack="torch", ok=False, summary="", request=self.request, candidates=[e.candidate for e in evals])
        plan.conflicts = self.conflicts(evals, chosen)
        if chosen is None:
            plan.status = "unsatisfiable"
            plan.summary = self.nothing_summary(evals)
        else:
            self.fill_actions(plan, chosen)
            plan.device_reason = self.device_reason(evals, chosen)
        plan.ok = plan.status == "ready" and not plan.conflicts
        if m.report.os.rosetta:
            self.notes.append("this Python runs under Rosetta (x86_64): install a native arm64 Python to use the Apple GPU (MPS)")
        if m.python is None:
            self.notes.append("the target Python version is unknown, so Python limits were not checked (pass --python X.Y)")
        if matrix.stale:
            self.notes.append(f"the bundled torch matrix expired on {matrix.envelope.expires}: newer torch releases are missing; update accelstack")
        plan.notes = self.notes + plan.notes
        return plan

    def evaluate_backend(self, dev: Optional[Device], backend: str, tier: int) -> List[_Eval]:
        names = self.matrix.variant_names(backend)
        if self.forced and self.forced not in (backend, *names):
            ev = _Eval(name=backend, backend=backend, device=dev, tier=tier, order=0)
            ev.collapsed = ("forced-backend", f"not the requested backend {self.request.backend!r}")
            return [ev]
        if self.forced in names:
            names = [self.forced]
        published = [n for n in names if any((r.variant(n) is not None and any(p in r.variant(n).platforms for p in self.m.platforms)) for r in self.matrix.releases)]
        if not published:
            ev = _Eval(name=backend, backend=backend, device=dev, tier=tier, order=0)
            ev.collapsed = ("platform", f"torch publishes no {_BACKEND_TEXT[backend]} builds for {self.m.platform} (in this matrix)")
            return [ev]
        problem = self.device_problem(dev, backend) if dev is not None else None
        if problem:
            ev = _Eval(name=backend, backend=backend, device=dev, tier=tier, order=0)
            ev.collapsed = problem
            return [ev]
        out = [self.evaluate(dev, backend, n, tier, i) for i, n in enumerate(published)]
        for ev in out:
            ev.covers = self.covers(ev)
        out.sort(key=lambda e: e.sort_key())
        return out

    def candidate(self, ev: _Eval, chosen: Optional[_Eval]) -> Candidate:
        gpus = [i for d in (ev.covers or ([ev.device] if ev.device else [])) for i in d.indexes]
        if ev.collapsed:
            return Candidate(name=ev.name, backend=ev.backend, accepted=False, code=ev.collapsed[0],
                             reason=f"{ev.name} rejected: {ev.collapsed[1]}", gpus=gpus)
        best = ev.best
        if best is None:
            code = ev.fails[0][1] if ev.fails else "platform"
            return Candidate(name=ev.name, backend=ev.backend, accepted=False, code=code,
                             reason=f"{ev.name} rejected: {self.render_fails(ev, ev.fails)}", gpus=gpus)
        newer = [f for f in ev.fails if _v(f[0]) > best.release.version]
        where = ev.device.label if ev.device else "the CPU"
        text = f"torch {best.release.torch} runs on {where}" + (f": {best.how}" if best.how else "")
        if len(ev.covers) > 1:
            text += f" (also on {', '.join(d.label for d in ev.covers[1:])})"
        if newer:
            text += f"; not newer: {self.render_fails(ev, newer)}"
        verdict = "chosen" if ev is chosen else "accepted"
        return Candidate(name=ev.name, backend=ev.backend, accepted=True, code=verdict,
                         reason=f"{ev.name} {verdict}: {text}", gpus=gpus, torch_version=best.release.torch)

    def polish_reasons(self, evals: List[_Eval], chosen: Optional[_Eval]) -> None:
        """Add the actionable alternative to driver rejections, and why accepted ones lost."""
        for e in evals:
            c = e.candidate
            if c.code == "driver":
                alt = chosen.name if chosen is not None and chosen.backend == e.backend and chosen.device is e.device else ""
                c.reason += f" (update the NVIDIA driver{', or use ' + alt if alt else ''})"
            elif c.accepted and e is not chosen and chosen is not None:
                c.reason += f" \u2014 not chosen: {self.why_not(e, chosen)}"

    def why_not(self, e: _Eval, chosen: _Eval) -> str:
        if e.device is chosen.device and e.backend == chosen.backend:
            a, b = e.best.release.version, chosen.best.release.version
            if b > a:
                return f"{chosen.name} gives a newer torch ({chosen.best.release.torch})"
            if len(chosen.covers) > len(e.covers):
                return f"{chosen.name} also runs on {', '.join(d.label for d in chosen.covers if d not in e.covers)}"
            return f"{chosen.name} is the newer {_BACKEND_TEXT[chosen.backend]} build of torch {chosen.best.release.torch}"
        return why_not_device(e.device, e.tier, _BACKEND_TEXT[e.backend], chosen.device, chosen.tier, _BACKEND_TEXT[chosen.backend])

    def device_reason(self, evals: List[_Eval], chosen: _Eval) -> str:
        others = [d for d in self.m.devices if d not in chosen.covers and d is not chosen.device]
        if chosen.device is None:
            if not self.m.devices:
                return "no GPU was found"
            return "no GPU build runs on " + ", ".join(d.label for d in self.m.devices) + " (see the rejected candidates)"
        parts = [f"{d.label}: used as well" for d in chosen.covers if d is not chosen.device]
        for d in others:
            works = [e for e in evals if e.device is d and e.best]
            if not works:
                asked = any(e.request_blocked for e in evals if e.device is d)
                parts.append(f"{d.label}: no torch build runs on it{' as requested' if asked else ''}")
            elif d.rank > chosen.device.rank:
                parts.append(f"{d.label}: ranks lower ({why_preferred(chosen.device, d)})")
            else:
                parts.append(f"{d.label}: only {', '.join(sorted({_BACKEND_TEXT[e.backend] for e in works}))} would run there")
        return f"{chosen.device.label} is used; " + "; ".join(parts) if parts else ""

    def conflicts(self, evals: List[_Eval], chosen: Optional[_Eval]) -> List[str]:
        """Parts of the request that cost this machine its best device/backend, with what would work."""
        first = next((e for e in evals if e.best or e.request_blocked), None)
        if first is None or first.best is not None and first is chosen:
            return []
        if chosen is not None and first.device is chosen.device and first.backend == chosen.backend:
            return []
        group = [e for e in evals if e.device is first.device and e.backend == first.backend]
        universe = [r.torch for r in reversed(self.matrix.releases)]
        by_template: Dict[str, List[str]] = {}
        options: List[Tuple[Version, str]] = []
        for e in group:
            blocked = e.request_blocked
            for line, _code, template in blocked:
                by_template.setdefault(template, []).append(line)
            if blocked:
                line, code, _t = blocked[0]
                rel = next(r for r in self.matrix.releases if r.torch == line)
                alt = f"torch {line} {e.name}"
                if code == "python":
                    var = rel.variant(e.name)
                    alt += f" (Python {(var.python if var else '') or rel.python})"
                options.append((rel.version, alt))
        blockers = [t.replace("{rng}", format_range(lines, universe)) for t, lines in by_template.items()]
        alternatives = [a for _, a in sorted(options, key=lambda o: o[0], reverse=True)]
        asked = [self.reqs.texts[n] for n in self.reqs.specs] + ([f"Python {self.m.python_text}"] if any(c == "python" for e in group for _, c, _ in e.request_blocked) else [])
        where = first.device.label if first.device else "the CPU"
        msg = (f"{' and '.join(asked) or 'the request'} leaves no {_BACKEND_TEXT[first.backend]} build that runs on {where}: "
               f"{'; '.join(blockers)}. What would work: {', '.join(alternatives[:5])}.")
        if chosen is not None:
            msg += f" Using {chosen.name} (torch {chosen.best.release.torch}) instead."
        return [msg]

    def nothing_summary(self, evals: List[_Eval]) -> str:
        if self.forced:
            return f"no torch build for backend {self.request.backend!r} runs on this machine (torch backends: {', '.join(b for t in self.matrix.backend_tiers for b in t)})"
        return f"no torch build in the matrix runs on this machine as requested ({self.m.platform}); see the rejected candidates"

    # -- actions -------------------------------------------------------------------------------
    def fill_actions(self, plan: Plan, ev: _Eval) -> None:
        best, m, matrix = ev.best, self.m, self.matrix
        rel, var, build = best.release, best.variant, best.build
        plan.status = "ready"
        plan.backend, plan.variant, plan.torch_version = ev.backend, ev.name, rel.torch
        plan.gpus = [i for d in ev.covers for i in d.indexes]
        packages: List[str] = []
        if var.package:
            packages.append(var.package)
            plan.notes.append(f"{var.package.split('=')[0]} installs torch {var.pins} itself; it is no longer developed, so CUDA, ROCm or XPU builds are better where they run")
        else:
            packages.append(self.pin("torch", rel.torch))
        for name in ("torchvision", "torchaudio"):
            if name in self.reqs.specs:
                line = rel.companions.get(name)
                if line:
                    packages.append(self.pin(name, line))
                else:
                    packages.append(self.reqs.texts[name])
                    plan.notes.append(f"the matrix does not say which {name} goes with torch {rel.torch}; pip picks one")
        plan.packages = packages
        index = build.index or var.index
        url = "" if index == "pypi" else (index or matrix.index_url.replace("{variant}", var.name))
        plan.index_url = url
        idx_args = ["--index-url", url] if url else []
        plan.commands = [Command("pip", [PYTHON_PLACEHOLDER, "-m", "pip", "install", *packages, *idx_args], "install the chosen torch build")]
        plan.uv_commands = [Command("uv", ["uv", "pip", "install", "--python", PYTHON_PLACEHOLDER, *packages, *idx_args], "install the chosen torch build")]
        if self.reqs.others:
            plan.commands.append(Command("pip", [PYTHON_PLACEHOLDER, "-m", "pip", "install", *self.reqs.others], "your other requirements, from PyPI"))
            plan.uv_commands.append(Command("uv", ["uv", "pip", "install", "--python", PYTHON_PLACEHOLDER, *self.reqs.others], "your other requirements, from PyPI"))
        for extra in rel.extras:
            if (extra.backends and ev.backend not in extra.backends) or (extra.platforms and not set(extra.platforms) & set(m.platforms)):
                continue
            if extra.install == "optional":
                plan.optional_packages.append(f"{extra.package}{extra.spec}")
                plan.notes.append(f"optional: {extra.package}{extra.spec} ({extra.why})")
            else:
                plan.notes.append(f"{extra.package}: {extra.why}")
        env: Dict[str, str] = dict(best.env)
        if ev.device is not None:
            api = {"cuda": "cuda", "rocm": "rocm", "xpu": "xpu"}.get(ev.backend, "")
            if api:
                env.update(visible_devices_env(m, ev.device.vendor, plan.gpus, api))
        if ev.backend == "mps":
            env["PYTORCH_ENABLE_MPS_FALLBACK"] = "1"
        if ev.backend == "directml" and ev.device is not None and len(m.report.gpus) > 1:
            plan.notes.append(f"torch-directml numbers adapters as DirectX does; pick {ev.device.label} with torch_directml.device(<index>)")
        plan.env = env
        if ev.device is not None and not ev.device.cc and ev.backend == "cuda":
            plan.notes.append(f"the compute capability of {ev.device.name} is unknown; if torch reports 'no kernel image is available', choose an older CUDA variant")
        if "PTX" in best.how:
            plan.notes.append("this build reaches the GPU through PTX: the first start compiles kernels and can take minutes")
        target = ev.device.label if ev.device else "the CPU"
        plan.summary = f"torch {rel.torch} ({ev.name}) for {target}"
        if ev.device is None and m.devices:
            plan.summary += ": no GPU build runs on this machine's GPUs"
        elif ev.device is None:
            plan.summary += ": no supported GPU found"

    def pin(self, name: str, line: str) -> str:
        spec = SpecifierSet(f"=={line}.*")
        user = self.reqs.specs.get(name)
        if user is not None and str(user):
            spec &= user
        # "==2.14.*" first reads best; SpecifierSet's own str() sorts alphabetically
        parts = [f"=={line}.*"] + sorted(str(s) for s in spec if str(s) != f"=={line}.*")
        return name + ",".join(parts)


def resolve_torch(machine: Machine, request: Request, reqs: Requirements, matrix: Optional[TorchMatrix]) -> Plan:
    if matrix is None:
        return Plan(stack="torch", ok=False, status="unsatisfiable", request=request,
                    summary="no torch matrix was given to the resolver", notes=["load one with Manifests.builtin()"])
    return _TorchResolver(machine, request, reqs, matrix).run()
