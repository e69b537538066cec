"""The README's first command leaves an `accelstack` command where people look for one (issue 42, item 1):
after `./scripts/first-run.sh` there was none, and nothing said where it was. Run as written in a fresh
copy of the checkout with an empty HOME (its install a dry run, to keep the test short), then the
README's next command through PATH; a file of that name that is not ours is never replaced."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _fresh_copy(dest: Path) -> Path:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, files):
        src = REPO / os.fsdecode(name)
        if src.is_file():
            (dest / os.fsdecode(name)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / os.fsdecode(name))
    return dest


def _first_run(clone: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["./scripts/first-run.sh", "--dry-run"], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=900)


def test_first_run_puts_accelstack_on_path_says_so_and_never_replaces_a_file_not_its_own(tmp_path):
    clone, home = _fresh_copy(tmp_path / "clone"), tmp_path / "home"
    bin_dir = home / ".local" / "bin"
    bin_dir.mkdir(parents=True)
    theirs = bin_dir / "accelstack"
    theirs.write_text("#!/bin/sh\necho someone else's accelstack\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "XDG_BIN_HOME"))}
    env.update(HOME=str(home), PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", ACCELSTACK_HOME=str(tmp_path / "ahome"),
               ACCELSTACK_CACHE=str(tmp_path / "cache"))
    res = _first_run(clone, env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    target = clone.resolve() / ".venv" / "bin" / "accelstack"
    assert theirs.read_text() == "#!/bin/sh\necho someone else's accelstack\n"  # left alone
    assert f"accelstack command: {theirs} is not a link this script made, so it was left alone; run {target}" in res.stdout
    assert f"next: {target} generate" in res.stdout, res.stdout[-1500:]

    theirs.unlink()
    res = _first_run(clone, env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert theirs.is_symlink() and Path(os.readlink(theirs)) == target
    assert res.stdout.startswith(f"accelstack command: {theirs} -> {target}\n"), res.stdout[:500]
    assert "is not on your PATH" not in res.stdout
    assert res.stdout.count("no channel is configured") == 1, res.stdout  # said once (item 10: plan and install both said it)
    last = res.stdout.rstrip().splitlines()[-2:]
    assert last[0].startswith("next: accelstack generate -m ") and last[1].startswith("      accelstack status"), last

    # the README's next command, as written, found on PATH
    st = subprocess.run(["accelstack", "status", "--offline"], cwd=tmp_path, env=env, capture_output=True, text=True,
                        timeout=300)
    assert st.returncode == 0 and "runtime home:" in st.stdout, st.stdout + st.stderr

    # a PATH without the folder: the link is still made, and the line to add it is printed
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != str(bin_dir))
    res = _first_run(clone, env)
    assert res.returncode == 0 and "(already there)" in res.stdout.splitlines()[0], res.stdout[:500]
    assert f"{bin_dir} is not on your PATH: add it (e.g. in ~/.profile): export PATH=\"{bin_dir}:$PATH\"" in res.stdout
    assert f"next: {theirs} generate" in res.stdout
