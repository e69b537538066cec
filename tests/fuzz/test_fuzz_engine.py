"""Fuzzing the engine's inputs (issue 10): model file headers and the worker's HTTP requests.

Model files are tiny GGUF / safetensors / torch zip checkpoints made here (no real weights), then
mutated: :func:`check_model` either accepts them or raises ``ModelLoadError``, within a time and a
memory bound. The worker's HTTP server (the real one, on 127.0.0.1, with a backend that never
loads a runtime) gets random request lines, headers and bodies over real sockets: it answers or
closes, never dies, and the token holder's ``/ping`` still works afterwards. Examples that found
bugs are kept below as plain tests.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import socket
import struct
import threading
import zipfile
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelstack.engine.errors import ModelLoadError
from accelstack.engine.models.check import check_model
from accelstack.engine.supervision.client import WorkerClient
from accelstack.engine.supervision.supervisor import Supervisor
from accelstack.engine.worker import server as worker_server
from accelstack.engine.worker.backend import WorkerBackend
from accelstack.engine.worker.main import listen
from accelstack.engine.worker.server import make_server
from accelstack.engine.worker.state import WorkerState

from .fuzzing import Counter, bounded, fuzz

STATS: Dict[str, Counter] = {"model headers": Counter(), "model refused": Counter(), "http in-process": Counter(),
                             "http real worker": Counter(), "http closed without answer": Counter()}


# -- tiny model files ----------------------------------------------------------------------------------------
def gguf_bytes(tensors: List[Tuple[bytes, List[int], int, int]], kv: List[Tuple[bytes, int, bytes]] = (),
               version: int = 3, n_tensors: int = -1, n_kv: int = -1, alignment: int = 32) -> bytes:
    """A GGUF file: (name, dims, ggml type, offset) per tensor, (key, type, raw value) per KV; the
    counts can lie (``n_tensors``/``n_kv``); data is zeros up to the largest tensor's end."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors < 0 else n_tensors,
                                          len(kv) if n_kv < 0 else n_kv))
    for key, kind, raw in kv:
        out += struct.pack("<Q", len(key)) + key + struct.pack("<I", kind) + raw
    end = 0
    for name, dims, kind, offset in tensors:
        out += struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d & (2 ** 64 - 1)) for d in dims) + struct.pack("<IQ", kind, offset)
        n = 1
        for d in dims:
            n *= max(d, 0)
        end = max(end, offset + n * 4)
    out += b"\0" * (-len(out) % alignment)
    return bytes(out) + b"\0" * min(end, 1 << 20)


def safetensors_bytes(header: object, data: bytes = b"", length: int = -1) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw) if length < 0 else length) + raw + data


def ckpt_bytes(path: Path, pkl: bytes = b"", names: Tuple[str, ...] = ("archive/data/0",)) -> bytes:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pkl or pickle.dumps({"w": 1}, protocol=2))
        for name in names:
            archive.writestr(name, b"\0" * 16)
    return path.read_bytes()


GOOD_GGUF = gguf_bytes([(b"w", [4, 2], 0, 0), (b"b", [64], 8, 32)], kv=[(b"general.name", 8, struct.pack("<Q", 3) + b"sd1")])
GOOD_SAFETENSORS = safetensors_bytes({"w": {"dtype": "F16", "shape": [2, 2], "data_offsets": [0, 8]},
                                      "__metadata__": {"format": "pt"}}, b"\0" * 8)


def _refused(path: Path, words: str) -> None:
    with pytest.raises(ModelLoadError) as err:
        check_model(path)
    assert words in str(err.value), str(err.value)
    assert len(str(err.value)) < 800


# -- kept examples: what crashed stable-diffusion.cpp or hung before the checks ------------------------------
def test_good_tiny_files_pass(tmp_path):
    (tmp_path / "m.gguf").write_bytes(GOOD_GGUF)
    assert check_model(tmp_path / "m.gguf").tensors == 2
    (tmp_path / "m.safetensors").write_bytes(GOOD_SAFETENSORS)
    assert check_model(tmp_path / "m.safetensors").tensors == 1
    ckpt_bytes(tmp_path / "m.ckpt")
    assert check_model(tmp_path / "m.ckpt").kind == "ckpt"


def test_non_regular_model_paths_are_never_opened(tmp_path):
    os.mkfifo(tmp_path / "model.safetensors")  # opening it would block until a writer comes: a hang
    _refused(tmp_path / "model.safetensors", "not a regular file")
    _refused(Path("/dev/zero"), "not a regular file")
    _refused(tmp_path / "model.safetensors" / "x", "does not exist")
    _refused(Path(str(tmp_path) + "/a\0b"), "NUL")


def test_gguf_names_as_long_as_the_runtime_takes_are_accepted(tmp_path):
    """The runtime's tensor names hold 127 bytes: stable-diffusion.cpp's CMakeLists.txt compiles itself
    and ggml with GGML_MAX_NAME=128 (ggml.h's default is 64). SD 1.x/XL checkpoints converted to GGUF
    keep their names, and many are longer than 63 bytes."""
    sdxl = b"model.diffusion_model.output_blocks.2.1.transformer_blocks.9.attn1.to_out.0.weight"
    (tmp_path / "m.gguf").write_bytes(gguf_bytes([(sdxl, [4], 0, 0), (b"x" * 127, [4], 0, 32)]))
    assert check_model(tmp_path / "m.gguf").tensors == 2


@pytest.mark.parametrize("data, words", [
    (gguf_bytes([], n_tensors=2 ** 62), "claims 4611686018427387904 tensors"),  # SIGSEGV in the worker
    (gguf_bytes([], n_kv=2 ** 40), "metadata entries"),
    (gguf_bytes([(b"w", [-4, 2], 0, 0)]), "negative dimension"),  # negative shapes crashed the worker
    (gguf_bytes([(b"w", [2 ** 62, 2 ** 62], 0, 0)]), "more elements"),
    (gguf_bytes([(b"w", [4], 0, 1 << 40)]), "outside"),
    (gguf_bytes([(b"x" * 128, [4], 0, 0)]), "tensor name is 128 bytes long, more than the 127 allowed"),
    (gguf_bytes([(b"w", [4, 1, 1, 1, 1], 0, 0)]), "5 dimensions"),
    (gguf_bytes([(b"w", [4], 4, 0)]), "unknown type 4"),
    (gguf_bytes([(b"w", [33], 8, 0)]), "not a multiple"),
    (gguf_bytes([(b"w", [4], 0, 4)]), "not aligned"),
    (gguf_bytes([], version=1), "version 1"),
    (gguf_bytes([], kv=[(b"k", 9, struct.pack("<IQ", 9, 2))]), "arrays of arrays"),
    (gguf_bytes([], kv=[(b"k", 9, struct.pack("<IQ", 0, 2 ** 62))]), "past the end"),
    (gguf_bytes([], kv=[(b"k", 8, struct.pack("<Q", 2 ** 63))]), "more than"),
    (gguf_bytes([], kv=[(b"general.alignment", 4, struct.pack("<I", 3))]), "power of two"),
    (gguf_bytes([], kv=[(b"k" * 5000, 4, b"\0" * 4)]), "metadata key is 5000 bytes"),
    (b"GGUF\x03\x00\x00\x00\x01", "past the end"),
])
def test_corrupt_gguf_is_refused(tmp_path, data, words):
    (tmp_path / "m.gguf").write_bytes(data)
    _refused(tmp_path / "m.gguf", words)


@pytest.mark.parametrize("data, words", [
    (safetensors_bytes({"w": {"dtype": "F16", "shape": [-2, 2], "data_offsets": [0, 8]}}, b"\0" * 8), "invalid shape"),
    (safetensors_bytes({"w": {"dtype": 7, "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4), "dtype"),  # nlohmann throws
    (safetensors_bytes({"w": {"shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4), "dtype"),
    (safetensors_bytes({"w": {"dtype": "F16", "shape": "2", "data_offsets": [0, 4]}}, b"\0" * 4), "invalid shape"),
    (safetensors_bytes({"w": {"dtype": "F16", "shape": [2.5], "data_offsets": [0, 4]}}, b"\0" * 4), "invalid shape"),
    (safetensors_bytes({"w": {"dtype": "F16", "shape": [1, 1, 1, 1, 1, 1], "data_offsets": [0, 2]}}, b"\0" * 2), "invalid shape"),
    (safetensors_bytes({"w": {"dtype": "F16", "shape": [3], "data_offsets": [0, 4]}}, b"\0" * 4), "B of data"),
    (safetensors_bytes({"w": {"dtype": "F16", "shape": [2 ** 62, 2 ** 62], "data_offsets": [0, 4]}}, b"\0" * 4), "B of data"),
    (safetensors_bytes({"w": {"dtype": "F16", "shape": [2], "data_offsets": [-4, 0]}}, b"\0" * 4), "outside"),
    (safetensors_bytes({"w": "x"}, b""), "not an object"),
    (safetensors_bytes({}, b"", length=2 ** 63), "header length"),
    (struct.pack("<Q", 20) + b"[" * 20, "not JSON"),
    (struct.pack("<Q", 20_000) + b"{\"a\":" * 4000, "not JSON"),  # nlohmann recurses per level
])
def test_corrupt_safetensors_is_refused(tmp_path, data, words):
    (tmp_path / "m.safetensors").write_bytes(data)
    _refused(tmp_path / "m.safetensors", words)


def test_corrupt_checkpoints_are_refused(tmp_path):
    good = ckpt_bytes(tmp_path / "good.ckpt")
    cases = {
        "garbage.ckpt": (b"PK\x03\x04" + os.urandom(200), "no zip directory"),  # crashed the worker's zip reader
        "cut.ckpt": (good[:-30], "zip"),
        "huge-dir.ckpt": (good[:-22] + b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, 5, 5, 2 ** 31, 0, 0), "outside"),
        "many.ckpt": (good[:-22] + b"PK\x05\x06" + struct.pack("<HHHHIIH", 0, 0, 0xFFFF, 0xFFFF, 10, 0, 0), "zip64"),
        "bad-pickle.ckpt": (ckpt_bytes(tmp_path / "x.ckpt", pkl=b"\x80\x02}q\x00(X\xff\xff\xff\x7f"), "not a valid pickle"),
        "nopkl.ckpt": (_zip_without_pickle(tmp_path / "y.zip"), "no data.pkl"),
        "legacy.ckpt": (b"\x80\x02" + os.urandom(64), "pickle"),
    }
    for name, (data, words) in cases.items():
        (tmp_path / name).write_bytes(data)
        _refused(tmp_path / name, words)


def _zip_without_pickle(path: Path) -> bytes:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("readme.txt", "hello")
    return path.read_bytes()


# -- the fuzz target: mutated tiny files -------------------------------------------------------------------
SEEDS = {"m.gguf": GOOD_GGUF, "m.safetensors": GOOD_SAFETENSORS}


@st.composite
def mutated_model(draw) -> Tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(SEEDS) + ["m.ckpt"]))
    data = bytearray(SEEDS.get(name) or _CKPT_SEED)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "u64", "cut", "insert", "u32"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif op in ("u64", "u32"):
            size = 8 if op == "u64" else 4
            value = draw(st.sampled_from([0, 1, 2 ** 31, 2 ** 32 - 1, 2 ** 62, 2 ** 63, 2 ** 64 - 1, 255, 65535]))
            data[at:at + size] = value.to_bytes(8, "little")[:size]
        elif op == "cut":
            del data[at:at + draw(st.integers(1, 64))]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=32))
    return name, bytes(data)


_CKPT_SEED = b""


@pytest.fixture(scope="module", autouse=True)
def _ckpt_seed(tmp_path_factory):
    global _CKPT_SEED
    _CKPT_SEED = ckpt_bytes(tmp_path_factory.mktemp("seed") / "m.ckpt")


@fuzz(int(os.environ.get("FUZZ_MODEL_EXAMPLES", "300")))
@given(mutated_model())
def test_fuzz_model_headers(tmp_path_factory, example):
    STATS["model headers"]()
    name, data = example
    path = tmp_path_factory.getbasetemp() / "fuzz-model"
    path.mkdir(exist_ok=True)
    target = path / name
    target.write_bytes(data)
    with bounded("check_model"):
        try:
            check_model(target)
        except ModelLoadError as exc:
            STATS["model refused"]()
            assert len(str(exc)) < 1000


# -- the fuzz target: HTTP requests over real sockets ------------------------------------------------------
TOKEN = "fuzz-token"
PATHS = ["/ping", "/status", "/status?wait=0.01&since=0", "/status?wait=nan&since=-1", "/result?job=abc",
         "/result?job=abc&wait=0.01", "/generate", "/cancel", "/shutdown", "/nope", "/%00", "*", "", "/" + "a" * 300]
METHODS = ["GET", "POST", "PUT", "HEAD", "OPTIONS", "G\x00T", "\u00e9", ""]


@st.composite
def http_request(draw, token: str, paths=PATHS) -> bytes:
    if draw(st.integers(0, 9)) == 0:  # now and then: pure noise
        return draw(st.binary(max_size=300))
    method = draw(st.sampled_from(METHODS))
    path = draw(st.sampled_from(paths) | st.text(max_size=40).map(lambda t: "/" + t))
    version = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/9", "", "HTTP/1.1 extra"]))
    lines = [f"{method} {path} {version}".rstrip()]
    auth = draw(st.sampled_from(["good", "good", "bad", "none", "long"]))
    if auth == "good":
        lines.append(f"Authorization: Bearer {token}")
    elif auth == "bad":
        lines.append("Authorization: Bearer " + draw(st.text(max_size=50)))
    elif auth == "long":
        lines.append("Authorization: " + "B" * draw(st.integers(1000, 20000)))
    body = draw(st.sampled_from([b"", b"{}", b"[]", b"{", b"null"]) | st.binary(max_size=200) | st.builds(
        lambda d: json.dumps(d).encode(), st.dictionaries(
            st.sampled_from(["prompt", "width", "height", "steps", "seed", "cfg_scale", "sampler", "batch_count",
                             "clip_skip", "negative_prompt", "extra"]),
            st.one_of(st.integers(-(2 ** 70), 2 ** 70), st.text(max_size=30), st.floats(), st.none(), st.lists(st.integers(), max_size=3)),
            max_size=6)))
    length = draw(st.sampled_from(["exact", "none", "-1", "huge", "text", "short", "long", "two"]))
    if length == "exact":
        lines.append(f"Content-Length: {len(body)}")
    elif length == "-1":
        lines.append("Content-Length: -1")
    elif length == "huge":
        lines.append("Content-Length: 99999999999999999999")
    elif length == "text":
        lines.append("Content-Length: " + draw(st.text(max_size=10)))
    elif length == "short":
        lines.append(f"Content-Length: {max(0, len(body) - 3)}")
    elif length == "long":
        lines.append(f"Content-Length: {len(body) + 50}")
    elif length == "two":
        lines += ["Content-Length: 1", "Content-Length: 2"]
    for _ in range(draw(st.integers(0, 3))):
        lines.append(draw(st.text(max_size=30)) + ": " + draw(st.text(max_size=30)))
    if draw(st.booleans()):
        lines.append("Transfer-Encoding: chunked")
    head = "\r\n".join(lines) + draw(st.sampled_from(["\r\n\r\n", "\n\n", "\r\n", ""]))
    return head.encode("utf-8", "surrogatepass") + body


def send(port: int, data: bytes) -> bytes:
    """One request on a fresh connection; the write side is shut so the server never waits for more."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        out = b""
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the server answered and closed before reading everything: allowed
            pass
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                out += chunk
        except ConnectionResetError:
            pass
        return out


def _check_answer(out: bytes) -> None:
    if not out:
        STATS["http closed without answer"]()
        return
    assert out.startswith((b"HTTP/1.", b"<!DOCTYPE HTML>")), out[:100]


@pytest.fixture(scope="module")
def http_server():
    saved = worker_server.exit_soon
    worker_server.exit_soon = lambda code: None  # /shutdown and /cancel must not end pytest
    state = WorkerState(WorkerBackend(io.StringIO()), TOKEN)
    state.phase = "ready"
    state.backend.sd = object()  # "loaded": /generate starts a job, which the bare backend fails
    srv = make_server(state, listen())
    srv.RequestHandlerClass.timeout = 2.0
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()
    worker_server.exit_soon = saved


@fuzz(int(os.environ.get("FUZZ_HTTP_EXAMPLES", "150")))
@given(data=st.data())
def test_fuzz_worker_http_in_process(http_server, data):
    STATS["http in-process"]()
    request = data.draw(http_request(TOKEN))
    with bounded("an HTTP request", time_s=10.0):
        _check_answer(send(http_server.server_address[1], request))
    assert http_server.errors == 0
    with http_server.guard:
        assert http_server.open_connections <= 96


def test_in_process_server_still_serves_after_fuzzing(http_server):
    assert WorkerClient(http_server.server_address[1], TOKEN).ping(timeout=5)
    assert http_server.errors == 0


@pytest.fixture(scope="module")
def real_worker(ggml_cpu_runtime):
    from accelstack.engine.runtime import Runtime

    with Supervisor(Runtime(Path(ggml_cpu_runtime))) as sup:
        yield sup


@fuzz(40)
@given(data=st.data())
def test_fuzz_real_worker_http(real_worker, data):
    """The real worker process (runtime imported, no model); /shutdown is left out (it is obeyed)."""
    STATS["http real worker"]()
    request = data.draw(http_request(real_worker.client.token, [p for p in PATHS if p != "/shutdown"]))
    with bounded("an HTTP request", time_s=10.0):
        _check_answer(send(real_worker.client.port, request))
    assert real_worker.alive()


def test_real_worker_still_serves_after_fuzzing(real_worker):
    assert real_worker.ping(timeout=5) and real_worker.status().phase == "ready"
    assert "Traceback" not in "\n".join(real_worker.log_tail(200))


def teardown_module(module):
    print("\nengine fuzz:", {k: v.count for k, v in STATS.items()})
