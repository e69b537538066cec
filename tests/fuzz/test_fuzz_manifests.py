"""Fuzzing the manifest and signature parsers (issue 10).

Manifests and their ``.sig`` come from servers: anyone who serves them can send anything, no key
needed. For mutated valid manifests (the shipped example and torch matrix), random JSON, deep
nesting and huge strings and numbers, loading and verifying either succeed or raise one of
accelstack's typed errors, within a time and a memory bound. Examples that found bugs are kept
as plain tests in tests/manifests/test_manifest_schema.py and test_signing.py.
"""
from __future__ import annotations

import base64
import copy
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelstack.errors import AccelstackError
from accelstack.manifests import TrustedManifests, load_manifest
from accelstack.manifests.envelope import parse_expires
from accelstack.manifests.errors import ManifestFormatError
from accelstack.manifests.signatures import parse_signature, sign_manifest

from .fuzzing import Counter, bounded, fuzz, node_mutation

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "accelstack" / "manifests" / "data"
GGML = json.loads((DATA / "ggml-example.json").read_text(encoding="utf-8"))
TORCH = json.loads((DATA / "torch.json").read_text(encoding="utf-8"))
NOW = datetime(2026, 6, 1, tzinfo=timezone.utc)


def fixed_keypair() -> tuple:
    """A key pair from a fixed seed, so signatures (and so every example) are the same each run."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    raw = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return pem, base64.b64encode(raw).decode("ascii")


PEM, PUB = fixed_keypair()

STATS = {name: Counter() for name in ("mutated", "bytes", "random", "deep", "signature", "expires", "accepted")}


def must_be_typed(call: Callable[[], Any], what: str) -> None:
    """``call()`` returns or raises an AccelstackError, within the time and memory bounds."""
    with bounded(what):
        try:
            call()
            STATS["accepted"]()
        except AccelstackError:
            pass


def load(data: bytes) -> None:
    load_manifest(data, now=NOW)


def verify(data: bytes, sig: Any) -> None:
    TrustedManifests(keys=[PUB], include_package_keys=False, clock=lambda: NOW).verify(data, sig, "fuzz")


# -- strategies -------------------------------------------------------------------------------
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20)),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)),
    max_leaves=20,
)
ODD = st.one_of(
    JSON,
    st.integers(min_value=-(2 ** 100), max_value=2 ** 100), st.just(10 ** 4000), st.just(-(10 ** 4000)),
    st.just("x" * 200_000), st.just("\x00"), st.just("a/../b"), st.just(" " + "ab" * 32), st.just("AB" * 32),
    st.just("9999-12-31T23:59:59-23:59"), st.just("0001-01-01T00:00:00+23:59"), st.just("2027-06-01T00:00:00Z\n"),
    st.just("1" * 4000), st.just(json.loads("[" * 30 + "]" * 30)),
)


def mutation() -> Any:
    return node_mutation(ODD, 7)


def dumps(doc: Any) -> bytes:
    return json.dumps(doc).encode("utf-8")


# -- targets ----------------------------------------------------------------------------------
@fuzz(300)
@given(base=st.sampled_from(["ggml", "torch"]), mutations=st.lists(mutation(), min_size=1, max_size=4))
def test_fuzz_mutated_manifests(base, mutations):
    STATS["mutated"]()
    doc = copy.deepcopy(GGML if base == "ggml" else TORCH)
    for m in mutations:
        doc = m(doc)
    must_be_typed(lambda: load(dumps(doc)), "load of a mutated manifest")


@fuzz(200)
@given(cut=st.floats(min_value=0, max_value=1), flips=st.lists(st.integers(min_value=0), max_size=6),
       insert=st.binary(max_size=40))
def test_fuzz_manifest_bytes(cut, flips, insert):
    STATS["bytes"]()
    data = bytearray(dumps(GGML))
    for f in flips:
        data[f % len(data)] ^= 1 << (f % 8)
    at = int(cut * len(data))
    mutated = bytes(data[:at]) + insert + bytes(data[at:])
    must_be_typed(lambda: load(mutated), "load of damaged manifest bytes")


@fuzz(200)
@given(doc=JSON)
def test_fuzz_random_json(doc):
    STATS["random"]()
    must_be_typed(lambda: load(dumps(doc)), "load of random JSON")
    must_be_typed(lambda: parse_signature(dumps(doc)), "parse of a random signature document")


@fuzz(60)
@given(depth=st.integers(min_value=1, max_value=200_000), opener=st.sampled_from(["[", '{"a":']),
       where=st.sampled_from(["top", "sources", "sig"]))
def test_fuzz_deep_nesting(depth, opener, where):
    STATS["deep"]()
    closer = "]" if opener == "[" else "}"
    deep = opener * depth + "1" + closer * depth
    if where == "top":
        must_be_typed(lambda: load(deep.encode()), "load of a deep manifest")
    elif where == "sources":
        text = dumps(GGML).decode()
        text = text.replace('"sources": {', f'"deep": {deep}, "sources": {{', 1)
        must_be_typed(lambda: load(text.encode()), "load of a manifest with a deep field")
    else:
        sig = b'{"format": "accelstack-signature", "signatures": ' + deep.encode() + b"}"
        must_be_typed(lambda: verify(dumps(GGML), sig), "verify with a deep signature")


@fuzz(200)
@given(mutations=st.lists(mutation(), min_size=1, max_size=3), raw=st.booleans(), noise=st.binary(max_size=64))
def test_fuzz_signatures(mutations, raw, noise):
    STATS["signature"]()
    data = dumps(GGML)
    sig = sign_manifest(data, PEM)
    if raw:
        mutated = noise + sig[len(noise):]
    else:
        doc = json.loads(sig)
        for m in mutations:
            doc = m(doc)
        mutated = dumps(doc)
    must_be_typed(lambda: verify(data, mutated), "verify with a mutated signature")


@fuzz(300)
@given(year=st.integers(min_value=0, max_value=9999), month=st.integers(0, 13), day=st.integers(0, 32),
       hour=st.integers(0, 25), offset=st.sampled_from(["Z", "+23:59", "-23:59", "+00:00", "+24:00", ""]),
       fraction=st.sampled_from(["", ".5", ".123456789", ".1234567890123"]))
def test_fuzz_expires(year, month, day, hour, offset, fraction):
    STATS["expires"]()
    text = f"{year:04d}-{month:02d}-{day:02d}T{hour:02d}:00:00{fraction}{offset}"
    with bounded("parse_expires"):
        try:
            parse_expires(text)
        except ManifestFormatError:
            pass


def test_fuzz_manifest_counts(capsys):
    """How many inputs each target ran (quoted in the issue's closing note); runs after them."""
    with capsys.disabled():
        print("\nfuzz manifests: " + ", ".join(f"{k} {v.count}" for k, v in STATS.items()))


def test_signed_example_verifies():
    """The fuzz baseline: an unmutated signed manifest is accepted."""
    data = dumps(GGML)
    verify(data, sign_manifest(data, PEM))


@pytest.mark.parametrize("value", [10 ** 4000, "x" * 200_000, "\x00"])
def test_odd_values_anywhere_are_typed_errors(value):
    """Examples of the fuzzer's odd values at the places it reached, kept as plain tests."""
    for key in ("version", "source", "expires", "package", "targets"):
        doc = copy.deepcopy(GGML)
        doc[key] = value
        with pytest.raises(ManifestFormatError):
            load(dumps(doc))
