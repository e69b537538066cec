"""Manifests are checked on load: every malformed one is refused with a message naming the field."""
from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from accelstack.errors import Action
from accelstack.manifests import ExpiredManifestFormatError, GgmlManifest, TorchMatrix, load_manifest, load_manifest_file
from accelstack.manifests.errors import ManifestError, ManifestExpiredError, ManifestFormatError, ManifestSignatureError
from accelstack.manifests.torch_matrix import builtin_torch_matrix

from ._factory import EXAMPLE_GGML, REPO

TORCH_JSON = REPO / "accelstack" / "manifests" / "data" / "torch.json"
SHA = "ab" * 32


def ggml_doc() -> dict:
    return {
        "format": "accelstack-manifest", "format_version": 1, "source": "test", "version": 3,
        "expires": "2099-01-01T00:00:00Z", "kind": "ggml", "package": "stable-diffusion.cpp",
        "targets": [
            {"id": "cpu", "os": "linux", "arch": "x86_64", "backend": "cpu",
             "artifacts": [{"name": "cpu.tar.gz", "sha256": SHA, "size": 10, "url": "http://127.0.0.1:1/cpu.tar.gz"}]},
            {"id": "vk", "os": "linux", "arch": "x86_64", "backend": "vulkan", "requires": {"vulkan": "1.2"},
             "artifacts": [{"name": "vk.tar.gz", "sha256": SHA, "size": 10, "urls": ["http://127.0.0.1:1/vk.tar.gz"]}]},
            {"id": "cu", "os": "windows", "arch": "x86_64", "backend": "cuda",
             "requires": {"cuda": "12.8", "sm": ["8.6", "12.0a"], "ptx": ["9.0"], "cpu_features": ["avx2"]},
             "artifacts": [{"name": "a.zip", "sha256": SHA, "size": 1, "urls": ["https://a/a.zip", "https://b/a.zip"]},
                           {"name": "b.zip", "sha256": SHA, "size": 2, "url": "https://a/b.zip"}]},
        ],
    }


def load(doc, **kw):
    return load_manifest(json.dumps(doc).encode(), **kw)


def refused(doc, *, kind=ManifestFormatError, **kw) -> str:
    with pytest.raises(kind) as info:
        load(doc, **kw)
    return str(info.value)


def test_valid_ggml_manifest_loads_with_url_or_mirror_list():
    m = load(ggml_doc())
    assert isinstance(m, GgmlManifest)
    assert [t.id for t in m.targets] == ["cpu", "vk", "cu"]
    assert m.targets[0].artifacts[0].urls == ["http://127.0.0.1:1/cpu.tar.gz"]
    assert m.targets[2].artifacts[0].urls == ["https://a/a.zip", "https://b/a.zip"]
    assert m.targets[2].requires.sm == ["8.6", "12.0a"]
    assert m.envelope.version == 3 and m.envelope.source == "test"


def test_shipped_example_and_torch_matrix_load():
    example = load_manifest_file(EXAMPLE_GGML)
    assert {t.backend for t in example.targets} == {"cpu", "cuda", "vulkan", "rocm", "metal"}
    matrix = builtin_torch_matrix()
    assert isinstance(matrix, TorchMatrix)
    assert matrix.releases[0].version > matrix.releases[-1].version  # newest first


def test_every_source_key_cited_in_the_torch_matrix_is_defined():
    doc = json.loads(TORCH_JSON.read_text())
    defined = set(doc["sources"])
    cited = set()

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "sources" and isinstance(v, list):
                    cited.update(v)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc)
    assert cited and cited <= defined, cited - defined


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d["targets"][1]["artifacts"][0].pop("sha256"), "targets[1].artifacts[0].sha256: missing"),
        (lambda d: d["targets"][2]["artifacts"][1].__setitem__("sha256", "AB" * 32), "targets[2].artifacts[1].sha256"),
        (lambda d: d["targets"][2]["artifacts"][1].__setitem__("sha256", "ab" * 31), "targets[2].artifacts[1].sha256"),
        (lambda d: d["targets"][0]["artifacts"][0].__setitem__("size", 0), "targets[0].artifacts[0].size"),
        (lambda d: d["targets"][0]["artifacts"][0].__setitem__("size", "10"), "targets[0].artifacts[0].size: expected an integer"),
        (lambda d: d["targets"][0]["artifacts"][0].__setitem__("size", True), "targets[0].artifacts[0].size: expected an integer"),
        (lambda d: d["targets"][0]["artifacts"][0].pop("url"), "targets[0].artifacts[0].urls: missing"),
        (lambda d: d["targets"][1]["artifacts"][0].__setitem__("urls", []), "targets[1].artifacts[0].urls: missing"),
        (lambda d: d["targets"][1]["artifacts"][0].__setitem__("urls", "http://x/y"), "targets[1].artifacts[0].urls: expected a list"),
        (lambda d: d["targets"][1]["artifacts"][0].__setitem__("urls", ["ftp://x/y"]), "targets[1].artifacts[0].urls[0]"),
        (lambda d: d["targets"][1]["artifacts"][0].__setitem__("name", "../evil"), "targets[1].artifacts[0].name"),
        (lambda d: d["targets"][1].__setitem__("artifacts", []), "targets[1].artifacts"),
        (lambda d: d["targets"][1].__setitem__("backend", "opencl"), "targets[1].backend: unknown value 'opencl'"),
        (lambda d: d["targets"][1].__setitem__("os", "freebsd"), "targets[1].os"),
        (lambda d: d["targets"][1].__setitem__("arch", 64), "targets[1].arch: expected a string"),
        (lambda d: d["targets"][1].__setitem__("id", "cpu"), "targets[1].id: duplicate"),
        (lambda d: d["targets"][2]["requires"].__setitem__("sm", ["sm_86"]), "targets[2].requires.sm[0]"),
        (lambda d: d["targets"][2]["requires"].__setitem__("cuda", "twelve"), "targets[2].requires.cuda"),
        (lambda d: d["targets"][2]["requires"].__setitem__("gfx", "gfx1100"), "targets[2].requires.gfx: expected a list"),
        (lambda d: d["targets"][2]["requires"].__setitem__("min_vram", 8), "targets[2].requires.min_vram: unknown requirement"),
        (lambda d: d.__setitem__("targets", {}), "targets: expected a list"),
        (lambda d: d.pop("targets"), "targets: missing"),
        (lambda d: d.__setitem__("backend_tiers", [["cuda"], ["directml"]]), "backend_tiers[1][0]"),
        (lambda d: d.__setitem__("backend_tiers", [["cuda"], []]), "backend_tiers[1]: expected a non-empty list of backends"),
    ],
)
def test_malformed_ggml_bodies_name_the_field(mutate, field):
    doc = ggml_doc()
    mutate(doc)
    assert field in refused(doc)


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.__setitem__("format_version", 2), "format_version: unknown format version 2"),
        (lambda d: d.__setitem__("format_version", "1"), "format_version: expected an integer"),
        (lambda d: d.__setitem__("format", "other"), "format:"),
        (lambda d: d.pop("source"), "source: missing"),
        (lambda d: d.__setitem__("version", -1), "version:"),
        (lambda d: d.__setitem__("version", 1.5), "version: expected an integer"),
        (lambda d: d.__setitem__("kind", "onnx"), "kind: unknown value 'onnx'"),
        (lambda d: d.__setitem__("expires", "next year"), "expires:"),
        (lambda d: d.__setitem__("expires", "2027-01-01T00:00:00"), "expires:"),  # no time zone
        (lambda d: d.__setitem__("expires", 20270101), "expires: expected a string"),
    ],
)
def test_malformed_envelopes_name_the_field(mutate, field):
    doc = ggml_doc()
    mutate(doc)
    assert field in refused(doc)


def test_newer_format_version_says_upgrade():
    doc = ggml_doc()
    doc["format_version"] = 7
    with pytest.raises(ManifestFormatError) as info:
        load(doc)
    assert "upgrade accelstack" in info.value.hint
    assert info.value.action is Action.UPDATE_ACCELSTACK


def test_expired_manifest_is_refused_as_format_and_expiry_error():
    doc = ggml_doc()
    doc["expires"] = "2020-01-01T00:00:00Z"
    with pytest.raises(ManifestExpiredError) as info:
        load(doc)
    assert isinstance(info.value, ManifestFormatError) and isinstance(info.value, ExpiredManifestFormatError)
    assert str(info.value).startswith("expires:")
    # the clock is an input: the same manifest is fine before its expiry
    assert load(doc, now=datetime(2019, 12, 31, tzinfo=timezone.utc))
    assert load(doc, check_expiry=False)


def test_not_json_and_not_an_object():
    with pytest.raises(ManifestFormatError, match="not valid JSON"):
        load_manifest(b"{nope")
    with pytest.raises(ManifestFormatError, match="not UTF-8"):
        load_manifest(b"\xff\xfe")
    with pytest.raises(ManifestFormatError, match="JSON object"):
        load_manifest(b"[1, 2]")


def test_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "m.json"
    doc = ggml_doc()
    del doc["targets"][0]["artifacts"][0]["sha256"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(ManifestFormatError) as info:
        load_manifest_file(bad)
    assert str(bad) in str(info.value) and "targets[0].artifacts[0].sha256: missing" in str(info.value)
    with pytest.raises(ManifestError, match="cannot read manifest"):
        load_manifest_file(tmp_path / "missing.json")


LINES = [r["torch"] for r in json.loads(TORCH_JSON.read_text(encoding="utf-8"))["releases"]]  # as the data has them


def torch_doc() -> dict:
    return json.loads(TORCH_JSON.read_text())


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d["releases"][0]["variants"][0].__setitem__("cuda", "12.7"), "releases[0].variants[0].cuda: CUDA 12.7 is not in cuda_toolkits"),
        (lambda d: d["releases"][0]["variants"][0]["platforms"]["linux-x86_64"].__setitem__("sm", ["86"]), "releases[0].variants[0].platforms.linux-x86_64.sm[0]"),
        (lambda d: d["releases"][0]["variants"][0]["platforms"]["linux-x86_64"].pop("sm") and
         d["releases"][0]["variants"][0]["platforms"]["linux-x86_64"].pop("ptx"), "releases[0].variants[0].platforms.linux-x86_64.sm: missing"),
        (lambda d: d["releases"][0]["variants"][0]["platforms"].__setitem__("solaris-sparc", {}), "releases[0].variants[0].platforms.solaris-sparc"),
        (lambda d: d["releases"][0]["variants"][0].__setitem__("backend", "opencl"), "releases[0].variants[0].backend: unknown value 'opencl'"),
        (lambda d: d["releases"][1].__setitem__("python", "3.10+"), "releases[1].python"),
        (lambda d: d["releases"][1].__setitem__("versions", ["2.9.0"]), f"releases[1].versions[0]: 2.9.0 is not in the {LINES[1]} release line"),
        (lambda d: d["releases"][1].update(torch=LINES[0], versions=[]), f"releases[1].torch: duplicate release line {LINES[0]}"),
        (lambda d: d["cuda_toolkits"][0]["driver"].__setitem__("linux", "new"), "cuda_toolkits[0].driver.linux"),
        (lambda d: d["releases"][2]["variants"][3]["platforms"]["linux-x86_64"].__setitem__("gfx", ["navi31"]), "releases[2].variants[3].platforms.linux-x86_64.gfx[0]"),
        (lambda d: d["releases"][2]["extras"][0].__setitem__("install", "always"), "releases[2].extras[0].install"),
        (lambda d: d.__setitem__("releases", []), "releases: must list at least one release"),
        (lambda d: d.__setitem__("backend_tiers", [["cuda"], ["vulkan"]]), "backend_tiers[1][0]: unknown backend 'vulkan'"),
        (lambda d: d.__setitem__("backend_tiers", [["cuda", "rocm"], ["cuda"]]), "backend_tiers[1][0]: backend 'cuda' is listed twice"),
    ],
)
def test_malformed_torch_matrix_names_the_field(mutate, field):
    doc = torch_doc()
    mutate(doc)
    assert field in refused(doc)


def test_builtin_matrix_past_expiry_is_stale_not_refused():
    matrix = builtin_torch_matrix(now=datetime(2100, 1, 1, tzinfo=timezone.utc))
    assert matrix.stale
    assert not builtin_torch_matrix(now=datetime(2026, 1, 1, tzinfo=timezone.utc)).stale


def test_verified_load_checks_signature_then_body(tmp_path):
    from accelstack.manifests import TrustedManifests
    from accelstack.manifests.signing import generate_keypair, sign_manifest

    private, public = generate_keypair()
    trusted = TrustedManifests(keys=[public], include_package_keys=False)
    data = json.dumps(ggml_doc()).encode()
    sig = sign_manifest(data, private)
    assert isinstance(trusted.load(data, sig, "https://example.org/m.json"), GgmlManifest)
    with pytest.raises(ManifestSignatureError, match=r"^https://example.org/m.json: .*modified after signing"):
        trusted.load(data.replace(b'"version": 3', b'"version": 4'), sig, "https://example.org/m.json")
    bad = ggml_doc()
    bad["targets"][0]["artifacts"][0]["sha256"] = "x"
    bad_data = json.dumps(bad).encode()
    with pytest.raises(ManifestFormatError, match=r"targets\[0\]\.artifacts\[0\]\.sha256"):
        trusted.load(bad_data, sign_manifest(bad_data, private))


# -- hostile documents (issue 10): each is refused with a typed error naming the field ----------
def test_deeply_nested_manifest_is_a_format_error_not_a_recursion_error():
    deep = b'{"a": ' * 100_000 + b"1" + b"}" * 100_000
    with pytest.raises(ManifestFormatError, match="nests"):
        load_manifest(deep)
    doc = ggml_doc()
    doc["sources"] = {"x": json.loads("[" * 40 + "]" * 40)}
    assert "nests deeper" in refused(doc)


def test_oversized_manifest_is_refused_before_parsing():
    from accelstack.limits import MAX_JSON_BYTES

    with pytest.raises(ManifestFormatError, match="more than"):
        load_manifest(b" " * (MAX_JSON_BYTES + 1))


@pytest.mark.parametrize("expires", [
    "9999-12-31T23:59:59-23:59",  # was OverflowError converting to UTC
    "0001-01-01T00:00:00+23:59",
    "1999-12-31T00:00:00Z",
    "2201-01-01T00:00:00Z",
    "2027-06-01T00:00:00Z\n",  # "$" matched before a trailing newline
    "\uff12\uff10\uff12\uff17-06-01T00:00:00Z",  # full-width digits matched \d
])
def test_expires_out_of_range_or_not_ascii_is_a_format_error(expires):
    doc = ggml_doc()
    doc["expires"] = expires
    assert refused(doc, check_expiry=False).startswith("expires:")


def test_expires_with_nanoseconds_reads_on_every_python():
    doc = ggml_doc()
    doc["expires"] = "2099-01-01T00:00:00.123456789+02:00"
    assert load(doc).envelope.expires.endswith("+02:00")


@pytest.mark.parametrize("tid, why", [
    ("x" * 129, "not a valid target id"),
    ("cpu\x00", "NUL"),
    ("../../etc", "not a valid target id"),
    ("a/b", "not a valid target id"),
    ("CPU", "not a valid target id"),
    ("", "must not be empty"),
])
def test_target_ids_follow_the_documented_pattern(tid, why):
    doc = ggml_doc()
    doc["targets"][0]["id"] = tid
    message = refused(doc)
    assert message.startswith("targets[0].id:") and why in message


def test_valid_ids_of_every_shape_in_use_stay_valid():
    doc = ggml_doc()
    for target, tid in zip(doc["targets"], ["linux-x86_64-cpu-avx2", "win-x64-cuda12.8", "a" * 128]):
        target["id"] = tid
    assert [t.id for t in load(doc).targets] == ["linux-x86_64-cpu-avx2", "win-x64-cuda12.8", "a" * 128]


@pytest.mark.parametrize("sha", [
    " " + SHA, SHA + " ", SHA + "\n", SHA.upper(), SHA[:-1], SHA + "0", "\u0660" * 64,
])
def test_sha256_is_exactly_64_lowercase_hex_digits(sha):
    doc = ggml_doc()
    doc["targets"][0]["artifacts"][0]["sha256"] = sha
    assert "targets[0].artifacts[0].sha256: " in refused(doc)


@pytest.mark.parametrize("name", ["a\x00.zip", "a\nb.zip", " a.zip", "x" * 300, "..", "a\\b.zip"])
def test_artifact_names_are_plain_bounded_file_names(name):
    doc = ggml_doc()
    doc["targets"][0]["artifacts"][0]["name"] = name
    assert "targets[0].artifacts[0].name: " in refused(doc)


@pytest.mark.parametrize("field, value, path", [
    ("version", 10 ** 30, "version: "),
    ("source", "x\x00", "source: "),
    ("source", "a/b", "source: "),
    ("package", "p" * 5000, "package: 5000 characters"),
])
def test_envelope_numbers_and_strings_are_bounded(field, value, path):
    doc = ggml_doc()
    doc[field] = value
    assert refused(doc).startswith(path)


def test_huge_numbers_and_versions_are_format_errors():
    with pytest.raises(ManifestFormatError):  # int() of 5000 digits raises ValueError in Python
        load_manifest(b'{"format": "accelstack-manifest", "format_version": ' + b"9" * 5000 + b"}")
    doc = ggml_doc()
    doc["targets"][0]["artifacts"][0]["size"] = 1 << 60
    assert "size: must be a positive number" in refused(doc)
    doc = ggml_doc()
    doc["targets"][1]["requires"]["vulkan"] = "1" * 4000
    assert "requires.vulkan" in refused(doc)


def test_torch_variant_names_are_ids():
    doc = torch_doc()
    doc["releases"][0]["variants"][0]["name"] = "cu/../x"
    assert refused(doc).startswith("releases[0].variants[0].name:")


def test_manifest_file_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    import os

    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this OS")
    fifo = tmp_path / "manifest.json"
    os.mkfifo(fifo)
    with pytest.raises(ManifestFormatError, match="not a regular file"):
        load_manifest_file(fifo)
