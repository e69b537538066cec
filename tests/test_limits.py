"""The bounded parsers every outside document goes through (accelstack/limits.py)."""
from __future__ import annotations

import pytest

from accelstack.limits import MAX_DEPTH, MalformedInput, parse_json, parse_yaml


@pytest.mark.parametrize("text", [
    "a: !!timestamp x",  # PyYAML: AttributeError
    "a: !!float",  # PyYAML: IndexError
    "a: &" + "x" * 5000 + " 1\nb: *" + "x" * 5000,  # an alias, with a name long enough to flood a message
    "a: &a [1, 2]\nb: [*a, *a]",  # billion laughs starts like this
    "[" * 5000,
    "a:\n" + "".join("  " * i + "b:\n" for i in range(1, MAX_DEPTH + 5)),
])
def test_hostile_yaml_is_a_short_typed_error(text):
    with pytest.raises(MalformedInput) as info:
        parse_yaml(text, what="config.yaml")
    assert len(str(info.value)) < 600


@pytest.mark.parametrize("data", [b"\xff\xfe", "a: 1\x00", "x" * 300_000])
def test_yaml_that_is_not_small_utf8_text_is_refused(data):
    with pytest.raises(MalformedInput):
        parse_yaml(data, what="config.yaml")


@pytest.mark.parametrize("data", ["[" * 100_000 + "]" * 100_000, "[" * 40 + "]" * 40, "{", b"\xff", "1" * 10_000])
def test_hostile_json_is_a_typed_error(data):
    with pytest.raises(MalformedInput):
        parse_json(data, what="manifest")


def test_json_size_is_capped_before_parsing():
    with pytest.raises(MalformedInput, match="is 43 B, more than the 10 B accepted"):  # sizes in binary units (issue 25)
        parse_json("[" + "1," * 20 + "1]", what="manifest", max_bytes=10)


def test_ordinary_documents_parse():
    assert parse_json('{"a": [1, {"b": null}]}', what="m") == {"a": [1, {"b": None}]}
    assert parse_yaml("a: {b: 1}\nc: [x, y]", what="c") == {"a": {"b": 1}, "c": ["x", "y"]}
