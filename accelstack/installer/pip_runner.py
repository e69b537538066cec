"""Running the target's Python, pip and uv, each with a timeout: a question answered in JSON, a
virtual environment made, a pip command run with its progress and its failure read.

The interpreter may be any Python (a venv's, the user's own) and may lack accelstack; what it is
asked runs as a small program (:mod:`.torch_scripts`) that prints one JSON object.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple

from ..errors import Action, SubprocessTimeout
from ..events import ProgressCallback, ProgressEvent
from ..settings import inherited_env
from ..subprocesses import run_logged
from .errors import TorchInstallError
from .pip_output import PipOutput, pip_failure, redact

__all__ = ["run_json", "python_version", "venv_python", "ensure_venv", "pip_version", "run_pip"]

_PIP_VERSIONS: Dict[str, Tuple[int, ...]] = {}


def run_json(python: str, code: str, arg: object, timeout: float,
             env: Optional[Mapping[str, str]] = None) -> Dict[str, object]:
    """Run ``code`` in ``python`` with one JSON argument (``env``: added to the environment it
    inherits); its last stdout line is a JSON object."""
    try:
        res = subprocess.run([python, "-c", code, json.dumps(arg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, timeout=timeout, env=inherited_env(**env) if env else None)
    except subprocess.TimeoutExpired:
        raise SubprocessTimeout(f"{python} did not answer within {timeout:.0f} s", hint="the environment may be "
                                "starting very slowly or hanging on import; try again") from None
    except OSError as exc:
        raise TorchInstallError(f"cannot run {python}: {exc.strerror or exc}", action=Action.FIX_INPUT) from None
    try:
        data = json.loads(res.stdout.strip().splitlines()[-1])
        if not isinstance(data, dict):
            raise ValueError("not an object")
        return data
    except (ValueError, IndexError):
        raise TorchInstallError(f"{python} could not run the check: {(res.stderr.strip().splitlines() or ['no output'])[-1]}") from None


def python_version(python: str, timeout: float) -> str:
    """``"3.11"`` for the interpreter ``python``."""
    info = run_json(python, "import json,sys;print(json.dumps({'v':'%d.%d'%sys.version_info[:2]}))", None, timeout)
    return str(info.get("v", ""))


def venv_python(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure_venv(venv: Path, timeout: float, base_python: str = sys.executable) -> str:
    """Create ``venv`` if it does not exist; return its interpreter."""
    py = venv_python(venv)
    if not py.exists():
        try:
            res = subprocess.run([base_python, "-m", "venv", str(venv)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SubprocessTimeout(f"creating the virtual environment {venv} took longer than {timeout:.0f} s") from None
        if res.returncode != 0:
            raise TorchInstallError(f"could not create the virtual environment {venv}: {res.stdout.strip()[-300:]}",
                                    action=Action.FIX_INPUT)
    return str(py)


def pip_version(python: str, timeout: float = 60) -> Tuple[int, ...]:
    """pip's version in ``python`` as a tuple (``(24, 1)``); ``()`` when pip cannot say."""
    if python not in _PIP_VERSIONS:
        try:
            res = subprocess.run([python, "-c", "import pip; print(pip.__version__)"], stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL, text=True, timeout=timeout)
            found = re.match(r"(\d+)\.(\d+)", res.stdout.strip())
            _PIP_VERSIONS[python] = tuple(int(x) for x in found.groups()) if found else ()
        except (OSError, subprocess.TimeoutExpired):
            _PIP_VERSIONS[python] = ()
    return _PIP_VERSIONS[python]


def _with_progress(argv: List[str], timeout: float) -> Tuple[List[str], Optional[Dict[str, str]]]:
    """``argv`` and environment under which pip reports its download progress through a pipe.

    pip >= 24.1 has ``--progress-bar raw`` (``Progress N of TOTAL`` lines, exact bytes). Older
    pips (>= 22) draw a rich bar, which rich suppresses when output is not a terminal unless
    ``FORCE_COLOR`` is set; the bar's ``1.2/2.5 GB`` is parsed then. Anything else (uv, a pip
    older than 22) still shows each file as it starts."""
    if len(argv) < 4 or argv[1:3] != ["-m", "pip"] or argv[3] not in ("install", "download"):
        return argv, None
    if any(a.startswith("--progress-bar") or a in ("-q", "--quiet") for a in argv):
        return argv, None
    version = pip_version(argv[0], min(timeout, 60))
    if version >= (24, 1):
        return argv[:4] + ["--progress-bar", "raw"] + argv[4:], None
    if version >= (22, 0):
        # pip's environment, as a "terminal" without colours (fewer escapes) that is not a dumb
        # one (rich redraws nothing there)
        return argv, inherited_env(FORCE_COLOR="1", NO_COLOR="1", TERM="xterm")
    return argv, None


def run_pip(argv: List[str], timeout: float, progress: ProgressCallback, after: str, stage: str = "install", *,
            proxied: bool) -> None:
    """Run one pip (or uv) command: its download progress as ``download`` events (bytes, per file),
    its other lines as ``message`` events of ``stage``; a failure raises the :class:`PipError` that
    names pip's real cause (``after``: what the caller has done about it, for the hint; ``proxied``:
    see :func:`~.pip_output.pip_failure`)."""
    argv, env = _with_progress(argv, timeout)
    progress(ProgressEvent("message", stage, task="torch", message="$ " + " ".join(redact(argv))))
    out = PipOutput(progress, stage)
    try:
        outcome = run_logged(argv, timeout=timeout, on_line=out.feed, env=env)
    except OSError as exc:
        raise TorchInstallError(f"cannot run {argv[0]}: {exc.strerror or exc}", action=Action.FIX_INPUT) from None
    except BaseException:
        out.close(False)
        raise
    out.close(outcome.returncode == 0 and not outcome.timed_out)
    if outcome.timed_out:  # the watchdog stopped it even if it hung without printing
        raise SubprocessTimeout(f"{argv[0]} did not finish within {timeout:.0f} s", hint=f"{after}; try again on a faster connection")
    if outcome.returncode != 0:
        raise pip_failure(out.lines, argv, after, proxied=proxied)

