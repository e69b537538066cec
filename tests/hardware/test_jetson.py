"""Jetson/Tegra (issue 11): the SoC from the device tree, CUDA from the L4T release, nvidia-smi ignored."""
from __future__ import annotations

import pytest

from accelstack import serde
from accelstack.hardware import tables
from accelstack.hardware.common import parse_smi_csv
from accelstack.hardware.report import HardwareReport

from .conftest import CAPTURES, replay
from .make_i11d_fixtures import JETSON_SMI_ROW, mf

XAVIER_NX_COMPATIBLE = "lenovo,thinkedge-se70\x00nvidia,p3509-0000+p3668-0001\x00nvidia,tegra194\x00"


def _jetson(builder, **files: str):
    b = builder(machine="aarch64")
    for path, text in files.items():
        b.file(path, text)
    return b


@pytest.mark.parametrize(
    "l4t, cuda",
    [("32.7.4", "10.2"), ("35.3.1", "11.4"), ("35.4.1", "11.4"), ("36.2.0", "12.2"), ("36.3.0", "12.2"), ("36.4.3", "12.6"), ("38.2.0", "13.0"), ("37.1", ""), ("3", "")],
)
def test_cuda_by_l4t_release_longest_prefix(l4t, cuda):
    assert tables.jetson_cuda(l4t) == cuda


@pytest.mark.parametrize(
    "compatible, family, cc",
    [
        ("nvidia,p3737-0000+p3701-0005\x00nvidia,p3701-0005\x00nvidia,tegra234\x00", "Orin", "8.7"),
        (XAVIER_NX_COMPATIBLE, "Xavier", "7.2"),
        ("nvidia,p3310-1000\x00nvidia,tegra186\x00", "TX2 (Parker)", "6.2"),
        ("nvidia,p3450-0000\x00nvidia,tegra210\x00", "TX1/Nano", "5.3"),
        ("raspberrypi,4-model-b\x00brcm,bcm2711\x00", "", ""),
        ("nvidia,tegra2340\x00", "", ""),  # whole entries only
    ],
)
def test_soc_from_device_tree_compatible(compatible, family, cc):
    assert tables.jetson_soc(compatible) == (family, cc)


def test_a_board_whose_model_does_not_name_the_soc(builder, tmp_path):
    """Lenovo's ThinkEdge SE70 is a Xavier NX (Linux tegra194-lenovo-thinkedge-se70.dts): the SoC decides."""
    b = _jetson(builder, **{"/proc/device-tree/model": "Lenovo ThinkEdge SE70\x00", "/proc/device-tree/compatible": XAVIER_NX_COMPATIBLE,
                            "/etc/nv_tegra_release": "# R35 (release), REVISION: 3.1, GCID: 32827747, BOARD: t186ref, EABI: aarch64\n"})
    g = replay(b.write(tmp_path / "cap")).gpus[0]
    assert (g.name, g.compute_capability, g.cuda_driver_version, g.l4t_version) == ("NVIDIA Jetson Xavier (Lenovo ThinkEdge SE70)", "7.2", "11.4", "35.3.1")


def test_jetpack6_openrm_module_without_release_file(builder, tmp_path):
    """In a container without /etc/nv_tegra_release, JetPack 6's 540.x module still names its L4T release."""
    b = _jetson(builder, **{"/proc/device-tree/compatible": "nvidia,p3768-0000+p3767-0005\x00nvidia,p3767-0005\x00nvidia,tegra234\x00",
                            "/sys/module/nvidia/version": "540.4.0\n"})
    r = replay(b.write(tmp_path / "cap"))
    g = r.gpus[0]
    assert (g.name, g.compute_capability, g.l4t_version, g.cuda_driver_version, g.driver_version) == ("NVIDIA Jetson Orin", "8.7", "36.4", "12.6", "540.4.0")
    assert "jetson_l4t_unknown" not in r.problem_codes()


def test_unknown_l4t_release_is_a_problem_and_cuda_stays_unproven(builder, tmp_path):
    b = _jetson(builder, **{"/proc/device-tree/model": "NVIDIA Jetson Xavier NX Developer Kit\x00"})
    b.device("/sys/module/nvgpu")
    r = replay(b.write(tmp_path / "cap"))
    g = r.gpus[0]
    assert (g.compute_capability, g.l4t_version, g.cuda_driver_version) == ("7.2", "", "")
    p = next(p for p in r.problems if p.code == "jetson_l4t_unknown")
    assert p.gpu == 0 and "/etc/nv_tegra_release" in p.hint
    assert not (r.api("cuda") and r.api("cuda").usable)


def test_other_arm_boards_are_not_jetsons(builder, tmp_path):
    """A Raspberry Pi has a device-tree model too; without any Tegra sign there is no NVIDIA GPU."""
    b = _jetson(builder, **{"/proc/device-tree/model": "Raspberry Pi 4 Model B Rev 1.4\x00",
                            "/proc/device-tree/compatible": "raspberrypi,4-model-b\x00brcm,bcm2711\x00"})
    r = replay(b.write(tmp_path / "cap"))
    assert r.gpus == [] and r.problem_codes() == []


def test_jetson_nvidia_smi_row_parses_without_inventing_facts():
    """Jetson's nvidia-smi prints [N/A] for memory, driver and compute capability (vllm-cli#11)."""
    (row,) = parse_smi_csv(JETSON_SMI_ROW)
    assert (row.name, row.vram_total, row.vram_free, row.driver_version, row.compute_capability, row.bus_id) == ("Orin (nvgpu)", None, None, "", "", "")


def test_jetson_detection_does_not_ask_nvidia_smi(builder, tmp_path):
    """Its 540.x 'driver version' is no desktop branch: the desktop table would say CUDA 12.3, not 12.6."""
    b = _jetson(builder, **{"/proc/device-tree/compatible": "nvidia,tegra234\x00", "/sys/module/nvidia/version": "540.4.0\n"})
    b.command(mf.SMI_QUERY, stdout="0, 00000000:00:00.0, Orin (nvgpu), [N/A], [N/A], 540.4.0, 8.7\n")
    r = replay(b.write(tmp_path / "cap"))
    assert [g.cuda_driver_version for g in r.gpus] == ["12.6"]
    assert tables.cuda_for_driver("540.4.0", "linux") != "12.6"  # what using nvidia-smi's version would have said


def test_l4t_version_round_trips_through_json():
    r = replay(CAPTURES / "i11d-jetson-agx-orin-jp6")
    back = serde.loads(HardwareReport, serde.dumps(r))
    assert back == r and back.gpus[0].l4t_version == "36.3.0"
