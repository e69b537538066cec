"""Choosing the ggml build: match published variant targets to the machine, or say what to build.

A ggml target is chosen by its properties (os, arch, backend, requirements) against the machine's
facts. The best backend the *hardware* supports is worked out independently of what is published,
so when no artifact fits — or only a worse one does — the plan still names the backend and the
properties a local build needs (``Plan.build``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, cast

from ..hardware.cpu import normalize_features
from ..hardware.report import VulkanDevice
from ..domain import ApiName, Backend
from .ggml_manifest import DEFAULT_GGML_TIERS, GgmlTarget
from .hw_rules import branch_note, cuda_driver_check, driver_hint, hw_rules
from .knowledge import Manifests
from .machine import (
    Device,
    Machine,
    cc_parts,
    cuda_kernels_for,
    kind_rank,
    slots,
    sm_name,
    version_of,
    version_or_none,
    visible_devices_env,
    why_not_device,
    why_preferred,
)
from .plan import BuildSpec, Candidate, Plan, Request, merge_identical_rejections
from .request import Requirements

_API: Dict[str, ApiName] = {"cuda": "cuda", "rocm": "rocm", "vulkan": "vulkan", "metal": "metal", "sycl": "xpu", "cpu": "cpu"}
_TEXT = {"cuda": "CUDA", "rocm": "ROCm", "vulkan": "Vulkan", "metal": "Metal", "sycl": "SYCL", "cpu": "CPU"}
# CPU features a build may be specialised for (what a local build's flags depend on), in detection's
# normalized names (accelstack.hardware.cpu: "sse4.2", "avx512vnni", "avxvnni", "amx"); a name detection
# never writes would silently drop out of the spec (tests/manifests/test_cpu_feature_names.py).
BUILD_FEATURES = ("sse4.2", "avx", "avx2", "fma", "f16c", "bmi2", "avxvnni", "avx512f", "avx512bw", "avx512vl",
                  "avx512vnni", "avx512bf16", "amx", "neon", "dotprod", "fp16", "i8mm", "sve", "sve2", "sme")


def _feature(name: str) -> str:
    """A feature a manifest requires, in detection's spelling ("sse4_2" -> "sse4.2"); unknown names stay as written."""
    found = normalize_features([name])
    return found[0] if found else name


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


class _GgmlResolver:
    def __init__(self, machine: Machine, request: Request, reqs: Requirements, manifests: Manifests) -> None:
        self.m = machine
        self.request = request
        self.reqs = reqs
        self.manifests = manifests
        self.forced = request.backend.strip().lower()
        self.targets: List[GgmlTarget] = [
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

    def device_problem(self, dev: Device, backend: str) -> Optional[Tuple[str, str]]:
        m, g = self.m, dev.first
        usable = m.api_usable(_API[backend], g.index)
        if backend == "cuda":
            if usable is True or (usable is None and (dev.cuda_max or dev.driver)):
                return None
            if g.driver == "nouveau":
                return ("api", f"{dev.label} runs the open-source nouveau driver; CUDA needs NVIDIA's driver{branch_note(dev.cc)}")
            return ("api", f"CUDA is not usable on {dev.label}: {m.api_evidence('cuda', g) or 'no working NVIDIA driver answered'}")
        if backend == "rocm":
            if not dev.gfx:
                return ("device", f"the gfx target of {dev.label} is unknown, so no ROCm build can be matched to it")
            if usable is False:
                return ("api", f"ROCm/HIP cannot reach {dev.label}: {m.api_evidence('rocm', g) or 'no HIP runtime'}")
            return None
        if backend == "vulkan":
            if usable:
                return None
            return ("api", f"no Vulkan driver was found for {dev.label} (install the GPU driver with Vulkan support)")
        if backend == "metal":
            return None if usable is not False else ("api", f"Metal is not usable on {dev.label}")
        if backend == "sycl":
            if usable:
                return None
            return ("api", f"SYCL needs Intel's Level Zero driver for {dev.label}, which was not found")
        return None

    # -- one target on one device ----------------------------------------------------------------
    def check(self, dev: Optional[Device], t: GgmlTarget) -> Tuple[Optional[Tuple[str, str]], str]:
        m, req = self.m, t.requires
        if m.os == "linux":
            if m.musl:
                return ("glibc", f"{t.id} is built for glibc; this system uses musl libc"), ""
            if req.glibc and m.glibc is not None and m.glibc < version_of(req.glibc):
                return ("glibc", f"{t.id} needs glibc >= {req.glibc}; this system has glibc {m.report.os.libc_version}"), ""
        if req.macos_min and m.macos is not None and m.macos < version_of(req.macos_min):
            return ("os-version", f"{t.id} needs macOS {req.macos_min} or newer; this Mac runs macOS {m.report.os.version}"), ""
        missing = [f for f in req.cpu_features if _feature(f) not in m.report.cpu.features]
        if missing:
            if not m.report.cpu.features:
                return ("cpu-features", f"{t.id} needs CPU features {', '.join(req.cpu_features)}, and this CPU's features are unknown"), ""
            cpu = m.report.cpu.model or "this CPU"
            return ("cpu-features", f"{t.id} needs CPU features {', '.join(req.cpu_features)}; {cpu} lacks {', '.join(missing)}"), ""
        how = ""
        if dev is not None and t.backend == "cuda" and dev.jetson:
            return ("device", f"{t.id} is built for discrete NVIDIA GPUs and ARM servers, not for the Tegra GPU of {dev.name} (Jetson)"), ""
        if dev is not None and t.backend == "cuda":
            native = False
            if req.sm or req.ptx:
                if dev.cc:
                    kernels = cuda_kernels_for(dev.cc, req.sm, req.ptx)
                    if kernels is None:
                        built = ", ".join(req.sm + [p + " (PTX)" for p in req.ptx])
                        return ("kernels", f"{t.id} has no kernels for {sm_name(dev.cc)} ({dev.name}); it is built for {built}"), ""
                    native = not kernels.startswith("compute_")
                    how = f"{kernels} kernels for {dev.name}"
                else:
                    how = f"compute capability of {dev.name} unknown; kernels not checked"
            fail = self.driver_fail(dev, t, native)
            if fail:
                return fail, ""
        elif dev is not None and t.backend == "rocm" and req.gfx:
            if dev.gfx not in req.gfx:
                return ("kernels", f"{dev.gfx} ({dev.name}) is not among the targets of {t.id} ({', '.join(req.gfx)})"), ""
            how = f"{dev.gfx} is compiled in"
        elif dev is not None and t.backend == "vulkan" and req.vulkan:
            api = m.report.api("vulkan")
            have = api.version if api else ""
            offered = version_or_none(have)  # the driver's own text: may carry more than a version
            if offered is not None and offered < version_of(req.vulkan):
                return ("driver", f"{t.id} needs Vulkan {req.vulkan}; the driver offers Vulkan {have}"), ""
        return None, how or (f"runs on {dev.name}" if dev is not None else "")

    def driver_fail(self, dev: Device, t: GgmlTarget, native: bool = False) -> Optional[Tuple[str, str]]:
        """The driver rule of torch (NVIDIA's minor-version compatibility) applied to a ggml CUDA target."""
        req, g = t.requires, dev.first
        min_drv = req.nvidia_driver.get(self.m.driver_os, "")
        if req.cuda:
            why, _how = cuda_driver_check(dev, req.cuda, min_drv, native=native, os_name=self.m.driver_os,
                                          what=t.id, policy=self.request.cuda_driver)
            return ("driver", why) if why else None
        if min_drv:
            if dev.driver is None:
                return ("driver", f"the NVIDIA driver version is unknown; {t.id} needs driver >= {min_drv}")
            if dev.driver < version_of(min_drv):
                return ("driver", f"NVIDIA driver {g.driver_version} is older than {min_drv}, which {t.id} needs; {driver_hint(dev.cc, min_drv)}")
        return None

    # -- can a local build work at all? -----------------------------------------------------------
    def build_problem(self, dev: Optional[Device], backend: str) -> Optional[Tuple[str, str]]:
        """Why a local ``backend`` build for ``dev`` could never run (the published builds' rules, applied
        to what a current toolchain can still build): None when it can."""
        if dev is None:
            return None
        rules = hw_rules()
        g = dev.first
        if backend == "cuda":
            parts = cc_parts(dev.cc)
            if parts is not None and parts < rules.ggml_min_cc:
                arch = rules.architecture(dev.cc)
                era = f"{arch.name}, " if arch else ""
                return ("kernels", f"{dev.name} ({era}compute capability {dev.cc}) is older than any CUDA toolkit that can build ggml "
                                   f"supports: ggml's CUDA backend starts at compute capability {'.'.join(map(str, rules.ggml_min_cc))}")
            major = rules.ggml_min_cuda_major
            floor = rules.floor(major, self.m.driver_os)
            need = f"a driver of the CUDA {major} family or newer" + (f" (>= {floor} on {'Windows' if self.m.driver_os == 'windows' else 'Linux'})" if floor and not dev.jetson else "")
            hint = "" if dev.jetson else f"; {driver_hint(dev.cc, floor)}"
            if dev.cuda_max is not None:
                if dev.cuda_max.major < major:
                    return ("driver", f"the driver of {dev.name} supports CUDA up to {g.cuda_driver_version}; the CUDA toolkits that can build "
                                      f"ggml (CUDA {major} and newer) need {need}{hint}")
            elif dev.driver is not None:
                if floor and dev.driver < version_of(floor):
                    return ("driver", f"NVIDIA driver {g.driver_version} is older than {floor}; the CUDA toolkits that can build ggml need {need}{hint}")
            else:
                return ("driver", f"the driver of {dev.name} reported no CUDA version; a local ggml CUDA build needs {need}")
            return None
        if backend == "rocm":
            if dev.gfx and dev.gfx not in rules.rocm_build_gfx:
                return ("kernels", f"{dev.gfx} ({dev.name}) is a target of no current ROCm release, so no local ROCm build can run on it "
                                   f"(current ROCm compiles for {rules.rocm_build_gfx[0]} to {rules.rocm_build_gfx[-1]})")
            return None
        if backend == "vulkan":
            api = self.m.report.api("vulkan")
            have = version_or_none(api.version) if api else None
            if have is not None and have < rules.vulkan_min:
                return ("driver", f"ggml's Vulkan backend needs Vulkan {rules.vulkan_min}; the driver of {dev.name} offers Vulkan {api.version if api else ''}")
            return None
        return None

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
            why = "no ggml manifest was given" if not self.manifests.ggml else f"the manifest has no {_TEXT[backend]} build for {where}"
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
        for tier_i, dev, backend in slots(m.devices, self.tiers):
            if backend not in self.backends_for(dev):
                continue
            group = self.evaluate(dev, cast(Backend, backend), tier_i)
            evals.extend(group)
            if group and not (group[0].fail and group[0].fail[0] in ("api", "device", "forced-backend", "cpu-device")):
                problem = self.build_problem(dev, backend)
                if problem is None:
                    hardware.append(group[0])
                elif dev is not None:
                    self.build_rejects.append(Candidate(
                        name=f"local-{backend}", backend=cast(Backend, backend), accepted=False, code=problem[0],
                        reason=f"a local {_TEXT[backend]} build for {dev.label} would not run: {problem[1]}", gpus=list(dev.indexes)))
        chosen = next((e for e in evals if e.ok), None)
        if chosen is not None and len(chosen.covers) > 1:
            also = [d for d in chosen.covers if d is not chosen.device]
            evals = [e for e in evals if e.device not in also]
        plan = Plan(stack="ggml", summary="", request=self.request)
        plan.candidates = merge_identical_rejections([self.candidate(e, chosen) for e in evals] + self.build_rejects)
        best_hw = hardware[0] if hardware else None
        if chosen is not None:
            self.fill(plan, chosen)
        if best_hw is not None and (chosen is None or best_hw.device is not chosen.device or best_hw.backend != chosen.backend):
            plan.build = self.build_spec(best_hw)
            if chosen is None:
                plan.status = "needs-build"
                plan.backend = best_hw.backend
                plan.gpus = best_hw.device.indexes if best_hw.device else []
                plan.summary = f"no published ggml build fits this machine; a local {_TEXT[best_hw.backend]} build is needed: {plan.build.reason}"
            else:
                self.notes.append(f"a local {_TEXT[best_hw.backend]} build would do better: {plan.build.reason}")
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
        text = f"{e.name} {verdict}: {_TEXT[e.backend]} build for {where}" + (f" ({e.how})" if e.how else "")
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
        return why_not_device(e.device, e.tier, _TEXT[e.backend], chosen.device, chosen.tier, _TEXT[chosen.backend])

    def fill(self, plan: Plan, e: _Eval) -> None:
        m = self.m
        plan.status = "ready"
        plan.backend, plan.variant = e.backend, e.name
        plan.gpus = [i for d in e.covers for i in d.indexes]
        plan.artifacts = list(e.tgt.artifacts)
        plan.cuda_libs = list(e.tgt.cuda_libs)
        size = sum(a.size for a in plan.artifacts)
        where = e.where
        plan.summary = f"ggml {e.name} ({_TEXT[e.backend]}) for {where}: {len(plan.artifacts)} file(s), {size / 2**20:.1f} MiB"
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
        reason = f"{_TEXT[e.backend]} for {where} on {m.os} {m.arch}" + (" (" + ", ".join(f"{k} {props[k]}" for k in keys) + ")" if keys else "")
        return BuildSpec(backend=e.backend, os=m.os, arch=m.arch, gpus=dev.indexes if dev else [], properties=props, reason=reason)


def resolve_ggml(machine: Machine, request: Request, reqs: Requirements, manifests: Manifests) -> Plan:
    return _GgmlResolver(machine, request, reqs, manifests).run()
