"""Build the issue-11 detection fixtures (``tests/fixtures/captures/i11d-*``) from real dumps.

Same format and README layout as ``tests/fixtures/make_fixture.py`` (whose ``CaptureBuilder`` and
``Fixture`` it uses): outputs detection reads as they are are cut from the dump byte for byte,
other facts are transcribed, and what the dump does not show is listed as assumed.

    .venv/bin/python tests/detect/make_i11d_fixtures.py            # rewrite every i11d fixture
    .venv/bin/python tests/detect/make_i11d_fixtures.py NAME ...   # rewrite some
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import List

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("accelstack_make_fixture", HERE.parent / "fixtures" / "make_fixture.py")
assert _spec and _spec.loader
mf = sys.modules.get("accelstack_make_fixture") or importlib.util.module_from_spec(_spec)
if "accelstack_make_fixture" not in sys.modules:
    sys.modules["accelstack_make_fixture"] = mf
    _spec.loader.exec_module(mf)

CaptureBuilder, Fixture, dump_block = mf.CaptureBuilder, mf.Fixture, mf.dump_block
CAPTURES = mf.CAPTURES
MIB, GIB = mf.MIB, mf.GIB

# -- Jetson ----------------------------------------------------------------------------------------

# nvidia-smi on a JetPack 6 Orin: every field but the name is [N/A] (Chen-zexi/vllm-cli#11 shows the
# row "0, Orin (nvgpu), [N/A], [N/A], [N/A], [N/A], [N/A]"; jetpack-nixos#371 shows "CUDA Version: N/A").
JETSON_SMI_ROW = "0, [N/A], Orin (nvgpu), [N/A], [N/A], [N/A], [N/A]\n"


def jetson_xavier_jp5() -> CaptureBuilder:
    b = CaptureBuilder(machine="aarch64")
    b.file("/proc/device-tree/model", "NVIDIA Jetson AGX Xavier Developer Kit\x00")
    b.file("/proc/device-tree/compatible", "nvidia,p2972-0000\x00nvidia,tegra194\x00")
    b.file("/etc/nv_tegra_release", "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, DATE: Tue Aug  1 19:57:35 UTC 2023\n")
    b.device("/sys/module/nvgpu")
    return b


def jetson_agx_orin_jp6() -> CaptureBuilder:
    b = CaptureBuilder(machine="aarch64")
    b.file("/proc/device-tree/model", "NVIDIA Jetson AGX Orin Developer Kit\x00")
    b.file("/proc/device-tree/compatible", "nvidia,p3737-0000+p3701-0005\x00nvidia,p3701-0005\x00nvidia,tegra234\x00")
    b.file("/etc/nv_tegra_release", "# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64, DATE: Mon May  6 17:34:21 UTC 2024\n")
    b.file("/sys/module/nvidia/version", "540.3.0\n")
    b.command(mf.SMI_QUERY, stdout=JETSON_SMI_ROW)
    b.memory = [int(61.4 * GIB), int(51.6 * GIB)]
    return b


FIXTURES: List[Fixture] = [
    Fixture(
        "i11d-jetson-xavier-jp5",
        "032",
        jetson_xavier_jp5,
        summary="Jetson AGX Xavier on JetPack 5 (L4T R35): libcuda reports CUDA 11.4 and compute capability 7.2 (Tegra194).",
        transcribed=[
            "CUDA driver 11.4 on JetPack 5 (dump) -> `/etc/nv_tegra_release` of an L4T R35 system (the line format of a real R35.4.1 release file)",
            "compute capability 7.2 (dump) -> SoC Tegra194 (the only Jetson SoC with CC 7.2, NV-LEGACY): `/proc/device-tree/compatible` "
            "= `nvidia,p2972-0000`, `nvidia,tegra194` (NUL-separated, as the Linux kernel's tegra194-p2972-0000.dts lists them)",
            "libcuda from /usr/lib/aarch64-linux-gnu/tegra (dump): the nvgpu driver, so `/sys/module/nvgpu` exists and no nvidia.ko is loaded",
        ],
        assumed=[
            "the board is the AGX Xavier developer kit (`/proc/device-tree/model` = `NVIDIA Jetson AGX Xavier Developer Kit`; the dump prints no name)",
            "L4T revision 4.1 (JetPack 5.1.2); any R35 revision gives the same CUDA 11.4",
            "no PCI GPUs (Jetson's GPU is not on PCI), no nvidia-smi (JetPack 5 has none)",
        ],
    ),
    Fixture(
        "i11d-jetson-agx-orin-jp6",
        "033",
        jetson_agx_orin_jp6,
        summary="Jetson AGX Orin 64GB on JetPack 6.0 (L4T R36.3): CUDA driver 12.2, compute capability 8.7; nvidia-smi answers [N/A] for every field.",
        transcribed=[
            "CUDA driver 12.2, Ollama variant jetpack6 (dump) -> `/etc/nv_tegra_release` of L4T R36.3 (JetPack 6.0, the JetPack 6 release with CUDA 12.2)",
            "compute=8.7, name=Orin (dump) -> `/proc/device-tree/compatible` ending in `nvidia,tegra234` (Orin)",
            "61.4 GiB total / 51.6 GiB available (dump; unified memory = system RAM) -> the capture's memory",
        ],
        assumed=[
            "64 GB AGX Orin module p3701-0005 on the p3737 developer kit carrier (model `NVIDIA Jetson AGX Orin Developer Kit`)",
            "JetPack 6's OpenRM module reports version 540.3.0 in `/sys/module/nvidia/version` (OE4T/linux-tegra-5.10#17 shows NVIDIA-SMI 540.3.0 with CUDA 12.2)",
            "nvidia-smi query output `0, [N/A], Orin (nvgpu), [N/A], [N/A], [N/A], [N/A]`, the all-[N/A] row of Chen-zexi/vllm-cli#11 "
            "(https://github.com/Chen-zexi/vllm-cli/pull/11); detection must not use it",
            "no PCI GPUs",
        ],
    ),
]


def main(argv: List[str]) -> int:
    wanted = set(argv)
    for fx in FIXTURES:
        if not wanted or fx.name in wanted:
            readme = fx.readme().replace("tests/fixtures/make_fixture.py", "tests/detect/make_i11d_fixtures.py")
            fx.build().write(CAPTURES / fx.name, readme)
            print(CAPTURES / fx.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
