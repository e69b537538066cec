"""Fuzzing the offline-bundle reader (issue 29): tars of hostile members in any order, sparse
members that claim up to a terabyte, gzip-compressed tars, cut short anywhere. Reading either
succeeds or raises a ``BundleError``, within a time and memory bound, and what it writes is never
more than the bytes of the file itself: only artifacts the caller accepted, each at the size it
gave, and nothing at all before the caller is asked (the documents come first)."""
from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelstack.core.bundle_file import BundleError, read_bundle

from .bundle_tars import gzipped, tar_bytes
from .fuzzing import Counter, bounded, fuzz

STATS = {"read": Counter(), "refused": Counter()}
INDEX = json.dumps({"format": "accelstack-bundle", "version": 1, "stack": "ggml"}).encode()
_SHAS = [hashlib.sha256(bytes([i])).hexdigest() for i in range(3)]
_NAMES = st.sampled_from(["accelstack-bundle.json", "ggml-manifest.json", "ggml-manifest.json.sig",
                          *(f"artifacts/{s}" for s in _SHAS), "artifacts/../x", "x"])
# a member: its name, the bytes stored, and the full size of a sparse member (None: regular)
_MEMBER = st.tuples(st.one_of(st.sampled_from([f"artifacts/{s}" for s in _SHAS]), _NAMES), st.binary(max_size=600),
                    st.one_of(st.none(), st.none(), st.none(), st.integers(min_value=1, max_value=1 << 40)))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bundle-fuzz")


@fuzz(200)
@given(st.lists(_MEMBER, max_size=6), st.booleans(), st.sampled_from([False, False, True]),
       st.sampled_from([0, 0, 0, 1, 3, 8, 20]), st.booleans(),
       st.dictionaries(st.sampled_from(_SHAS), st.integers(0, 1 << 40), max_size=3))
def test_any_bundle_writes_at_most_its_own_bytes_and_only_what_was_accepted(work, members, index_first, compress,
                                                                           cut, as_stored, accepted):
    case = Path(tempfile.mkdtemp(dir=work))
    members = [m if m[2] is None or m[2] >= len(m[1]) else (m[0], m[1], None) for m in members]
    if as_stored:  # the sizes a manifest would give for the members as stored (sparse ones: their full size)
        accepted = {**accepted, **{m[0][10:]: m[2] if m[2] is not None else len(m[1])
                                   for m in members if m[0][10:] in _SHAS}}
    if index_first:
        members = [("accelstack-bundle.json", INDEX, None), ("ggml-manifest.json", b"{}", None), *members]
    data = tar_bytes(members)
    if cut:
        data = data[:-cut * 64]
    if compress:
        data = gzipped(data)
    path = case / "b.tar"
    path.write_bytes(data)
    root = case / "root"
    root.mkdir()
    asked = []
    with bounded("read_bundle"):
        try:
            opened = read_bundle(path, root)
            assert list(root.iterdir()) == []  # the documents alone: nothing written before the caller decides
            asked.append(True)
            opened.extract(accepted)
            STATS["read"]()
        except BundleError:
            STATS["refused"]()
    written = list(root.iterdir())
    assert all(p.name in accepted and p.stat().st_size == accepted[p.name] for p in written)
    assert sum(p.stat().st_blocks * 512 for p in written) <= max(len(data), 4096) * 2
    assert not compress or not asked, "a compressed bundle is refused before its members are read"
    first: dict = {}
    for m in members:
        first.setdefault(m[0], m)  # a name's later members are refused as duplicates
    for p in written:
        name, stored, full = first[f"artifacts/{p.name}"]
        assert full is None and p.read_bytes() == stored, "a sparse member was written, or other bytes than stored"


def test_zz_report():
    print("\nbundle fuzz:", {k: v.count for k, v in STATS.items()})
