"""data/hw-rules.json: every block cites sources that exist, and the rules read from it decide."""
from __future__ import annotations

import copy
import json

from accelstack.manifests.hw_rules import BUILTIN, hw_rules, parse_hw_rules

from ._factory import REPO

DOC = json.loads((REPO / "accelstack" / "manifests" / "data" / BUILTIN).read_text())


def test_every_block_cites_known_sources():
    keys = set(DOC["sources"])
    for name, block in DOC.items():
        if isinstance(block, dict) and "sources" in block and name != "sources":
            assert block["sources"] and set(block["sources"]) <= keys, name


def test_nvidias_numbers_are_the_ones_of_the_fact_sheet():
    rules = hw_rules()
    assert (rules.floor(11, "linux"), rules.floor(11, "windows")) == ("450.80.02", "452.39")
    assert (rules.floor(12, "linux"), rules.floor(12, "windows")) == ("525.60.13", "527.41")
    assert rules.floor(13, "linux") == "580.65.06" and rules.floor(10, "linux") == ""
    assert [(a.name, a.last_branch) for a in (rules.architecture("3.7"), rules.architecture("6.1"), rules.architecture("7.0"))] == [
        ("Kepler", "470"), ("Pascal", "580"), ("Volta", "580")]
    assert rules.architecture("7.5") is None  # Turing onward: support ongoing
    assert "gfx803" not in rules.rocm_build_gfx and "gfx1103" in rules.rocm_build_gfx


def test_jetpack_names_come_from_the_table_or_the_family():
    rules = hw_rules()
    assert rules.jetpack_of("35.4.1") == "5.1.2" and rules.jetpack_of("36.3.0") == "6.0"
    assert rules.jetpack_of("36.5.0") == "6.x" and rules.jetpack_of("36.4.7") == "6.x"  # not in the table: its family
    assert rules.jetpack_of("28.2") == ""


def test_the_parsed_rules_follow_the_data():
    doc = copy.deepcopy(DOC)
    doc["cuda_minor_compat"]["majors"]["12"]["linux"] = "530.30.02"
    doc["ggml_cuda_build"]["min_cc"] = "6.0"
    rules = parse_hw_rules(doc)
    assert rules.floor(12, "linux") == "530.30.02" and rules.ggml_min_cc == (6, 0)
