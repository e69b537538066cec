"""`accelstack cache list | purge`, through the real command: what is listed, what is removed, and
everything that must stay (links and what they point to, files accelstack did not write, the runtime
home, entries in use, lock files, everything on a dry run)."""
from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Dict

from filelock import FileLock

from accelstack.engine.png import encode_png
from accelstack.engine.probes.weights import POOLS_MAGIC

from cli_helpers import REPO, error_of, result_of, run_cli

BLOB = "ab" * 32
SLOT = "0123456789abcdef0123"


def _env(tmp_path: Path) -> Dict[str, str]:
    return {"ACCELSTACK_CACHE": str(tmp_path / "cache"), "ACCELSTACK_HOME": str(tmp_path / "home"),
            "ACCELSTACK_BUILD_CACHE": str(tmp_path / "cache" / "builds"),
            "ACCELSTACK_PROBE_CACHE": str(tmp_path / "cache" / "probe")}


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _record(size: int) -> bytes:
    """A build slot's record of ``size`` bytes: what makes a 20-hex-digit folder accelstack's (issue 29)."""
    head = json.dumps({"key": SLOT, "variant": "cpu", "sha256": "", "pad": ""}).encode()
    return head[:-2] + b"x" * (size - len(head)) + b'"}'


def _pools(size: int) -> bytes:
    """A pools file as accelstack writes it: its header (engine.probes.weights.POOLS_MAGIC) is its mark."""
    return (POOLS_MAGIC + b"x" * size)[:size]


def _probe_marker() -> bytes:
    """probe.json as probe_model writes it: its ``method`` names accelstack's synthesis (the mark)."""
    return json.dumps({"seed": 1234, "format_version": 1,
                       "method": "windows of a hashed Irwin-Hall pool, see accelstack.engine.probes.model"}).encode()


def _stamp(name: str) -> bytes:
    return json.dumps({"sha256": name, "size": 1, "mtime_ns": 1, "inode": 1, "device": 1}).encode()


def _image_record(size: int) -> bytes:
    doc = {"format": 1, "key": "k", "sha256": "0" * 64, "when": 1.0,
           "what": "the probe image of a passing accelstack verify (see accelstack.engine.probes.record)"}
    raw = json.dumps(doc).encode()
    return raw[:-1] + b" " * (size - len(raw)) + b"}"


def _verify_png(size: int) -> bytes:
    """A probe image as verify writes it: its parameters begin with verify's prompt (the mark)."""
    raw = encode_png(1, 1, b"\0\0\0", {"parameters": "accelstack probe\nSteps: 1, Model: accelstack probe (seed 1)"})
    return raw + b"\0" * (size - len(raw))


def _vulkan_answer(size: int) -> bytes:
    raw = json.dumps({"format": "accelstack-detect-cache", "version": 1, "inputs": {}, "returncode": 0,
                      "stdout": "", "stderr": ""}, sort_keys=True).encode()
    return raw[:-1] + b" " * (size - len(raw)) + b"}"


def _populate(tmp_path: Path) -> Dict[str, Path]:
    """A cache as accelstack leaves it, plus things that are not accelstack's."""
    cache = tmp_path / "cache"
    blobs = cache / "blobs" / "sha256"
    outside = _write(tmp_path / "outside" / "precious.bin", b"p" * 1000)
    p: Dict[str, Path] = {
        "blob": _write(blobs / BLOB, b"b" * 5000),
        "part": _write(blobs / ("cd" * 32 + ".part"), b"c" * 300),
        "part_lock": _write(blobs / ("cd" * 32 + ".lock"), b""),  # taken before a .part is made: its mark
        "stamp": _write(blobs / (BLOB + ".verified"), _stamp(BLOB)),
        "blob_lock": _write(blobs / (BLOB + ".lock"), b""),
        "foreign_blob_dir_file": _write(blobs / "README.txt", b"mine"),
        "slot": _write(cache / "builds" / SLOT / "build.json", _record(700)).parent,
        "slot_lock": _write(cache / "builds" / (SLOT + ".lock"), b""),
        "sdist": _write(cache / "builds" / "sdist" / "stable_diffusion_cpp_python-0.4.7.tar.gz", b"s" * 2000),
        "sdist_note": _write(cache / "builds" / "sdist" / "notes.md", b"mine"),
        "headers": _write(cache / "builds" / "vulkan-headers" / "1.4" / "usr" / "include" / "v.h", b"h"),
        "probe": _write(cache / "probe" / "sd1-f1-s1234" / "unet" / "m.safetensors", b"u" * 4000).parents[1],
        "probe_marker": _write(cache / "probe" / "sd1-f1-s1234" / "probe.json", _probe_marker()),
        "stale_tmp": _write(cache / "probe" / ".tmp-sd1-f2-s1234-dead" / ".owner",
                            json.dumps({"pid": 2 ** 22 + 12345, "host": os.uname().nodename}).encode()).parent,
        "pools": _write(cache / "probe" / "pools-f3-s1234-F8_E5M2.bin", _pools(600)),
        "pools_tmp": _write(cache / "probe" / ".pools-f3-s1234-F8_E5M2.bin.4242.tmp", _pools(50)),
        "live_tmp": _write(cache / "probe" / ".tmp-sd1-f2-s1234-live" / ".owner",
                           json.dumps({"pid": os.getpid(), "host": os.uname().nodename}).encode()).parent,
        "verify_png": _write(cache / "verify" / "verify-cpu.png", _verify_png(190)),
        "record": _write(cache / "verify" / ("image-" + "7" * 32 + ".json"), _image_record(280)),
        "verify_note": _write(cache / "verify" / "my-notes.txt", b"mine"),
        "outside": outside,
    }
    (blobs / ("ef" * 32)).symlink_to(outside)  # named like a blob, but a link out of the cache
    (cache / "builds" / ("9" * 20)).symlink_to(outside.parent, target_is_directory=True)
    (cache / "probe" / "sd1-f2-s7").symlink_to(outside.parent, target_is_directory=True)
    (cache / "verify" / "verify-vulkan.png").symlink_to(outside)  # named like an image, but a link
    return p


def _tree(root: Path) -> Dict[str, int]:
    return {str(p.relative_to(root)): (p.lstat().st_size if not p.is_dir() or p.is_symlink() else -1)
            for p in sorted(root.rglob("*"))}


def test_list_on_a_fresh_machine_creates_nothing(tmp_path):
    rc, out, err = run_cli(["cache", "list", "--json"], env=_env(tmp_path))
    assert rc == 0, err
    res = result_of(out)
    assert [c["name"] for c in res["caches"]] == ["downloads", "builds", "probe", "verify", "detect", "service", "converted"]
    assert all(c["exists"] is False and c["size"] == 0 and c["count"] == 0 for c in res["caches"])
    assert not (tmp_path / "cache").exists() and not (tmp_path / "home").exists()


def test_list_counts_only_what_accelstack_wrote(tmp_path):
    _populate(tmp_path)
    rc, out, err = run_cli(["cache", "list", "--json"], env=_env(tmp_path))
    assert rc == 0, err
    caches = {c["name"]: c for c in result_of(out)["caches"]}
    assert caches["downloads"]["size"] == 5000 + 300 + len(_stamp(BLOB)) and caches["downloads"]["count"] == 3
    assert {e["kind"] for e in caches["downloads"]["entries"]} == {"blob", "partial download", "hash record"}
    assert "README.txt" in caches["downloads"]["other"] and "ef" * 32 in caches["downloads"]["other"]
    assert caches["builds"]["size"] == 700 + 2000
    assert set(caches["builds"]["other"]) >= {"vulkan-headers", "9" * 20, "sdist/notes.md"}
    assert caches["probe"]["count"] == 5 and "sd1-f2-s7" in caches["probe"]["other"]
    kinds = {e["name"]: e["kind"] for e in caches["probe"]["entries"]}
    assert kinds["sd1-f1-s1234"] == "probe model (older format, unused)"  # the 2.1 GB f16 probe of before
    assert kinds["pools-f3-s1234-F8_E5M2.bin"] == "probe pools"
    assert kinds[".pools-f3-s1234-F8_E5M2.bin.4242.tmp"] == "unfinished write"
    assert {e["name"]: e["kind"] for e in caches["verify"]["entries"]} == {
        "verify-cpu.png": "verify image", "image-" + "7" * 32 + ".json": "probe image record"}
    assert caches["verify"]["size"] == 190 + 280 and set(caches["verify"]["other"]) == {"my-notes.txt", "verify-vulkan.png"}
    rc, out, _ = run_cli(["cache", "list"], env=_env(tmp_path))
    assert rc == 0 and "downloads" in out and "left alone" in out and "total" in out


def test_the_family_probes_and_their_pools_are_accelstacks_by_format(tmp_path):
    # verify --family F keeps pools-<family>-f<format>-s<seed>-<dtype>.bin in the probe cache (tens of MB each)
    # and keep=True a <family>-f<format>-s<seed>/ folder: `cache` listed both as not accelstack's, so purge
    # left them and a format change (FAMILY_FORMAT_VERSION 2) left the older ones forever.
    from accelstack.engine.probes.family_files import FAMILY_FORMAT_VERSION as F

    probe = tmp_path / "cache" / "probe"
    for folder in (f"flux-f{F}-s1234", f"qwen-image-f{F - 1}-s1234"):
        _write(probe / folder / "probe.safetensors", b"x" * 100)
        _write(probe / folder / "probe.json", _probe_marker())
    _write(probe / f"pools-sd3-f{F}-s1234-F8_E5M2.bin", _pools(300))
    _write(probe / f"pools-qwen-image-f{F - 1}-s1234-F8_E5M2.bin", _pools(400))
    _write(probe / "pools-mine-f1-s1-F8_E5M2.bin", b"m")  # no family of ours: left alone
    rc, out, err = run_cli(["cache", "list", "--json"], env=_env(tmp_path))
    assert rc == 0, err
    entry = next(c for c in result_of(out)["caches"] if c["name"] == "probe")
    kinds = {e["name"]: e["kind"] for e in entry["entries"]}
    assert kinds == {f"flux-f{F}-s1234": "probe model", f"qwen-image-f{F - 1}-s1234": "probe model (older format, unused)",
                     f"pools-sd3-f{F}-s1234-F8_E5M2.bin": "probe pools",
                     f"pools-qwen-image-f{F - 1}-s1234-F8_E5M2.bin": "probe pools (older format, unused)"}
    assert entry["other"] == ["pools-mine-f1-s1-F8_E5M2.bin"]
    rc, out, err = run_cli(["cache", "purge", "probe", "--yes", "--json"], env=_env(tmp_path))
    assert rc == 0, err
    # what stays: the file that is not ours, and the lock files purge took (as for every cache entry)
    assert sorted(p.name for p in probe.iterdir() if not p.name.endswith(".lock")) == ["pools-mine-f1-s1-F8_E5M2.bin"]


def _lookalikes(tmp_path: Path) -> Dict[str, Path]:
    """A user's files in folders the caches point at, named exactly like accelstack's entries but
    without accelstack's marks (issue 47: `cache purge probe` removed three of these)."""
    from accelstack.engine.probes.family_files import FAMILY_FORMAT_VERSION as F

    cache = tmp_path / "cache"
    blobs, probe = cache / "blobs" / "sha256", cache / "probe"
    return {
        "blob": _write(blobs / ("12" * 32), b"my file"),
        "stamp": _write(blobs / ("34" * 32 + ".verified"), b"{}"),
        "part": _write(blobs / ("56" * 32 + ".part"), b"my part"),
        "probe": _write(probe / "sd1-f3-s42" / "notes.txt", b"mine").parent,
        "probe_unmarked_json": _write(probe / "sd1-f3-s43" / "probe.json", b'{"mine": true}').parent,
        "family_probe": _write(probe / f"flux-f{F}-s42" / "photo.jpg", b"mine").parent,
        "tmp": _write(probe / ".tmp-sd1-mine" / "diary.txt", b"mine").parent,
        "pools": _write(probe / "pools-f3-s42-F8_E5M2.bin", b"my pools"),
        "family_pools": _write(probe / f"pools-flux-f{F}-s42-F8_E5M2.bin", b"my pools"),
        "pools_tmp": _write(probe / ".pools-f3-s42-F8_E5M2.bin.4242.tmp", b"my temp"),
        "verify_png": _write(cache / "verify" / "verify-cpu.png", encode_png(1, 1, b"\0\0\0", {"parameters": "a cat"})),
        "record": _write(cache / "verify" / ("image-" + "8" * 32 + ".json"), b'{"format": 1}'),
        "vulkan": _write(cache / "detect" / ("vulkan-" + "1" * 16 + ".json"), b'{"mine": 1}'),
    }


def test_purge_and_gc_leave_what_only_looks_like_accelstacks(tmp_path):
    """Every cache `cache purge` and `gc` touch deletes only entries accelstack wrote and marked,
    whatever their names (issue 47: a folder where a user keeps files lost three of them)."""
    mine = _lookalikes(tmp_path)
    before = {k: _tree(p) if p.is_dir() else p.read_bytes() for k, p in mine.items()}
    rc, out, err = run_cli(["cache", "list", "--json"], env=_env(tmp_path))
    assert rc == 0, err
    caches = {c["name"]: c for c in result_of(out)["caches"]}
    assert all(c["count"] == 0 and c["size"] == 0 for c in caches.values()), caches
    rc, out, err = run_cli(["cache", "purge", "all", "--yes", "--json"], env=_env(tmp_path))
    assert rc == 0, err
    assert result_of(out)["removed"] == [] and result_of(out)["bytes_freed"] == 0
    rc, out, err = run_cli(["gc", "--json"], env=_env(tmp_path))
    assert rc == 0, err
    assert {k: _tree(p) if p.is_dir() else p.read_bytes() for k, p in mine.items()} == before


def test_dry_run_changes_nothing_and_says_what_would_go(tmp_path):
    _populate(tmp_path)
    before = _tree(tmp_path)
    rc, out, err = run_cli(["cache", "purge", "--dry-run", "--json"], env=_env(tmp_path))
    assert rc == 0, err
    res = result_of(out)
    assert res["dry_run"] and res["bytes_freed"] == 5000 + 300 + len(_stamp(BLOB)) + 700 + 2000 + 4000 + len(_probe_marker()) + 600 + 50 + 190 + 280 + len(
        (tmp_path / "cache" / "probe" / ".tmp-sd1-f2-s1234-dead" / ".owner").read_bytes())
    assert _tree(tmp_path) == before


def test_purge_all_removes_only_accelstacks_entries(tmp_path):
    p = _populate(tmp_path)
    rc, out, err = run_cli(["cache", "purge", "all", "--yes", "--json"], env=_env(tmp_path))
    assert rc == 0, err
    res = result_of(out)
    for gone in ("blob", "part", "stamp", "slot", "sdist", "probe", "pools", "pools_tmp", "stale_tmp", "verify_png", "record"):
        assert not p[gone].exists(), gone
    for kept in ("blob_lock", "slot_lock", "foreign_blob_dir_file", "sdist_note", "headers", "live_tmp", "verify_note", "outside"):
        assert p[kept].exists(), kept
    assert (tmp_path / "cache" / "blobs" / "sha256" / ("ef" * 32)).is_symlink()
    assert (tmp_path / "outside" / "precious.bin").read_bytes() == b"p" * 1000
    assert (tmp_path / "cache" / "verify" / "verify-vulkan.png").is_symlink()
    assert res["bytes_freed"] == 5000 + 300 + len(_stamp(BLOB)) + 700 + 2000 + 4000 + len(_probe_marker()) + 600 + 50 + 190 + 280 + len(json.dumps(
        {"pid": 2 ** 22 + 12345, "host": os.uname().nodename}).encode())
    assert any("in use by a running verify" in k for k in res["kept"])
    rc, out, _ = run_cli(["cache", "purge", "all", "--yes", "--json"], env=_env(tmp_path))
    assert rc == 0 and result_of(out)["bytes_freed"] == 0, "a second purge finds nothing"


def test_the_detect_cache_lists_and_purges_only_its_answers(tmp_path):
    """Detection's kept Vulkan enumeration (``<cache>/detect``) is a cache like the others: listed,
    purged, and nothing else in its folder is touched."""
    folder = tmp_path / "cache" / "detect"
    answer = _write(folder / ("vulkan-" + "0123abcd" * 2 + ".json"), _vulkan_answer(120))
    unfinished = _write(folder / (".vulkan-" + "0123abcd" * 2 + ".json.4242.1f2e3d4c.tmp"), _vulkan_answer(110))
    mine = _write(folder / "vulkan-notes.json", b"mine")
    outside = _write(tmp_path / "outside" / "precious.json", b"p")
    (folder / ("vulkan-" + "f" * 16 + ".json")).symlink_to(outside)
    rc, out, err = run_cli(["cache", "list", "--json"], env=_env(tmp_path))
    assert rc == 0, err
    info = next(c for c in result_of(out)["caches"] if c["name"] == "detect")
    assert {e["name"]: e["kind"] for e in info["entries"]} == {answer.name: "vulkan enumeration",
                                                              unfinished.name: "unfinished write"}
    assert info["size"] == 230 and set(info["other"]) == {mine.name, "vulkan-" + "f" * 16 + ".json"}
    rc, out, err = run_cli(["cache", "purge", "detect", "--yes", "--json"], env=_env(tmp_path))
    assert rc == 0, err
    assert result_of(out)["bytes_freed"] == 230
    assert not answer.exists() and not unfinished.exists()
    assert mine.read_bytes() == b"mine" and outside.read_bytes() == b"p" and (folder / ("vulkan-" + "f" * 16 + ".json")).is_symlink()


def test_purge_one_cache_leaves_the_others(tmp_path):
    p = _populate(tmp_path)
    rc, out, err = run_cli(["cache", "purge", "probe", "-y"], env=_env(tmp_path))
    assert rc == 0, err
    assert "freed" in out
    assert not p["probe"].exists() and p["blob"].exists() and p["slot"].exists()


def test_never_the_runtime_home_even_inside_a_cache(tmp_path):
    env = _env(tmp_path)
    home = tmp_path / "cache" / "probe" / "sd1-f2-s99"  # named like a probe folder
    _write(home / "receipts" / "r.json", b"{}")
    _write(home / "probe.json", _probe_marker())  # and even marked like one
    env["ACCELSTACK_HOME"] = str(home)
    rc, out, err = run_cli(["cache", "purge", "probe", "--yes", "--json"], env=env)
    assert rc == 0, err
    assert (home / "receipts" / "r.json").exists()
    assert any("runtime home" in k for k in result_of(out)["kept"])


def test_an_entry_in_use_by_another_process_stays(tmp_path):
    p = _populate(tmp_path)
    with FileLock(str(p["slot_lock"])):  # a build of this slot is running
        rc, out, err = run_cli(["cache", "purge", "builds", "--yes", "--json"], env=_env(tmp_path))
    assert rc == 0, err
    assert p["slot"].exists() and not p["sdist"].exists()
    assert any("in use by another accelstack process" in k for k in result_of(out)["kept"])


def test_no_terminal_and_no_yes_is_a_usage_error(tmp_path):
    p = _populate(tmp_path)
    rc, out, _ = run_cli(["cache", "purge", "--json"], env=_env(tmp_path))
    assert rc == 2
    err = error_of(out)
    assert err["code"] == "usage" and "--yes" in err["hint"]
    assert p["blob"].exists()
    rc, _, err_text = run_cli(["cache"], env=_env(tmp_path))
    assert rc == 2 and "cache list" in err_text


def test_on_a_terminal_it_asks_and_no_keeps_everything(tmp_path):
    p = _populate(tmp_path)
    master, slave = pty.openpty()
    env = {**os.environ, **_env(tmp_path), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "accelstack", "cache", "purge", "downloads"], stdin=slave,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
    os.close(slave)
    os.write(master, b"n\n")
    out, err = proc.communicate(timeout=60)
    os.close(master)
    assert proc.returncode == 1, err
    assert "remove accelstack's entries from: downloads" in err and "nothing removed" in out
    assert p["blob"].exists()


def test_help_has_a_description_and_examples():
    for args in (["cache", "--help"], ["cache", "purge", "--help"], ["cache", "list", "--help"]):
        rc, out, _ = run_cli(args)
        assert rc == 0 and "examples:" in out and "accelstack cache" in out


def test_a_probe_folder_of_a_verify_on_another_host_is_kept_and_said_so(tmp_path):
    """A cache shared between machines (an NFS home): a temporary probe folder whose owner record names
    another host is kept, since whether that verify still runs cannot be told from here, and the
    reason says that, not "in use by a running verify"."""
    folder = tmp_path / "cache" / "probe" / ".tmp-sd1-f2-s1234-elsewhere"
    _write(folder / ".owner", json.dumps({"pid": 4242, "host": "render-node-7", "created": 0}).encode())
    rc, out, err = run_cli(["cache", "purge", "probe", "--yes", "--json"], env=_env(tmp_path))
    assert rc == 0, err
    kept = result_of(out)["kept"]
    assert any("made by a verify on another host (render-node-7)" in k for k in kept), kept
    assert not any("in use by a running verify" in k for k in kept), kept
    assert folder.is_dir()


def test_list_says_whose_the_project_scripts_folders_are(tmp_path):
    """vulkan-headers and vulkan-lavapipe are written into the build cache by the project's own setup scripts
    (scripts/setup-vulkan.sh, scripts/vulkan-lavapipe.sh), runtime-* and sd-cli-* by benchmarks/bench_engine.py:
    `cache list` said "not written by accelstack" of them. They stay left alone (not entries, never purged), and
    the list says who wrote them; a folder only named like one of them is still "not written by accelstack"."""
    builds = tmp_path / "cache" / "builds"
    _write(builds / "vulkan-headers" / "1.4.309.0-1" / "usr" / "include" / "vulkan" / "vulkan.h", b"h")
    _write(builds / "vulkan-lavapipe" / "25.0.7-2~bpo12+1" / "env",
           b"# lavapipe from Mesa 25.0.7-2~bpo12+1 (Debian bookworm-backports), for accelstack's Vulkan tests "
           b"(scripts/vulkan-lavapipe.sh)\nVK_DRIVER_FILES=/x/lvp_icd.json\n")
    _write(builds / ("runtime-" + "5e" * 8) / "stable_diffusion_cpp" / "__init__.py", b"")
    _write(builds / ("sd-cli-" + "41" * 8) / "build" / "bin" / "sd-cli", b"\x7fELF")
    _write(builds / "sd-cli-mine" / "notes.txt", b"mine")  # only named like one
    rc, out, err = run_cli(["cache", "list", "--json"], env=_env(tmp_path))
    assert rc == 0, err
    info = {c["name"]: c for c in result_of(out)["caches"]}["builds"]
    assert info["count"] == 0 and set(info["other"]) == {"vulkan-headers", "vulkan-lavapipe", "runtime-" + "5e" * 8,
                                                          "sd-cli-" + "41" * 8, "sd-cli-mine"}
    assert {n: w.split(":")[0] for n, w in info["written_by"].items()} == {
        "vulkan-headers": "scripts/setup-vulkan.sh", "vulkan-lavapipe": "scripts/vulkan-lavapipe.sh",
        "runtime-" + "5e" * 8: "benchmarks/bench_engine.py", "sd-cli-" + "41" * 8: "benchmarks/bench_engine.py"}
    rc, out, err = run_cli(["cache", "list"], env=_env(tmp_path))
    assert rc == 0, err
    stranger = next(line for line in out.splitlines() if "not written by accelstack" in line)
    assert "sd-cli-mine" in stranger and "vulkan" not in stranger and "runtime-" not in stranger
    assert "vulkan-headers (scripts/setup-vulkan.sh:" in out and "vulkan-lavapipe (scripts/vulkan-lavapipe.sh:" in out
    rc, out, err = run_cli(["cache", "purge", "builds", "--yes", "--json"], env=_env(tmp_path))
    assert rc == 0 and result_of(out)["removed"] == [], err
    assert (builds / "vulkan-lavapipe" / "25.0.7-2~bpo12+1" / "env").is_file()
