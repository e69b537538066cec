"""Choosing the torch wheel: rank the checked candidates, explain each, turn the winner into commands.

The checks themselves are in :mod:`accelstack.manifests.torch_checks`.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple, cast

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from ..domain import ApiName, Backend
from .hw_rules import jetson_text
from .machine import Device, Machine, slots, version_of, visible_devices_env, why_not_device, why_preferred
from .plan import PYTHON_PLACEHOLDER, Candidate, Command, Plan, Request, merge_identical_rejections
from .request import Requirements
from .torch_checks import BACKEND_TEXT, TorchEval, format_range
from .torch_device_rules import TorchDeviceRules
from .torch_matrix import TorchMatrix

__all__ = ["ENGINE_WHY", "engine_command", "resolve_torch", "without_engine"]

_GPU_API: Dict[str, ApiName] = {"cuda": "cuda", "rocm": "rocm", "xpu": "xpu"}
ENGINE_WHY = "the torch engine's packages, for accelstack generate --backend torch"


def engine_command(plan: Plan) -> Optional[Command]:
    """The plan's command that installs the torch engine's packages (None: the plan has none)."""
    return next((c for c in plan.commands if c.why == ENGINE_WHY), None)


def without_engine(plan: Plan) -> Plan:
    """``plan`` without the torch engine's packages: torch alone, for an app that runs its own code on it."""
    plan.commands = [c for c in plan.commands if c.why != ENGINE_WHY]
    plan.uv_commands = [c for c in plan.uv_commands if c.why != ENGINE_WHY]
    plan.notes = [n for n in plan.notes if not n.startswith(ENGINE_WHY)]
    return plan


class _TorchResolver(TorchDeviceRules):
    """Ranks the candidates :class:`TorchChecks` evaluates (with :class:`TorchDeviceRules`), explains them, and fills the plan."""

    # -- the whole resolution ------------------------------------------------------------------
    def run(self) -> Plan:
        m, matrix = self.m, self.matrix
        evals: List[TorchEval] = []
        for gpu in m.devices:
            if not self.backends_for(gpu):
                self.notes.append(f"{gpu.label}: torch has no GPU build for {gpu.vendor} GPUs on {m.os}")
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
            chosen.cand.chosen = True
        self.polish_reasons(evals, chosen)
        plan = Plan(stack="torch", summary="", request=self.request, candidates=merge_identical_rejections([e.cand for e in evals]))
        plan.conflicts = self.conflicts(evals, chosen)
        if chosen is None:
            plan.status = "unsatisfiable"
            plan.summary = self.nothing_summary(evals)
        else:
            self.fill_actions(plan, chosen)
            plan.device_reason = self.device_reason(evals, chosen)
            unread = self.unread_note(chosen.device, chosen.backend)
            if unread:
                plan.notes.append(unread)
        for d in m.devices:
            if d.jetson:
                self.notes.append(f"{d.label}: CPU torch from PyPI is planned; for its GPU, {jetson_text(d)}")
        if m.report.os.rosetta:
            self.notes.append("this Python runs under Rosetta (x86_64): install a native arm64 Python to use the Apple GPU (MPS)")
        if m.python is None:
            self.notes.append("the target Python version is unknown, so Python limits were not checked (name the target Python version)")
        if matrix.stale:
            self.notes.append(f"the bundled torch matrix expired on {matrix.envelope.expires}: newer torch releases are missing; update accelstack")
        plan.notes = self.notes + plan.notes
        return plan

    def evaluate_backend(self, dev: Optional[Device], backend_name: str, tier: int) -> List[TorchEval]:
        backend = cast(Backend, backend_name)
        names = self.matrix.variant_names(backend)
        if self.forced and self.forced not in (backend, *names):
            ev = TorchEval(name=backend, backend=backend, device=dev, tier=tier, order=0)
            ev.collapsed = ("forced-backend", f"not the requested backend {self.request.backend!r}")
            return [ev]
        if self.forced in names:
            names = [self.forced]
        published = [n for n in names if any(self.published_here(r.variant(n)) for r in self.matrix.releases)]
        if not published:
            ev = TorchEval(name=backend, backend=backend, device=dev, tier=tier, order=0)
            ev.collapsed = ("platform", f"torch publishes no {BACKEND_TEXT[backend]} builds for {self.m.platform} (in this matrix)")
            return [ev]
        problem = self.device_problem(dev, backend) if dev is not None else None
        if problem:
            ev = TorchEval(name=backend, backend=backend, device=dev, tier=tier, order=0)
            ev.collapsed = problem
            return [ev]
        out = [self.evaluate(dev, backend, n, tier, i) for i, n in enumerate(published)]
        for ev in out:
            ev.covers = self.covers(ev)
        if backend == "rocm" and dev is not None:
            self.rank_native_first(out, dev)
        out.sort(key=lambda e: e.sort_key())
        return out

    @staticmethod
    def rank_native_first(evals: List[TorchEval], dev: Device) -> None:
        """The GPU's own code first. A build marked ``defer_to_native`` (AMD's index on Linux) yields to
        any build that holds the target natively (PyTorch's own wheel), whatever torch it gives; where
        none does, it runs the target's own code and so ranks before HSA_OVERRIDE_GFX_VERSION, which
        runs another target's code (and which AMD's ROCm never gets)."""
        ok = [e for e in evals if e.best]
        native = sorted((e for e in ok if not e.top.build.defer_to_native and dev.gfx in e.top.build.gfx
                         and "HSA_OVERRIDE_GFX_VERSION" not in e.top.env), key=lambda e: e.sort_key())
        deferring = [e for e in ok if e.top.build.defer_to_native]
        for e in deferring:
            if native:
                e.rank = 2
                e.rank_why = f"PyTorch's own {native[0].name} holds {dev.gfx} natively ({e.top.build.defer_to_native})"
        own = [e for e in deferring if e.rank == 0]
        for e in ok:
            if own and "HSA_OVERRIDE_GFX_VERSION" in e.top.env:
                e.rank = 1
                e.rank_why = f"{own[0].name} runs {dev.gfx}'s own code, without HSA_OVERRIDE_GFX_VERSION"

    def candidate(self, ev: TorchEval, chosen: Optional[TorchEval]) -> Candidate:
        gpus = [i for d in (ev.covers or ([ev.device] if ev.device else [])) for i in d.indexes]
        if ev.collapsed:
            return Candidate(name=ev.name, backend=ev.backend, accepted=False, code=ev.collapsed[0],
                             reason=f"{ev.name} rejected: {ev.collapsed[1]}", gpus=gpus)
        best = ev.best
        if best is None:
            code = ev.fails[0][1] if ev.fails else "platform"
            return Candidate(name=ev.name, backend=ev.backend, accepted=False, code=code,
                             reason=f"{ev.name} rejected: {self.render_fails(ev, ev.fails)}", gpus=gpus)
        newer = [f for f in ev.fails if version_of(f[0]) > best.release.version]
        where = ev.device.label if ev.device else "the CPU"
        text = f"torch {best.release.torch} runs on {where}" + (f": {best.how}" if best.how else "")
        if len(ev.covers) > 1:
            text += f" (also on {', '.join(d.label for d in ev.covers[1:])})"
        if newer:
            text += f"; not newer: {self.render_fails(ev, newer)}"
        skipped = [ok.release.torch for ok in ev.oks if ok.release.version > best.release.version]
        if skipped:  # newer lines that would run, passed over because nobody confirmed their wheels
            text += (f"; not newer: the publication of torch {', '.join(skipped)} is unverified "
                     f"(ask for torch=={skipped[0]}.* to use it)")
        if best.build.unverified or best.variant.unverified:
            text += " [publication unverified]"
        verdict = "chosen" if ev is chosen else "accepted"
        return Candidate(name=ev.name, backend=ev.backend, accepted=True, code=verdict,
                         reason=f"{ev.name} {verdict}: {text}", gpus=gpus, torch_version=best.release.torch)

    def polish_reasons(self, evals: List[TorchEval], chosen: Optional[TorchEval]) -> None:
        """Add the actionable alternative to driver rejections, and why accepted ones lost."""
        for e in evals:
            c = e.cand
            if c.code == "driver":
                alt = chosen.name if chosen is not None and chosen.backend == e.backend and chosen.device is e.device else ""
                if alt:
                    c.reason += f" (or use {alt})"
            elif c.accepted and e is not chosen and chosen is not None:
                c.reason += f" \u2014 not chosen: {self.why_not(e, chosen)}"

    def why_not(self, e: TorchEval, chosen: TorchEval) -> str:
        if e.device is chosen.device and e.backend == chosen.backend:
            if e.rank_why and e.rank > chosen.rank:
                return e.rank_why
            a, b = e.top.release.version, chosen.top.release.version
            if b > a:
                return f"{chosen.name} gives a newer torch ({chosen.top.release.torch})"
            if len(chosen.covers) > len(e.covers):
                return f"{chosen.name} also runs on {', '.join(d.label for d in chosen.covers if d not in e.covers)}"
            return f"{chosen.name} is the newer {BACKEND_TEXT[chosen.backend]} build of torch {chosen.top.release.torch}"
        return why_not_device(e.device, e.tier, BACKEND_TEXT[e.backend], chosen.device, chosen.tier, BACKEND_TEXT[chosen.backend])

    def device_reason(self, evals: List[TorchEval], chosen: TorchEval) -> str:
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
                parts.append(f"{d.label}: only {', '.join(sorted({BACKEND_TEXT[e.backend] for e in works}))} would run there")
        return f"{chosen.device.label} is used; " + "; ".join(parts) if parts else ""

    def conflicts(self, evals: List[TorchEval], chosen: Optional[TorchEval]) -> List[str]:
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
        msg = (f"{' and '.join(asked) or 'the request'} leaves no {BACKEND_TEXT[first.backend]} build that runs on {where}: "
               f"{'; '.join(blockers)}. What would work: {', '.join(alternatives[:5])}.")
        if chosen is not None:
            msg += f" Using {chosen.name} (torch {chosen.top.release.torch}) instead."
        return [msg]

    def nothing_summary(self, evals: List[TorchEval]) -> str:
        if self.forced:
            return f"no torch build for backend {self.request.backend!r} runs on this machine (torch backends: {', '.join(b for t in self.matrix.backend_tiers for b in t)})"
        return f"no torch build in the matrix runs on this machine as requested ({self.m.platform}); see the rejected candidates"

    # -- actions -------------------------------------------------------------------------------
    def fill_actions(self, plan: Plan, ev: TorchEval) -> None:
        best, m, matrix = ev.top, self.m, self.matrix
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
        # AMD's multi-arch index: the extra picks each GPU's kernels, on torch and torchvision alike
        gfx = sorted({d.gfx for d in ev.covers if d.gfx}) if var.device_extra else []
        device_extras = ",".join(var.device_extra.replace("{gfx}", g) for g in gfx)
        for name in ("torchvision", "torchaudio"):
            if name in self.reqs.specs or (device_extras and name == "torchvision" and name in rel.companions):
                line = rel.companions.get(name)
                if line:
                    packages.append(self.pin(name, line))
                else:
                    packages.append(self.reqs.texts[name])
                    plan.notes.append(f"the matrix does not say which {name} goes with torch {rel.torch}; pip picks one")
        if device_extras:
            packages = [_with_extra(p, device_extras) if p.startswith(("torch=", "torchvision=")) else p for p in packages]
            late = [f"{d.gfx} ({d.name})" for d in ev.covers if d.gfx in build.gfx_build_only]
            if late:
                plan.notes.append(f"warning: AMD builds {var.name} for {', '.join(late)} but has not release-tested it on this OS; "
                                  "if torch does not find the GPU, the next candidate is the fallback")
            if self.m.os == "linux":
                plan.notes.append(f"{var.name} is AMD's ROCm, which fails to start when HSA_OVERRIDE_GFX_VERSION is set: "
                                  "unset it where torch runs (the plan sets none)")
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
        engine = self.engine_packages()
        if engine:  # with the torch pins, which the installed torch meets: pip keeps it rather than take PyPI's
            engine = engine + packages
            plan.commands.append(Command("pip", [PYTHON_PLACEHOLDER, "-m", "pip", "install", *engine], ENGINE_WHY))
            plan.uv_commands.append(Command("uv", ["uv", "pip", "install", "--python", PYTHON_PLACEHOLDER, *engine], ENGINE_WHY))
            plan.notes.append(f"{ENGINE_WHY}: {', '.join(engine[:-len(packages)])}")
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
            api = _GPU_API.get(ev.backend)
            if api is not None:
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
        unverified = build.unverified or var.unverified
        if unverified:
            older = next((r.torch for r in matrix.releases if r.version < rel.version and r.variant(var.name)), "")
            asked = any(code == "requirement" for _, code, _ in ev.fails)  # a confirmed line was excluded by the request
            why = ("because your requirement excludes every release whose publication is confirmed" if asked else
                   "as a fallback: no release whose publication is confirmed runs here")
            plan.notes.append(f"unverified: that torch {rel.torch} publishes {var.name} for {m.platform} is not confirmed "
                              f"({unverified}); chosen {why}")
            if older:
                plan.notes[-1] += f"; if pip finds no such wheel, ask for torch<{rel.torch} (torch {older} {var.name})"
        target = ev.device.label if ev.device else "the CPU"
        plan.summary = f"torch {rel.torch} ({ev.name}) for {target}"
        if ev.device is None and m.devices:
            plan.summary += ": no GPU build runs on this machine's GPUs"
        elif ev.device is None:
            plan.summary += ": no supported GPU found"

    def engine_packages(self) -> List[str]:
        """The torch engine's packages, unless the request says it does not want the engine
        (``Request.engine`` false); a package the user names in a requirement is theirs to pin."""
        if not getattr(self.request, "engine", True):
            return []
        mine = {canonicalize_name(Requirement(text).name) for text in self.reqs.others}
        return [p for p in self.matrix.engine_packages if canonicalize_name(Requirement(p).name) not in mine]

    def pin(self, name: str, line: str) -> str:
        spec = SpecifierSet(f"=={line}.*")
        user = self.reqs.specs.get(name)
        if user is not None and str(user):
            spec &= user
        # "==2.14.*" first reads best; SpecifierSet's own str() sorts alphabetically
        parts = [f"=={line}.*"] + sorted(str(s) for s in spec if str(s) != f"=={line}.*")
        return name + ",".join(parts)


def _with_extra(requirement: str, extra: str) -> str:
    """``torch==2.14.*`` with ``device-gfx1100`` -> ``torch[device-gfx1100]==2.14.*``."""
    name = Requirement(requirement).name
    return f"{name}[{extra}]{requirement[len(name):]}"


def resolve_torch(machine: Machine, request: Request, reqs: Requirements, matrix: Optional[TorchMatrix]) -> Plan:
    if matrix is None:
        return Plan(stack="torch", status="unsatisfiable", request=request,
                    summary="no torch matrix was given to the resolver", notes=["load one with Manifests.builtin()"])
    return _TorchResolver(machine, request, reqs, matrix).run()
