"""The ggml build spec and the published variants name CPU features as detection does (issue 11).

Detection normalizes flags ("sse4_2" -> "sse4.2", "avx512_vnni" -> "avx512vnni"); a spec or manifest
written with another spelling would drop the feature silently or reject every CPU.
"""
from __future__ import annotations

import json

import pytest

from accelstack.hardware.cpu import KEEP, normalize_features
from accelstack.manifests import Manifests
from accelstack.manifests.ggml_checks import _feature
from accelstack.manifests.ggml_resolve import BUILD_FEATURES
from accelstack.publisher.variants import PROPERTIES

from ._factory import EXAMPLE_GGML, machine, plan_of


def test_every_build_spec_feature_is_a_name_detection_writes():
    assert set(BUILD_FEATURES) <= KEEP, sorted(set(BUILD_FEATURES) - KEEP)
    assert set(normalize_features(BUILD_FEATURES)) == set(BUILD_FEATURES)  # already normalized


def test_published_variant_properties_use_detection_names():
    for variant, props in PROPERTIES.items():
        for f in props.get("cpu_features", []):  # type: ignore[union-attr]
            assert f in KEEP, f"{variant}: {f!r} is not a feature name detection writes"


def test_example_manifest_requires_only_detection_names():
    doc = json.loads(EXAMPLE_GGML.read_text())
    for t in doc["targets"]:
        for f in (t.get("requires") or t.get("properties") or {}).get("cpu_features", []):
            assert f in KEEP, f"{t['id']}: {f!r}"


@pytest.mark.parametrize("raw", [
    "sse4_2 avx avx2 fma f16c bmi2 avx512f avx512bw avx512vl avx512_vnni avx512_bf16 avx_vnni amx_tile amx_int8",
])
def test_no_detected_feature_drops_out_of_the_build_spec(raw):
    # a Sapphire Rapids flag line as /proc/cpuinfo spells it, through detection's normalization
    features = normalize_features(raw.split())
    report = machine(features=features, apis={})
    bare = plan_of(report, "ggml", manifests=Manifests.builtin())  # no published build: the spec says what to build
    assert bare.build is not None
    spec = bare.build.properties["cpu_features"].split(",")
    wanted = {"sse4.2", "avx512vnni", "avx512bf16", "avxvnni", "amx"}
    assert wanted <= set(spec), (spec, features)
    assert set(spec) == set(features) & set(BUILD_FEATURES)  # nothing detected and buildable is left out


def test_a_manifest_written_with_cpuinfo_spelling_still_matches():
    assert _feature("sse4_2") == "sse4.2" and _feature("avx512_vnni") == "avx512vnni" and _feature("made_up") == "made_up"
