"""Fuzzing the config loader (issue 10): random bytes, YAML built from hostile pieces (aliases,
tags, deep nesting, huge numbers), and well-formed documents with values of every type. Loading
either gives options or raises ``ConfigError``, within a time and a memory bound, with a short
message. Examples that found bugs are kept as plain tests (and in tests/engine/test_engine_hostile)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from accelstack.engine.config import EngineOptions, load_config
from accelstack.engine.errors import ConfigError

from .fuzzing import Counter, bounded, fuzz

STATS = {"config": Counter(), "config refused": Counter()}
OPTIONS = ["flash_attention", "offload_to_cpu", "vae_tiling", "vae_tile_size", "threads", "weight_type", "memory_check"]
PIECES = ["engine:", "\n", "  ", "- ", ": ", "&a ", "*a", "&b [*a, *a, *a]", "!!binary ", "!!timestamp ", "!!float ",
          "!!python/object:os.system ", "? ", "[", "]", "{", "}", "'", '"', "#", "---", "...", "%YAML 1.1\n", "auto",
          "true", "no", "~", ".nan", "-.inf", "0x1F", "0o17", "1_000", "2001-13-45", "9" * 5000, "\t", "\ufeff",
          "\\x00", "|\n", ">\n"] + OPTIONS


def _load(tmp: Path, data: bytes) -> None:
    STATS["config"]()
    path = tmp / "config.yaml"
    path.write_bytes(data)
    with bounded("load_config"):
        try:
            options = load_config(path)
        except ConfigError as exc:
            STATS["config refused"]()
            assert len(str(exc)) < 1500, str(exc)[:200]
        else:
            assert isinstance(options, EngineOptions)
            options.validate()


scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70), st.floats(allow_nan=True),
                    st.text(max_size=40), st.sampled_from(["auto", "f16", "Q8_0", "default"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                      max_leaves=12)


# -- kept examples: each escaped as a traceback or a giant message before ------------------------------------
@pytest.mark.parametrize("data, words", [
    (b"!!timestamp ", "AttributeError"),  # PyYAML's timestamp constructor on a non-date (found by fuzzing)
    (b"!!float ", "IndexError"),  # PyYAML's float constructor on an empty scalar (found by fuzzing)
    (b"engine:\n  threads: !!int ", "not valid YAML"),
    (b"*a" + b"9" * 5000, "..."),  # the alias name was quoted whole: a 5 KB message (found by fuzzing)
    (b"engine:\n  threads: 1" + b"0" * 5000, "digits"),  # ValueError of int() past 4300 digits
    (b"engine:\n  vae_tiling: 2001-13-45", "month"),
])
def test_kept_config_examples(tmp_path, data, words):
    path = tmp_path / "config.yaml"
    path.write_bytes(data)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert words in str(err.value) and len(str(err.value)) < 1000, str(err.value)[:300]


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("config-fuzz")


@fuzz(150)
@given(st.binary(max_size=600))
def test_fuzz_config_bytes(tmp, data):
    _load(tmp, data)


@fuzz(int(os.environ.get("FUZZ_CONFIG_EXAMPLES", "250")))
@given(st.lists(st.sampled_from(PIECES), max_size=40))
def test_fuzz_config_pieces(tmp, pieces):
    _load(tmp, "".join(pieces).encode("utf-8", "surrogatepass"))


@fuzz(200)
@given(st.dictionaries(st.sampled_from(OPTIONS + ["unknown", "threads "]), values, max_size=6),
       st.sampled_from(["engine", "engine", "other", 1]))
def test_fuzz_config_documents(tmp, section, name):
    _load(tmp, yaml.safe_dump({name: section}, allow_unicode=True).encode())


def teardown_module(module):
    print("\nconfig fuzz:", {k: v.count for k, v in STATS.items()})
