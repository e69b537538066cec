"""``doctor``: everything a support request needs, in one report, from a machine in any state.

Each section is gathered on its own and a section that fails becomes a problem in the report
(``problems``), never an exception: a broken home, an unreadable channels file or a detection
that times out is exactly what the report is for. It only reads: no lock is taken, nothing is
created or repaired (runtime health comes from the installer's read-only status).

:func:`write_bundle` puts the report and a detection capture (every file and command output
detection read, replayable with ``accelstack detect --replay``) into one archive for a bug report.
"""
from __future__ import annotations

import io
import json
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

from .. import __version__
from ..fsio import replacing
from ..installer.home import Home
from ..installer.maintenance import local_status
from ..manifests.channels import channel_trust, read_user_channels
from ..manifests.keys import TrustStore
from ..publisher.variants import TOOLCHAINS
from ..serde import to_dict
from ..settings import ENV, Settings, current_env, current_os, platform_dirs
from .caches import cache_infos
from .detection import detect
from .planning import hardware_fingerprint, remembered_channels

__all__ = ["DoctorReport", "PathInfo", "Tool", "doctor", "write_bundle", "TOOLS", "path_origins", "version_line"]

# Tools a build or a GPU check may need: (name shown, executables tried in order, version flag).
TOOLS = [
    ("cmake", ["cmake"], "--version"),
    ("c++ compiler", ["c++", "g++", "clang++", "cl"], "--version"),
    ("ninja", ["ninja"], "--version"),
    ("git", ["git"], "--version"),
    ("nvcc", ["nvcc"], "--version"),
    ("glslc", ["glslc"], "--version"),
    ("vulkaninfo", ["vulkaninfo"], "--version"),
]
TOOL_TIMEOUT = 10.0
BUILD_VARIANTS = ("cpu", "vulkan", "cuda")


@dataclass
class PathInfo:
    name: str  # "home", "cache", "build_cache", "probe_cache", "config_file", "config_dir", "state"
    path: str
    origin: str  # "argument", "ACCELSTACK_HOME", ..., "default", "derived from home"
    exists: bool = False


@dataclass
class Tool:
    name: str
    found: bool
    path: str = ""
    version: str = ""  # the first line of its --version


@dataclass
class DoctorReport:
    accelstack: Dict[str, str] = field(default_factory=dict)  # version, python, executable, os, machine
    paths: List[PathInfo] = field(default_factory=list)
    channels: List[Dict[str, Any]] = field(default_factory=list)
    trusted_keys: List[Dict[str, str]] = field(default_factory=list)  # keyid, origin
    runtimes: List[Dict[str, Any]] = field(default_factory=list)  # per stack, from the installer's status
    caches: List[Dict[str, Any]] = field(default_factory=list)  # name, path, size, entries
    toolchain: List[Tool] = field(default_factory=list)
    can_build: Dict[str, List[str]] = field(default_factory=dict)  # variant -> missing tools ([] = can build)
    hardware: Dict[str, Any] = field(default_factory=dict)  # the detection report
    hardware_problems: List[Dict[str, str]] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)  # sections doctor could not read, and why
    seconds: float = 0.0

    __derived__ = ("ok",)

    @property
    def ok(self) -> bool:
        """No section failed, every active runtime is healthy, detection found no error."""
        return (not self.problems and all(r.get("healthy", True) for r in self.runtimes if r.get("active"))
                and not any(p.get("severity") == "error" for p in self.hardware_problems))


def path_origins(settings: Settings, given: Mapping[str, Any], env: Optional[Mapping[str, str]] = None,
                 os_name: Optional[str] = None) -> List[PathInfo]:
    """Each path setting and where it came from: ``argument`` (``given`` names it), its
    ``ACCELSTACK_*`` variable, or ``default`` (the platform's directory, or one derived from
    another setting), found by resolving again without each source."""
    env = current_env() if env is None else env
    dirs = platform_dirs(os_name or current_os(), env)
    out = []
    for name in ("home", "cache", "build_cache", "probe_cache", "config_file", "config_dir"):
        value = Path(getattr(settings, name))
        if given.get(name) is not None:
            origin = "argument"
        elif env.get(ENV[name]) and Path(env[ENV[name]]).expanduser() == value:
            origin = ENV[name]
        else:
            origin = "default"
            if name in ("build_cache", "probe_cache") and value.parent == settings.cache and settings.cache != dirs["cache"]:
                origin = "default (inside the cache)"
        out.append(PathInfo(name, str(value.absolute()), origin, value.exists()))  # a relative one: where it really is
    out.append(PathInfo("state", str(settings.state_dir), "inside the home", settings.state_dir.exists()))
    return out


def _which(names: List[str]) -> str:
    for n in names:
        found = shutil.which(n)
        if found:
            return found
    return ""


def _version(cmd: List[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT, stdin=subprocess.DEVNULL,
                              errors="replace")
    except (OSError, subprocess.SubprocessError) as exc:
        return f"(could not run: {exc})"
    lines = [line.strip() for line in (done.stdout or done.stderr).splitlines() if line.strip()]
    if not lines:
        return f"(exit {done.returncode}, no output)"
    return version_line(lines)[:200]


def version_line(lines: List[str]) -> str:
    """The line of a ``--version`` output that gives the version: one saying ``release`` or
    ``version`` with a number (nvcc's "Cuda compilation tools, release 12.4, V12.4.131", not its
    "Copyright (c) 2005-2024" or "Built on" lines), else the first with a dotted number."""
    dotted = re.compile(r"\d+\.\d+")
    named = [line for line in lines if re.search(r"(?i)\b(release|version)\b", line) and dotted.search(line)]
    numbered = [line for line in lines if dotted.search(line) and not re.match(r"(?i)(copyright|built on)\b", line)]
    return (named or numbered or lines)[0]


def toolchain() -> List[Tool]:
    """Which build and GPU tools are on PATH, with their versions (asked in parallel), and pip."""
    found = [(name, _which(names), flag) for name, names, flag in TOOLS]
    jobs: Dict[int, List[str]] = {i: [path, flag] for i, (_n, path, flag) in enumerate(found) if path}
    pip_cmd = [sys.executable, "-m", "pip", "--version"]
    with ThreadPoolExecutor(max_workers=4) as pool:
        versions = {i: pool.submit(_version, cmd) for i, cmd in jobs.items()}
        pip = pool.submit(_version, pip_cmd)
        out = [Tool(name, bool(path), path, versions[i].result() if i in versions else "")
               for i, (name, path, _f) in enumerate(found)]
        pip_text = pip.result()
    out.append(Tool("pip", pip_text.startswith("pip "), f"{sys.executable} -m pip", pip_text))
    return out


def _settings_anyway(report: DoctorReport, home: Any) -> Settings:
    """Settings from the environment; when a variable is bad (``ACCELSTACK_OFFLINE=maybe``, a file
    as the home), the report names it and the rest is resolved without the option variables, then
    (a bad path) without any ``ACCELSTACK_*`` variable, so every other section can still run."""
    options = {ENV[k] for k in ("offline", "backend", "channel", "manifests", "trusted_keys", "min_rate")}
    environ = current_env()
    attempts = [environ, {k: v for k, v in environ.items() if k not in options},
                {k: v for k, v in environ.items() if not k.startswith("ACCELSTACK_")}]
    for n, env in enumerate(attempts):
        try:
            return Settings.resolve(env=env, home=home if n < 2 else None)
        except Exception as exc:  # reported; the next attempt leaves more out
            if n == 0:
                report.problems.append(f"settings: {getattr(exc, 'message', exc)}")
    return Settings.resolve(env={})


def _section(report: DoctorReport, name: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:  # doctor reports a broken part; it never fails on one
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        report.problems.append(f"{name}: {message}")


def doctor(settings: Optional[Settings] = None, *, given: Optional[Mapping[str, Any]] = None,
           system: Any = None, hardware: Any = None) -> DoctorReport:
    """The support report for ``settings`` (default: resolved from the environment). ``given``
    names the settings that came from arguments; ``system`` (a detect System, e.g. a
    CapturingSystem for a bundle) or an already made ``hardware`` report is used for detection."""
    start = time.perf_counter()
    report = DoctorReport()
    report.accelstack = {"version": __version__, "python": sys.version.split()[0], "python_build": sys.version,
                         "executable": sys.executable, "os": platform.platform(), "machine": platform.machine(),
                         "package": str(Path(__file__).resolve().parents[1])}
    st = settings if settings is not None else _settings_anyway(report, (given or {}).get("home"))

    def paths() -> None:
        report.paths = path_origins(st, given or {})

    def trust() -> None:
        store = TrustStore([TrustStore.key_arg(k) for k in st.trusted_keys], user_dir=st.user_keys_dir)
        keys = [store.get(k) for k in store.keyids]
        report.trusted_keys = [{"keyid": k.keyid, "origin": k.origin} for k in keys if k is not None]

    def channels() -> None:
        def row(c: Any, origin: str) -> Dict[str, Any]:
            return {"name": c.name, "url": c.url, "mirrors": list(c.mirrors), "trust": channel_trust(c), "origin": origin}

        rows = [row(c, "app") for c in st.channels]
        rows += [row(c, f"user ({st.channels_file})") for c in read_user_channels(st)]
        names = {r["name"] for r in rows}
        rows += [row(c, f"last install ({st.home})") for c in remembered_channels(st) if c.name not in names]
        rows += [{"name": "", "url": u, "mirrors": [], "trust": "globally trusted keys", "origin": "ACCELSTACK_MANIFESTS"}
                 for u in st.manifests]
        report.channels = rows

    found: Dict[str, Any] = {"hardware": hardware}

    def detect_hw() -> None:
        hw = found["hardware"] = hardware if hardware is not None else detect(system, settings=st, write_cache=False)
        report.hardware = to_dict(hw)
        report.hardware_problems = [{"code": p.code, "severity": p.severity, "message": p.message, "hint": p.hint}
                                    for p in hw.problems]

    def runtimes() -> None:
        hw = found["hardware"]
        home = Home(st.home)
        if not home.root.is_dir():
            report.runtimes = []
            return
        for status in local_status(home, hardware_fingerprint(hw) if hw is not None else None):
            r = status.receipt
            report.runtimes.append({
                "stack": status.stack, "active": status.active, "previous": status.previous,
                "healthy": status.healthy if status.active else None, "installed": status.installed,
                "runtime_path": status.runtime_path, "backend": r.backend if r else "",
                "manifest_source": r.manifest_source if r else "", "manifest_version": r.manifest_version if r else 0,
                "installed_at": r.installed_at if r else "", "verified_at": r.verified_at if r else "",
                "verified": bool(r and r.verification.ok), "missing_files": status.missing_files,
                "hardware_matches": status.hardware_matches,
                "problems": [p.message for p in status.problems]})

    def caches() -> None:
        report.caches = [{"name": c.name, "path": c.path, "exists": c.exists, "size": c.size, "entries": c.count}
                         for c in cache_infos(st)]

    def tools() -> None:
        report.toolchain = toolchain()
        report.can_build = {v: [t for t in TOOLCHAINS[v] if shutil.which(t) is None] for v in BUILD_VARIANTS}

    for name, fn in (("paths", paths), ("trusted keys", trust), ("channels", channels), ("hardware", detect_hw),
                     ("runtimes", runtimes), ("caches", caches), ("toolchain", tools)):
        _section(report, name, fn)
    report.seconds = round(time.perf_counter() - start, 3)
    return report


def write_bundle(path: Path, report: DoctorReport, capture_dir: Optional[Path], text: str = "") -> Path:
    """Write ``report`` (``doctor.json``, and ``doctor.txt`` when ``text``) and the detection
    capture in ``capture_dir`` (under ``capture/``) into ``path``: a ``.zip``, or a ``.tar.gz`` /
    ``.tgz`` by its name. Written beside it and renamed, so a failed write leaves no half file."""
    path = Path(path)
    doc = json.dumps(to_dict(report), indent=2, default=str).encode()
    members: List[tuple] = [("doctor.json", doc)]
    if text:
        members.append(("doctor.txt", text.encode()))
    files = sorted(p for p in capture_dir.rglob("*") if p.is_file() and not p.is_symlink()) if capture_dir else []
    with replacing(path, mode=0o600, make_parents=True) as fh:  # what a machine showed: for its owner's eyes
        if path.name.lower().endswith((".tar.gz", ".tgz")):
            with tarfile.open(fileobj=fh, mode="w:gz") as tar:
                for name, data in members:
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime = len(data), int(time.time())
                    tar.addfile(info, io.BytesIO(data))
                for f in files:
                    tar.add(str(f), arcname=f"capture/{f.relative_to(capture_dir).as_posix()}", recursive=False)  # type: ignore[arg-type]
        else:
            with zipfile.ZipFile(fh, "w", zipfile.ZIP_DEFLATED) as zf:
                for name, data in members:
                    zf.writestr(name, data)
                for f in files:
                    zf.write(f, f"capture/{f.relative_to(capture_dir).as_posix()}")  # type: ignore[arg-type]
    return path
