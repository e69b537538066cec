"""Build the issue-11 planning fixtures (``tests/fixtures/captures/i11p-*``) from real dumps.

    .venv/bin/python tests/manifests/make_i11p_fixtures.py

Uses the shared ``CaptureBuilder``/``Fixture`` of ``tests/fixtures/make_fixture.py``; the committed
directories are what the tests read, this script only records how they were made.
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "fixtures"))

from make_fixture import CAPTURES, CaptureBuilder, Fixture  # noqa: E402

MIB = 1024 * 1024


def linux_amd_ellesmere_gfx803() -> CaptureBuilder:
    b = CaptureBuilder()
    b.pci("0000:01:00.0", "030000", "1002", "67df", driver="amdgpu", vram_total=8192 * MIB)
    b.kfd_node(0, cpu_cores_count=8, simd_count=0, gfx_target_version=0, location_id=0, domain=0)
    b.kfd_node(1, cpu_cores_count=0, simd_count=144, gfx_target_version=80003, vendor_id=0x1002, device_id=0x67DF,
               location_id=0x0100, domain=0)
    b.device("/dev/kfd", rw=True)
    return b


FIXTURES = [
    Fixture(
        "i11p-linux-amd-ellesmere-gfx803",
        "010",
        linux_amd_ellesmere_gfx803,
        summary="Radeon RX 470/480/570/580 (Ellesmere, gfx803) with ROCm's KFD reachable: a gfx target no current ROCm "
                "release compiles for, so neither a published nor a local ROCm build can run on it.",
        transcribed=[
            "rocminfo's agent `gfx803` / `Ellesmere [Radeon RX 470/480/570/570X/580/580X]` written as KFD node 1 with "
            "gfx_target_version 80003 and PCI device 0x67df (an Ellesmere id) at 0000:01:00.0, `driver` -> amdgpu",
            "`/dev/kfd` exists and is readable and writable (rocminfo ran on ROCm 3.8)",
        ],
        assumed=[
            "node 0 is the CPU agent; `mem_info_vram_total` = 8192 MiB (an 8 GiB RX 580; the excerpt stops before the memory pools)",
            "`/etc/os-release`, `/proc/cpuinfo`, `/opt/rocm`: left out (the dump shows none of them)",
        ],
    ),
]


if __name__ == "__main__":
    for fx in FIXTURES:
        print(fx.build().write(CAPTURES / fx.name, fx.readme()))
