"""Differential test against torchruntime's ``get_torch_platform`` on the same replayed machines.

torchruntime (easydiffusion) is the field's reference: it maps the GPU model to a platform string,
without looking at the driver, the Python version or what each wheel was compiled for. Every machine
where the two disagree is listed below with the reason ours is right; a new disagreement (a new
capture, a torchruntime update, a matrix change) fails the test until it is explained here.

torchruntime reads the platform from module globals (``os_name``, ``arch``, ``py_version``) set at
import; to ask it about a replayed machine those globals are set to that machine's values. Its GPUs
come from its own PCI-id database when the capture has PCI ids, as on a live machine.
"""
from __future__ import annotations

import pytest

from accelstack.hardware.report import HardwareReport

from ._factory import fixture_names, plan_of, replay

torchruntime = pytest.importorskip("torchruntime")
from torchruntime import device_db, platform_detection  # noqa: E402

PYTHON = "3.11"
_OS = {"linux": "Linux", "windows": "Windows", "macos": "Darwin"}
_VENDOR_IDS = {"nvidia": "10de", "amd": "1002", "intel": "8086", "apple": "106b"}

# machine: (torchruntime says, we say, why ours is right)
#
# Issue 11 moved several rows (and added captures):
# - NVIDIA's minor-version compatibility (compat-facts 1.2): drivers R525-R575 now run the cu126 wheels of the
#   newest torch (2.14) instead of the cu118 wheel of torch 2.7, so the 535/550/555/531/546 machines differ from
#   torchruntime's cu128/cu124 only in which CUDA 12.x wheel gives the newest torch.
# - torch 2.15 (PyPI's own Linux wheel is CUDA 13.2): R580 machines get cu132 2.15 where torchruntime says cu128.
# - Jetson captures (i11d-jetson-*) agree with torchruntime (CPU torch), for our own reason: the aarch64 CUDA
#   wheels are SBSA builds; the plan points at NVIDIA's Jetson wheels for the board's JetPack.
# - gfx803, macOS 11 and a partial Windows report are new captures where torchruntime looks at the GPU name only.
DISAGREEMENTS = {
    "i11d-macos11-intel-uhd630-radeon5500m-text": ("mps", "cpu",
        "the Mac runs macOS 11.1; torch's MPS backend needs macOS 12.3 or newer (PT-MPS), so its last x86_64 torch (2.2) "
        "runs on the CPU only. torchruntime does not look at the macOS version"),
    "i11d-windows-adl-uhd46a3-rtx4060-laptop": ("cu128", "cu130",
        "both run on the RTX 4060 Laptop GPU (driver 581.15 reports CUDA 13.0); cu130 gives torch 2.14, cu128 ends at 2.11"),
    "i11d-windows-rtx4060-laptop-partial-wmi": ("cu128", "cu118",
        "the partial WMI report shows NVIDIA's driver but not its version, and no nvidia-smi answered: the plan takes the CUDA "
        "build this GPU runs with the oldest driver (cu118, driver >= 452.39 on Windows), says the driver could not be read and "
        "leaves the proof to the install's device check (issue 27); torchruntime maps the GPU name to cu128 (driver >= 527.41 "
        "for its PTX-free sm_89 code) without looking at the driver"),
    "i11p-linux-amd-ellesmere-gfx803": ("rocm4.2", "cpu",
        "gfx803 (Polaris) is in no torch ROCm wheel of the matrix (2.4+) and in no current ROCm release (compat-facts 3.4, 4.1); "
        "torchruntime's rocm4.2 index predates the matrix's torch lines and the ROCm releases still supported"),
    "linux-amd-2x-rx7900xtx-rocm": ("rocm6.2", "rocm7.14",
        "both have gfx1100 kernels; rocm6.2 caps torch at 2.5, rocm7.14 is the newest build listing gfx1100 (torch 2.14)"),
    "linux-amd-phoenix-780m-npu-amdxdna": ("rocm6.2", "cpu",
        "the 780M (gfx1103) has no /dev/kfd in the capture, so ROCm cannot run; its XDNA NPU is reported as an NPU, never a GPU "
        "(issue 27). torchruntime maps gfx1103 to rocm6.2, whose wheels have no gfx1103 code and hang with the override (PT-179653)"),
    "linux-amd-680m-apu-proxmox": ("rocm6.2", "cpu",
        "gfx1035 (integrated RDNA2) is in no PyTorch ROCm wheel and the override to gfx1030 is unreliable on iGPUs; "
        "the capture also shows /dev/kfd is not accessible, so ROCm cannot run at all (with /dev/kfd open, ours is AMD's own "
        "gfx1035 build, rocm-amd, release-ready on Linux in TheRock SUPPORTED_GPUS.md: test_amd_linux_rocm.py)"),
    "linux-amd-780m-apu-docker": ("rocm6.2", "rocm7.14",
        "rocm6.2 wheels have no gfx1103 code objects and HSA_OVERRIDE_GFX_VERSION=11.0.0 hangs gfx1103 (PT-179653); "
        "rocm7.14 lists gfx1103 natively"),
    "linux-amd-rx7900xtx-no-rocm": ("rocm6.2", "cpu",
        "/dev/kfd is not accessible in the capture: a ROCm torch would fall back to CPU at run time; ours says to add "
        "the user to the render/video groups and installs what works now"),
    "linux-nvidia-2x-quadro-rtx4000-535": ("cu128", "cu126",
        "driver 535.129.03 (CUDA 12.2) runs both through NVIDIA minor-version compatibility (compat-facts 1.2): a CUDA 12.x wheel with native code for the GPU runs on any R525+ driver; "
        "cu128 ends at torch 2.11, cu126 has sm_75 kernels up to torch 2.14"),
    "linux-nvidia-4x-titanx-pascal-418": ("cu124", "cpu",
        "driver 418.39 supports CUDA up to 10.1; every torch CUDA wheel in the matrix needs 11.8 or newer"),
    "linux-nvidia-dgx-spark-gb10-580": ("cu128", "cu132",
        "the GB10 (sm_121, aarch64) runs the 12.0 cubins of the CUDA 13 aarch64 wheels (compat-facts 3.3: cu130/cu132 for GB10); "
        "cu132 is torch 2.15, run by the 580 driver (CUDA 13.0) through NVIDIA minor-version compatibility; torchruntime maps "
        "the Blackwell name to cu128 without looking at the driver (issue 42)"),
    "windows-nvidia-rtx4060-laptop-595": ("cu128", "cu132",
        "both run on the RTX 4060 Laptop GPU; driver 595.79 reports CUDA 13.2 (its nvidia-smi), so cu132 (torch 2.15) runs natively; "
        "cu128 ends at torch 2.11 (issue 42)"),
    "linux-nvidia-8x-b200-580": ("cu128", "cu132",
        "both run (driver reports CUDA 13.0, sm_100 in both); cu128 ends at torch 2.11, cu132 is PyPI's own torch 2.15 "
        "(CUDA 13.2, run by the 13.0 driver through NVIDIA minor-version compatibility)"),
    "linux-nvidia-h200-580-container": ("cu128", "cu132",
        "both run (driver reports CUDA 13.0, sm_90 in both); cu128 ends at torch 2.11, cu132 is PyPI's own torch 2.15 "
        "(CUDA 13.2, run by the 13.0 driver through NVIDIA minor-version compatibility)"),
    "linux-nvidia-8x-h100-550": ("cu128", "cu126",
        "driver 550.54.15 (CUDA 12.4) runs both through NVIDIA minor-version compatibility (compat-facts 1.2): a CUDA 12.x wheel with native code for the GPU runs on any R525+ driver; cu128 ends at torch 2.11, cu126 (sm_90) reaches 2.14"),
    "linux-nvidia-driver-library-mismatch-580": ("cu128", "cpu",
        "the kernel module and user-space driver differ (NVML mismatch): no CUDA program runs until a reboot"),
    "linux-nvidia-gtx680-331": ("cu118", "cpu",
        "the GTX 680 is Kepler sm_30: no torch CUDA wheel has kernels for it (cu118's oldest is sm_37), whatever the driver, "
        "and driver 331.38 reports no CUDA version at all; the rejection says the architecture first (issue 27)"),
    "linux-nvidia-quadro-k600-gk107-470": ("cu118", "cpu",
        "the Quadro K600 is a GK107 Kepler part, sm_30 (its PCI id 10de:0ffa, issue 42): no torch CUDA wheel has kernels for it "
        "(cu118's oldest is sm_37), whatever the driver; torchruntime maps the Kepler name to cu118 without looking at the SM"),
    "linux-nvidia-no-devices-rtx3090-550": ("cu128", "cpu",
        "the 550.144.03 module is loaded but could not initialize the RTX 3090 (nvidia-smi: No devices were found; dmesg: "
        "RmInitAdapter failed): no CUDA program sees the GPU until that is fixed, and the plan says so (issue 27)"),
    "linux-nvidia-nouveau-intel-haswell": ("cu124", "cpu",
        "the GTX 1060 runs the nouveau driver: CUDA needs NVIDIA's proprietary driver first"),
    "linux-nvidia-open-555-russian-date": ("cu128", "cu126",
        "driver 555.58 (CUDA 12.5) runs both through NVIDIA minor-version compatibility (compat-facts 1.2): a CUDA 12.x wheel with native code for the GPU runs on any R525+ driver; cu128 ends at torch 2.11, cu126 (sm_86) reaches 2.14"),
    "linux-nvidia-rtx3090-580-two-part-version": ("cu128", "cu132",
        "both run (driver reports CUDA 13.0); cu128 ends at torch 2.11, cu132 is PyPI's own torch 2.15 (13.2 on a 13.0 driver: minor-version compatibility)"),
    "linux-nvidia-rtx4070-550": ("cu128", "cu126",
        "driver 550.40.07 (CUDA 12.4) runs both through NVIDIA minor-version compatibility (compat-facts 1.2): a CUDA 12.x wheel with native code for the GPU runs on any R525+ driver; cu128 ends at torch 2.11, cu126 (sm_86 code runs on 8.9) reaches 2.14"),
    "linux-nvidia-rtx5090-rtx4090-580": ("cu128", "cu132",
        "both run on both cards (sm_120 and sm_86 kernels); cu128 ends at torch 2.11, cu132 is PyPI's own torch 2.15"),
    "macos-apple-m3": ("cpu", "mps",
        "torchruntime does not handle integrated GPUs on Macs; Apple silicon runs torch's MPS backend"),
    "macos-apple-m3-pro-truncated-json": ("cpu", "mps",
        "torchruntime does not handle integrated GPUs on Macs; Apple silicon runs torch's MPS backend"),
    "windows-amd-890m-gfx1150-hip7": ("directml", "rocm-amd",
        "gfx1150 is release-ready in AMD's own ROCm builds of PyTorch for Windows (TheRock SUPPORTED_GPUS.md) and the driver "
        "carries their HIP 7 runtime (amdhip64_7.dll), so torch[device-gfx1150] from AMD's multi-arch index runs there; "
        "torchruntime knows only PyTorch's index, which has no ROCm for Windows, and falls back to the unmaintained DirectML (DML)"),
    "windows-nvidia-gtx1080ti-531": ("cu124", "cu126",
        "driver 531.14 (CUDA 12.1, >= 527.41 on Windows) runs both through NVIDIA minor-version compatibility (compat-facts 1.2): a CUDA 12.x wheel with native code for the GPU runs on any R525+ driver; cu124 ends at torch 2.6, "
        "cu126 (sm_60 code runs on 6.1) reaches 2.14"),
    "windows-nvidia-rtx4060-laptop-driver-unread-smi-system32": ("cu128", "cu130",
        "nvidia-smi.exe in System32 reads driver 581.15 (CUDA 13.0) where WMI had no version; both run, cu130 gives torch 2.15, "
        "cu128 ends at 2.11"),
    "windows-nvidia-rtx4060-laptop-driver-from-registry": ("cu128", "cu130",
        "the registry's DriverVersion 32.0.15.8115 reads driver 581.15 (CUDA 13.0) where WMI had no version and no nvidia-smi "
        "answered (issue 27); both run, cu130 gives torch 2.15, cu128 ends at 2.11"),
    "windows-nvidia-rtx4060-591": ("cu128", "cu130",
        "both run (driver reports CUDA 13.1); cu130 gives torch 2.14, cu128 ends at 2.11"),
    "windows7-laptop-intel-hd-quadro-m2000m-441": ("cu124", "cpu",
        "driver 441.66 supports CUDA up to 10.2, and DirectML needs Windows 10 1709+: only the CPU build runs"),
    "wsl2-nvidia-rtx3060-laptop": ("cu128", "cu126",
        "the Windows host driver 546.80 (CUDA 12.3) runs both through NVIDIA minor-version compatibility (compat-facts 1.2): a CUDA 12.x wheel with native code for the GPU runs on any R525+ driver; cu128 ends at torch 2.11, cu126 reaches 2.14"),
}


def torchruntime_gpus(report: HardwareReport):
    gpus = []
    for g in report.gpus:
        if g.vendor not in _VENDOR_IDS:
            continue
        vendor = g.pci_vendor_id or _VENDOR_IDS[g.vendor]
        found = device_db.get_device_infos([(vendor, g.pci_device_id.lower())]) if g.pci_device_id else []
        gpus.extend(found or [device_db.GPU(vendor, g.vendor, g.pci_device_id, g.name, g.kind != "integrated")])
    return gpus


def torchruntime_says(report: HardwareReport, monkeypatch) -> str:
    os_name = _OS[report.os.name]
    arch = report.os.arch
    if os_name == "Windows":
        arch = "amd64"
    elif os_name == "Linux" and arch == "arm64":
        arch = "aarch64"
    monkeypatch.setattr(platform_detection, "os_name", os_name)
    monkeypatch.setattr(platform_detection, "arch", arch)
    monkeypatch.setattr(platform_detection, "py_version", tuple(int(p) for p in PYTHON.split(".")))
    try:
        return platform_detection.get_torch_platform(torchruntime_gpus(report))
    except NotImplementedError as exc:  # its answer for mixed vendors and unknown platforms
        return f"raises NotImplementedError: {exc}"


@pytest.mark.parametrize("name", fixture_names())
def test_against_torchruntime(name, monkeypatch, capsys):
    report = replay(name)
    theirs = torchruntime_says(report, monkeypatch)
    capsys.readouterr()  # torchruntime prints its warnings
    ours = plan_of(report, "torch", python=PYTHON).variant
    if theirs == ours:
        assert name not in DISAGREEMENTS, f"{name}: now agrees ({ours}); drop it from DISAGREEMENTS"
        return
    assert name in DISAGREEMENTS, f"{name}: torchruntime says {theirs!r}, we say {ours!r}: explain it in DISAGREEMENTS"
    listed_theirs, listed_ours, why = DISAGREEMENTS[name]
    assert (theirs, ours) == (listed_theirs, listed_ours), why


def test_every_listed_disagreement_is_a_capture():
    assert set(DISAGREEMENTS) <= set(fixture_names())
