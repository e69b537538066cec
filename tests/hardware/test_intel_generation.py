"""Intel GPU generation by PCI device id (issue 11): the kernel's id list decides before the marketing name."""
from __future__ import annotations

import pytest

from accelstack.hardware import tables
from accelstack.hardware.common import classify_kind


@pytest.mark.parametrize(
    "device_id, name, generation, kind",
    [
        ("46a3", "Intel(R) UHD Graphics", "Xe-LP (Gen12, Alder Lake)", "integrated"),  # the name alone says Gen9
        ("46A3", "", "Xe-LP (Gen12, Alder Lake)", "integrated"),
        ("9bc4", "Intel(R) UHD Graphics", "Gen9.5 (Comet Lake)", "integrated"),  # dump 019
        ("0412", "", "Gen7.5 (Haswell)", "integrated"),  # dump 045
        ("191b", "Intel(R) HD Graphics 530", "Gen9 (Skylake)", "integrated"),
        ("a7a0", "Intel(R) Iris(R) Xe Graphics", "Xe-LP (Gen12, Raptor Lake)", "integrated"),
        ("4c8a", "Intel(R) UHD Graphics 750", "Xe-LP (Gen12, Rocket Lake)", "integrated"),
        ("9a49", "Intel(R) Iris(R) Xe Graphics", "Xe-LP (Gen12, Tiger Lake)", "integrated"),
        ("8a52", "Intel(R) Iris(R) Plus Graphics", "Gen11 (Ice Lake)", "integrated"),
        ("7d55", "Intel(R) Arc(TM) Graphics", "Xe-LPG (Meteor Lake)", "integrated"),
        ("7d67", "Intel(R) Graphics", "Xe-LPG (Arrow Lake)", "integrated"),
        ("64a0", "Intel(R) Arc(TM) 140V GPU (16GB)", "Xe2-LPG (Lunar Lake)", "integrated"),
        ("b0a0", "", "Xe3-LPG (Panther Lake)", "integrated"),
        ("56a0", "Intel(R) Arc(TM) A770 Graphics", "Xe-HPG (Alchemist)", "discrete"),  # dump 056
        ("e20b", "Intel(R) Arc(TM) B580 Graphics", "Xe2-HPG (Battlemage)", "discrete"),  # dump 057
        ("e223", "", "Xe2-HPG (Battlemage)", "discrete"),
        ("56c0", "Intel(R) Data Center GPU Flex 170", "Xe-HPG (Flex)", "discrete"),
        ("0bd5", "Intel(R) Data Center GPU Max 1550", "Xe-HPC (Ponte Vecchio)", "discrete"),
        ("4905", "Intel(R) Iris(R) Xe MAX Graphics", "Xe-LP (DG1)", "discrete"),
        # ids the table does not know: the name rules still answer
        ("ffff", "Intel(R) Arc(TM) A380 Graphics", "Xe-HPG (Alchemist)", "discrete"),
        ("", "Intel(R) HD Graphics 4600", "Gen7.5 (Haswell)", "integrated"),
        ("", "", "", "unknown"),
    ],
)
def test_generation_by_device_id_then_name(device_id, name, generation, kind):
    assert tables.intel_generation_for(device_id, name) == (generation, kind)


def test_every_listed_id_is_unique_four_hex_digits():
    seen = set()
    for platform, generation, kind, ids in tables._data("intel.json")["generation_by_device_id"]["platforms"]:
        assert generation and kind in ("integrated", "discrete"), platform
        for i in ids:
            assert len(i) == 4 and int(i, 16) >= 0 and i == i.lower(), (platform, i)
            assert i not in seen, f"{i} listed twice"
            seen.add(i)


@pytest.mark.parametrize("device_id, kind", [("46a3", "integrated"), ("e223", "discrete"), ("0b69", "discrete"), ("5690", "discrete"), ("3e92", "integrated")])
def test_discrete_or_integrated_from_the_id(device_id, kind):
    assert classify_kind("intel", "Intel(R) Graphics", device_id) == kind
