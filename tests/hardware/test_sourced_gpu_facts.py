"""Issue 42, detection: GPU facts the name tables miss, read from sourced data (replayed real machines)."""
from __future__ import annotations

from pathlib import Path

from accelstack.hardware import detect
from accelstack.hardware.common import nvidia_driver_hint
from accelstack.hardware.system import ReplaySystem

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "captures"


def _replay(name: str):
    return detect(ReplaySystem(str(CAPTURES / name)), home=Path("/nonexistent/accelstack-test-home"))


def test_a_gk107_part_no_name_rule_knows_gets_its_compute_capability_from_the_pci_id():
    report = _replay("linux-nvidia-quadro-k600-gk107-470")
    (g,) = report.gpus
    assert (g.name, g.pci_device_id, g.compute_capability) == ("Quadro K600", "0ffa", "3.0")
    assert "compute_capability: PCI device id (GK107)" in g.sources
    for p in report.problems:  # R470 is the newest branch a Kepler GPU runs: nothing tells it to go past it
        assert "R525" not in p.hint and "R580" not in p.hint, p


def test_driver_advice_for_a_kepler_part_names_the_legacy_r470_branch():
    hint = nvidia_driver_hint("3.0", install=True)
    assert "R470" in hint and "R580" not in hint and "R525 or newer" not in hint


def test_the_gb10_of_a_dgx_spark_is_an_integrated_gpu_whatever_the_pci_database_flags():
    report = _replay("linux-nvidia-dgx-spark-gb10-580")
    (g,) = report.gpus
    assert (g.name, g.compute_capability, g.cuda_driver_version) == ("NVIDIA GB10", "12.1", "13.0")
    assert g.kind == "integrated"  # unified memory: the system's LPDDR5X, no memory of its own
    assert "discrete" not in report.preference[0].reason


def test_a_windows_r595_driver_reports_cuda_13_2_as_its_nvidia_smi_does():
    report = _replay("windows-nvidia-rtx4060-laptop-595")
    (g,) = report.gpus
    assert (g.driver_version, g.cuda_driver_version) == ("595.79", "13.2")
    cuda = report.api("cuda")
    assert cuda is not None and cuda.usable and cuda.version == "13.2"


def test_an_intel_data_center_gpu_max_is_named_and_its_dkms_driver_version_is_not_the_kernels_release():
    report = _replay("linux-intel-max1100-pvc-dkms")
    (g,) = report.gpus
    assert g.name == "Intel Data Center GPU Max 1100"
    assert (g.kind, g.intel_generation) == ("discrete", "Xe-HPC (Ponte Vecchio)")
    assert g.driver_version == "1.24.4.12.240603.18" != report.os.kernel
