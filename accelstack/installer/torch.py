"""The torch destination: a Python environment that gets the planned torch, checked there, or undone.

The plan gives exact pip/uv commands (``{python}`` stands for the target interpreter). Before
running them, the distributions the plan will replace are moved aside (a rename within the same
site-packages, so it costs nothing for a multi-GB CUDA torch); if pip fails or the verifier says
FAIL, the new ones are uninstalled and the old ones moved back. The receipt lives in the home;
the environment itself is the user's and is never deleted.

pip's output becomes progress events (each download's bytes, per file) and, when pip fails, a
typed error that names the root cause pip printed (an index that does not resolve, refused the
connection, a proxy, TLS, a missing package, a conflict, a full disk), not its last line.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion

from ..errors import Action, SubprocessTimeout
from ..events import ProgressCallback, ProgressEvent
from ..manifests.plan import PYTHON_PLACEHOLDER, Command, Plan
from ..manifests.request import TORCH_FAMILY
from ..manifests.torch_matrix import ENGINE_PACKAGES
from ..manifests.torch_resolve import engine_command
from ..settings import Settings
from ..subprocesses import run_logged
from ..verdict import DeviceInfo, VerifyCheck, VerifyReport
from .home import Home
from .records import InstalledFile, Receipt
from .torch_scripts import _CHECK, _ENGINE, _INSPECT
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
    engine = engine_modules(plan) if plan is not None else []
    info = run_json(staged.python or str(staged.path), _CHECK, {"backend": backend, "engine": engine}, timeout)
    ok, reason = _judge(info, backend, plan.torch_version if plan is not None else "")
    broken = info.get("engine_errors")
    if ok and isinstance(broken, dict) and broken:
        ok, reason = False, ("the torch engine's packages do not import: "
                             + "; ".join(f"{m} ({why})" for m, why in sorted(broken.items())))
    dev = DeviceInfo(name=str(info.get("device", backend)), kind="cpu" if backend == "cpu" else "gpu")
    return VerifyReport(ok=ok, reason="" if ok else reason, runtime=str(staged.path), backend=backend, check="import",
                        device=dev, checks=[VerifyCheck("torch", ok, reason)], total_seconds=round(time.perf_counter() - t0, 4),
                        details={k: v for k, v in info.items() if k != "ok"})


def engine_modules(plan: Plan) -> List[str]:
    """The modules of the torch engine's packages the plan installs (none when it installs no engine)."""
    cmd = engine_command(plan)
    if cmd is None:
        return []
    names = []
    for arg in cmd.argv[4:] if cmd.tool == "pip" else []:
        try:
            name = canonicalize_name(Requirement(arg).name)
        except InvalidRequirement:
            continue
        if name not in TORCH_FAMILY and not name.startswith("torch-"):
            names.append(name.replace("-", "_"))
    return names


class TorchEngineMissingError(InstallError):
    """The torch runtime lacks packages accelstack's torch engine imports (diffusers, transformers...)."""

    default_action = Action.REINSTALL


_ENGINE_NEEDED = tuple(req for req in ENGINE_PACKAGES if not req.startswith("accelerate"))


def check_engine(python: str, timeout: float = 60, packages: Sequence[str] = _ENGINE_NEEDED) -> None:
    """Raise :class:`TorchEngineMissingError` naming every one of ``packages`` that ``python``
    cannot import, and the pip command that adds them; before a torch worker starts, so a person
    reads which packages are missing instead of a worker that failed to start. accelerate is not
    asked for by default: the engine runs without it (loading a model takes more memory)."""
    modules = {canonicalize_name(Requirement(p).name).replace("-", "_"): p for p in packages}
    info = run_json(python, _ENGINE, list(modules), timeout)
    found = info.get("missing")
    missing = [modules[m] for m in (found if isinstance(found, list) else []) if m in modules]
    if missing:
        names = ", ".join(Requirement(p).name for p in missing)
        command = " ".join([python, "-m", "pip", "install", *(shlex.quote(p) for p in missing)])
        raise TorchEngineMissingError(
            f"the torch runtime {python} lacks {names}, which generating images with torch needs; add them with: {command}",
            "install the torch stack again (it adds them), or run that pip command", code="torch-engine-missing")


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
    """Run one pip (or uv) command: its download progress as ``download`` events (bytes, per file),
    its other lines as ``message`` events of ``stage``; a failure raises the :class:`PipError` that
    names pip's real cause (``after``: what the caller has done about it, for the hint)."""
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
        raise pip_failure(out.lines, argv, after)


# -- pip's output: download progress -----------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_DOWNLOADING = re.compile(r"^\s*Downloading\s+(\S+)(?:\s+\((\d+(?:\.\d+)?)\s*([kKMGT]?i?B)\))?\s*$")
_RAW = re.compile(r"^\s*Progress\s+(\d+)\s+of\s+(\d+)\s*$")  # pip >= 24.1, --progress-bar raw
_RICH = re.compile(r"(\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)\s+([kKMGT]?i?B)\b")  # pip >= 22 rich bar: "1.2/2.5 GB"
_RICH_SIZE = re.compile(r"^[\s\-\\|/━╸╺]*(\d+(?:\.\d+)?)\s+([kKMGT]?i?B)\s")  # the same without a known size
_UNITS = {"B": 1, "kB": 1000, "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3, "TB": 1000 ** 4,
          "KiB": 1024, "kiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3, "TiB": 1024 ** 4}
_PIP_VERSIONS: Dict[str, Tuple[int, ...]] = {}


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS.get(unit, 1))


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
        env = dict(os.environ, FORCE_COLOR="1", NO_COLOR="1")  # a "terminal" without colours: fewer escapes
        if env.get("TERM", "dumb") == "dumb":
            env["TERM"] = "xterm"  # rich redraws nothing on a dumb terminal
        return argv, env
    return argv, None


class PipOutput:
    """Reads pip's output line by line: each download becomes ``start``/``advance``/``end`` events
    of stage ``download`` (task: the file name, ``done``/``total`` in bytes, at most one advance
    every ``interval`` seconds), every other line a ``message`` event of ``stage``; the lines are
    kept (without progress redraws and terminal escapes) for :func:`pip_failure`."""

    def __init__(self, progress: ProgressCallback, stage: str, interval: float = 0.25) -> None:
        self.progress = progress
        self.stage = stage
        self.interval = interval
        self.lines: List[str] = []
        self.files: List[str] = []
        self._task = ""
        self._total: Optional[int] = None
        self._done = 0
        self._sent = 0.0

    def feed(self, raw: str) -> None:
        text = _ANSI.sub("", raw).replace("\r", "").rstrip()
        if not text.strip():
            return
        m = _DOWNLOADING.match(text)
        if m:
            self._finish(True)
            url = m.group(1)
            self._task = Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path)).name or url
            self._total = _bytes(m.group(2), m.group(3)) if m.group(2) else None
            self._done, self._sent = 0, time.monotonic()
            self.files.append(self._task)
            self._keep(text)
            self.progress(ProgressEvent("start", "download", task=self._task, total=self._total, extra={"unit": "B"}))
            return
        if self._task and self._progress_line(text):
            return
        self._finish(not text.lstrip().startswith(("ERROR", "WARNING: Retrying")))  # a broken download is not done
        self._keep(text)
        self.progress(ProgressEvent("message", self.stage, task="pip", message=text))

    def _progress_line(self, text: str) -> bool:
        raw = _RAW.match(text)
        if raw:
            self._advance(int(raw.group(1)), int(raw.group(2)))
            return True
        rich = _RICH.search(text)
        if rich:
            total = _bytes(rich.group(2), rich.group(3))
            if self._total is not None and abs(total - self._total) <= _UNITS.get(rich.group(3), 1) // 10 + 1:
                total = self._total  # the same size, rounded: keep the more exact one
            self._advance(min(_bytes(rich.group(1), rich.group(3)), total), total)
            return True
        size = _RICH_SIZE.match(text)
        if size:
            self._advance(_bytes(size.group(1), size.group(2)), self._total)
            return True
        return False

    def _advance(self, done: int, total: Optional[int]) -> None:
        self._done, self._total = done, total
        now = time.monotonic()
        if now - self._sent >= self.interval or (total is not None and done >= total):
            self._sent = now
            self.progress(ProgressEvent("advance", "download", task=self._task, done=done, total=total, extra={"unit": "B"}))

    def _finish(self, ok: bool) -> None:
        if not self._task:
            return
        done = self._total if ok and self._total is not None else self._done
        self.progress(ProgressEvent("end", "download", task=self._task, done=done, total=self._total, ok=ok,
                                    extra={"unit": "B"}))
        self._task = ""

    def _keep(self, text: str) -> None:
        self.lines.append(text)
        if len(self.lines) > 2000:
            del self.lines[:1000]

    def close(self, ok: bool = True) -> None:
        """The command ended: a download still open ended with it."""
        self._finish(ok)


# -- pip's output: why it failed ---------------------------------------------------------------------


class PipError(TorchInstallError):
    """pip failed; ``kind`` says why in one word and ``cause`` is pip's own line that says so."""

    def __init__(self, message: str, hint: Optional[str] = None, *, kind: str = "", cause: str = "",
                 action: Optional[Action] = None, code: Optional[str] = None) -> None:
        super().__init__(message, hint, action=action, code=code)
        self.kind = kind
        self.cause = cause


class PipNetworkError(PipError):
    """pip could not reach a package index or download a file (DNS, refused, proxy, TLS, HTTP error)."""

    default_action = Action.CHECK_NETWORK


class PipNotFoundError(PipError):
    """No package (or no version of it) that fits was on the indexes pip searched."""

    default_action = Action.FIX_INPUT


class PipConflictError(PipError):
    """The requirements cannot be installed together (pip's ResolutionImpossible)."""

    default_action = Action.FIX_INPUT


class PipDiskFullError(PipError):
    """The disk filled up while pip downloaded or unpacked."""

    default_action = Action.FREE_DISK


class PipHashMismatchError(PipError):
    """A downloaded file is not the one its hash names (a broken download, or a changed file)."""

    default_action = Action.RETRY


# (kind, what it means, hint, patterns in pip's lines); the first kind found in any line wins
_NETWORK = [
    ("insecure-index", "pip ignored a plain-HTTP package index",
     "use the index's https:// address, or pass pip --trusted-host for a mirror you control",
     ["is not a trusted or secure host and is being ignored"]),
    ("proxy", "pip could not go through the proxy",
     "check the proxy settings (HTTPS_PROXY / HTTP_PROXY, pip's proxy option) and that the proxy is running",
     ["ProxyError", "Cannot connect to proxy", "407 Proxy Authentication Required", "Tunnel connection failed"]),
    ("dns", "a package index's host name does not resolve (DNS)",
     "check the network connection and the index URL; without network, install from an offline bundle",
     ["Name or service not known", "Temporary failure in name resolution", "nodename nor servname provided",
      "getaddrinfo failed", "No address associated with hostname", "[Errno -2]", "[Errno -3]", "[Errno 11001]",
      "NameResolutionError"]),
    ("tls", "the TLS (HTTPS) connection to a package index failed",
     "check the system's CA certificates (pip's --cert / PIP_CERT for a corporate proxy) and the machine's clock",
     ["CERTIFICATE_VERIFY_FAILED", "SSLCertVerificationError", "SSLError", "problem confirming the ssl certificate"]),
    ("connection-refused", "a package index refused the connection",
     "check the index URL and its port, and that the server (or mirror) is running",
     ["Connection refused", "[Errno 111]", "[Errno 61]", "ConnectionRefusedError", "[WinError 10061]"]),
    ("unreachable", "the network or a package index's host is unreachable",
     "check the network connection; without network, install from an offline bundle",
     ["Network is unreachable", "No route to host", "[Errno 101]", "[Errno 113]"]),
    ("timeout", "a package index did not answer in time",
     "try again; on a slow line raise pip's --timeout (PIP_DEFAULT_TIMEOUT)",
     ["ReadTimeoutError", "ConnectTimeoutError", "Read timed out", "timed out. (connect timeout"]),
    ("connection-lost", "the connection broke during a download",
     "try again; downloads that break repeatedly point to a proxy or an unstable connection",
     ["Connection reset by peer", "RemoteDisconnected", "IncompleteRead", "Connection broken", "ProtocolError"]),
]
_HTTP_ERROR = re.compile(r"HTTP error (\d{3}) while getting (\S+)|(\d{3}) (?:Client|Server) Error: .*? for url: (\S+)")
_NOT_FOUND = re.compile(r"No matching distribution found for (.+)$")
_VERSIONS = re.compile(r"Could not find a version that satisfies the requirement (.+?) \(from versions: (.*)\)\s*$")
_INDEXES = re.compile(r"^Looking in indexes: (.+)$")
_PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


def _first(lines: Sequence[str], needles: Sequence[str]) -> str:
    for line in lines:
        if any(n in line for n in needles):
            return line.strip()
    return ""


_CAUSE_TEXT = [re.compile(p) for p in (r"Failed to establish a new connection: [^'\")]+", r"Cannot connect to proxy",
                                        r"\[SSL[^\]]*\][^'\")]*", r"Read timed out[^'\")]*", r"\d{3} Proxy Authentication Required",
                                        r"Connection reset by peer", r"The repository located at \S+ is not a trusted or secure host")]


def _quote(line: str, width: int = 240) -> str:
    """The telling part of one of pip's lines: urllib3's reason rather than its retry bookkeeping."""
    for pattern in _CAUSE_TEXT:
        m = pattern.search(line)
        if m:
            return m.group(0).strip()
    line = re.sub(r"<[\w.]+ object at 0x[0-9a-f]+>: ", "", re.sub(r"^\s*(ERROR|WARNING): ", "", line.strip()))
    return line if len(line) <= width else line[:width] + "…"


def searched_indexes(lines: Sequence[str], argv: Sequence[str]) -> List[str]:
    """The indexes pip searched: its own "Looking in indexes" line, else the command's, else PyPI."""
    for line in lines:
        m = _INDEXES.match(line.strip())
        if m:
            return [u.strip() for u in m.group(1).split(",") if u.strip()]
    urls = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--index-url", "-i", "--extra-index-url")]
    if "--no-index" in argv:
        return urls
    return urls if any(a in ("--index-url", "-i") for a in argv) else ["https://pypi.org/simple", *urls]


def index_problem(url: str, timeout: float = 5.0) -> Tuple[str, str]:
    """``(kind, cause)`` when the index at ``url`` cannot be reached at all (its host does not
    resolve, or refuses or drops the connection), else ``("", "")``. Asked only when pip failed
    without saying why (``PIP_RETRIES=0`` hides connection errors), and not behind a proxy, where
    a direct connection proves nothing."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(os.environ.get(v) for v in _PROXY_ENV):
        return "", ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return "dns", f"{parts.hostname}: {exc.strerror or exc}"
    except OSError:
        return "", ""
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout).close()
    except ConnectionRefusedError as exc:
        return "connection-refused", f"{parts.hostname}:{port}: {exc.strerror or exc}"
    except socket.timeout:
        return "timeout", f"{parts.hostname}:{port}: no answer within {timeout:.0f} s"
    except OSError as exc:
        return "unreachable", f"{parts.hostname}:{port}: {exc.strerror or exc}"
    return "", ""


def _unreachable(indexes: Sequence[str], where: str, then: str, after: str) -> Optional[PipNetworkError]:
    """The network error for the first of ``indexes`` that cannot be reached at all, if any."""
    for url in indexes:
        kind, why = index_problem(url)
        if kind:
            what, hint = next((w, h) for k, w, h, _ in _NETWORK if k == kind)
            return PipNetworkError(f"pip failed: {what}: {redact([why])[0]}; indexes searched: {where}{then}",
                                   f"{hint}{after}", kind=kind, cause=why, code=f"pip-{kind}")
    return None


def pip_failure(lines: Sequence[str], argv: Sequence[str], after: str) -> PipError:
    """The error for a pip command that failed with output ``lines``: the root cause, not the last
    line (a host that does not resolve ends in "No matching distribution", or in "conflicting
    dependencies" when another index has other versions), quoted, with what to do about it."""
    after = f"; {after}" if after else ""
    indexes = searched_indexes(lines, argv)
    links = [m.group(1) for m in (re.match(r"^Looking in links: (.+)$", line.strip()) for line in lines) if m]
    where = ", ".join(redact(indexes + links)) or "no index"
    cause = _first(lines, ["No space left on device", "[Errno 28]"])
    if cause:
        return PipDiskFullError(f"pip failed: the disk is full ({_quote(cause)})", f"free disk space and try again{after}",
                                kind="disk-full", cause=cause)
    cause = _first(lines, ["DO NOT MATCH THE HASHES", "Expected sha256", "hash mismatch"])
    if cause:
        got = _first(lines, ["Got        ", "Got "])
        return PipHashMismatchError(f"pip failed: a downloaded file does not match its hash ({_quote(cause)}"
                                    + (f"; {_quote(got)}" if got else "") + ")",
                                    f"try again; if it repeats, the index or a proxy serves changed files{after}",
                                    kind="hash-mismatch", cause=cause)
    last = [line.strip() for line in lines if line.startswith("ERROR:")]
    then = f" (pip then said: {_quote(last[0])})" if last else ""
    for kind, what, hint, needles in _NETWORK:
        cause = _first(lines, needles)
        if cause:  # the root cause, even when pip ends with "no matching distribution" or a conflict
            return PipNetworkError(f"pip failed: {what}: {_quote(cause)}; indexes searched: {where}{then}",
                                   f"{hint}{after}", kind=kind, cause=cause, code=f"pip-{kind}")
    cause = next((line.strip() for line in lines if _HTTP_ERROR.search(line)), "")
    http = _HTTP_ERROR.search(cause)
    if http:
        status, url = http.group(1) or http.group(3), http.group(2) or http.group(4)
        hint = {"401": "the index wants credentials: put them in the index URL or pip's keyring",
                "403": "the index refuses this file: check credentials and the mirror's access rules",
                "404": "the index lists a file it does not serve: the mirror may be incomplete or mid-sync; try again later"
                }.get(status, "the index's server failed: try again later" if status.startswith("5") else "check the index")
        return PipNetworkError(f"pip failed: HTTP {status} for {redact([url])[0]} ({_quote(cause)})", f"{hint}{after}",
                               kind=f"http-{status}", cause=cause, code=f"pip-http-{status}")
    cause = _first(lines, ["requires a different Python"])
    if cause:
        return PipNotFoundError(f"pip failed: {_quote(cause.replace('ERROR: ', ''))}",
                                f"use a Python version the package supports for the target environment{after}",
                                kind="python", cause=cause)
    missing = next((m for m in (_NOT_FOUND.search(line) for line in lines) if m), None)
    if missing:
        versions = next((m for m in (_VERSIONS.search(line) for line in lines) if m), None)
        listed = versions.group(2).strip() if versions else ""
        if listed and listed != "none":
            return PipNotFoundError(f"pip failed: no version of {missing.group(1)} fits (available on {where}: {listed})",
                                    f"ask for one of the available versions, or add an index that has it{after}",
                                    kind="no-matching-version", cause=missing.group(0))
        unreachable = _unreachable(indexes, where, then, after)
        if unreachable is not None:
            return unreachable
        return PipNotFoundError(f"pip failed: no package {missing.group(1)} on {where}",
                                f"check the package name, or name an index (a mirror) that has it{after}",
                                kind="not-found", cause=missing.group(0))
    if _first(lines, ["ResolutionImpossible", "conflicting dependencies"]):
        unreachable = _unreachable(indexes, where, then, after)  # an index it could not reach leaves other versions
        if unreachable is not None:
            return unreachable
        start = next((i for i, line in enumerate(lines) if "The conflict is caused by" in line), None)
        detail = [] if start is None else [line.strip() for line in lines[start + 1:start + 7]
                                           if line.strip() and not line.startswith(("To fix", "ERROR"))]
        cannot = _first(lines, ["Cannot install", "conflicting dependencies"])
        return PipConflictError(f"pip failed: the requirements conflict ({_quote(cannot.replace('ERROR: ', ''))}"
                                + (f": {'; '.join(detail)}" if detail else "") + ")",
                                f"loosen or drop one of the conflicting requirements{after}", kind="conflict", cause=cannot)
    errors = [line.strip() for line in lines if line.startswith("ERROR:")]
    reason = errors[0] if errors else (lines[-1].strip() if lines else "no output")
    return PipError(f"pip failed: {_quote(reason)}", after[2:] or None, kind="other", cause=reason)


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
                      pip_python: str = sys.executable, index_url: Optional[str] = None,
                      extra_index_urls: Sequence[str] = ()) -> List[List[str]]:
    """``pip download`` of the plan's pip commands: the same requirements and indexes (with the
    user's mirror, as :func:`with_indexes` applies it), binary wheels only, for the target's Python
    ``python_version`` (``"3.11"``) and, when given, the target's ``platforms`` (pip tags such as
    ``manylinux_2_28_x86_64``; default: this machine's).

    Several commands (torch, then the engine's packages) become one download, resolved once: the
    engine's packages require torch, which an install finds installed but separate downloads would
    each resolve again (another torch from PyPI, other versions of shared dependencies, and a
    bundle can hold one version of each). The torch command's index is searched as well, so the
    pin picks the planned build (``2.13.0+cpu`` sorts above PyPI's ``2.13.0``)."""
    target = ["--only-binary=:all:", "--python-version", python_version]
    for tag in platforms:
        target += ["--platform", tag]
    commands = with_indexes(plan.commands, index_url, extra_index_urls)
    for cmd in commands:
        if cmd.tool != "pip" or cmd.argv[:4] != [PYTHON_PLACEHOLDER, "-m", "pip", "install"]:
            raise TorchInstallError(f"the plan's command {cmd.render()} is not a pip install; it cannot be bundled",
                                    action=Action.REPORT_BUG)
    if len(commands) == 1:
        return [[pip_python, "-m", "pip", "download", "--dest", str(dest), *target, *commands[0].argv[4:]]]
    parts = [_pip_parts(cmd.argv[4:]) for cmd in commands]
    requirements = list(dict.fromkeys(r for p in parts for r in p["requirements"]))
    index = next((p["index"][0] for p in parts[1:] if p["index"]), "")  # the later commands': PyPI or the mirror
    extras = list(dict.fromkeys([*parts[0]["index"], *(u for p in parts for u in p["extra"])]))
    argv = [pip_python, "-m", "pip", "download", "--dest", str(dest), *target, *requirements]
    argv += ["--index-url", index] if index else []
    for url in extras:
        if url != index:
            argv += ["--extra-index-url", url]
    for path in dict.fromkeys(f for p in parts for f in p["find_links"]):
        argv += ["--find-links", path]
    return [argv]


def _pip_parts(args: Sequence[str]) -> Dict[str, List[str]]:
    """A pip install's arguments sorted out: requirements, ``--index-url``, extra indexes, find-links."""
    out: Dict[str, List[str]] = {"requirements": [], "index": [], "extra": [], "find_links": []}
    which = {"--index-url": "index", "-i": "index", "--extra-index-url": "extra", "--find-links": "find_links", "-f": "find_links"}
    it = iter(args)
    for arg in it:
        if arg in which:
            out[which[arg]].append(next(it, ""))
        elif not arg.startswith("-"):
            out["requirements"].append(arg)
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
