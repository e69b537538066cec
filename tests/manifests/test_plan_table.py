"""Table-driven: for each replayed machine, the torch variant, the torch version range and the ggml backend.

The captures under tests/fixtures/captures are real detection inputs (see their README/make_fixture);
detection runs on each and the resolver plans from its report, as `accelstack plan --replay` does.
The captures carry no Python version, so the plans are for a Python 3.11 environment.
Columns: torch variant, torch release line range, ggml backend chosen from the example manifest,
and the backend of the local build the plan asks for (None: the published artifact is the best).
"""
from __future__ import annotations

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from ._factory import amd, apple, fixture_names, intel, machine, nvidia, plan_of, replay

PYTHON = "3.11"

FIXTURES = {
    # machine:                                   (torch variant, torch line, ggml backend, local build)
    "i11d-jetson-agx-orin-jp6":                  ("cpu", ">=2.14", "cuda", "cuda"),     # Tegra: no SBSA wheels; ggml built for sm_87
    "i11d-jetson-xavier-jp5":                    ("cpu", ">=2.14", "cuda", "cuda"),     # Tegra sm_72, JetPack 5.1.2 (CUDA 11.4)
    "i11d-macos11-intel-uhd630-radeon5500m-text": ("cpu", "~=2.2.0", "metal", "metal"),  # macOS 11.1 < 12.3: no MPS
    "i11d-macos11-m1-json-khw-key":              ("cpu", "~=2.11.0", "metal", "metal"), # macOS 11: no MPS, <14 ends at 2.11
    "i11d-windows-adl-uhd46a3-rtx4060-laptop":   ("cu130", ">=2.14", "cuda", None),
    "i11d-windows-rtx4060-laptop-partial-wmi":   ("cu118", "~=2.7.0", "cuda", None),    # driver unread: the CUDA build with the oldest driver floor, both stacks (issues 27, 42)
    "linux-amd-phoenix-780m-npu-amdxdna":        ("cpu", ">=2.14", "cpu", None),        # the XDNA NPU is no GPU; gfx1103 without /dev/kfd
    "linux-intel-max1100-pvc-dkms":              ("xpu", ">=2.14", "cpu", "sycl"),      # Data Center GPU Max 1100 (Xe-HPC), named from its PCI id
    "linux-intel-meteorlake-7d55-npu":           ("xpu", ">=2.14", "cpu", "sycl"),      # Meteor Lake iGPU (integrated), its NPU no GPU
    "linux-nvidia-gtx680-331":                   ("cpu", ">=2.14", "cpu", None),        # sm_30: no torch CUDA wheel has its kernels
    "linux-nvidia-no-devices-rtx3090-550":       ("cpu", ">=2.14", "cpu", None),        # driver loaded, GPU not initialized
    "linux-nvidia-dgx-spark-gb10-580":           ("cu132", ">=2.15", "cuda", "cuda"),   # GB10 sm_121 (integrated, unified memory); no published arm64 ggml CUDA build
    "linux-nvidia-quadro-k600-gk107-470":        ("cpu", ">=2.14", "cpu", None),        # GK107 sm_30 (from its PCI id): no CUDA wheel, no local build
    "windows-nvidia-rtx4060-laptop-driver-unread-smi-system32": ("cu130", ">=2.14", "cuda", None),  # version from System32's nvidia-smi.exe
    "windows-nvidia-rtx4060-laptop-driver-from-registry": ("cu130", ">=2.14", "cuda", None),  # version from the registry's DriverVersion
    "i11p-linux-amd-ellesmere-gfx803":           ("cpu", ">=2.14", "cpu", None),        # gfx803: in no current ROCm
    "container-amd-mi300x-kfd-einval":           ("cpu", ">=2.14", "cpu", None),        # /dev/kfd EINVAL: ROCm unusable
    "linux-amd-2x-rx7900xtx-rocm":               ("rocm7.14", ">=2.14", "rocm", None),
    "linux-amd-680m-apu-proxmox":                ("cpu", ">=2.14", "cpu", None),        # gfx1035 iGPU, no ROCm access
    "linux-amd-780m-apu-docker":                 ("rocm7.14", ">=2.14", "rocm", None),  # gfx1103 native in ROCm 7.14
    "linux-amd-rx7900xtx-no-rocm":               ("cpu", ">=2.14", "cpu", None),
    "linux-arm64-graviton1":                     ("cpu", ">=2.14", "cpu", None),
    "linux-arm64-jetson-orin-nx":                ("cpu", ">=2.14", "cuda", "cuda"),     # CUDA 11.4: nothing published
    "linux-cpu-pentium-e5700-no-avx":            ("cpu", ">=2.14", "cpu", None),
    "linux-intel-arc-a770":                      ("xpu", ">=2.14", "cpu", "sycl"),
    "linux-nvidia-2x-quadro-rtx4000-535":        ("cu126", ">=2.14", "cuda", None),     # driver CUDA 12.2: 12.x minor-version compat
    "linux-nvidia-4x-titanx-pascal-418":         ("cpu", ">=2.14", "cpu", None),        # driver CUDA 10.1: no toolkit that builds ggml runs
    "linux-nvidia-8x-b200-580":                  ("cu132", ">=2.14", "cuda", None),
    "linux-nvidia-h200-580-container":           ("cu132", ">=2.14", "cuda", None),     # captured on a real H200, where torch cu130 passed verify
    "linux-nvidia-8x-h100-550":                  ("cu126", ">=2.14", "cuda", None),     # driver CUDA 12.4: 12.x minor-version compat
    "linux-nvidia-driver-library-mismatch-580":  ("cpu", ">=2.14", "cpu", None),        # NVML mismatch: reboot first
    "linux-nvidia-nouveau-intel-haswell":        ("cpu", ">=2.14", "cpu", None),
    "linux-nvidia-open-555-russian-date":        ("cu126", ">=2.14", "cuda", None),     # driver CUDA 12.5: 12.x minor-version compat
    "linux-nvidia-rtx3090-580-two-part-version": ("cu132", ">=2.14", "cuda", None),
    "linux-nvidia-rtx4070-550":                  ("cu126", ">=2.14", "cuda", None),
    "linux-nvidia-rtx5090-rtx4090-580":          ("cu132", ">=2.14", "cuda", None),
    "macos-apple-m3":                            ("mps", ">=2.14", "metal", None),
    "macos-apple-m3-pro-truncated-json":         ("mps", ">=2.14", "metal", None),
    "macos-imacpro-vega64":                      ("mps", "~=2.2.0", "metal", "metal"),  # last x86_64 macOS torch
    "windows-amd-890m-gfx1150-hip7":             ("rocm-amd", ">=2.14", "rocm", None),  # AMD's Windows ROCm wheels, HIP 7 driver
    "windows-amd-rx7900xtx-hip6":                ("directml", "~=2.4.0", "vulkan", None), # HIP 6 driver: ROCm rejected with the update
    "windows-amd-rx9070xt-gfx1201-hip6":         ("directml", "~=2.4.0", "vulkan", None), # gfx1201 build-only, HIP 6 driver
    "windows-intel-uhd-cometlake":               ("directml", "~=2.4.0", "vulkan", None),
    "windows-nvidia-gtx1080ti-531":              ("cu126", ">=2.14", "cuda", None),     # sm_60 SASS; 531.14 >= 527.41
    "windows-nvidia-rtx4060-591":                ("cu130", ">=2.14", "cuda", None),
    "windows-nvidia-rtx4060-laptop-595":         ("cu132", ">=2.14", "cuda", None),     # R595 reports CUDA 13.2 on Windows too (issue 42)
    "windows-ryzen-igpu-arc-b580":               ("xpu", ">=2.14", "vulkan", "sycl"),
    "windows7-laptop-intel-hd-quadro-m2000m-441": ("cpu", ">=2.14", "vulkan", None),     # driver CUDA 10.2: local CUDA build rejected
    "wsl2-nvidia-rtx3060-laptop":                ("cu126", ">=2.14", "cuda", None),
}

CONSTRUCTED = {
    # machines the captures do not have
    "gtx970-580": (machine(nvidia(name="NVIDIA GeForce GTX 970", cc="5.2", vram=4)), ("cu126", ">=2.14", "vulkan", "cuda")),  # ggml cuda12 starts at sm_61
    "k80-525": (machine(nvidia(name="Tesla K80", cc="3.7", cuda="12.0", driver="525.60.13", vram=12)), ("cu118", "~=2.7.0", "vulkan", None)),  # no toolkit that builds ggml compiles for sm_37
    "v100-580-windows": (machine(nvidia(name="Tesla V100", cc="7.0", vram=16), os="windows"), ("cu126", ">=2.14", "cuda", None)),
    "rx6700xt-gfx1031": (machine(amd(name="AMD Radeon RX 6700 XT", gfx="gfx1031", vram=12)), ("rocm-amd", ">=2.14", "rocm", None)),  # AMD's own gfx1031 build, not gfx1030 code through the override
    "radeon-vii-gfx906": (machine(amd(name="AMD Radeon VII", gfx="gfx906", vram=16)), ("rocm6.3", "~=2.8.0", "rocm", None)),
    "m1-macos13": (machine(apple(name="Apple M1"), os="macos", arch="arm64", version="13.6"), ("mps", "~=2.8.0", "metal", None)),
    "arc-a770-windows": (machine(intel(), os="windows"), ("xpu", ">=2.14", "vulkan", "sycl")),
    "centos7-glibc217-4090": (machine(nvidia(), glibc="2.17"), ("cu124", "~=2.6.0", "cuda", "cuda")),  # every example Linux build needs glibc 2.28
}


def check(plan_torch, plan_ggml, expected):
    variant, line, ggml_backend, build = expected
    assert plan_torch.variant == variant, plan_torch.summary
    assert Version(plan_torch.torch_version) in SpecifierSet(line), plan_torch.torch_version
    assert plan_ggml.backend == ggml_backend, plan_ggml.summary
    assert (plan_ggml.build.backend if plan_ggml.build else None) == build
    # every plan explains itself
    assert plan_torch.chosen is not None and all(c.reason for c in plan_torch.candidates)
    assert all(c.reason for c in plan_ggml.candidates)


def test_the_table_covers_every_capture():
    assert set(fixture_names()) == set(FIXTURES), "add a row for each new capture (and drop removed ones)"


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_replayed_machine(name):
    if name not in fixture_names():
        pytest.skip(f"capture {name} is not in tests/fixtures/captures")
    report = replay(name)
    check(plan_of(report, "torch", python=PYTHON), plan_of(report, "ggml"), FIXTURES[name])


@pytest.mark.parametrize("name", sorted(CONSTRUCTED))
def test_constructed_machine(name):
    report, expected = CONSTRUCTED[name]
    check(plan_of(report, "torch", python=PYTHON), plan_of(report, "ggml"), expected)
