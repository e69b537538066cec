"""scripts/torch_data.py: its comparison of torch.json with PyPI, on canned answers (no network here)."""
from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from ._factory import REPO

_spec = importlib.util.spec_from_file_location("torch_data", REPO / "scripts" / "torch_data.py")
assert _spec is not None and _spec.loader is not None
td = importlib.util.module_from_spec(_spec)
sys.modules["torch_data"] = td
_spec.loader.exec_module(td)

PIP_OUTPUT = """WARNING: pip index is currently an experimental command.
torch (2.15.0)
Available versions: 2.15.0, 2.14.1, 2.14.0, 2.13.0+cpu, 2.13.0, 2.12.1, 2.12.0, 2.11.0, 2.10.0, 2.9.1, 2.9.0, 2.8.0, 2.7.1, 2.7.0, 2.6.0, 2.5.1, 2.5.0, 2.4.1, 2.4.0, 2.3.1, 2.3.0, 2.2.2, 2.2.1, 2.2.0, 2.1.2
"""
# the 2.15.0 METADATA lines that matter, as PyPI's wheels carry them (read by the script on 2026-12-01)
METADATA_215 = """Metadata-Version: 2.4
Name: torch
Version: 2.15.0
Requires-Python: >=3.11
Requires-Dist: filelock
Requires-Dist: cuda-toolkit[cublas,cudart,cufft,cufile,cupti,cusolver,cusparse,nvjitlink,nvrtc,nvtx]==13.2.2; platform_system == "Linux"
Requires-Dist: nvidia-cudnn-cu13==9.26.0.51; platform_system == "Linux"
Requires-Dist: nvidia-nccl-cu13==2.30.7; platform_system == "Linux"
Requires-Dist: triton~=3.9.0; platform_system == "Linux" and python_version < "3.16"
Requires-Dist: optree>=0.13.0; extra == "optree"
"""
TAGS = {"linux-x86_64": "manylinux_2_28_x86_64", "linux-arm64": "manylinux_2_28_aarch64", "windows-x86_64": "win_amd64",
        "macos-arm64": "macosx_14_0_arm64"}


def wheels(version, pythons, cuda_on_linux="", platforms=tuple(TAGS)):
    out = []
    for py in pythons:
        tag = "cp" + py.replace(".", "")
        for plat in platforms:
            w = td.wheel_of(f"torch-{version}-{tag}-{tag}-{TAGS[plat]}.whl")
            assert w is not None
            w.cuda = cuda_on_linux if plat.startswith("linux") else ""
            out.append(w)
    return out


def test_pip_output_and_wheel_names_are_parsed():
    versions = td.parse_pip_index_versions(PIP_OUTPUT)
    assert versions[:3] == ["2.15.0", "2.14.1", "2.14.0"] and "2.13.0+cpu" in versions
    w = td.wheel_of("torch-2.15.0-cp314-cp314t-manylinux_2_28_x86_64.whl")
    assert (w.version, w.python, w.free_threaded, w.platform) == ("2.15.0", "3.14", True, "linux-x86_64")
    assert td.wheel_of("torchvision-0.30.0-cp312-cp312-win_amd64.whl") is None


@pytest.mark.parametrize("platform, expected", [("linux-x86_64", "13.2"), ("linux-arm64", "13.2"), ("windows-x86_64", ""), ("macos-arm64", "")])
def test_cuda_is_read_from_requires_dist_with_markers(platform, expected):
    assert td.cuda_of_metadata(METADATA_215, platform) == expected


def test_cuda_major_from_nvidia_wheels_without_a_toolkit_pin():
    text = 'Requires-Dist: nvidia-cublas-cu12==12.6.4.1; platform_system == "Linux" and platform_machine == "x86_64"\n'
    assert td.cuda_of_metadata(text, "linux-x86_64") == "12"


def _matrix(**rel_overrides):
    rel = {"torch": "2.14", "versions": ["2.14.0"], "python": ">=3.10,<3.15",
           "companions": {"torchvision": "0.29"},
           "variants": [{"name": "cu132", "backend": "cuda", "cuda": "13.2",
                         "platforms": {"linux-x86_64": {"sm": ["9.0"], "index": "pypi"},
                                       "linux-arm64": {"sm": ["9.0"], "index": "pypi"}}}]}
    rel.update(rel_overrides)
    return {"releases": [rel]}


def test_a_matching_matrix_has_no_findings():
    ws = wheels("2.14.0", ["3.10", "3.11", "3.12", "3.13", "3.14"], cuda_on_linux="13.2")
    assert td.compare(_matrix(), ["2.14.0"], ws, {"torchvision": ["0.29.0"]}) == []


def test_each_kind_of_drift_is_found():
    ws = wheels("2.14.0", ["3.11", "3.12"], cuda_on_linux="13.0", platforms=("linux-x86_64",))
    found = td.compare(_matrix(), ["2.15.0", "2.14.1", "2.14.0", "2.3.0"], ws, {"torchvision": ["0.28.0"]})
    kinds = {(f.kind, f.line) for f in found}
    assert ("missing-line", "2.15") in kinds            # a new release
    assert ("missing-version", "2.14") in kinds         # a new patch
    assert ("python-range", "2.14") in kinds            # 3.10, 3.13, 3.14 claimed, no wheels
    assert ("pypi-cuda", "2.14") in kinds               # PyPI's wheel is CUDA 13.0, the matrix has no cu130
    assert ("companion", "2.14") in kinds               # torchvision 0.29 not on PyPI
    assert not any(k == "missing-line" and line == "2.3" for k, line in kinds)  # an older gap is deliberate
    assert all(str(f).startswith(f.kind) for f in found)


def test_unverified_variants_are_listed():
    rel = _matrix()["releases"][0]
    rel["variants"].append({"name": "cu130", "backend": "cuda", "cuda": "13.0", "unverified": "RFC open",
                            "platforms": {"linux-x86_64": {"sm": ["9.0"]}}})
    found = td.compare({"releases": [rel]}, ["2.14.0"])
    assert [(f.kind, f.text) for f in found] == [("unverified", "cu130: publication not confirmed (RFC open)")]


def test_the_bundled_matrix_matches_the_pypi_snapshot_it_was_checked_against():
    matrix = json.loads((REPO / "accelstack" / "manifests" / "data" / "torch.json").read_text())
    ws = wheels("2.15.0", ["3.11", "3.12", "3.13", "3.14", "3.15"], cuda_on_linux="13.2")
    ws += wheels("2.14.1", ["3.10", "3.11", "3.12", "3.13", "3.14"], cuda_on_linux="")
    found = [f for f in td.compare(matrix, td.parse_pip_index_versions(PIP_OUTPUT), ws) if f.kind != "unverified"]
    assert found == []
