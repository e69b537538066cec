"""A local CUDA build for the machine at hand (issue 12): the CUDA 12 or 13 variant its GPU and driver
need, compiled only for its GPUs' architectures, found again in the build cache, and said plainly by
a dry run. Hardware comes from replayed real captures; no CUDA is compiled here: a cached build is a
wheel and a build record written into the slot ``build_ggml`` keys, as ``build_ggml`` leaves them."""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import stat
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import pytest

import accelstack
from accelstack.core.detection import detect
from accelstack.core.local_build import (
    build_locally,
    build_sentence,
    cached_local_build,
    local_cuda_archs,
    local_variant,
    replan,
)
from accelstack.hardware.system import ReplaySystem
from accelstack.manifests.build_targets import BUILD_VARIANTS, build_archs
from accelstack.manifests.resolver import Manifests
from accelstack.publisher.build import VARIANTS, build_ggml, build_options
from accelstack.publisher.build_cache import BuildResult, cache_key, sha256_file
from accelstack.publisher.sdist import sdist_name
from accelstack.publisher.variants import CUDA13_SM, find_cuda_toolkit, properties_for
from accelstack.publisher.wheel_repack import PACKAGING_VERSION
from accelstack.settings import Settings, cuda_env

from cli_helpers import REPO, error_of, result_of, run_cli
from installer_helpers import write_wheel

CAPTURES = REPO / "tests" / "fixtures" / "captures"
PASCAL = "windows-nvidia-gtx1080ti-531"  # GTX 1080 Ti, compute capability 6.1: CUDA 13 no longer compiles for it
OLD_DRIVER = "linux-nvidia-rtx4070-550"  # RTX 4070 (8.9) on driver 550, which runs CUDA up to 12.4
AMPERE_580 = "linux-nvidia-rtx3090-580-two-part-version"  # RTX 3090 (8.6) on driver 580 (CUDA 13.0)
ADA_591 = "windows-nvidia-rtx4060-591"  # RTX 4060 (8.9) on driver 591 (CUDA 13.1)
TWO_GPUS = "linux-nvidia-rtx5090-rtx4090-580"  # RTX 5090 (12.0) and RTX 4090 (8.9), driver 580


@pytest.fixture(autouse=True)
def _no_arch_override(monkeypatch):
    monkeypatch.delenv("ACCELSTACK_CUDA_ARCHS", raising=False)


def _settings(tmp_path: Path) -> Settings:
    return Settings.resolve(home=tmp_path / "home", cache=tmp_path / "cache", build_cache=tmp_path / "builds",
                            manifests=[])


def _machine(name: str, tmp_path: Path):
    """The replayed capture's report and its ggml plan with no published build at all."""
    s = _settings(tmp_path)
    report = detect(ReplaySystem(CAPTURES / name), settings=s)
    plan = accelstack.plan(report, "ggml", settings=s, manifests=Manifests())
    assert plan.status == "needs-build" and plan.build is not None and plan.build.backend == "cuda", plan.summary
    return report, plan


@pytest.mark.parametrize("capture, variant, archs, why", [
    (PASCAL, "cuda12", ["61"], ("cuda_toolkit", "12.x")),
    (OLD_DRIVER, "cuda12", ["89"], ("cuda_max", "12.4")),
    (AMPERE_580, "cuda", ["86"], ("cuda_max", "13.0")),
    (ADA_591, "cuda", ["89"], ("cuda_max", "13.1")),
    (TWO_GPUS, "cuda", ["120"], ("cuda_max", "13.0")),  # the plan serves the 5090 (the 4090 stays unused)
])
def test_the_local_build_is_the_variant_and_architectures_of_this_machine(capture, variant, archs, why, tmp_path):
    report, plan = _machine(capture, tmp_path)
    assert plan.build is not None and plan.build.properties.get(why[0]) == why[1]
    assert local_variant(plan, report) == variant
    assert local_cuda_archs(plan, report) == archs


def test_a_plan_over_gpus_of_different_compute_capabilities_compiles_each_of_them(tmp_path):
    report, plan = _machine(TWO_GPUS, tmp_path)
    assert plan.build is not None
    # the resolver's rule over both GPUs, and a plan without the decision (an older plan's JSON) given it
    assert build_archs("cuda", [0, 1], plan.build.properties, report) == ["89", "120"]
    both = dataclasses.replace(plan, build=dataclasses.replace(plan.build, gpus=[0, 1], variant="", archs=[]))
    assert local_cuda_archs(both, report) == ["89", "120"]


def test_an_unknown_compute_capability_builds_every_architecture_and_says_so(tmp_path):
    report, _plan = _machine(AMPERE_580, tmp_path)
    report.gpus[0].compute_capability = ""
    s = _settings(tmp_path)
    plan = accelstack.plan(report, "ggml", settings=s, manifests=Manifests())
    assert plan.build is not None and plan.build.properties["sm"] == "unknown"
    assert local_variant(plan, report) == "cuda" and local_cuda_archs(plan, report) is None
    said = build_sentence("cuda", None)
    assert said.startswith("would build cuda from source for every architecture the cuda variant supports (sm_75, ")
    assert "this GPU's compute capability is unknown" in said and "about 9-10 h on 2 cores" in said
    # an install builds (here: finds in the build cache) the variant's full build, and says why
    full = cached_cuda_build(s.build_cache, "cuda", None)
    messages: List[str] = []
    manifests = build_locally(report, plan, Manifests(), s, lambda e: messages.append(e.message), channels=False)
    assert any(m.startswith("no published build fits; reusing the cuda build for sm_75, sm_80")
               and "(this GPU's compute capability is unknown) already in the build cache" in m
               for m in messages), messages  # a cache hit: why every architecture, and no compile time
    assert [a.sha256 for t in manifests.ggml[-1].targets for a in t.artifacts] == [full.sha256]


def test_the_build_sentence_names_the_architectures_the_time_and_the_toolkit():
    said = build_sentence("cuda", ["86"])
    assert said.startswith("would build cuda from source for sm_86 (about 1-2 h on 2 cores, less with more cores; "
                           "needs cmake, a C++ compiler and NVIDIA's CUDA 13 compiler")
    assert build_sentence("cuda", ["86", "89"]).startswith("would build cuda from source for sm_86, sm_89 (about 2-3 h")
    said = build_sentence("cuda12", ["61"])
    assert said.startswith("would build cuda12 from source for sm_61 (about 1-2 h on 2 cores")
    assert "a system CUDA 12 toolkit with nvcc 12.x" in said
    if find_cuda_toolkit(12, cuda_env())[0] is None:
        assert said.endswith("a CUDA 12 toolkit")  # "not found here: ..., a CUDA 12 toolkit"


# -- the build cache ----------------------------------------------------------------------------
def _wheel(folder: Path, marker: str) -> Path:
    info = "stable_diffusion_cpp_python-0.4.7.dist-info"
    tag = f"py3-none-linux_{platform.machine()}"
    return write_wheel(folder / f"stable_diffusion_cpp_python-0.4.7-{tag}.whl", {
        "stable_diffusion_cpp/__init__.py": f"MARK = {marker!r}\n".encode(),
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: stable-diffusion-cpp-python\nVersion: 0.4.7\n",
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n".encode()})


def cached_cuda_build(builds: Path, variant: str, archs: Optional[Sequence[str]]) -> BuildResult:
    """A finished build of ``variant`` for ``archs`` in the build cache ``builds``, as ``build_ggml``
    leaves one: the source in ``sdist/``, the slot of the key :func:`build_options` gives, the
    packaged wheel in ``lean<N>/`` and ``build.json`` (a :class:`BuildResult`)."""
    sdist = builds / "sdist" / sdist_name()
    if not sdist.is_file():
        sdist.parent.mkdir(parents=True, exist_ok=True)
        sdist.write_bytes(b"a stand-in source distribution")
    cmake_args, toolkit = build_options(variant, archs, cuda_env=cuda_env())
    assert toolkit is not None
    source = sha256_file(sdist)
    key = cache_key(source, variant, cmake_args, toolkit)
    slot = builds / key
    wheel = _wheel(slot / f"lean{PACKAGING_VERSION}", f"{variant} {archs}")
    result = BuildResult(variant=variant, wheel=str(wheel), sha256=sha256_file(wheel), size=wheel.stat().st_size,
                         cmake_args=cmake_args, source_sha256=source, key=key,
                         properties=properties_for(variant, cmake_args, str(toolkit["cuda"])),
                         platform_tag=f"linux_{platform.machine()}", packaging=PACKAGING_VERSION,
                         compiled_wheel=str(wheel), toolchain=dict(toolkit))
    (slot / "build.json").write_text(json.dumps(dataclasses.asdict(result), indent=2))
    return result


def test_a_cached_cuda_build_is_found_for_its_architectures_only(tmp_path):
    builds = tmp_path / "builds"
    made = cached_cuda_build(builds, "cuda", ["86"])
    assert cached_local_build("cuda", builds, ["86"]) == made.wheel
    assert cached_local_build("cuda", builds, ["89"]) == ""  # another architecture is another build
    assert cached_local_build("cuda", builds) == ""  # so is the build for all of them
    full = cached_cuda_build(builds, "cuda", None)
    assert cached_local_build("cuda", builds) == full.wheel and full.properties["sm"][0] == "7.5"
    assert len(full.properties["sm"]) == len(CUDA13_SM)
    # build_ggml keys the build the same way: a cache hit, with nothing downloaded or compiled
    hit = build_ggml("cuda", Settings.resolve(build_cache=builds), cuda_archs=["86"])
    assert hit.cache_hit and hit.wheel == made.wheel and hit.properties["sm"] == ["8.6"]


def _fake_toolkit(root: Path, version: str) -> Path:
    """A folder with an nvcc that answers ``--version`` as NVIDIA's does (nothing is compiled)."""
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "include" / "cuda_runtime.h").write_text("/* */\n")
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {version}, V{version}.1'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    return root


@pytest.mark.skipif(os.name == "nt", reason="a shell-script nvcc")
def test_a_cached_cuda12_build_is_found_with_the_toolkit_it_was_made_with(tmp_path, monkeypatch):
    kit = _fake_toolkit(tmp_path / "cuda-12.8", "12.8")
    monkeypatch.setenv("CUDA_HOME", str(kit))
    builds = tmp_path / "builds"
    made = cached_cuda_build(builds, "cuda12", ["61"])
    assert made.toolchain["cuda"] == "12.8" and made.properties["cuda"] == "12.8"
    assert cached_local_build("cuda12", builds, ["61"]) == made.wheel
    assert cached_local_build("cuda", builds, ["61"]) == ""
    if find_cuda_toolkit(12, {"PATH": os.environ.get("PATH", "")})[0] is None:
        monkeypatch.delenv("CUDA_HOME")  # without its toolkit there is no build to reuse (nor to make)
        assert cached_local_build("cuda12", builds, ["61"]) == ""


def test_an_install_reuses_the_cached_build_of_this_gpu_and_plans_it(tmp_path):
    """``_build_locally`` asks build_ggml for this GPU's architecture only, says so, and the build it
    gets (here from the cache) is what the plan then installs."""
    report, plan = _machine(AMPERE_580, tmp_path)
    s = _settings(tmp_path)
    made = cached_cuda_build(s.build_cache, "cuda", ["86"])
    said: List[str] = []
    manifests = build_locally(report, plan, Manifests(), s, lambda e: said.append(e.message), channels=False)
    assert any(m.startswith("no published build fits; reusing the cuda build for sm_86 already in the build cache")
               for m in said), said  # a cache hit compiles nothing, and says which architectures it has
    assert "reusing cached build " + made.key in said
    new = replan(report, plan, manifests, s)
    assert new.ok and new.backend == "cuda" and [a.sha256 for a in new.artifacts] == [made.sha256], new.summary


# -- what install --dry-run says, on replayed machines -------------------------------------------
def _env(tmp_path: Path) -> Dict[str, str]:
    state = tmp_path / "state"
    return {"ACCELSTACK_HOME": str(state / "home"), "ACCELSTACK_CACHE": str(state / "cache"),
            "ACCELSTACK_BUILD_CACHE": str(state / "builds"), "ACCELSTACK_PROBE_CACHE": str(state / "probe"),
            "ACCELSTACK_CONFIG": str(state / "config" / "config.yaml"), "ACCELSTACK_CONFIG_DIR": str(state / "config"),
            "ACCELSTACK_OFFLINE": "", "ACCELSTACK_BACKEND": "", "ACCELSTACK_CUDA_ARCHS": ""}


def _snapshot(root: Path) -> List[str]:
    return [f"{p.relative_to(root)} {p.lstat().st_size} {p.lstat().st_mtime_ns}" for p in sorted(root.rglob("*"))]


@pytest.mark.parametrize("capture, first", [
    (OLD_DRIVER, "would build cuda12 from source for sm_89 (about 1-2 h on 2 cores"),
    (AMPERE_580, "would build cuda from source for sm_86 (about 1-2 h on 2 cores"),
])
def test_dry_run_on_a_machine_without_a_channel_names_the_variant_and_architecture(capture, first, tmp_path):
    (tmp_path / "state").mkdir()
    before = _snapshot(tmp_path)
    rc, out, err = run_cli(["install", "--dry-run", "--json", "--replay", CAPTURES / capture], _env(tmp_path))
    assert rc == 0, err
    res = result_of(out)
    assert res["dry_run"] and res["would_build"] == first.split()[2] and res["would"][0].startswith(first)
    assert any("no channel" in n for n in res["notes"]), res["notes"]
    assert _snapshot(tmp_path) == before  # no home, lock, cache, config or build


def test_dry_run_says_when_the_build_cache_has_this_gpus_cuda_build(tmp_path):
    env = _env(tmp_path)
    made = cached_cuda_build(Path(env["ACCELSTACK_BUILD_CACHE"]), "cuda", ["86"])
    before = _snapshot(tmp_path)
    rc, out, err = run_cli(["install", "--dry-run", "--json", "--replay", CAPTURES / AMPERE_580], env)
    assert rc == 0, err
    assert result_of(out)["would"][0] == f"would reuse the cuda build already in the build cache (no compile): {made.wheel}"
    assert _snapshot(tmp_path) == before


# -- accelstack build ggml --cuda-arch ------------------------------------------------------------
@pytest.mark.parametrize("args, said", [
    (["--backend", "cpu", "--cuda-arch", "86"], "--cuda-arch narrows a CUDA build; the cpu variant compiles no CUDA"),
    (["--backend", "cuda", "--cuda-arch", "x"], "--cuda-arch='x': give compute capabilities such as 90 or 86,90"),
    (["--backend", "cuda12", "--cuda-arch", "86,sm_9"], "--cuda-arch='86,sm_9'"),
])
def test_build_cuda_arch_is_refused_as_a_usage_error_before_anything(args, said, tmp_path):
    env = {"ACCELSTACK_BUILD_CACHE": str(tmp_path / "builds"), "ACCELSTACK_CUDA_ARCHS": ""}
    rc, out, _err = run_cli(["build", "ggml", *args, "--json"], env)
    error = error_of(out)
    assert rc == 2 and error["code"] == "usage" and error["message"].startswith(said), error
    assert not (tmp_path / "builds").exists()  # nothing downloaded, no toolkit looked for


def test_build_cuda_arch_narrows_the_build_to_those_architectures(tmp_path):
    builds = tmp_path / "builds"
    made = cached_cuda_build(builds, "cuda", ["86", "89"])
    rc, out, err = run_cli(["build", "ggml", "--backend", "cuda", "--cuda-arch", "sm_89,8.6", "--json"],
                           {"ACCELSTACK_BUILD_CACHE": str(builds), "ACCELSTACK_CUDA_ARCHS": ""})
    assert rc == 0, (out, err)
    res = result_of(out)
    assert res["cache_hit"] and res["key"] == made.key and res["properties"]["sm"] == ["8.6", "8.9"]
    assert "-DCMAKE_CUDA_ARCHITECTURES=86-real;89" in res["cmake_args"]


# -- the plan carries what a local build makes (issue 43): the resolver decides, the build follows ------
@pytest.mark.parametrize("capture, variant, archs", [
    (PASCAL, "cuda12", ["61"]),
    (OLD_DRIVER, "cuda12", ["89"]),
    (AMPERE_580, "cuda", ["86"]),
    (ADA_591, "cuda", ["89"]),
    (TWO_GPUS, "cuda", ["120"]),
    ("linux-cpu-pentium-e5700-no-avx", "cpu-noavx2", []),
])
def test_the_plan_carries_the_variant_and_architectures_of_its_local_build(capture, variant, archs, tmp_path):
    from accelstack.manifests.plan import Plan
    from accelstack.serde import from_dict, to_dict

    s = _settings(tmp_path)
    report = detect(ReplaySystem(CAPTURES / capture), settings=s)
    plan = accelstack.plan(report, "ggml", settings=s, manifests=Manifests())
    assert plan.status == "needs-build" and plan.build is not None, plan.summary
    assert (plan.build.variant, plan.build.archs) == (variant, archs)
    assert from_dict(Plan, json.loads(json.dumps(to_dict(plan)))).build == plan.build  # in the plan's JSON too
    assert set(BUILD_VARIANTS) <= set(VARIANTS) and plan.build.variant in VARIANTS  # the publisher's names


def test_a_rocm_plan_names_the_gfx_target_its_build_serves(tmp_path):
    s = _settings(tmp_path)
    report = detect(ReplaySystem(CAPTURES / "linux-amd-2x-rx7900xtx-rocm"), settings=s)
    plan = accelstack.plan(report, "ggml", settings=s, manifests=Manifests(), backend="rocm")
    assert plan.build is not None and plan.build.backend == "rocm", plan.summary
    assert (plan.build.variant, plan.build.archs) == ("rocm", ["gfx1100"])


def test_the_local_build_makes_what_the_plan_says(tmp_path):
    """The core reads the variant and architectures off the plan; it does not decide them again."""
    report, plan = _machine(AMPERE_580, tmp_path)
    assert plan.build is not None
    told = dataclasses.replace(plan, build=dataclasses.replace(plan.build, variant="cuda12", archs=["75", "86"]))
    assert local_variant(told, report) == "cuda12" and local_cuda_archs(told, report) == ["75", "86"]
    every = dataclasses.replace(plan, build=dataclasses.replace(plan.build, variant="cuda", archs=[]))
    assert local_cuda_archs(every, report) is None  # no architecture named: every one of the variant
