"""`model inspect` on hostile files (issue 26 review): bounded work, typed errors, safe text.

Each file is crafted here in ``tmp_path``: a pickle whose memo makes one list of 2^21 copies
(which ``repr`` would expand), a zip entry that declares 1000 bytes and inflates to 50 MB, a
pickle of more opcodes than accepted, unreadable and odd paths, names that would drive a terminal,
lone surrogates, and files that hold no tensors. Work is measured by tracemalloc's peak or by the
answer itself, never by time.
"""
from __future__ import annotations

import json
import os
import struct
import sys
import tracemalloc
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List

import pytest

from accelstack.engine.errors import ModelLoadError, ModelNotFoundError
from accelstack.engine.models.check import check_model
from accelstack.engine.models.ckpt_index import MAX_OPS, checkpoint_index
from accelstack.engine.models.inspection import inspect_model

from cli_helpers import error_of, json_lines, result_of, run_cli

ESC_NAME = "\x1b]0;PWNED\x07\x1b[2Jevil\nname"


@contextmanager
def peak_memory() -> Iterator[List[int]]:
    """The traced peak (bytes) of the body, in the yielded list once it ends."""
    out: List[int] = []
    tracemalloc.start()
    try:
        yield out
    finally:
        out.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()


def _ckpt(path: Path, pkl: bytes, compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as archive:
        archive.writestr("archive/data.pkl", pkl)
        archive.writestr("archive/data/0", b"\0" * 16)
    return path


def _safetensors(path: Path, raw_header: bytes, data: int = 4) -> Path:
    path.write_bytes(struct.pack("<Q", len(raw_header)) + raw_header + b"\0" * data)
    return path


def _st_header(name: str) -> bytes:
    return json.dumps({name: {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()


# -- 1. a key that is no text is never repr'd -------------------------------------------------------------
def _repr_bomb(levels: int) -> bytes:
    """A list of two copies of the previous one, ``levels`` times (memo GETs: 2^levels copies in repr),
    then used as a dict key."""
    return b"\x80\x02]q\x00" + b"(h\x00h\x00lq\x00" * levels + b"}h\x00Ns."


def test_a_pickle_key_that_is_no_text_is_not_expanded(tmp_path):
    path = _ckpt(tmp_path / "bomb.ckpt", _repr_bomb(21))  # repr would build a 12-million-character string
    with peak_memory() as peak:
        r = inspect_model(path)
    assert peak[0] < 4 << 20, f"peak {peak[0]} bytes"
    assert r.format == "ckpt" and r.tensors == 0


def test_a_stack_global_of_no_text_gives_up_without_expanding(tmp_path):
    pkl = b"\x80\x02]q\x00" + b"(h\x00h\x00lq\x00" * 21 + b"h\x00\x93."  # STACK_GLOBAL(module=a list, attr=a list)
    path = _ckpt(tmp_path / "global.ckpt", pkl)
    with peak_memory() as peak:
        found = checkpoint_index(path)
    assert peak[0] < 4 << 20, f"peak {peak[0]} bytes"
    assert found is None


def test_a_state_dict_that_holds_itself_names_each_tensor_once(tmp_path):
    # {0: D, 1: D, ..., 9: D, "w": tensor} where D is the dict itself: each dict is walked once
    tensor = (b"ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nHalfStorage\n"
              b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQK\x00K\x04\x85K\x01\x85\x89}tR")
    pkl = (b"\x80\x02}q\x00(" + b"".join(b"K" + bytes([i]) + b"h\x00" for i in range(10))
           + b"X\x01\x00\x00\x00w" + tensor + b"u.")
    found = checkpoint_index(_ckpt(tmp_path / "self.ckpt", pkl))
    assert found is not None and [(t.name, t.shape, t.dtype) for t in found] == [("w", (4,), "F16")]


def test_a_tensor_shape_beyond_int64_is_not_a_tensor(tmp_path):
    huge = (1 << 70).to_bytes(9, "little", signed=True)
    pkl = (b"\x80\x02}X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\n"
           b"HalfStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQK\x00\x8a\x09" + huge + b"\x85K\x01\x85\x89}tRs.")
    assert checkpoint_index(_ckpt(tmp_path / "huge.ckpt", pkl)) == []


# -- 2. a zip entry that inflates past its declared size -----------------------------------------------------
def _zip_bomb(path: Path, inflated: int, declared: int = 1000) -> Path:
    """A zip whose data.pkl holds ``inflated`` deflated zeros but declares ``declared`` bytes, in its
    local header and in the central directory (zipfile trusts the latter)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("archive/data.pkl", b"\0" * inflated)
    raw = bytearray(path.read_bytes())
    local = raw.index(b"PK\x03\x04")
    struct.pack_into("<I", raw, local + 22, declared)
    central = raw.index(b"PK\x01\x02")
    struct.pack_into("<I", raw, central + 24, declared)
    path.write_bytes(bytes(raw))
    return path


def test_a_zip_bomb_is_refused_before_it_is_inflated(tmp_path):
    path = _zip_bomb(tmp_path / "bomb.ckpt", 50 << 20)
    assert path.stat().st_size < 200_000
    with peak_memory() as peak:
        with pytest.raises(ModelLoadError, match="damaged checkpoint"):
            check_model(path)
    assert peak[0] < 8 << 20, f"peak {peak[0]} bytes: the entry was inflated"


def test_the_names_reader_inflates_no_more_than_declared(tmp_path):
    path = _zip_bomb(tmp_path / "bomb.ckpt", 50 << 20)
    with peak_memory() as peak:
        with pytest.raises(ModelLoadError, match="damaged checkpoint"):
            checkpoint_index(path)
    assert peak[0] < 8 << 20, f"peak {peak[0]} bytes: the entry was inflated"


# -- 3. the opcode check has a cap ----------------------------------------------------------------------------
def test_a_pickle_of_more_opcodes_than_accepted_is_refused(tmp_path):
    pkl = b"\x80\x02" + b"N0" * (MAX_OPS // 2 + 1) + b"N."  # NONE, POP: a valid pickle of None
    path = _ckpt(tmp_path / "ops.ckpt", pkl, zipfile.ZIP_DEFLATED)
    with pytest.raises(ModelLoadError, match="opcodes"):
        check_model(path)


# -- 4. unreadable and odd paths --------------------------------------------------------------------------------
@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs Linux's /proc/self/mem (a read gives EIO)")
def test_a_read_error_after_open_is_a_typed_error():
    with pytest.raises(ModelLoadError, match="cannot read it") as err:
        check_model("/proc/self/mem")
    assert "/proc/self/mem" in err.value.message
    code, out, _ = run_cli(["model", "inspect", "--json", "/proc/self/mem"])
    assert code == 1 and error_of(out)["error"] == "ModelLoadError"


def test_a_name_starting_with_a_tilde_that_is_no_user(tmp_path, monkeypatch):
    _safetensors(tmp_path / "~model.safetensors", _st_header("w"))
    monkeypatch.chdir(tmp_path)
    assert check_model("~model.safetensors").tensors == 1  # the literal file
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        check_model("~no-such-user-zq/model.safetensors")
    code, out, _ = run_cli(["model", "inspect", "--json", "~model.safetensors"], cwd=tmp_path)
    assert code == 0 and result_of(out)["models"][0]["tensors"] == 1


def test_an_empty_path_is_a_usage_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match="empty"):
        check_model("")
    code, out, _ = run_cli(["model", "inspect", "--json", ""], cwd=tmp_path)
    assert code == 2 and "empty" in error_of(out)["message"]
    code, _, err = run_cli(["model", "inspect", ""], cwd=tmp_path)
    assert code == 2 and "empty" in err and "Traceback" not in err


# -- 5. untrusted text on a terminal ------------------------------------------------------------------------------
def _no_controls(text: str) -> None:
    assert not [c for c in text if not c.isprintable() and c != "\n"], repr(text)


def test_tensor_names_reach_people_escaped(tmp_path):
    path = _safetensors(tmp_path / "esc.safetensors", _st_header(ESC_NAME))
    code, out, err = run_cli(["model", "inspect", str(path)])
    assert code == 0, err
    _no_controls(out)
    assert "\\x1b]0;PWNED\\x07\\x1b[2Jevil\\nname" in out
    code, out, _ = run_cli(["model", "inspect", "--json", str(path)])
    assert ESC_NAME in result_of(out)["models"][0]["evidence"][-1]  # JSON carries the name as it is


def test_a_file_name_reaches_people_escaped(tmp_path):
    path = _safetensors(tmp_path / "ev\x1b[31mil\nname.safetensors", _st_header("w"))
    code, out, err = run_cli(["model", "inspect", str(path)])
    assert code == 0, err
    _no_controls(out)
    assert out.splitlines()[0].startswith("ev\\x1b[31mil\\nname.safetensors: ")


def test_a_lone_surrogate_in_a_safetensors_name_is_refused(tmp_path):
    """stable-diffusion.cpp's JSON parser (and the safetensors library's) refuse it: no such file loads."""
    path = _safetensors(tmp_path / "sur.safetensors", b'{"\\ud800x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}')
    with pytest.raises(ModelLoadError, match="surrogate"):
        check_model(path)
    code, out, err = run_cli(["model", "inspect", str(path)])
    assert code == 1 and "Traceback" not in err
    code, out, _ = run_cli(["model", "inspect", "--json", str(path)])
    assert code == 1 and "\\ud800" in error_of(out)["message"]  # the name quoted with the escape, as text
    assert "\\ud800" not in out.replace("\\\\ud800", "")  # no JSON escape of a lone surrogate itself


def test_a_lone_surrogate_in_a_checkpoint_name_becomes_a_replacement(tmp_path):
    name = b"w\xed\xa0\x80x"  # UTF-8 bytes of U+D800, as pickle writes a lone surrogate
    tensor = (b"ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nHalfStorage\n"
              b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQK\x00K\x04\x85K\x01\x85\x89}tR")
    pkl = b"\x80\x02}X" + struct.pack("<I", len(name)) + name + tensor + b"s."
    path = _ckpt(tmp_path / "sur.ckpt", pkl)
    r = inspect_model(path)
    assert r.tensors == 1 and all(e.encode("utf-8") for e in r.evidence)
    code, out, err = run_cli(["model", "inspect", "--json", str(path)])
    assert code == 0 and "\\ud800" not in out and "\\udc" not in out
    code, out, err = run_cli(["model", "inspect", str(path)])
    assert code == 0 and "Traceback" not in err


# -- 7. no tensors, or tensors not read ---------------------------------------------------------------------------
def test_a_gguf_without_tensors_is_refused_like_safetensors(tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0) + b"\0" * 40)
    with pytest.raises(ModelLoadError, match="holds no tensors"):
        check_model(tmp_path / "m.gguf")


def test_a_checkpoint_whose_names_are_not_read_claims_no_tensor_count(tmp_path):
    path = _ckpt(tmp_path / "persid.ckpt", b"\x80\x02P0\n.")  # PERSID (text): not followed
    r = inspect_model(path)
    assert (r.tensors, r.parameters, r.family) == (0, None, "unknown")
    code, out, err = run_cli(["model", "inspect", str(path)])
    assert code == 0 and "2 tensors" not in out and "no tensor names read" in out, out


def test_a_checkpoint_whose_pickle_names_no_tensor_claims_no_count(tmp_path):
    """A data.pkl that holds no state dict the reader finds: its tensors are unknown, not zero."""
    r = inspect_model(_ckpt(tmp_path / "empty.ckpt", b"\x80\x02}."))
    assert (r.tensors, r.parameters, r.family) == (0, None, "unknown")
    assert "tensor names are unknown" in r.evidence[0] and not any("prefixes" in e for e in r.evidence)


def test_cli_json_contract_for_hostile_files(tmp_path):
    """Every hostile file: exactly one final JSON line (json_lines checks it) and no traceback."""
    files = [_ckpt(tmp_path / "bomb.ckpt", _repr_bomb(21)), _zip_bomb(tmp_path / "zip.ckpt", 1 << 20),
             _safetensors(tmp_path / "esc.safetensors", _st_header(ESC_NAME))]
    for f in files:
        code, out, err = run_cli(["model", "inspect", "--json", str(f)])
        assert code in (0, 1) and "Traceback" not in err, (f.name, err)
        json_lines(out)


if sys.platform == "win32":  # pragma: no cover - the names above are POSIX file names
    pytestmark = pytest.mark.skip("POSIX file names")


def test_an_error_naming_a_hostile_file_reaches_people_escaped(tmp_path):
    """The CLI's error printer quotes paths: a name could clear the terminal or forge a line. A
    message's newlines stay (a build error holds its log's last lines), each one indented."""
    code, out, err = run_cli(["model", "inspect", str(tmp_path / "ev\x1b[31mil\nx.nope")])
    assert code == 2, err
    _no_controls(err)
    assert "ev\\x1b[31mil\n    x.nope does not exist" in err
    assert all(line.startswith(("accelstack: error: ", " ")) for line in err.splitlines()), err


def test_verify_model_of_a_vae_says_it_holds_no_diffusion_model(tmp_path):
    import model_specs as m

    from accelstack.engine.errors import InvalidRequestError
    from accelstack.engine.probes.families import probe_families_of

    vae = m.write_safetensors(tmp_path / "ae.safetensors", m.sd_vae(""))
    with pytest.raises(InvalidRequestError, match="holds no diffusion model") as err:
        probe_families_of([str(vae)])
    assert " is none" not in err.value.message
