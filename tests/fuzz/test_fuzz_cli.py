"""Fuzzing `accelstack generate`'s parameters (issue 10): its real argument parser, then every
check the command runs before any work (:func:`accelstack.commands.generate.prepare`: the request,
the engine options, the output paths, the model file). Random values for every option (huge and
negative numbers, NaN, thousands of digits, odd Unicode, paths to folders, FIFOs and files that
are not models). Only a usage exit (argparse, code 2) or an ``AccelstackError`` may come out, within
a time and a memory bound, with a short message; nothing is written. Examples that found bugs are
kept in tests/engine/test_engine_hostile.py."""
from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelstack.cli import ParseError, build_parser
from accelstack.commands import generate as generate_cmd
from accelstack.errors import AccelstackError

from .fuzzing import Counter, bounded, fuzz

STATS = {"cli": Counter(), "cli usage exit": Counter(), "cli refused": Counter(), "cli accepted": Counter()}

NUMBERS = st.one_of(st.integers(-(2 ** 70), 2 ** 70).map(str), st.sampled_from(
    ["0", "-1", "nan", "inf", "-inf", "1e999", "512", "4096", "4104", "64", "8", "9" * 5000, "0x10", "1_000", " 7 ", "", "auto"]),
    st.text(max_size=12))
TEXT = st.one_of(st.text(max_size=60), st.sampled_from(["(cat:.)", "(cat:1" + "0" * 50 + ")", "<lora:/dev/zero:1>",
                                                        "x" * 3000, "a\ud800b", "BREAK", "\\(", "(((("]))
OPTIONS = {
    "--width": NUMBERS, "--height": NUMBERS, "--steps": NUMBERS, "--cfg-scale": NUMBERS, "--seed": NUMBERS,
    "--batch-count": NUMBERS, "--threads": NUMBERS, "--vae-tile-size": NUMBERS, "--sampler": TEXT,
    "--scheduler": TEXT, "--weight-type": TEXT, "--negative-prompt": TEXT, "--prompt": TEXT, "--backend": TEXT,
}
FLAGS = ["--vae-tiling", "--no-vae-tiling", "--flash-attention", "--no-flash-attention", "--no-memory-check", "--json"]


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-fuzz")
    (root / "folder.png").mkdir()
    (root / "file").write_text("x")
    os.mkfifo(root / "fifo")
    (root / "junk.safetensors").write_bytes(b"\xff" * 64)
    (root / "m.gguf").write_bytes(b"GGUF" + (3).to_bytes(4, "little") + bytes(16))  # a valid, empty GGUF
    return root


def _paths(root: Path):
    return st.sampled_from([root / "out.png", root / "folder.png", root / "file" / "x.png", root / "fifo",
                            root / "new" / "x-%d.png", root / ("n" * 300 + ".png"), root / "x.jpg"]).map(str) | st.text(max_size=20)


@fuzz(int(os.environ.get("FUZZ_CLI_EXAMPLES", "300")))
@given(data=st.data())
def test_fuzz_generate_arguments(places, data):
    STATS["cli"]()
    argv = ["generate", "--runtime", str(places)]
    argv += ["-m", data.draw(st.sampled_from([places / "m.gguf", places / "junk.safetensors", places / "fifo",
                                              places / "folder.png", places / "missing.ckpt"]).map(str))]
    if data.draw(st.integers(0, 9)):  # mostly: a prompt (required)
        argv += ["-p", data.draw(TEXT)]
    for name in data.draw(st.lists(st.sampled_from(sorted(OPTIONS)), max_size=6, unique=True)):
        argv += [name, data.draw(OPTIONS[name])]
    argv += data.draw(st.lists(st.sampled_from(FLAGS), max_size=2))
    if data.draw(st.booleans()):
        argv += ["-o", data.draw(_paths(places))]
    before = sorted(p.name for p in places.iterdir())
    stderr = io.StringIO()
    with bounded("parsing and checking generate's arguments"), contextlib.redirect_stderr(stderr):
        try:
            args = build_parser("generate").parse_args(argv)
            generate_cmd.prepare(args)
            STATS["cli accepted"]()
        except ParseError:  # argparse's usage error (main() exits 2 with it)
            STATS["cli usage exit"]()
        except AccelstackError as exc:
            STATS["cli refused"]()
            assert len(str(exc)) < 1500, str(exc)[:300]
    assert sorted(p.name for p in places.iterdir()) == before  # nothing created by the checks


def teardown_module(module):
    print("\ncli fuzz:", {k: v.count for k, v in STATS.items()})
