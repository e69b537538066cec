"""Windows VRAM and NVIDIA driver facts, grouped problems, and driver hints a GPU can follow (issue 11)."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import pytest

from accelstack import serde
from accelstack.hardware.common import Probe, newest_usable_branch, nvidia_driver_hint
from accelstack.hardware.report import HardwareReport

from .conftest import CAPTURES, replay
from .make_i11d_fixtures import ADL_CPU, ADL_FEATURES, ADL_NVIDIA, mf

MIB = 1024 * 1024
GIB = 1024 * MIB


def _windows(builder, tmp_path, nvidia: Dict[str, Any], registry: Optional[List[Dict[str, Any]]] = None, smi: Optional[list] = None,
             win_version: str = "10.0.26200") -> HardwareReport:
    b = builder(system="Windows", machine="AMD64", win_version=win_version)
    b.powershell({"gpus": [nvidia], "registry": registry or [], "cpu": ADL_CPU, "features": ADL_FEATURES})
    if smi is None:
        b.command(mf.SMI_QUERY, missing=True)
    else:
        b.smi(smi)
    return replay(b.write(tmp_path / "win"))


# -- VRAM: AdapterRAM caps at 4 GiB ----------------------------------------------------------------


@pytest.mark.parametrize("adapter_ram", [4293918720, 4294967295])
def test_capped_adapter_ram_is_a_lower_bound_not_the_size(builder, tmp_path, adapter_ram):
    g = _windows(builder, tmp_path, dict(ADL_NVIDIA, AdapterRAM=adapter_ram)).gpus[0]
    assert (g.vram_total, g.vram_at_least) == (None, adapter_ram)
    assert any("at least AdapterRAM" in s for s in g.sources)


def test_adapter_ram_below_the_cap_is_exact(builder, tmp_path):
    g = _windows(builder, tmp_path, dict(ADL_NVIDIA, Name="NVIDIA GeForce GTX 1050", PNPDeviceID="PCI\\VEN_10DE&DEV_1C81", AdapterRAM=2 * GIB)).gpus[0]
    assert (g.vram_total, g.vram_at_least) == (2 * GIB, None)


def test_registry_size_wins_over_adapter_ram(builder, tmp_path):
    reg = [{"DriverDesc": ADL_NVIDIA["Name"], "MatchingDeviceId": "pci\\ven_10de&dev_28a0", "HardwareInformation.qwMemorySize": 8 * GIB}]
    g = _windows(builder, tmp_path, ADL_NVIDIA, registry=reg).gpus[0]
    assert (g.vram_total, g.vram_at_least) == (8 * GIB, None)


def test_nvidia_smi_size_replaces_the_lower_bound(builder, tmp_path):
    smi = [[0, "00000000:01:00.0", ADL_NVIDIA["Name"], 8188, 8000, "581.15", "8.9"]]
    g = _windows(builder, tmp_path, ADL_NVIDIA, smi=smi).gpus[0]
    assert (g.vram_total, g.vram_at_least) == (8188 * MIB, None)


# -- driver present with an unknown version vs no driver -------------------------------------------


def test_marketing_name_means_the_driver_is_installed(builder, tmp_path):
    r = _windows(builder, tmp_path, dict(ADL_NVIDIA, DriverVersion=None))
    g = r.gpus[0]
    assert (g.driver, g.driver_version, g.cuda_driver_version) == ("wddm", "", "")
    assert r.problem_codes() == ["nvidia_driver_version_unknown"]
    assert r.problems[0].severity == "warning" and "nvidia-smi" in r.problems[0].hint
    cuda = r.api("cuda")
    assert cuda is not None and not cuda.usable and "installed" in cuda.evidence[0] and "version" in cuda.evidence[0]


def test_basic_display_adapter_means_no_driver(builder, tmp_path):
    r = _windows(builder, tmp_path, dict(ADL_NVIDIA, Name="Microsoft Basic Display Adapter", DriverVersion="10.0.26100.1"))
    g = r.gpus[0]
    assert g.vendor == "nvidia" and g.driver == "basic-display" and g.driver_version == "" and "Microsoft" not in g.name
    (p,) = r.problems
    assert p.code == "nvidia_driver_not_loaded" and p.severity == "error" and "basic display adapter" in p.message
    assert "no NVIDIA driver" in r.api("cuda").evidence[0]


def test_driver_version_from_the_wddm_version_still_counts(builder, tmp_path):
    g = _windows(builder, tmp_path, ADL_NVIDIA).gpus[0]  # DriverVersion 32.0.15.8115, no nvidia-smi
    assert (g.driver_version, g.cuda_driver_version) == ("581.15", "13.0")


def test_new_fields_round_trip_through_json():
    for name in ("i11d-windows-rtx4060-laptop-partial-wmi", "linux-nvidia-4x-titanx-pascal-418"):
        r = replay(CAPTURES / name)
        back = serde.loads(HardwareReport, serde.dumps(r))
        assert back == r
    assert back.problems[0].gpus == [0, 1, 2, 3]


# -- the same problem on several identical GPUs ------------------------------------------------------


def test_identical_problems_are_reported_once_with_every_gpu():
    probe = Probe(system=None)  # type: ignore[arg-type]
    for i in range(4):
        probe.problem("x", "GTX 1060 has no driver", "install it", "error", i)
    probe.problem("x", "GTX 1060 has no driver", "install it", "error", 2)  # the same GPU again: nothing new
    probe.problem("x", "RTX 4070 has no driver", "install it", "error", 4)  # other words: its own problem
    probe.problem("x", "GTX 1060 has no driver", "another hint", "error", 5)  # another hint: its own problem
    assert [(p.gpu, p.gpus) for p in probe.problems] == [(0, [0, 1, 2, 3]), (4, [4]), (5, [5])]
    assert probe.problems[0].message == "GTX 1060 has no driver (GPUs 0, 1, 2, 3)"


def test_machine_wide_problems_keep_no_gpu_list():
    probe = Probe(system=None)  # type: ignore[arg-type]
    probe.problem("no_avx2", "no AVX2")
    probe.problem("no_avx2", "no AVX2")
    assert [(p.gpu, p.gpus) for p in probe.problems] == [(None, [])]


def test_two_nouveau_gpus_of_one_model_give_one_problem(builder, tmp_path):
    b = builder()
    for bus in ("01", "02"):
        b.pci(f"0000:{bus}:00.0", "030000", "10de", "1c03", driver="nouveau")
    b.pci("0000:03:00.0", "030000", "10de", "2786", driver="nouveau")
    r = replay(b.write(tmp_path / "nouveau"))
    got = [(p.gpus, "last branch for Pascal" in p.hint) for p in r.problems if p.code == "nvidia_driver_not_loaded"]
    assert got == [([0, 1], True), ([2], False)]  # GTX 1060 (Pascal: R580 at most) twice, RTX 4070 once


# -- hints never advise a driver the GPU (or the OS) cannot run -------------------------------------


@pytest.mark.parametrize(
    "cc, branch",
    [("3.0", 470), ("3.5", 470), ("3.7", 470), ("5.0", 580), ("5.2", 580), ("6.0", 580), ("6.1", 580), ("7.0", 580),
     ("7.5", None), ("8.6", None), ("8.9", None), ("12.0", None), ("", None), ("2.1", 390)],
)
def test_newest_usable_branch_per_architecture(cc, branch):
    best = newest_usable_branch(cc)
    assert (best[0] if best else None) == branch


@pytest.mark.parametrize("cc", ["3.0", "3.5", "3.7"])
def test_kepler_is_told_r470_and_never_a_cuda12_driver(cc):
    for install in (False, True):
        hint = nvidia_driver_hint(cc, install)
        assert "R470" in hint and "R525" not in hint and "R580" not in hint


@pytest.mark.parametrize("cc", ["5.0", "5.2", "6.1", "7.0"])
def test_maxwell_pascal_volta_are_told_r580_at_most(cc):
    hint = nvidia_driver_hint(cc)
    assert "R580" in hint and "CUDA 13 builds do not run" in hint


def test_a_gpu_past_every_current_driver_is_told_so():
    assert "no current NVIDIA driver runs this GPU" in nvidia_driver_hint("2.1")


def test_windows_7_caps_every_gpu_at_r470():
    assert newest_usable_branch("8.6", "windows", "6.1.7601")[0] == 470
    assert "R470" in nvidia_driver_hint("7.5", os_name="windows", os_version="6.1.7601")
    assert newest_usable_branch("8.6", "windows", "10.0.19045") is None


@pytest.mark.parametrize(
    "name, dev, driver, cuda, old",
    [
        ("Tesla K80", "102d", "450.80.02", "11.0", True),  # Kepler below R470: update to R470
        ("Tesla K80", "102d", "470.256.02", "11.4", False),  # already the newest Kepler driver
        ("NVIDIA GeForce GTX 1080 Ti", "1b06", "535.54.03", "12.2", False),
        ("NVIDIA GeForce RTX 4070", "2786", "520.61.05", "11.8", True),
    ],
)
def test_driver_age_problem(builder, tmp_path, name, dev, driver, cuda, old):
    b = builder()
    b.pci("0000:01:00.0", "030200", "10de", dev, driver="nvidia")
    b.file("/sys/module/nvidia/version", driver + "\n")
    b.smi([[0, "00000000:01:00.0", name, 12000, 12000, driver]])
    r = replay(b.write(tmp_path / "age"))
    assert r.gpus[0].cuda_driver_version == cuda
    found = [p for p in r.problems if p.code == "nvidia_driver_old"]
    assert bool(found) == old
    if found and "K80" in name:
        assert "R470" in found[0].hint and "R525" not in found[0].hint
