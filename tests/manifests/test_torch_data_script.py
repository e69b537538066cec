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


# -- AMD's own index (TheRock multi-arch), served by a real HTTP server on 127.0.0.1 --------------------
WINDOWS_GFX = ["gfx1010", "gfx1011", "gfx1012", "gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036",
               "gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx900", "gfx906", "gfx1153",
               "gfx1200", "gfx1201"]
LINUX_GFX = ["gfx942", "gfx1010", "gfx1011", "gfx1012", "gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035",
             "gfx1036", "gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1200", "gfx1201",
             "gfx900", "gfx906", "gfx908", "gfx90a", "gfx950", "gfx1153"]


def _amd_metadata(targets):
    return "Metadata-Version: 2.4\nName: torch\nVersion: 2.14.0+rocm7.14.0\n" + "".join(
        f"Provides-Extra: device-{g}\nRequires-Dist: amd-torch-device-{g}==2.14.0; extra == \"device-{g}\"\n" for g in targets
    ) + "Provides-Extra: device-all\n"


def _serve_amd_index(root, torch_versions, torchvision_versions, targets, linux_targets):
    """A PEP 503 index as AMD's looks: local versions, win_amd64 and linux_x86_64 wheels (AMD tags its Linux
    wheels linux_x86_64, not manylinux), each offering its OS's targets, PEP 658 metadata files."""
    import hashlib
    from urllib.parse import quote

    for package, versions in (("torch", torch_versions), ("torchvision", torchvision_versions)):
        page = root / "whl" / package
        page.mkdir(parents=True)
        anchors = []
        for v in versions:
            for tag, offered in (("win_amd64", targets), ("linux_x86_64", linux_targets)):
                name = f"{package}-{v}+rocm7.14.0-cp312-cp312-{tag}.whl"
                meta = _amd_metadata(offered).encode()
                (page / name).write_bytes(b"PK not a real wheel")
                (page / f"{name}.metadata").write_bytes(meta)
                anchors.append(f'<a href="{quote(name)}" data-core-metadata="sha256={hashlib.sha256(meta).hexdigest()}">{name}</a><br/>')
        (page / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "\n".join(anchors) + "\n</body></html>\n")


@pytest.fixture()
def amd_index(tmp_path):
    import functools
    import http.server
    import threading

    servers = []

    def start(torch_versions, torchvision_versions, targets, linux_targets=tuple(LINUX_GFX)):
        _serve_amd_index(tmp_path, torch_versions, torchvision_versions, targets, linux_targets)
        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
        handler.log_message = lambda *a: None  # type: ignore[attr-defined]
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        url = f"http://127.0.0.1:{server.server_address[1]}/whl/"
        matrix = json.loads((REPO / "accelstack" / "manifests" / "data" / "torch.json").read_text())
        for rel in matrix["releases"]:
            for var in rel["variants"]:
                if var.get("device_extra"):
                    var["index"] = url
        return matrix, url

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_amd_index_matching_the_matrix_only_confirms_what_is_marked_unverified(amd_index):
    matrix, url = amd_index(["2.14.0", "2.13.0", "2.12.0", "2.11.0"], ["0.29.0", "0.28.0", "0.27.0", "0.26.0"], WINDOWS_GFX)
    found = td.amd_findings(matrix)
    assert {f.kind for f in found} == {"amd-confirmed"}
    assert sorted(f.line for f in found) == ["2.11", "2.11", "2.12", "2.12", "2.13", "2.13", "2.14", "2.14"]
    assert {f.text.split(" for ")[1].split(" ")[0] for f in found} == {"windows-x86_64", "linux-x86_64"}
    assert all(url in f.text and "drop its 'unverified'" in f.text for f in found)


def test_amd_index_drift_is_found(amd_index):
    targets = [g for g in WINDOWS_GFX if g != "gfx1010"] + ["gfx1250"]
    matrix, url = amd_index(["2.15.0", "2.14.0", "2.13.0", "2.12.0"], ["0.29.0", "0.28.0", "0.26.0"], targets)
    found = {(f.kind, f.line, f.text) for f in td.amd_findings(matrix)}
    assert ("amd-index", "2.15", f"torch 2.15 is on {url} but torch.json has no rocm-amd for it") in found
    assert ("amd-index", "2.11", f"rocm-amd: {url} has no torch 2.11 wheel for windows-x86_64") in found
    assert ("amd-index", "2.12", f"rocm-amd: {url} has no torchvision 0.27 wheel for windows-x86_64") in found
    extra = {t for k, line, t in found if k == "amd-extra"}
    assert extra == {
        "rocm-amd on windows-x86_64 lists gfx1010, but torch-2.14.0+rocm7.14.0-cp312-cp312-win_amd64.whl has no device-gfx1010 extra",
        "torch-2.14.0+rocm7.14.0-cp312-cp312-win_amd64.whl offers device-gfx1250; torch.json lists it neither as release-ready (gfx) "
        "nor as build-only (gfx_build_only) on windows-x86_64",
    }


def test_amd_linux_wheels_are_checked_against_the_linux_targets(amd_index):
    linux = [g for g in LINUX_GFX if g != "gfx942"] + ["gfx90c"]
    matrix, url = amd_index(["2.14.0", "2.13.0", "2.12.0", "2.11.0"], ["0.29.0", "0.28.0", "0.27.0", "0.26.0"], WINDOWS_GFX, linux)
    found = td.amd_findings(matrix)
    assert not [f for f in found if f.kind == "amd-index"]  # linux_x86_64 wheels are the linux-x86_64 platform
    assert {f.text for f in found if f.kind == "amd-extra"} == {
        "rocm-amd on linux-x86_64 lists gfx942, but torch-2.14.0+rocm7.14.0-cp312-cp312-linux_x86_64.whl has no device-gfx942 extra",
        "torch-2.14.0+rocm7.14.0-cp312-cp312-linux_x86_64.whl offers device-gfx90c; torch.json lists it neither as release-ready (gfx) "
        "nor as build-only (gfx_build_only) on linux-x86_64",
    }


def test_an_unreachable_amd_index_is_a_finding_not_a_crash(amd_index):
    matrix, url = amd_index([], [], [])
    for rel in matrix["releases"]:
        for var in rel["variants"]:
            if var.get("device_extra"):
                var["index"] = url + "missing/"
    found = td.amd_findings(matrix)
    assert [f.kind for f in found] == ["amd-index", "amd-index"] and "HTTP Error 404" in found[0].text


def test_pep691_json_pages_are_read_too():
    body = json.dumps({"files": [{"filename": "torch-2.14.0+rocm7.14.0-cp312-cp312-win_amd64.whl",
                                  "url": "torch-2.14.0%2Brocm7.14.0-cp312-cp312-win_amd64.whl", "core-metadata": {"sha256": "0" * 64}},
                                 {"filename": "torch-2.14.0.tar.gz", "url": "x"}]}).encode()
    files = td.index_files(body, "https://repo.amd.com/rocm/whl-multi-arch/torch/")
    assert [(f.line, f.platform, f.has_metadata) for f in files] == [("2.14", "windows-x86_64", True)]
    assert files[0].url == "https://repo.amd.com/rocm/whl-multi-arch/torch/torch-2.14.0%2Brocm7.14.0-cp312-cp312-win_amd64.whl"
