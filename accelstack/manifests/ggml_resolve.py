"""Choosing the ggml build: match published variant targets to the machine, or say what to build.

A ggml target is chosen by its properties (os, arch, backend, requirements) against the machine's
facts. The best backend the *hardware* supports is worked out independently of what is published,
so when no artifact fits — or only a worse one does — the plan still names the backend and the
properties a local build needs (``Plan.build``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, cast

from ..domain import Backend
from ..hardware.report import VulkanDevice
from ..serde import plural, size_text
from .build_targets import build_archs, build_variant
from .ggml_checks import BACKEND_TEXT, GgmlChecks
from .ggml_manifest import DEFAULT_GGML_TIERS, GgmlTarget
from .hw_rules import driver_unread, hw_rules, unread_driver_note
from .knowledge import Manifests
from .machine import (
    Device,
    Machine,
    kind_rank,
    slots,
    sm_name,
    visible_devices_env,
    why_not_device,
    why_preferred,
)
from .plan import BuildSpec, Candidate, Plan, Request, merge_identical_rejections
from .request import Requirements

__all__ = ["BUILD_FEATURES", "resolve_ggml"]

# CPU features a build may be specialised for (what a local build's flags depend on), in detection's
# normalized names (accelstack.hardware.cpu: "sse4.2", "avx512vnni", "avxvnni", "amx"); a name detection
# never writes would silently drop out of the spec (tests/manifests/test_cpu_feature_names.py).
BUILD_FEATURES = ("sse4.2", "avx", "avx2", "fma", "f16c", "bmi2", "avxvnni", "avx512f", "avx512bw", "avx512vl",
                  "avx512vnni", "avx512bf16", "amx", "neon", "dotprod", "fp16", "i8mm", "sve", "sve2", "sme")


@dataclass
class _Eval:
    name: str
    backend: Backend
    device: Optional[Device]
    tier: int
    target: Optional[GgmlTarget] = None
    order: int = 0
    fail: Optional[Tuple[str, str]] = None  # (code, reason)
    how: str = ""
    covers: List[Device] = field(default_factory=list)
    vk: Optional[VulkanDevice] = None  # a Vulkan build on a CPU-type Vulkan device (lavapipe), forced

    @property
    def where(self) -> str:
        if self.device is not None:
            return self.device.label
        if self.vk is not None:
            return f"Vulkan device {self.vk.index} {self.vk.name} (a CPU-type device)"
        return "the CPU"

    @property
    def ok(self) -> bool:
        return self.target is not None and self.fail is None

    @property
    def tgt(self) -> GgmlTarget:
        """The target of an evaluation that has one (every accepted one does)."""
        if self.target is None:
            raise ValueError(f"{self.name}: no target")
        return self.target

    def sort_key(self) -> tuple:
        prio = -(self.target.priority if self.target else 0)
        return (0 if self.ok else 1, prio, self.order)


class _GgmlResolver(GgmlChecks):
    """Ranks the targets :class:`GgmlChecks` passes, explains them, and fills the plan (or the local build)."""

    def __init__(self, machine: Machine, request: Request, reqs: Requirements, manifests: Manifests) -> None:
        super().__init__(machine, request)
        self.reqs = reqs
        self.manifests = manifests
        self.forced = request.backend.strip().lower()
        self.targets = [
            t for mf in manifests.ggml for t in mf.targets if t.os == machine.os and t.arch == machine.arch
        ]
        self.tiers = manifests.ggml[0].backend_tiers if manifests.ggml else [list(t) for t in DEFAULT_GGML_TIERS]
        self.notes: List[str] = []
        self.build_rejects: List[Candidate] = []  # local builds that could never run, with why

    def backends_for(self, dev: Optional[Device]) -> List[str]:
        if dev is None:
            # A CPU-type Vulkan device (lavapipe) is a candidate too, so the plan says why it is not used.
            return ["cpu", "vulkan"] if self.m.cpu_vulkan_devices() and self.m.os != "macos" else ["cpu"]
        if self.m.os == "macos":
            return ["metal"]
        native = {"nvidia": "cuda", "amd": "rocm", "intel": "sycl"}.get(dev.vendor)
        return [b for b in (native, "vulkan") if b]

    # -- the resolution ----------------------------------------------------------------------------
    def forces(self, backend: str) -> bool:
        """The request names ``backend`` (or one of its targets) explicitly."""
        return bool(self.forced) and (self.forced == backend or any(
            t.id.lower() == self.forced and t.backend == backend for t in self.targets))

    def evaluate(self, dev: Optional[Device], backend: Backend, tier: int) -> List[_Eval]:
        ids = {t.id.lower() for t in self.targets}
        if self.forced and not self.forces(backend):
            return [_Eval(backend, backend, dev, tier, fail=("forced-backend", f"not the requested backend {self.request.backend!r}"))]
        vk = self.m.cpu_vulkan_devices()[0] if dev is None and backend == "vulkan" else None
        if vk is not None and not self.forces("vulkan"):
            # lavapipe ran the 64x64 probe step ~150x slower than the CPU build (issue 12): it is a
            # way to test Vulkan builds without a GPU, never an accelerator to prefer.
            return [_Eval(backend, backend, dev, tier, vk=vk, fail=(
                "cpu-device", f"Vulkan device {vk.index} {vk.name} is a CPU-type device (Vulkan in software on the "
                              f"processor), far slower than the native CPU build; ask for it with --backend vulkan"))]
        problem = self.device_problem(dev, backend) if dev is not None else None
        if problem:
            return [_Eval(backend, backend, dev, tier, fail=problem)]
        targets = [t for t in self.targets if t.backend == backend and (self.forced not in ids or t.id.lower() == self.forced)]
        if not targets:
            where = f"{self.m.os} {self.m.arch}"
            why = "no ggml manifest was given" if not self.manifests.ggml else f"the manifest has no {BACKEND_TEXT[backend]} build for {where}"
            return [_Eval(backend, backend, dev, tier, fail=("no-artifact", why))]
        out = []
        for i, t in enumerate(targets):
            fail, how = self.check(dev, t)
            if vk is not None and fail is None:
                how = f"asked for with --backend {self.request.backend}; GGML_VK_VISIBLE_DEVICES={vk.index} names it"
            out.append(_Eval(t.id, backend, dev, tier, target=t, order=i, fail=fail, how=how, vk=vk))
        for e in out:
            if e.ok and dev is not None:
                e.covers = [dev] + [o for o in self.m.devices if o is not dev and o.vendor == dev.vendor
                                    and kind_rank(o) == kind_rank(dev)
                                    and not self.device_problem(o, backend) and self.check(o, e.tgt)[0] is None]
        out.sort(key=lambda e: e.sort_key())
        return out

    def run(self) -> Plan:
        m = self.m
        evals: List[_Eval] = []
        hardware: List[_Eval] = []  # the first eval of each (device, backend) the hardware can run
        order: List[Tuple[Optional[Device], str]] = []  # the (device, backend) slots in preference order
        for tier_i, dev, backend in slots(m.devices, self.tiers):
            if backend not in self.backends_for(dev):
                continue
            order.append((dev, backend))
            group = self.evaluate(dev, cast(Backend, backend), tier_i)
            evals.extend(group)
            if group and not (group[0].fail and group[0].fail[0] in ("api", "device", "forced-backend", "cpu-device")):
                problem = self.build_problem(dev, backend)
                if problem is None:
                    hardware.append(group[0])
                elif dev is not None:
                    self.build_rejects.append(Candidate(
                        name=f"local-{backend}", backend=cast(Backend, backend), accepted=False, code=problem[0],
                        reason=f"a local {BACKEND_TEXT[backend]} build for {dev.label} would not run: {problem[1]}", gpus=list(dev.indexes)))
        chosen = next((e for e in evals if e.ok), None)
        if chosen is not None and len(chosen.covers) > 1:
            also = [d for d in chosen.covers if d is not chosen.device]
            evals = [e for e in evals if e.device not in also]
        plan = Plan(stack="ggml", summary="", request=self.request)
        plan.candidates = merge_identical_rejections([self.candidate(e, chosen) for e in evals] + self.build_rejects)
        best_hw = hardware[0] if hardware else None
        if chosen is not None and best_hw is not None and _slot(order, best_hw) > _slot(order, chosen):
            best_hw = None  # the published build is preferred to any build this machine could make itself
        if chosen is not None:
            self.fill(plan, chosen)
        if best_hw is not None and (chosen is None or best_hw.device is not chosen.device or best_hw.backend != chosen.backend):
            plan.build = self.build_spec(best_hw)
            if chosen is None:
                plan.status = "needs-build"
                plan.backend = best_hw.backend
                plan.gpus = best_hw.device.indexes if best_hw.device else []
                plan.summary = f"no published ggml build fits this machine; a local {BACKEND_TEXT[best_hw.backend]} build is needed: {plan.build.reason}"
            else:
                self.notes.append(f"a local {BACKEND_TEXT[best_hw.backend]} build would do better: {plan.build.reason}")
        if chosen is None and best_hw is None:
            plan.status = "unsatisfiable"
            plan.summary = (f"no ggml backend {self.request.backend!r} runs on this machine" if self.forced
                            else "no ggml build runs on this machine; see the rejected candidates")
        if not m.report.cpu.features:
            self.notes.append("this CPU's features are unknown, so only builds that need none were eligible")
        if self.reqs.specs or self.reqs.others:
            self.notes.append("package requirements apply to the torch stack; they were ignored for ggml")
        for mf in self.manifests.ggml:
            if mf.stale:
                self.notes.append(f"{mf.envelope.label} expired on {mf.envelope.expires}")
        plan.notes = self.notes + plan.notes
        return plan

    def candidate(self, e: _Eval, chosen: Optional[_Eval]) -> Candidate:
        gpus = [i for d in (e.covers or ([e.device] if e.device else [])) for i in d.indexes]
        where = e.where
        if not e.ok:
            code, why = e.fail or ("no-artifact", "no build")
            return Candidate(name=e.name, backend=e.backend, accepted=False, code=code, reason=f"{e.name} rejected: {why}", gpus=gpus)
        verdict = "chosen" if e is chosen else "accepted"
        text = f"{e.name} {verdict}: {BACKEND_TEXT[e.backend]} build for {where}" + (f" ({e.how})" if e.how else "")
        if len(e.covers) > 1:
            text += f", also on {', '.join(d.label for d in e.covers[1:])}"
        if e is not chosen and chosen is not None:
            text += f" \u2014 not chosen: {self.why_not(e, chosen)}"
        return Candidate(name=e.name, backend=e.backend, accepted=True, code=verdict, reason=text, gpus=gpus, chosen=e is chosen)

    def why_not(self, e: _Eval, chosen: _Eval) -> str:
        if e.device is chosen.device and e.backend == chosen.backend:
            if e.tgt.priority < chosen.tgt.priority:
                return f"{chosen.name} is preferred (priority {chosen.tgt.priority} vs {e.tgt.priority})"
            return f"{chosen.name} is listed first"
        return why_not_device(e.device, e.tier, BACKEND_TEXT[e.backend], chosen.device, chosen.tier, BACKEND_TEXT[chosen.backend])

    def fill(self, plan: Plan, e: _Eval) -> None:
        m = self.m
        plan.status = "ready"
        plan.backend, plan.variant = e.backend, e.name
        plan.gpus = [i for d in e.covers for i in d.indexes]
        plan.artifacts = list(e.tgt.artifacts)
        plan.cuda_libs = list(e.tgt.cuda_libs)
        size = sum(a.size for a in plan.artifacts)
        where = e.where
        plan.summary = f"ggml {e.name} ({BACKEND_TEXT[e.backend]}) for {where}: {plural(len(plan.artifacts), 'file')}, {size_text(size)}"
        env: Dict[str, str] = {}
        if e.device is not None:
            vendor = e.device.vendor
            if e.backend == "cuda":
                env.update(visible_devices_env(m, vendor, plan.gpus, "cuda"))
            elif e.backend == "rocm":
                env.update(visible_devices_env(m, vendor, plan.gpus, "rocm"))
            elif e.backend == "vulkan":
                loader = m.vulkan_indexes(plan.gpus)
                if loader:  # the loader's own order, as detection enumerated it: what ggml-vulkan numbers
                    env["GGML_VK_VISIBLE_DEVICES"] = ",".join(map(str, loader))
                else:  # no Vulkan device list (an older report): the Vulkan API entry's order, else the GPUs'
                    api = m.report.api("vulkan")
                    listed = api.gpus if api and api.gpus else [g.index for g in m.report.gpus]
                    if len(listed) > len(plan.gpus):
                        env["GGML_VK_VISIBLE_DEVICES"] = ",".join(str(listed.index(i)) for i in plan.gpus if i in listed)
            elif e.backend == "sycl":
                intel = visible_devices_env(m, vendor, plan.gpus, "xpu")
                if intel:
                    env["ONEAPI_DEVICE_SELECTOR"] = "level_zero:" + intel["ZE_AFFINITY_MASK"]
        if e.vk is not None:
            # ggml-vulkan skips CPU-type devices unless GGML_VK_VISIBLE_DEVICES names them.
            env["GGML_VK_VISIBLE_DEVICES"] = str(e.vk.index)
            plan.device_reason = (f"Vulkan device {e.vk.index} {e.vk.name} is used because the Vulkan backend was asked for; "
                                  f"it is a CPU-type device (Vulkan in software on the processor), slower than the CPU build")
        plan.env = env
        if e.device is not None and len(m.devices) > 1:
            others = [d for d in m.devices if d not in e.covers]
            if others:
                plan.device_reason = f"{e.device.label} is used; " + "; ".join(
                    f"{d.label}: " + (f"ranks lower ({why_preferred(e.device, d)})" if d.rank > e.device.rank else "no better build runs on it")
                    for d in others)
        if e.backend == "cuda" and e.device is not None and driver_unread(e.device):
            self.notes.append(unread_driver_note(e.device, self.lowest_floor(e.device)))
        if "PTX" in e.how:
            self.notes.append("this build reaches the GPU through PTX: the first start compiles kernels and can take minutes")

    def build_spec(self, e: _Eval) -> BuildSpec:
        m = self.m
        props: Dict[str, str] = {}
        feats = [f for f in BUILD_FEATURES if f in m.report.cpu.features]
        if feats:
            props["cpu_features"] = ",".join(feats)
        if m.report.cpu.x86_64_level:
            props["x86_64_level"] = str(m.report.cpu.x86_64_level)
        dev = e.device
        if dev is not None:
            g = dev.first
            if e.backend == "cuda":
                props["sm"] = dev.cc or "unknown"
                if g.cuda_driver_version:
                    props["cuda_max"] = g.cuda_driver_version
                if g.driver_version:
                    props["nvidia_driver"] = g.driver_version
                arch = hw_rules().architecture(dev.cc)
                if arch is not None and arch.last_cuda < 13 and not dev.jetson:
                    # CUDA 13 no longer compiles for Maxwell, Pascal and Volta (NV-DC-MATRIX, GGML-CUDA-CMAKE)
                    props["cuda_toolkit"] = f"{arch.last_cuda}.x"
                if dev.jetson:
                    props["l4t"] = dev.l4t
                    jp = hw_rules().jetpack_of(dev.l4t)
                    if jp:
                        props["jetpack"] = jp
            elif e.backend == "rocm":
                props["gfx"] = dev.gfx
                if m.report.rocm_version:
                    props["rocm"] = m.report.rocm_version
            elif e.backend == "vulkan":
                api = m.report.api("vulkan")
                if api and api.version:
                    props["vulkan"] = api.version
            elif e.backend == "metal":
                if g.metal_support:
                    props["metal"] = g.metal_support
            elif e.backend == "sycl" and g.intel_generation:
                props["intel_generation"] = g.intel_generation
        if m.macos is not None:
            props["macos"] = m.report.os.version
        if m.glibc is not None:
            props["glibc"] = m.report.os.libc_version
        where = dev.label if dev else "the CPU"
        if dev is not None and dev.jetson and e.backend == "cuda":
            where += (f" (Jetson/Tegra: published CUDA builds target discrete GPUs; build with JetPack's CUDA for "
                      f"{sm_name(dev.cc) if dev.cc else 'its SM'})")
        keys = [k for k in ("sm", "cuda_max", "cuda_toolkit", "jetpack", "gfx", "vulkan", "metal", "intel_generation", "cpu_features") if props.get(k)]
        reason = f"{BACKEND_TEXT[e.backend]} for {where} on {m.os} {m.arch}" + (" (" + ", ".join(f"{k} {props[k]}" for k in keys) + ")" if keys else "")
        gpus = dev.indexes if dev else []
        return BuildSpec(backend=e.backend, os=m.os, arch=m.arch, gpus=gpus, properties=props, reason=reason,
                         variant=build_variant(e.backend, props, m.report), archs=build_archs(e.backend, gpus, props, m.report))


def _slot(order: List[Tuple[Optional[Device], str]], e: _Eval) -> int:
    """Where ``e``'s (device, backend) comes in the preference order."""
    return next(i for i, (dev, backend) in enumerate(order) if dev is e.device and backend == e.backend)


def resolve_ggml(machine: Machine, request: Request, reqs: Requirements, manifests: Manifests) -> Plan:
    return _GgmlResolver(machine, request, reqs, manifests).run()
