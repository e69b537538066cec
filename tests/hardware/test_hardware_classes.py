"""Issue 27, detection: the hardware classes real machines' dumps still got wrong.

Each class is replayed from a capture made of a real public dump (tests/hardware/make_class_fixtures.py);
the variations a dump does not show are built here with the same CaptureBuilder.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from accelstack import schemas
from accelstack.hardware import detect, tables, windows
from accelstack.hardware.capture import CapturingSystem
from accelstack.hardware.common import classify_kind
from accelstack.hardware.report import HardwareReport
from accelstack.hardware.system import ReplaySystem
from accelstack.manifests import Manifests, Request, resolve
from accelstack.serde import from_dict, to_dict

from .conftest import CAPTURES, TEST_HOME, make_fixture, replay

MTL = "linux-intel-meteorlake-7d55-npu"
XDNA = "linux-amd-phoenix-780m-npu-amdxdna"
NO_DEVICES = "linux-nvidia-no-devices-rtx3090-550"
SMI_SYSTEM32 = "windows-nvidia-rtx4060-laptop-driver-unread-smi-system32"
PARTIAL_WMI = "i11d-windows-rtx4060-laptop-partial-wmi"


# -- Intel Core Ultra iGPUs are integrated: the platform decides, not a name or a database flag -------

def test_meteor_lake_arc_graphics_is_integrated():
    r = replay(CAPTURES / MTL)
    g = r.gpus[0]
    assert (g.name, g.kind, g.intel_generation) == ("Intel Arc Graphics", "integrated", "Xe-LPG (Meteor Lake)")
    assert "integrated GPU" in r.preference[0].reason


def test_the_database_flag_is_not_what_decides():
    """torchruntime's PCI database flags 7d55 discrete; the kernel's id list says Meteor Lake, an iGPU."""
    known = tables.pci_lookup("8086", "7d55")
    if known is not None:
        assert known[1] is True  # the flag this issue is about: were it fixed, this test would say so
    assert tables.intel_platform("7d55") == ("MTL", "Xe-LPG (Meteor Lake)", "integrated")


@pytest.mark.parametrize("device, bus, kind", [
    ("7dff", "0000:00:02.0", "integrated"),  # an id the kernel list does not know yet, at the iGPU's position
    ("e21f", "0000:03:00.0", "discrete"),    # a Battlemage-prefix id behind a root port
    ("e21f", "0000:00:02.0", "integrated"),  # the bus position of the integrated function wins over a prefix
    ("7d55", "0000:03:00.0", "integrated"),  # the kernel's id list wins over everything
    ("56a0", "", "discrete"),
])
def test_intel_kind_from_the_id_list_then_the_bus_position(device, bus, kind):
    assert classify_kind("intel", "Intel(R) Arc(TM) Graphics", device, bus_id=bus) == kind


def test_lunar_and_arrow_lake_ids_on_linux_are_integrated(tmp_path, builder):
    b = builder()
    b.pci("0000:00:02.0", "030000", "8086", "64a0", driver="xe")  # Lunar Lake Arc 140V
    r = replay(b.write(tmp_path / "lnl"))
    assert (r.gpus[0].kind, r.gpus[0].intel_generation) == ("integrated", "Xe2-LPG (Lunar Lake)")
    b = builder()
    b.pci("0000:00:02.0", "030000", "8086", "7d51", driver="i915")  # Arrow Lake-P Arc 130T/140T
    r = replay(b.write(tmp_path / "arl"))
    assert (r.gpus[0].kind, r.gpus[0].intel_generation) == ("integrated", "Xe-LPG (Arrow Lake)")


def test_windows_meteor_lake_next_to_an_nvidia_card(tmp_path, builder):
    """Windows names it 'Intel(R) Arc(TM) Graphics' with PCI id 7D55: integrated, after the discrete NVIDIA card."""
    b = builder(system="Windows", machine="AMD64", release="11", version="10.0.22631", win_version="10.0.22631")
    b.powershell({
        "gpus": [{"Name": "Intel(R) Arc(TM) Graphics", "PNPDeviceID": "PCI\\VEN_8086&DEV_7D55", "DriverVersion": "31.0.101.5590",
                  "AdapterRAM": 134217728, "Status": "OK"},
                 {"Name": "NVIDIA GeForce RTX 4060 Laptop GPU", "PNPDeviceID": "PCI\\VEN_10DE&DEV_28A0", "DriverVersion": "32.0.15.8115",
                  "AdapterRAM": 4293918720, "Status": "OK"}],
        "registry": [], "cpu": {"Name": "Intel(R) Core(TM) Ultra 7 155H", "Manufacturer": "GenuineIntel"}, "features": {},
    })
    b.command(make_fixture.SMI_QUERY, missing=True)
    r = replay(b.write(tmp_path / "win-mtl"))
    assert [(g.vendor, g.kind) for g in r.gpus] == [("intel", "integrated"), ("nvidia", "discrete")]
    assert r.gpus[0].intel_generation == "Xe-LPG (Meteor Lake)"


# -- NPUs are reported as NPUs, never as GPUs ------------------------------------------------------------

def test_the_meteor_lake_npu_is_an_npu_not_a_gpu():
    r = replay(CAPTURES / MTL)
    assert [g.pci_device_id for g in r.gpus] == ["7d55"]
    assert [(n.vendor, n.name, n.pci_device_id, n.bus_id, n.driver) for n in r.npus] == [
        ("intel", "Intel NPU (Meteor Lake)", "7d1d", "0000:00:0b.0", "intel_vpu")]
    assert all(p.gpu in (None, 0) for p in r.preference)


def test_the_amd_xdna_npu_is_an_npu():
    r = replay(CAPTURES / XDNA)
    assert [g.pci_device_id for g in r.gpus] == ["15bf"]
    assert [(n.vendor, n.pci_device_id, n.bus_id, n.driver) for n in r.npus] == [("amd", "1502", "0000:c2:00.1", "amdxdna")]


def test_an_npu_without_its_driver_is_known_by_its_id(tmp_path, builder):
    b = builder()
    b.pci("0000:00:0b.0", "120000", "8086", "643e")  # Lunar Lake NPU, intel_vpu not loaded
    b.pci("0000:c6:00.1", "118000", "1022", "17f0")  # Strix NPU, amdxdna not loaded
    r = replay(b.write(tmp_path / "unbound"))
    assert r.gpus == []
    assert [(n.name, n.driver) for n in r.npus] == [("Intel NPU (Lunar Lake)", ""), ("AMD XDNA 2 NPU (Strix / Krackan / Strix Halo)", "")]


def test_any_processing_accelerator_that_is_no_gpu_is_an_npu(tmp_path, builder):
    b = builder()
    b.pci("0000:03:00.0", "120000", "1e60", "2864", driver="hailo")  # a third-party AI accelerator card
    b.pci("0000:05:00.0", "120000", "1002", "74a1", driver="amdgpu")  # an Instinct MI300X carries class 0x12 too: a GPU
    r = replay(b.write(tmp_path / "accel"))
    assert [(g.vendor, g.pci_device_id) for g in r.gpus] == [("amd", "74a1")]
    assert [(n.vendor, n.pci_vendor_id, n.name) for n in r.npus] == [("other", "1e60", "PCI NPU 1e60:2864")]


def test_npus_round_trip_and_match_the_detect_schema():
    r = replay(CAPTURES / MTL)
    data = to_dict(r)
    assert from_dict(HardwareReport, json.loads(json.dumps(data))) == r
    schema = json.loads((schemas.HERE / "result-detect.schema.json").read_text(encoding="utf-8"))
    Draft202012Validator(schema).validate(data)


# -- the NVIDIA module is loaded, nvidia-smi: "No devices were found" ------------------------------------

def test_no_devices_found_is_its_own_problem_and_blocks_cuda():
    r = replay(CAPTURES / NO_DEVICES)
    (p,) = [p for p in r.problems if p.code.startswith("nvidia")]
    assert (p.code, p.severity) == ("nvidia_gpu_not_initialized", "error")
    assert "loaded" in p.message and "No devices were found" in p.message
    assert "dmesg" in p.hint and "RmInitAdapter" in p.hint and "install the NVIDIA proprietary driver" not in p.hint
    cuda = r.api("cuda")
    assert cuda is not None and not cuda.usable and "could not initialize" in cuda.evidence[0]
    assert [x.api for x in r.preference] == ["cpu"]


def test_no_vulkan_on_a_gpu_the_driver_could_not_initialize(tmp_path, copy_capture):
    src = copy_capture(NO_DEVICES)
    index = json.loads((src / "capture.json").read_text(encoding="utf-8"))
    index["exists"]["/usr/lib/x86_64-linux-gnu/libvulkan.so.1"] = True
    index["dirs"]["/usr/share/vulkan/icd.d"] = ["nvidia_icd.json"]
    (src / "capture.json").write_text(json.dumps(index), encoding="utf-8")
    r = replay(src)
    assert r.vulkan_loader and not (r.api("vulkan") and r.api("vulkan").usable)


def test_a_driver_that_is_not_running_is_still_that_problem(tmp_path, builder):
    """"couldn't communicate with the NVIDIA driver" is the driver missing: the advice stays to install it."""
    b = builder()
    b.pci("0000:01:00.0", "030000", "10de", "2204", driver="nvidia")
    b.command(make_fixture.SMI_QUERY, stdout="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", returncode=9)
    r = replay(b.write(tmp_path / "not-running"))
    assert "nvidia_driver_not_loaded" in r.problem_codes() and "nvidia_gpu_not_initialized" not in r.problem_codes()


# -- Windows: the driver version where Windows has it ----------------------------------------------------

def test_the_drivers_own_nvidia_smi_in_system32_gives_the_version():
    r = replay(CAPTURES / SMI_SYSTEM32)
    g = r.gpus[1]
    assert (g.driver_version, g.cuda_driver_version, g.vram_total) == ("581.15", "13.0", 8188 * 1024 * 1024)
    assert "nvidia_driver_version_unknown" not in r.problem_codes()
    assert (r.preference[0].api, r.preference[0].gpu) == ("cuda", 1)


def test_the_nvsmi_folder_of_older_drivers_too(tmp_path, copy_capture):
    src = copy_capture(PARTIAL_WMI)
    index = json.loads((src / "capture.json").read_text(encoding="utf-8"))
    nvsmi = "C:\\Program Files\\NVIDIA Corporation\\NVSMI\\nvidia-smi.exe"
    index["exists"][nvsmi] = True
    n = len(index["commands"])
    index["commands"].append({"argv": [nvsmi, *make_fixture.SMI_QUERY[1:]], "returncode": 0, "stdout": f"commands/{n}.out",
                              "stderr": f"commands/{n}.err", "timed_out": False, "missing": False, "duration_ms": 0.0})
    (src / "commands" / f"{n}.out").write_text("0, 00000000:01:00.0, NVIDIA GeForce RTX 4060 Laptop GPU, 8188, 7957, 537.13, 8.9\n")
    (src / "commands" / f"{n}.err").write_text("")
    (src / "capture.json").write_text(json.dumps(index), encoding="utf-8")
    r = replay(src)
    assert r.gpus[1].driver_version == "537.13"


def test_still_unread_the_report_says_so():
    r = replay(CAPTURES / PARTIAL_WMI)
    g = r.gpus[1]
    assert (g.driver, g.driver_version, g.cuda_driver_version) == ("wddm", "", "")
    assert "nvidia_driver_version_unknown" in r.problem_codes()


# -- Windows: the registry's DriverVersion when WMI and nvidia-smi(.exe) gave none -----------------------

REGISTRY = "windows-nvidia-rtx4060-laptop-driver-from-registry"
FULL_WMI = "i11d-windows-adl-uhd46a3-rtx4060-laptop"


class _Recording(ReplaySystem):
    """A replay that remembers which commands detection ran."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.ran: list = []

    def run(self, argv, timeout=5.0):  # type: ignore[override]
        self.ran.append(list(argv))
        return super().run(argv, timeout)


def _registry_capture(dest, stdout: str, returncode: int = 0):
    """The partial-WMI laptop copied to ``dest``, whose registry read answers ``stdout``."""
    src = Path(shutil.copytree(CAPTURES / PARTIAL_WMI, dest))
    index = json.loads((src / "capture.json").read_text(encoding="utf-8"))
    n = len(index["commands"])
    index["commands"].append({"argv": list(windows.REGISTRY_DRIVER), "returncode": returncode, "stdout": f"commands/{n}.out",
                              "stderr": f"commands/{n}.err", "timed_out": False, "missing": False, "duration_ms": 0.0})
    (src / "commands" / f"{n}.out").write_text(stdout, encoding="utf-8")
    (src / "commands" / f"{n}.err").write_text("", encoding="utf-8")
    (src / "capture.json").write_text(json.dumps(index), encoding="utf-8")
    return src


def test_the_registry_gives_the_version_when_wmi_and_nvidia_smi_did_not():
    r = replay(CAPTURES / REGISTRY)
    g = r.gpus[1]
    assert (g.driver_version, g.cuda_driver_version, g.vram_total) == ("581.15", "13.0", 8 * 1024 ** 3)
    assert any("registry" in s and "DriverVersion" in s for s in g.sources), g.sources
    assert "nvidia_driver_version_unknown" not in r.problem_codes()
    assert (r.preference[0].api, r.preference[0].gpu) == ("cuda", 1)


def test_the_registry_is_read_only_when_the_version_is_still_unknown():
    for name, needed in ((FULL_WMI, False), (SMI_SYSTEM32, False), (REGISTRY, True), (PARTIAL_WMI, True)):
        system = _Recording(str(CAPTURES / name))
        detect(system, home=TEST_HOME, timeout=5.0)
        assert (list(windows.REGISTRY_DRIVER) in system.ran) is needed, name
        assert system.ran[0] == list(windows.POWERSHELL), "the first query's command line is unchanged"


def test_the_registry_read_is_recorded_in_a_capture_and_replays(tmp_path):
    capturing = CapturingSystem(ReplaySystem(str(CAPTURES / REGISTRY)))
    first = detect(capturing, home=TEST_HOME, timeout=5.0)
    capturing.save(str(tmp_path / "again"))
    index = json.loads((tmp_path / "again" / "capture.json").read_text(encoding="utf-8"))
    assert list(windows.REGISTRY_DRIVER) in [c["argv"] for c in index["commands"]]
    assert replay(tmp_path / "again").gpus[1].driver_version == first.gpus[1].driver_version == "581.15"


def test_the_registry_entry_is_matched_by_the_pci_ids(tmp_path):
    entries = [{"MatchingDeviceId": "pci\\ven_10de&dev_28a01", "DriverVersion": "31.0.15.5222"},  # a longer id is another device
               {"MatchingDeviceId": "pci\\ven_10de&dev_2860", "DriverVersion": "31.0.15.5222"},   # another NVIDIA GPU
               {"MatchingDeviceId": "PCI\\VEN_10DE&DEV_28A0&SUBSYS_0B9A1028", "DriverVersion": "31.0.15.5222"}]
    r = replay(_registry_capture(tmp_path / "all", json.dumps(entries)))
    assert r.gpus[1].driver_version == "552.22"  # Windows' 31.0.15.5222 is NVIDIA's 552.22
    r = replay(_registry_capture(tmp_path / "others", json.dumps(entries[:2])))
    assert r.gpus[1].driver_version == "" and "nvidia_driver_version_unknown" in r.problem_codes()


@pytest.mark.parametrize("stdout, returncode", [
    ("", 0), ("garbage\r\n", 0), ("[", 0), ("[" * 100_000, 0), ("null", 0), ("42", 0), ('"31.0.15.5222"', 0), ("[[], 1, null]", 0),
    ('{"MatchingDeviceId": "pci\\\\ven_10de&dev_28a0", "DriverVersion": "31.0.15.5222"}', 1),  # the command failed
    ('{"MatchingDeviceId": "pci\\\\ven_10de&dev_28a0"}', 0),
    ('{"MatchingDeviceId": "pci\\\\ven_10de&dev_28a0", "DriverVersion": 3101552220}', 0),
    ('{"MatchingDeviceId": "pci\\\\ven_10de&dev_28a0", "DriverVersion": "not.a.version"}', 0),
    ('{"MatchingDeviceId": "pci\\\\ven_10de&dev_28a0", "DriverVersion": "31.0.15.' + "9" * 100_000 + '"}', 0),
    ('{"MatchingDeviceId": ["pci\\\\ven_10de&dev_28a0"], "DriverVersion": "31.0.15.5222"}', 0),
    # two entries for this GPU that disagree: neither is taken
    ('[{"MatchingDeviceId": "pci\\\\ven_10de&dev_28a0", "DriverVersion": "31.0.15.5222"},'
     ' {"MatchingDeviceId": "pci\\\\ven_10de&dev_28a0", "DriverVersion": "32.0.15.8115"}]', 0),
])
def test_garbage_from_the_registry_gives_no_version_and_no_crash(tmp_path, stdout, returncode):
    r = replay(_registry_capture(tmp_path / "cap", stdout, returncode))
    g = r.gpus[1]
    assert (g.driver_version, g.cuda_driver_version) == ("", "")
    assert "nvidia_driver_version_unknown" in r.problem_codes()
    assert not any(p.code.startswith("probe_failed") for p in r.problems)


def test_a_version_from_the_registry_gets_the_ordinary_cuda_plan():
    """Not the lowest-floor fallback of an unread driver: the plan of the driver the registry names."""
    unread = resolve(replay(CAPTURES / PARTIAL_WMI), Request(stack="torch", python="3.11"), Manifests.builtin())
    assert unread.variant == "cu118" and any("could not be read" in n for n in unread.notes)  # what it was before
    plan = resolve(replay(CAPTURES / REGISTRY), Request(stack="torch", python="3.11"), Manifests.builtin())
    full = resolve(replay(CAPTURES / FULL_WMI), Request(stack="torch", python="3.11"), Manifests.builtin())
    assert (plan.backend, plan.variant, plan.gpus) == (full.backend, full.variant, full.gpus) == ("cuda", "cu130", [1])
    assert not any("could not be read" in n for n in plan.notes)
