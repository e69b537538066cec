"""The torch destination: a Python environment that gets the planned torch, checked there, or undone.

The plan gives exact pip/uv commands (``{python}`` stands for the target interpreter). Before
running them, the distributions the plan will replace are moved aside (a rename within the same
site-packages, so it costs nothing for a multi-GB CUDA torch); if pip fails or the verifier says
FAIL, the new ones are uninstalled and the old ones moved back. The receipt lives in the home;
the environment itself is the user's and is never deleted.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion

from ..errors import Action, SubprocessTimeout
from ..events import ProgressCallback, ProgressEvent
from ..manifests.plan import PYTHON_PLACEHOLDER, Command, Plan
from ..settings import Settings
from ..subprocesses import run_logged
from ..verdict import DeviceInfo, VerifyCheck, VerifyReport
from .home import Home
from .records import InstalledFile, Receipt
from .torch_scripts import _CHECK, _INSPECT
from .transaction import StagedRuntime
from .wheel import InstallError

log = logging.getLogger(__name__)


class TorchInstallError(InstallError):
    """pip failed or the installed torch does not work; what was there before has been restored."""


def run_json(python: str, code: str, arg: object, timeout: float) -> Dict[str, object]:
    """Run ``code`` in ``python`` with one JSON argument; its last stdout line is a JSON object."""
    try:
        res = subprocess.run([python, "-c", code, json.dumps(arg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, timeout=timeout)
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


def receipt_id(plan: Plan, python: str) -> str:
    """One receipt per target environment: the same interpreter path always gets the same id."""
    return f"torch-{plan.variant}-{hashlib.sha256(str(Path(python).absolute()).encode()).hexdigest()[:10]}"


def package_names(plan: Plan) -> List[str]:
    names = []
    for spec in plan.packages:
        try:
            names.append(Requirement(spec).name.lower().replace("_", "-"))
        except InvalidRequirement:
            continue
    return names


def import_check(staged: StagedRuntime, progress: ProgressCallback, timeout: float = 300) -> VerifyReport:
    """The cheap check (no generation): torch imports in the target interpreter, is the planned
    build, sees the planned device, and has kernels for the GPU's architecture."""
    plan: Plan = staged.handle.plan if staged.handle is not None else None  # type: ignore[assignment]
    backend = staged.backend
    t0 = time.perf_counter()
    info = run_json(staged.python or str(staged.path), _CHECK, {"backend": backend}, timeout)
    ok, reason = _judge(info, backend, plan.torch_version if plan is not None else "")
    dev = DeviceInfo(name=str(info.get("device", backend)), kind="cpu" if backend == "cpu" else "gpu")
    return VerifyReport(ok=ok, reason="" if ok else reason, runtime=str(staged.path), backend=backend, check="import",
                        device=dev, checks=[VerifyCheck("torch", ok, reason)], total_seconds=round(time.perf_counter() - t0, 4),
                        details={k: v for k, v in info.items() if k != "ok"})


def _judge(info: Dict[str, object], backend: str, want_version: str) -> Tuple[bool, str]:
    if not info.get("ok"):
        return False, f"torch does not import: {info.get('error', 'unknown error')}"
    got = str(info.get("torch", ""))
    if want_version and not got.startswith(want_version):
        return False, f"torch {got} is installed but the plan asked for {want_version}"
    if backend == "cuda" and not info.get("cuda"):
        return False, f"torch {got} is not a CUDA build (torch.version.cuda is empty)"
    if backend == "rocm" and not info.get("hip"):
        return False, f"torch {got} is not a ROCm build (torch.version.hip is empty)"
    if backend in ("cuda", "rocm", "xpu", "mps", "directml") and not info.get("available"):
        return False, f"torch {got} cannot use the {backend} device here"
    arch = str(info.get("device_arch", ""))
    archs = info.get("arch_list")
    if arch and isinstance(archs, list) and arch not in [str(a) for a in archs]:
        return False, f"torch {got} has no kernels for {arch} (\"no kernel image is available\"); it was built for {archs}"
    return True, f"torch {got} works on {info.get('device', backend)}"


def run_pip(argv: List[str], timeout: float, progress: ProgressCallback, after: str, stage: str = "install") -> None:
    """Run one pip command, its lines as progress events of ``stage``; a failure names pip's first
    ``ERROR:`` line (``after``: what the caller has done about it, for the hint)."""
    progress(ProgressEvent("message", stage, task="torch", message="$ " + " ".join(redact(argv))))
    errors: List[str] = []

    def line(text: str) -> None:
        if text.startswith("ERROR:") and len(errors) < 3:
            errors.append(text.strip())
        progress(ProgressEvent("message", stage, task="pip", message=text.rstrip()))

    try:
        outcome = run_logged(argv, timeout=timeout, on_line=line)
    except OSError as exc:
        raise TorchInstallError(f"cannot run {argv[0]}: {exc.strerror or exc}", action=Action.FIX_INPUT) from None
    if outcome.timed_out:  # the watchdog stopped it even if it hung without printing
        raise SubprocessTimeout(f"{argv[0]} did not finish within {timeout:.0f} s", hint=f"{after}; try again on a faster connection")
    if outcome.returncode != 0:
        reason = errors[0] if errors else (outcome.last_lines[-1] if outcome.last_lines else "no output")
        raise TorchInstallError(f"pip failed: {reason}", hint=after)


# -- package indexes (mirrors) ----------------------------------------------------------------------

_INDEX_FLAGS = ("--index-url", "-i")


def with_indexes(commands: Sequence[Command], index_url: Optional[str], extra_index_urls: Sequence[str] = ()) -> List[Command]:
    """``commands`` with a user's package indexes: ``index_url`` replaces PyPI (only in commands
    that would use PyPI: a PyTorch index the plan chose for a CUDA/ROCm/XPU build stays, because
    that build is published only there), and each of ``extra_index_urls`` is searched as well, by
    every command. Commands that use no index (``--no-index``: bundles) are left alone."""
    out = []
    for cmd in commands:
        argv = list(cmd.argv)
        if "install" not in argv or "--no-index" in argv:
            out.append(Command(cmd.tool, argv, cmd.why))
            continue
        has_index = any(a in _INDEX_FLAGS or a.startswith("--index-url=") for a in argv)
        if index_url and not has_index:
            argv += ["--index-url", index_url]
        for url in extra_index_urls:
            if url not in argv:
                argv += ["--extra-index-url", url]
        out.append(Command(cmd.tool, argv, cmd.why))
    return out


def redact(argv: Sequence[str]) -> List[str]:
    """``argv`` for logs and progress: a password or token in an index URL (``https://user:token@host``) hidden."""
    return [re.sub(r"(?<=://)([^/@\s:]+):[^/@\s]+@", r"\1:***@", a) for a in argv]


# -- installing from local wheels (offline bundles) -------------------------------------------------


def download_commands(plan: Plan, dest: Path, python_version: str, platforms: Sequence[str] = (),
                      pip_python: str = sys.executable) -> List[List[str]]:
    """``pip download`` for each of the plan's pip commands: the same requirements and index, binary
    wheels only, for the target's Python ``python_version`` (``"3.11"``) and, when given, the target's
    ``platforms`` (pip tags such as ``manylinux_2_28_x86_64``; default: this machine's)."""
    target = ["--only-binary=:all:", "--python-version", python_version]
    for tag in platforms:
        target += ["--platform", tag]
    out = []
    for cmd in plan.commands:
        argv = list(cmd.argv)
        if cmd.tool != "pip" or argv[:4] != [PYTHON_PLACEHOLDER, "-m", "pip", "install"]:
            raise TorchInstallError(f"the plan's command {cmd.render()} is not a pip install; it cannot be bundled",
                                    action=Action.REPORT_BUG)
        out.append([pip_python, "-m", "pip", "download", "--dest", str(dest), *target, *argv[4:]])
    return out


_WHEEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,250}\.whl\Z")


def wheel_pin(filename: str) -> Tuple[str, str]:
    """``(name, version)`` of the wheel file ``filename``; TorchInstallError for anything that is not
    a plain wheel file name (no directories, no odd characters)."""
    if not _WHEEL_NAME.match(filename):
        raise TorchInstallError(f"{filename[:300]!r} is not a wheel file name", action=Action.FIX_INPUT)
    try:
        name, version, _build, _tags = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion) as exc:
        raise TorchInstallError(f"{filename!r} is not a wheel file name ({exc})", action=Action.FIX_INPUT) from None
    return str(name), str(version)


def hashed_requirements(wheels: Sequence[Tuple[str, str]]) -> str:
    """A requirements file for ``pip install --require-hashes``: one exact pin per project with the
    sha256 of each of its wheels (``wheels``: file name, sha256), so pip installs these bytes or nothing."""
    pins: Dict[str, Tuple[str, List[str]]] = {}
    for filename, sha in wheels:
        name, version = wheel_pin(filename)
        have = pins.setdefault(name, (version, []))
        if have[0] != version:
            raise TorchInstallError(f"two versions of {name} ({have[0]} and {version}); pip can install only one",
                                    action=Action.FIX_INPUT)
        have[1].append(sha)
    return "".join(f"{name}=={version} " + " ".join(f"--hash=sha256:{h}" for h in hashes) + "\n"
                   for name, (version, hashes) in sorted(pins.items()))


def local_install_command(find_links: Path, requirements: Path) -> Command:
    """The pip command that installs only the hashed wheels in ``find_links``: no index, binary only."""
    return Command("pip", [PYTHON_PLACEHOLDER, "-m", "pip", "install", "--no-index", "--find-links", str(find_links),
                           "--only-binary=:all:", "--require-hashes", "-r", str(requirements)],
                   "install the bundled wheels (no index; each wheel's sha256 required)")


class _Backup:
    """Moves installed distributions aside and back: the undo log of a torch install."""

    def __init__(self, python: str, names: List[str], prefix: Path, timeout: float) -> None:
        self.python = python
        self.names = names
        # a fresh directory this install creates, so discarding it can never remove anything else
        self.where = Path(tempfile.mkdtemp(prefix=".accelstack-backup-", dir=prefix))
        self.timeout = timeout
        self.moved: List[Tuple[Path, Path]] = []
        self.previous: Dict[str, str] = {}

    def stash(self) -> None:
        info = run_json(self.python, _INSPECT, self.names, self.timeout)
        dists = info.get("dists", [])
        for dist in dists if isinstance(dists, list) else []:
            self.previous[dist["name"]] = dist["version"]
            location = Path(dist["location"])
            tops = sorted({Path(f).parts[0] for f in dist["files"] if not f.startswith("..") and Path(f).parts})
            for top in tops:
                src = location / top
                if src.exists() and not any(src == m[0] for m in self.moved):
                    dest = self.where / f"{len(self.moved)}-{top}"
                    os.replace(src, dest)
                    self.moved.append((src, dest))

    def restore(self) -> None:
        for src, dest in reversed(self.moved):
            if src.exists():
                shutil.rmtree(src) if src.is_dir() else src.unlink()
            os.replace(dest, src)
        self.moved.clear()

    def discard(self) -> None:
        shutil.rmtree(self.where, ignore_errors=True)
        self.moved.clear()


@dataclass
class _Undo:
    plan: Plan
    backup: _Backup
    names: List[str]


@dataclass
class PipCommands:
    """A source: the plan's commands, run with pip (or uv when asked and on PATH)."""

    commands: List[Command]
    use_uv: bool = False

    @classmethod
    def for_plan(cls, plan: Plan, settings: Settings) -> PipCommands:
        """The plan's commands with the settings' package indexes (a mirror) and uv choice applied."""
        return cls(with_indexes(plan.commands, settings.index_url, settings.extra_index_urls), settings.use_uv)


class TorchEnvironment:
    """Destination for torch runtimes: the interpreter ``python`` (a venv's or any other)."""

    stack = "torch"

    def __init__(self, home: Home, python: str, pip_timeout: float, probe_timeout: float) -> None:
        self.home = home
        self.python = python
        self.pip_timeout = pip_timeout
        self.probe_timeout = probe_timeout

    def stage(self, plan: Plan, source: PipCommands, progress: ProgressCallback) -> StagedRuntime:
        if plan.stack != "torch" or not plan.ok or not source.commands:
            raise TorchInstallError(f"the plan has nothing to install ({plan.summary})", action=Action.EXPLAIN_PLAN)
        names = package_names(plan)
        info = run_json(self.python, _INSPECT, names, self.probe_timeout)
        backup = _Backup(self.python, names, Path(str(info.get("prefix", ""))), self.probe_timeout)
        try:
            backup.stash()
        except BaseException:
            backup.restore()
            backup.discard()
            raise
        staged = StagedRuntime(stack="torch", backend=plan.backend, path=Path(self.python), env=dict(plan.env),
                               python=self.python, handle=_Undo(plan, backup, names))
        try:
            for cmd in source.commands:
                self._run(cmd, source.use_uv, progress)
        except BaseException:
            self.abort(staged)
            raise
        return staged

    def _run(self, cmd: Command, use_uv: bool, progress: ProgressCallback) -> None:
        argv = [a.replace(PYTHON_PLACEHOLDER, self.python) for a in cmd.argv]
        if use_uv and cmd.tool == "pip" and shutil.which("uv"):
            argv = ["uv", "pip"] + argv[argv.index("pip") + 1:] + ["--python", self.python]
        run_pip(argv, self.pip_timeout, progress, "the previous torch (if any) has been restored")

    def files(self, staged: StagedRuntime) -> List[InstalledFile]:
        return []  # the environment is the user's; its files are pip's to track

    def commit(self, staged: StagedRuntime, receipt: Receipt) -> Optional[Path]:
        undo: _Undo = staged.handle
        receipt.path = self.python
        receipt.verification.details.setdefault("previous", dict(undo.backup.previous))
        self.home.write_receipt(receipt)
        undo.backup.discard()
        return None

    def abort(self, staged: StagedRuntime) -> None:
        undo: _Undo = staged.handle
        try:
            subprocess.run([self.python, "-m", "pip", "uninstall", "-y", "-q", *undo.names], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=self.pip_timeout)
        except (subprocess.TimeoutExpired, OSError):
            log.warning("pip uninstall in %s did not finish; restoring the previous files anyway", self.python)
        undo.backup.restore()
        undo.backup.discard()

    def retire(self, old: Path) -> None:  # never: the environment is the user's
        return None
