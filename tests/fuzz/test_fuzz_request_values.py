"""Fuzz the request values issue 44 added (guidance, flow shift, reference images, mask, values left to the
family): validate() accepts a value or raises InvalidRequestError naming the flag, never anything else."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from accelstack.engine.errors import InvalidRequestError
from accelstack.engine.request.defaults import apply_defaults
from accelstack.engine.worker.protocol import GenerateRequest

_ANY = (st.none() | st.booleans() | st.integers(-(10 ** 40), 10 ** 40) | st.floats(allow_nan=True, allow_infinity=True)
        | st.text(max_size=20) | st.lists(st.text(max_size=8), max_size=12) | st.binary(max_size=8))
_FLAGS = {"guidance": "--guidance", "flow_shift": "--flow-shift", "ref_images": "--ref-image", "ref_pixels": "--ref-image",
          "mask_image": "--mask", "mask_pixels": "mask"}


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(sorted(_FLAGS)), value=_ANY, init=st.booleans())
def test_new_request_values_are_accepted_or_refused_by_name(field, value, init):
    request = GenerateRequest(prompt="x", init_image="init.png" if init else "", **{field: value})
    try:
        request.validate()
    except InvalidRequestError as exc:
        assert _FLAGS[field] in exc.message or "must be a file path" in exc.message, (field, value, exc.message)


@settings(max_examples=100, deadline=None)
@given(family=st.sampled_from(["sd1", "flux", "flux2", "sd3", "qwen-image", "unknown", "no-such"]),
       cfg=st.none() | st.floats(0, 100), steps=st.none() | st.integers(1, 1000), guidance=st.none() | st.floats(0, 100))
def test_defaults_never_replace_a_value_given(family, cfg, steps, guidance):
    given_values = {k: v for k, v in (("cfg_scale", cfg), ("steps", steps), ("guidance", guidance)) if v is not None}
    out = apply_defaults(GenerateRequest(prompt="x", **given_values), family).validate()
    for k, v in given_values.items():
        assert getattr(out, k) == v
    assert type(out.cfg_scale) is float and type(out.steps) is int
