"""Pieces that need no runtime: PNG writing/reading, the liveness judge, killing a process tree,
pixel statistics, and the torch device order (with stand-in torch objects: no GPU here)."""
from __future__ import annotations

import io
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from accelstack.engine.png import decode_png, encode_png, parameters_text, read_png, write_png
from accelstack.engine.supervision.policy import LivenessJudge
from accelstack.engine.supervision.process import kill_tree
from accelstack.engine.verification.probe_verify import image_diff, pixel_stats
from accelstack.engine.verification.torch_check import pick_device


# -- PNG --------------------------------------------------------------------------------------------
def _gradient(w, h):
    return bytes((x * 7 + y * 3 + c * 50) % 256 for y in range(h) for x in range(w) for c in range(3))


def test_png_round_trip_with_parameters(tmp_path):
    rgb = _gradient(37, 21)
    text = parameters_text("a cat", "blurry", {"Steps": 20, "Sampler": "euler_a", "Seed": 7, "Size": "37x21"})
    path = write_png(tmp_path / "sub" / "a.png", 37, 21, rgb, {"parameters": text})
    img = read_png(path)
    assert (img.width, img.height, img.channels, img.pixels) == (37, 21, 3, rgb)
    assert img.text["parameters"] == "a cat\nNegative prompt: blurry\nSteps: 20, Sampler: euler_a, Seed: 7, Size: 37x21"
    assert not list(tmp_path.rglob("*.part"))


def test_png_is_read_by_pillow_and_reads_pillows_filters(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    rgb = _gradient(40, 30)
    data = encode_png(40, 30, rgb, {"parameters": "p"})
    im = Image.open(io.BytesIO(data))
    assert im.size == (40, 30) and im.tobytes() == rgb and im.info["parameters"] == "p"
    # Pillow chooses adaptive row filters (Sub/Up/Average/Paeth): the reader must undo them all.
    for mode in ("RGB", "RGBA", "L"):
        buf = io.BytesIO()
        Image.frombytes("RGB", (40, 30), rgb).convert(mode).save(buf, format="PNG", optimize=True)
        got = decode_png(buf.getvalue())
        assert got.pixels == Image.open(io.BytesIO(buf.getvalue())).tobytes()
    assert decode_png(encode_png(2, 1, b"\x01\x02\x03\x04\x05\x06")).rgb() == b"\x01\x02\x03\x04\x05\x06"


def test_png_parameters_keep_text_beyond_latin_1(tmp_path):
    """tEXt is Latin-1: a prompt in Chinese or with emoji came back as '?' (a user's own prompt,
    lost from the image that records it). Such text goes in an iTXt chunk, UTF-8, as Pillow writes
    it; Latin-1 text stays tEXt, which every reader knows."""
    Image = pytest.importorskip("PIL.Image")
    rgb = _gradient(8, 8)
    for text, kind in (("猫 café 🐈 <lora:x:1>\nNegative prompt: ぼやけた", b"iTXt"), ("a café", b"tEXt")):
        data = encode_png(8, 8, rgb, {"parameters": text})
        assert kind in data
        assert decode_png(data).text["parameters"] == text
        assert Image.open(io.BytesIO(data)).info["parameters"] == text


def test_png_rejects_wrong_sizes():
    with pytest.raises(ValueError, match="expected 12 bytes"):
        encode_png(2, 2, b"\0" * 11)


# -- liveness -----------------------------------------------------------------------------------------
def test_judge_progress_from_ticks_or_cpu():
    j = LivenessJudge(stall_timeout=10, cpu_progress=0.05)
    j.reset(0.0, cpu=1.0, ticks=5)
    assert j.observe(5.0, cpu=1.0, ticks=5) == "working"
    assert j.observe(9.0, cpu=1.0, ticks=6) == "working" and j.evidence == "progress callback"
    # no answer from the worker (ticks None) but CPU time grows: busy, not hung
    assert j.observe(18.0, cpu=1.5, ticks=None) == "working" and j.evidence == "CPU time"
    assert j.observe(27.0, cpu=1.52, ticks=None) == "working"  # 9 s since the last progress
    assert j.observe(28.5, cpu=1.53, ticks=None) == "stalled"  # tiny CPU growth does not count


def test_judge_ping_alone_is_no_verdict():
    j = LivenessJudge(stall_timeout=3)
    j.reset(0.0)
    for t in range(1, 20):  # a worker that answers nothing, but keeps computing
        assert j.observe(float(t), cpu=float(t), ticks=None) == "working"
    j2 = LivenessJudge(stall_timeout=3)
    j2.reset(0.0, cpu=0.0, ticks=1)
    # a worker that answers every status (heartbeat alive) but makes no progress at all
    assert j2.observe(2.0, cpu=0.0, ticks=1) == "working"
    assert j2.observe(4.0, cpu=0.0, ticks=1) == "stalled"


def test_kill_tree_kills_grandchildren():
    code = ("import subprocess, sys, time\n"
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print(c.pid, flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child_pid = int(parent.stdout.readline())
    kill_tree(parent.pid)
    parent.wait(5)
    deadline = time.monotonic() + 5
    while psutil.pid_exists(child_pid) and psutil.Process(child_pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "grandchild survived"
        time.sleep(0.05)
    kill_tree(parent.pid)  # already gone: no error


# -- pixels --------------------------------------------------------------------------------------------
def test_pixel_stats_and_diff():
    flat = bytes([0, 0, 0] * 10)
    assert pixel_stats(flat).distinct == 1 and pixel_stats(flat).saturated == 1.0
    varied = _gradient(8, 8)
    assert pixel_stats(varied).distinct > 10 and pixel_stats(varied).saturated < 0.5
    assert image_diff(b"\x00\x10", b"\x02\x10") == (1.0, 2)


# -- torch device order ------------------------------------------------------------------------------
class FakeTensor:
    def __init__(self, device, fail=None):
        self.device, self.fail = device, fail

    def __matmul__(self, other):
        if self.fail:
            raise RuntimeError(self.fail)
        return self

    def sum(self):
        return self

    def cpu(self):
        return self

    def __float__(self):
        return 512.0


def fake_torch(cuda=False, cuda_error=None, xpu=False, mps=False):
    def ones(*shape, device=None):
        return FakeTensor(device, cuda_error if getattr(device, "type", "") == "cuda" else None)

    def device(kind, index=None):
        return SimpleNamespace(type=kind, index=index)

    return SimpleNamespace(
        cuda=SimpleNamespace(is_available=lambda: cuda, get_device_name=lambda i: "NVIDIA GeForce RTX 3060"),
        xpu=SimpleNamespace(is_available=lambda: xpu, get_device_name=lambda i: "Intel Arc A770"),
        backends=SimpleNamespace(mps=SimpleNamespace(is_available=lambda: mps)),
        version=SimpleNamespace(hip=None, cuda="12.8"),
        device=device, ones=ones)


@pytest.fixture
def fake_directml(monkeypatch):
    mod = SimpleNamespace(device=lambda: SimpleNamespace(type="privateuseone"), device_name=lambda i: "DirectML GPU")
    monkeypatch.setitem(sys.modules, "torch_directml", mod)


def test_cuda_beats_an_installed_directml(fake_directml):
    kind, _, name, rejected = pick_device(fake_torch(cuda=True))
    assert (kind, name, rejected) == ("cuda", "NVIDIA GeForce RTX 3060", {})


def test_broken_cuda_falls_through_with_its_reason(fake_directml):
    kind, _, _, rejected = pick_device(fake_torch(cuda=True, cuda_error="CUDA error: no kernel image is available"))
    assert kind == "directml" and "no kernel image" in rejected["cuda"]


def test_order_xpu_mps_cpu():
    assert pick_device(fake_torch(xpu=True, mps=True))[0] == "xpu"
    assert pick_device(fake_torch(mps=True))[0] == "mps"
    assert pick_device(fake_torch())[0] == "cpu"
