"""system_profiler of every macOS era (issue 11): readable chip names and Metal support from every field."""
from __future__ import annotations

import json

import pytest

from accelstack.hardware import tables
from accelstack.hardware.macos import parse_profiler, readable_chip_key

from .conftest import replay
from .make_i11d_fixtures import mf


@pytest.mark.parametrize(
    "key, name",
    [
        ("kHW_AppleM1Item", "Apple M1"),  # exelban/stats#394
        ("kHW_IntelIris6100Item", "Intel Iris Graphics 6100"),  # duanefields/VirtualKVM#50
        ("kHW_IntelUHDGraphics630Item", "Intel UHD Graphics 630"),
        ("kHW_AppleM2ProItem", "Apple M2 Pro"),  # not listed: spelled out from the key
        ("kHW_AppleM3MaxItem", "Apple M3 Max"),
        ("kHW_IntelHDGraphics4000Item", "Intel HD Graphics 4000"),
        ("kHW_AMDRadeonPro5500MItem", "AMD Radeon Pro 5500M"),
        ("kHW_NVIDIAGeForceGT750MItem", "NVIDIA GeForce GT 750M"),
        ("Apple M3 Pro", "Apple M3 Pro"),  # already readable
        ("kHW_Item", "kHW_Item"),
    ],
)
def test_chip_keys_become_readable_names(key, name):
    assert readable_chip_key(key) == name


@pytest.mark.parametrize(
    "entry, metal",
    [
        ({"spdisplays_mtlgpufamilysupport": "spdisplays_metal4"}, "Metal 4"),  # macOS 26
        ({"spdisplays_mtlgpufamilysupport": "spdisplays_metal3"}, "Metal 3"),  # macOS 13-15 (dump 027)
        ({"spdisplays_metalfamily": "spdisplays_mtlgpufamilyapple7"}, "Metal 2 (Apple7)"),  # macOS 11/12 (stats#394)
        ({"spdisplays_metalfamily": "spdisplays_mtlgpufamilymac2"}, "Metal 2 (Mac2)"),
        ({"spdisplays_metal": "spdisplays_metalfeaturesetfamily13"}, "Metal 2 (macOS GPUFamily1 v3)"),  # macOS 10.13 (VirtualKVM#50)
        ({"spdisplays_metal": "spdisplays_metalfeaturesetfamily12"}, "Metal 1 (macOS GPUFamily1 v2)"),
        ({"spdisplays_metal": "spdisplays_metalfeaturesetfamily21"}, "Metal 2 (macOS GPUFamily2 v1)"),
        ({"spdisplays_metal": "spdisplays_supported"}, "Metal"),
        ({"Metal Support": "Metal 3"}, "Metal 3"),  # text, macOS 13+ (dump 026)
        ({"Metal Family": "Supported, Metal GPUFamily Apple 7"}, "Metal 2 (Apple7)"),  # text, macOS 11/12
        ({"Metal Family": "Supported, Metal GPUFamily macOS 2"}, "Metal 2 (Mac2)"),
        ({"Metal": "Supported, feature set macOS GPUFamily2 v1"}, "Metal 2 (macOS GPUFamily2 v1)"),  # text, 10.14/10.15 (dump 024)
        ({"Metal": "Supported, feature set macOS GPUFamily1 v2"}, "Metal 1 (macOS GPUFamily1 v2)"),
        ({"spdisplays_metal": "spdisplays_notsupported"}, ""),
        ({"sppci_model": "x"}, ""),
        ({"spdisplays_metal": "Something New 9"}, "Something New 9"),  # unknown wording kept as said
    ],
)
def test_metal_support_from_every_field(entry, metal):
    assert tables.apple_metal(entry) == metal


def test_newest_field_wins_when_several_are_present():
    assert tables.apple_metal({"spdisplays_metal": "spdisplays_supported", "spdisplays_mtlgpufamilysupport": "spdisplays_metal3"}) == "Metal 3"


def test_macos_1013_plist_keys_in_json_form():
    """The keys of VirtualKVM#50's macOS 10.13 plist: chip key, underscored VRAM key, feature-set family."""
    text = json.dumps({"SPDisplaysDataType": [{"_name": "kHW_IntelIris6100Item", "_spdisplays_vram": "1536 MB", "spdisplays_device-id": "0x162b",
                                               "spdisplays_metal": "spdisplays_metalfeaturesetfamily13"}]})
    (g,) = parse_profiler(text)
    assert (g.vendor, g.name, g.pci_device_id, g.metal_support, g.kind) == ("intel", "Intel Iris Graphics 6100", "162b", "Metal 2 (macOS GPUFamily1 v3)", "integrated")


def _mac(builder, tmp_path, version: str, entry: dict):
    b = builder(system="Darwin", machine="arm64", mac_version=version)
    b.command(mf.PROFILER_JSON, stdout=json.dumps({"SPDisplaysDataType": [entry]}))
    return replay(b.write(tmp_path / f"mac-{version}"))


def test_bare_supported_on_macos13_is_metal3_for_metal3_family_gpus(builder, tmp_path):
    entry = {"_name": "Apple M3 Max", "sppci_model": "Apple M3 Max", "spdisplays_metal": "spdisplays_supported", "spdisplays_vendor": "sppci_vendor_Apple"}
    assert _mac(builder, tmp_path, "14.5", entry).gpus[0].metal_support == "Metal 3"
    assert _mac(builder, tmp_path, "12.6", entry).gpus[0].metal_support == "Metal"


def test_metal3_is_never_reported_before_macos13(builder, tmp_path):
    entry = {"_name": "kHW_AppleM1Item", "spdisplays_mtlgpufamilysupport": "spdisplays_metal3"}
    g = _mac(builder, tmp_path, "12.7", entry).gpus[0]
    assert (g.name, g.metal_support) == ("Apple M1", "Metal 2")


def test_intel_mac_prefers_its_discrete_gpu_for_metal():
    from .conftest import CAPTURES

    r = replay(CAPTURES / "i11d-macos11-intel-uhd630-radeon5500m-text")
    assert [(p.api, p.gpu) for p in r.preference] == [("metal", 1), ("metal", 0), ("cpu", None)]
    assert "after any discrete one" in r.preference[1].reason


@pytest.mark.parametrize("text", ["[1, 2]", '{"SPDisplaysDataType": 5}', '"x"', "[" * 5000, '{"SPDisplaysDataType": [1, null]}'])
def test_profiler_output_of_another_shape_gives_no_gpus_and_no_exception(text):
    # found by the capture fuzz target (issue 10): valid JSON that is not the expected object
    from accelstack.hardware.macos import parse_profiler

    assert parse_profiler(text) == []
