"""Issue 25, beyond verify and generate: every output path a command writes (a bundle, a capture
folder, a key pair, a signature, a manifest, the channels file) and every input folder it names
(`manifest build DIR`, `serve --models-dir`) is checked before any work: a usage error (exit 2)
naming the path, with a hint and one final JSON error line, never a traceback. An OSError at the
final write is a typed error too."""
from __future__ import annotations

import errno
import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from accelstack.core.bundles import BundleError, write_bundle
from accelstack.errors import AccelstackError, UsageError
from accelstack.hardware.system import CapturingSystem, LiveSystem
from accelstack.manifests.keys import generate_keypair

from cli_helpers import error_of, run_cli

NO_PROC = not Path("/proc/self").is_dir()
needs_proc = pytest.mark.skipif(NO_PROC, reason="needs /proc (a folder no one can write in, root included)")


def _env(tmp_path: Path, **more: str) -> Dict[str, str]:
    state = tmp_path / "state"
    return {"ACCELSTACK_HOME": str(state / "home"), "ACCELSTACK_CACHE": str(state / "cache"),
            "ACCELSTACK_PROBE_CACHE": str(state / "probe"), "ACCELSTACK_BUILD_CACHE": str(state / "builds"),
            "ACCELSTACK_CONFIG": str(state / "config.yaml"), "ACCELSTACK_CONFIG_DIR": str(state / "config"),
            "ACCELSTACK_OFFLINE": "1", "ACCELSTACK_DEBUG": "", **more}


def _refused(argv: List[str], env: Dict[str, str], words: List[str], code: str = "output-path") -> Dict:
    """``argv`` with --json: exit 2, one final error line with ``code``, every one of ``words`` in
    its message, a hint; then without --json: exit 2, the message and what to do, no traceback."""
    rc, out, err = run_cli([*argv, "--json"], env, timeout=120)
    assert rc == 2, (argv, rc, out[-1500:], err[-1500:])
    e = error_of(out)
    assert e["code"] == code and all(w in e["message"] for w in words), e
    assert e["hint"], e
    assert "Traceback" not in err, err
    rc, out, err = run_cli(argv, env, timeout=120)
    assert rc == 2 and "what to do:" in err and "Traceback" not in err, (rc, err[-1500:])
    assert all(w in err for w in words), err
    return e


def _bad(tmp_path: Path, name: str) -> List[Tuple[Path, str]]:
    """(an output path that cannot be written, the words that say why)."""
    (tmp_path / "plain").write_text("x")
    cases = [(tmp_path / "plain" / name, "a part of the path is a file")]
    if not NO_PROC:
        cases += [(Path("/proc/nope") / name, "/proc/nope does not exist and cannot be made in /proc"),
                  (Path("/proc") / name, "the folder /proc cannot be written to")]
    return cases


# -- 1. bundle create -o --------------------------------------------------------------------------

def test_bundle_create_refuses_an_output_it_cannot_write_before_any_work(tmp_path):
    env = _env(tmp_path)
    for path, words in _bad(tmp_path, "b.tar"):
        # no channel is configured: the output is said first, before the channel is looked for
        _refused(["bundle", "create", "-o", str(path), "--backend", "cpu"], env, [str(path), words])
    assert not (tmp_path / "state" / "cache").exists()  # nothing was downloaded, no cache was made


@needs_proc
def test_an_oserror_writing_the_bundle_is_a_typed_error(tmp_path):
    with pytest.raises(UsageError) as err:  # the folder went away during the work
        write_bundle(Path("/proc/nope/b.tar"), [("accelstack-bundle.json", b"{}")], [])
    assert err.value.exit_code == 2 and err.value.code == "output-path" and "/proc/nope/b.tar" in err.value.message
    assert err.value.hint
    with pytest.raises(BundleError) as lost:  # an artifact that went missing is not blamed on the output
        write_bundle(tmp_path / "b.tar", [], [("artifacts/x", tmp_path / "gone")])
    assert lost.value.exit_code == 1 and str(tmp_path / "gone") in lost.value.message
    assert sorted(os.listdir(tmp_path)) == []  # no bundle, no temporary left
    size, digest = write_bundle(tmp_path / "ok" / "b.tar", [("accelstack-bundle.json", b"{}")], [])
    assert size == (tmp_path / "ok" / "b.tar").stat().st_size and len(digest) == 64


# -- 2. detect --capture --------------------------------------------------------------------------

def test_detect_capture_refuses_a_folder_it_cannot_write_before_detection(tmp_path):
    env = _env(tmp_path)
    for path, words in _bad(tmp_path, "cap"):
        if path.parent == Path("/proc"):
            words = "the folder /proc cannot be written to"
        elif "/proc/nope" in str(path):
            words = "cannot be made in /proc"
        _refused(["detect", "--capture", str(path)], env, [str(path), words])
    e = _refused(["detect", "--capture", str(tmp_path / "plain")], env, ["not an empty directory"], code="usage")
    assert str(tmp_path / "plain") in e["message"]


@needs_proc
def test_saving_a_capture_where_it_cannot_go_is_a_typed_error(tmp_path):
    capturing = CapturingSystem(LiveSystem())
    capturing.read_text("/proc/self/status")
    (tmp_path / "plain").write_text("x")
    for where in ("/proc/nope/cap", str(tmp_path / "plain" / "cap")):
        with pytest.raises(AccelstackError) as err:
            capturing.save(where)
        assert err.value.exit_code == 2 and err.value.code == "output-path" and where in err.value.message, err.value
        assert err.value.hint
    assert (capturing.save(str(tmp_path / "cap")) / "capture.json").is_file()


# -- 3. manifest keygen --out, manifest sign --out ------------------------------------------------

def test_keygen_refuses_an_output_it_cannot_write_before_making_a_key(tmp_path):
    env = _env(tmp_path)
    for prefix, words in _bad(tmp_path, "k"):
        _refused(["manifest", "keygen", "--out", str(prefix)], env, [f"{prefix}.key", words])
    (tmp_path / "d.key").mkdir()
    (tmp_path / "l.key").symlink_to(tmp_path / "elsewhere.key")
    _refused(["manifest", "keygen", "--out", str(tmp_path / "d"), "--force"], env, ["d.key", "existing folder"])
    _refused(["manifest", "keygen", "--out", str(tmp_path / "l"), "--force"], env, ["l.key", "symbolic link"])
    assert not list(tmp_path.glob("*.pub")) and not (tmp_path / "elsewhere.key").exists()  # no key was written


def _manifest(path: Path) -> Path:
    expires = (datetime.now(timezone.utc) + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc = {"format": "accelstack-manifest", "format_version": 1, "source": "official", "version": 7, "expires": expires,
           "kind": "ggml", "package": "stable-diffusion.cpp",
           "targets": [{"id": "cpu", "os": "linux", "arch": "x86_64", "backend": "cpu",
                        "artifacts": [{"name": "cpu.whl", "sha256": "ab" * 32, "size": 10,
                                       "url": "https://example.org/cpu.whl"}]}]}
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def test_sign_refuses_a_signature_path_it_cannot_write(tmp_path):
    env = _env(tmp_path)
    key = tmp_path / "k.key"
    key.write_bytes(generate_keypair()[0])
    m = _manifest(tmp_path / "m.json")
    cases = _bad(tmp_path, "m.json.sig") + [(tmp_path / "new" / "m.json.sig", f"the folder {tmp_path / 'new'} does not exist")]
    for out, words in cases:
        if out.parent == Path("/proc/nope"):
            words = "the folder /proc/nope does not exist"  # sign makes no folders
        _refused(["manifest", "sign", str(m), "--key", str(key), "--out", str(out)], env, [str(out), words])
    assert not (tmp_path / "new").exists()


# -- 4. channel add with a configuration folder that cannot be written --------------------------

@needs_proc
@pytest.mark.parametrize("config_dir", ["/proc/nope", "/proc"])
def test_channel_add_says_the_configuration_folder_cannot_be_written(tmp_path, config_dir):
    pub = tmp_path / "k.pub"
    pub.write_text(generate_keypair()[1] + "\n")
    env = _env(tmp_path, ACCELSTACK_CONFIG_DIR=config_dir)
    e = _refused(["channel", "add", "stable", "https://127.0.0.1:9/m.json", "--key", str(pub), "--no-check"], env,
                 [f"{config_dir}/channels.json", f"configuration folder {config_dir} cannot be made or written"])
    assert config_dir in e["hint"] and "ACCELSTACK_CONFIG_DIR" in e["hint"]


def test_a_full_disk_writing_the_channels_file_is_a_failure_not_a_usage_error(tmp_path):
    from accelstack.manifests.channels import _write_error
    from accelstack.settings import Settings

    s = Settings.resolve(home=tmp_path / "h", cache=tmp_path / "c", config_dir=tmp_path / "cfg")
    err = _write_error(s, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert err.exit_code == 1 and err.code == "disk-full" and str(tmp_path / "cfg") in err.hint


# -- 5. manifest build DIR: a missing input folder -------------------------------------------------

def test_manifest_build_refuses_a_missing_or_unwritable_folder(tmp_path):
    env = _env(tmp_path)
    (tmp_path / "plain").write_text("x")
    base = ["--base-url", "https://example.org/rt", "--version", "1"]
    _refused(["manifest", "build", str(tmp_path / "nope"), *base], env, [str(tmp_path / "nope"), "does not exist"], "usage")
    _refused(["manifest", "build", str(tmp_path / "plain"), *base], env, [str(tmp_path / "plain"), "is not a folder"],
             "usage")


# -- 6. serve --models-dir -------------------------------------------------------------------------

def test_serve_refuses_a_models_dir_that_is_not_there_before_it_starts(tmp_path):
    env = _env(tmp_path)
    (tmp_path / "plain").write_text("x")
    for path, words in ((tmp_path / "nope", "does not exist"), (tmp_path / "plain", "is not a folder")):
        _refused(["serve", "--models-dir", str(path), "--port", "0"], env, ["--models-dir", str(path), words], "usage")
    assert not (tmp_path / "state" / "home").exists()  # no service started: no token file, no home
