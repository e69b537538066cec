"""``Settings``: every path and option accelstack uses, resolved once and passed down.

Order of precedence, for each field: an explicit argument, then its ``ACCELSTACK_*`` variable,
then the platform's convention (platformdirs: XDG on Linux, ``~/Library`` on macOS,
``%LOCALAPPDATA%`` on Windows). Nothing below the core looks up a path or a variable of its own,
so an app that embeds accelstack controls all of it from one object, and ``--home`` on the
command line moves everything that belongs to a home (receipts, rollback watermarks, remembered
manifests) together.

Resolution takes the platform as data (``os_name``, ``env``) so the rules for Windows and macOS
are tested on Linux.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path, PureWindowsPath
from typing import Any, Dict, List, Mapping, Optional

from .errors import Action, UsageError

__all__ = ["APP", "ENV", "PROXY_ENV", "Timeouts", "Channel", "Settings", "current_env", "inherited_env", "cuda_env",
           "debug_requested", "log_level", "current_os", "platform_dirs", "check_directory", "check_path_length",
           "PATH_ROOM"]

APP = "accelstack"

ENV = {
    "home": "ACCELSTACK_HOME",
    "cache": "ACCELSTACK_CACHE",
    "build_cache": "ACCELSTACK_BUILD_CACHE",
    "probe_cache": "ACCELSTACK_PROBE_CACHE",
    "config_file": "ACCELSTACK_CONFIG",
    "config_dir": "ACCELSTACK_CONFIG_DIR",  # user configuration: trusted-keys/
    "offline": "ACCELSTACK_OFFLINE",
    "backend": "ACCELSTACK_BACKEND",
    "trusted_keys": "ACCELSTACK_TRUSTED_KEYS",  # os.pathsep-separated keys or .pub files
    "manifests": "ACCELSTACK_MANIFESTS",  # whitespace-separated URLs
    "channel": "ACCELSTACK_CHANNEL",  # whitespace-separated channel names to use
    "index_url": "ACCELSTACK_INDEX_URL",  # torch: the package index used instead of PyPI (a mirror)
    "extra_index_urls": "ACCELSTACK_EXTRA_INDEX_URL",  # torch: whitespace-separated extra indexes
    "cuda_archs": "ACCELSTACK_CUDA_ARCHS",  # ggml builds: "90" or "86,90" (a publisher's build for fewer GPUs)
    "min_rate": "ACCELSTACK_MIN_RATE",  # bytes per second a fetch must average (0: no overall deadline)
}

# torch: a proxy pip goes through (as pip and requests read them); see Settings.proxied
PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass
class Timeouts:
    """Seconds before an external step is given up (every subprocess has one)."""

    detect: float = 5.0  # one hardware probe (nvidia-smi, PowerShell, system_profiler)
    pip: float = 3600.0  # one pip/uv command (a multi-GB CUDA torch on a slow line)
    venv: float = 300.0  # creating a virtual environment
    probe: float = 120.0  # asking an interpreter or the runtime a question
    lock_wait: float = 0.0  # waiting for another accelstack process to release the home
    connect: float = 15.0  # opening a connection; also the least time any fetch gets
    read: float = 60.0  # silence between two reads
    min_rate: float = 64 * 1024.0  # bytes/s a fetch must average: its deadline is connect + bytes / min_rate
    document: float = 60.0  # the most a document (a manifest, its signature, an index page) may add to ``connect``
    status_network: float = 3.0  # `status`'s upgrade check: seconds on the network before the last answer is shown


@dataclass
class Channel:
    """A named source of ggml builds: its manifest URL (mirrors after it) and the keys that must sign it.

    ``keys`` (base64 public keys, or paths of ``.pub`` files) pin the channel's trust: when given,
    only they verify its manifest, so a key trusted for one channel never signs for another. With
    none, the globally trusted keys (shipped, the user's trusted-keys directory) apply. During a
    key rotation a channel lists both the current and the next key."""

    name: str
    url: str
    mirrors: List[str] = field(default_factory=list)
    keys: List[str] = field(default_factory=list)


@dataclass
class Settings:
    """Where things live and how accelstack behaves; see the module docstring for precedence."""

    home: Path
    cache: Path
    build_cache: Path
    probe_cache: Path
    config_file: Path
    config_dir: Path  # user-level configuration: trusted-keys/, channels
    offline: bool = False
    backend: str = ""  # a forced backend ("" = choose)
    manifests: List[str] = field(default_factory=list)  # ggml manifest URLs (or paths)
    channels: List[Channel] = field(default_factory=list)  # the embedding app's own channels (before the user's)
    channel: List[str] = field(default_factory=list)  # use only these channels, by name ("" = every configured one)
    trusted_keys: List[str] = field(default_factory=list)  # extra keys: base64 text or .pub paths
    insecure_unsigned: bool = False  # accept unsigned manifests (a mirror you control)
    allow_build: bool = True  # build ggml locally when no published build fits
    torch_venv: Optional[Path] = None  # torch: install into this virtual environment (created if missing)
    torch_python: str = ""  # torch: install into this interpreter ("" = the one running accelstack)
    use_uv: bool = False  # torch: run uv instead of pip when it is on PATH
    index_url: Optional[str] = None  # torch: a package index used where PyPI would be (a mirror); None = PyPI
    extra_index_urls: List[str] = field(default_factory=list)  # torch: indexes pip searches as well
    torch_engine: bool = True  # torch: install the generation engine's packages (diffusers...) with torch
    proxied: bool = False  # torch: pip goes through a proxy (PROXY_ENV): a failed pip's indexes are not tried directly
    cuda_archs: str = ""  # ggml builds: the CUDA architectures to compile, as written ("" = every one)
    cuda_env: Dict[str, str] = field(default_factory=dict)  # ggml builds: where a CUDA toolkit is (cuda_env())
    timeouts: Timeouts = field(default_factory=Timeouts)

    # -- derived paths: one rule each ---------------------------------------------------------
    @property
    def state_dir(self) -> Path:
        return self.home / "state"

    @property
    def rollback_state(self) -> Path:
        """The highest manifest version seen per source (rollback protection), per home."""
        return self.state_dir / "manifest-versions.json"

    @property
    def remembered(self) -> Path:
        """Manifests an install used, so status/upgrade keep working without repeating them."""
        return self.home / "settings.json"

    @property
    def verify_dir(self) -> Path:
        """``verify``'s probe images (``verify-<backend>.png``) and its records of them (probe_record)."""
        return self.cache / "verify"

    @property
    def detect_cache(self) -> Path:
        """Detection's kept probe answers (the Vulkan enumeration), remade when what they depend on changes."""
        return self.cache / "detect"

    @property
    def user_keys_dir(self) -> Path:
        return self.config_dir / "trusted-keys"

    @property
    def channels_file(self) -> Path:
        """The user's channels (``accelstack channel add``); a hand-written ``channels.yaml`` beside it is read too."""
        return self.config_dir / "channels.json"

    @classmethod
    def resolve(cls, *, env: Optional[Mapping[str, str]] = None, os_name: Optional[str] = None,
                **overrides: Any) -> Settings:
        """Settings from ``overrides`` (None = not given), then ``env`` (default ``os.environ``),
        then the platform's directories for ``os_name`` (default: this machine's)."""
        env = os.environ if env is None else env
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
        given: Dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
        dirs = platform_dirs(os_name or current_os(), env)

        def argument(name: str, default: Path) -> Path:
            return Path(given[name]).expanduser() if name in given else default

        def path(name: str, default: Path) -> Path:
            return argument(name, _env_path(env, name) or default)

        cache = path("cache", dirs["cache"])
        out = cls(
            home=argument("home", cls.resolve_home(env=env, os_name=os_name)),
            cache=cache,
            build_cache=path("build_cache", cache / "builds"),
            probe_cache=path("probe_cache", cache / "probe"),
            config_file=path("config_file", dirs["config"] / "config.yaml"),
            config_dir=path("config_dir", dirs["config"]),
        )
        out.offline = bool(given["offline"]) if "offline" in given else _flag(env, ENV["offline"])
        out.backend = str(given.get("backend", env.get(ENV["backend"], ""))).strip()
        out.manifests = _strings(given["manifests"]) if "manifests" in given else env.get(ENV["manifests"], "").split()
        out.channel = _strings(given["channel"]) if "channel" in given else env.get(ENV["channel"], "").split()
        if "channels" in given:
            out.channels = [_channel(c) for c in given["channels"]]
        keys = env.get(ENV["trusted_keys"], "")
        out.trusted_keys = _strings(given["trusted_keys"]) if "trusted_keys" in given else [k for k in keys.split(os.pathsep) if k]
        if "torch_venv" in given:
            out.torch_venv = Path(given["torch_venv"]).expanduser()
        out.torch_python = str(given.get("torch_python", ""))
        out.index_url = str(given["index_url"]).strip() if "index_url" in given else env.get(ENV["index_url"], "").strip()
        out.index_url = out.index_url or None
        extras = _strings(given["extra_index_urls"]) if "extra_index_urls" in given else env.get(ENV["extra_index_urls"], "").split()
        out.extra_index_urls = [u.strip() for u in extras if u.strip()]
        out.cuda_archs = str(given.get("cuda_archs", env.get(ENV["cuda_archs"], ""))).strip()
        out.cuda_env = dict(given["cuda_env"]) if "cuda_env" in given else cuda_env(env)
        out.proxied = bool(given["proxied"]) if "proxied" in given else any(env.get(v) for v in PROXY_ENV)
        for name in ("insecure_unsigned", "allow_build", "use_uv", "torch_engine"):
            if name in given:
                setattr(out, name, bool(given[name]))
        if "timeouts" in given:
            out.timeouts = given["timeouts"]
        rate = env.get(ENV["min_rate"], "").strip()
        if rate and out.timeouts.min_rate == Timeouts.min_rate:  # an app's own rate wins over the variable
            out.timeouts = dataclasses.replace(out.timeouts, min_rate=_rate(rate))
        if os_name is None or os_name == current_os():  # paths of this machine: refuse files now
            out.check_directories()
        return out

    def check_directories(self) -> None:
        """Raise :class:`UsageError` if a directory setting names an existing file, or a path under one.

        Checked when settings are resolved, before anything is created: otherwise the first
        ``mkdir`` deep inside an install fails with "File exists" or "Not a directory".
        """
        for name, what, action in (("home", "the runtime home", Action.CHOOSE_HOME),
                                   ("cache", "the download cache", Action.FIX_INPUT),
                                   ("build_cache", "the build cache", Action.FIX_INPUT),
                                   ("probe_cache", "the probe cache", Action.FIX_INPUT),
                                   ("config_dir", "the configuration directory", Action.FIX_INPUT)):
            check_directory(getattr(self, name), what, f"--home or {ENV[name]}" if name == "home" else ENV[name], action)
        check_path_length(self.config_file, "the config file", f"--config or {ENV['config_file']}", Action.FIX_INPUT,
                          room=0)
        if self.torch_venv is not None:
            check_path_length(self.torch_venv, "the torch virtual environment", "--venv", Action.FIX_INPUT)

    @staticmethod
    def resolve_home(*, env: Optional[Mapping[str, str]] = None, os_name: Optional[str] = None) -> Path:
        """The home rule, which :meth:`resolve` applies when no argument names a home:
        ``ACCELSTACK_HOME``, else the platform's data directory. It reads only the variables that
        rule needs: detection applies it to a captured machine's environment, which records every
        variable read (and must not fail on a bad ``ACCELSTACK_OFFLINE`` there)."""
        env = os.environ if env is None else env
        return _env_path(env, "home") or platform_dirs(os_name or current_os(), env)["data"]

    def replace(self, **changes: Any) -> Settings:
        """A copy with some fields changed (None values are ignored, like in :meth:`resolve`)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


def current_env() -> Dict[str, str]:
    """A copy of this process's environment, for resolving settings against variants of it
    (``doctor`` names which variable is bad by resolving without it)."""
    return dict(os.environ)


def inherited_env(**extra: str) -> Dict[str, str]:
    """The environment a child process starts from: this process's own, plus ``extra``. Building a
    child's environment is not reading a setting; it is here so that only this module touches
    ``os.environ``."""
    return {**os.environ, **extra}


def cuda_env(env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The variables that say where a system CUDA toolkit is (``CUDA_HOME``, ``CUDA_PATH``,
    ``CUDA_ROOT``, Windows' ``CUDA_PATH_V12_8``, and ``PATH`` for an nvcc on it), from ``env``
    (default ``os.environ``): all a ggml build's toolkit search reads."""
    env = os.environ if env is None else env
    return {k: v for k, v in env.items() if k in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "PATH") or k.startswith("CUDA_PATH_V")}


def debug_requested(env: Optional[Mapping[str, str]] = None) -> bool:
    """``ACCELSTACK_DEBUG`` (any value): the CLI shows tracebacks and debug logs, as ``--debug`` does."""
    return bool((os.environ if env is None else env).get("ACCELSTACK_DEBUG"))


def log_level(env: Optional[Mapping[str, str]] = None) -> str:
    """``ACCELSTACK_LOG`` (``debug``, ``info``...): the level of library logs the CLI shows on
    stderr, upper-cased; "" when unset."""
    return (os.environ if env is None else env).get("ACCELSTACK_LOG", "").upper()


def current_os() -> str:
    if sys.platform.startswith("win"):
        return "windows"
    if sys.platform == "darwin":
        return "macos"
    return "linux"


def platform_dirs(os_name: str, env: Mapping[str, str]) -> Dict[str, Path]:
    """The per-user data, cache and config directories on ``os_name``.

    On a live macOS or Windows machine (its own OS and ``os.environ``) platformdirs answers
    (Windows asks the shell for its folders). Elsewhere the same layout platformdirs uses is
    applied to ``env``: Windows ``%LOCALAPPDATA%\\accelstack`` (cache in ``Cache`` below it),
    macOS ``~/Library/Application Support`` and ``~/Library/Caches``, Linux the XDG variables:
    on Linux that rule is all platformdirs does, so the live machine uses it too and a cold
    ``accelstack detect`` does not load platformdirs (tests/test_settings.py checks they agree).
    """
    if os_name == current_os() and env is os.environ and os_name != "linux":
        pd = importlib.import_module("platformdirs").PlatformDirs(APP, appauthor=False)
        return {"data": Path(pd.user_data_dir), "cache": Path(pd.user_cache_dir), "config": Path(pd.user_config_dir)}
    if os_name == "windows":
        local = env.get("LOCALAPPDATA") or str(PureWindowsPath(env.get("USERPROFILE", "C:\\Users\\Default"), "AppData", "Local"))
        data = Path(str(PureWindowsPath(local, APP)))
        return {"data": data, "cache": Path(str(PureWindowsPath(local, APP, "Cache"))), "config": data}
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    if os_name == "macos":
        support = home / "Library" / "Application Support" / APP
        return {"data": support, "cache": home / "Library" / "Caches" / APP, "config": support}

    def xdg(var: str, default: Path) -> Path:
        value = env.get(var, "").strip()
        return Path(value) if value and Path(value).is_absolute() else default

    return {"data": xdg("XDG_DATA_HOME", home / ".local" / "share") / APP,
            "cache": xdg("XDG_CACHE_HOME", home / ".cache") / APP,
            "config": xdg("XDG_CONFIG_HOME", home / ".config") / APP}


# Room left below a directory setting for the deepest path accelstack makes inside it
# (runtimes/<stack>/<id>/ then a wheel's own paths; a torch environment's site-packages).
PATH_ROOM = 256
_PATH_MAX = os.pathconf("/", "PC_PATH_MAX") if hasattr(os, "pathconf") else 0  # 4096 on Linux; Windows: none said


def check_path_length(path: Path, what: str, option: str = "", action: Action = Action.FIX_INPUT,
                      room: int = PATH_ROOM) -> None:
    """Raise :class:`UsageError` when ``path`` (with ``room`` bytes for what goes inside it) is longer
    than the system takes (PATH_MAX), or a name in it is over 255 bytes (NTFS: UTF-16 units):
    otherwise the first ``stat`` or ``mkdir`` deep inside a command dies with "File name too long"."""
    size, limit = len(os.fsencode(str(path))), _PATH_MAX
    longest = max((len(part) if os.name == "nt" else len(os.fsencode(part)) for part in path.parts), default=0)
    shown = str(path) if len(str(path)) <= 120 else f"{str(path)[:60]}...{str(path)[-40:]}"
    too_long = f"a name in it is {longest} bytes long, more than the 255 a name can have" if longest > 255 else ""
    if not too_long and limit and size + room > limit:
        too_long = (f"it is {size} bytes long; this system takes paths of up to {limit} bytes" +
                    (f" and {what} needs {room} of them for what accelstack keeps inside it" if room else ""))
    if too_long:
        raise UsageError(f"the path of {what}{f' ({option})' if option else ''} is too long: {too_long} ({shown})",
                         f"choose a writable directory with a shorter path for {what}" if room else
                         f"choose a shorter path for {what}", action=action)


def check_directory(path: Path, what: str, option: str = "", action: Action = Action.FIX_INPUT) -> None:
    """Raise :class:`UsageError` when ``path`` exists and is not a directory (a link to one is
    fine), or when the nearest existing path above it is not one (it could never be created),
    or when it is too long for this system (:func:`check_path_length`)."""
    check_path_length(path, what, option, action)
    for candidate in (path, *path.parents):
        try:
            st = candidate.stat()
        except (FileNotFoundError, NotADirectoryError):
            continue
        except (OSError, ValueError):  # unreadable, or a NUL in the path: the step that uses it reports it
            return
        if stat.S_ISDIR(st.st_mode):
            return
        where = "is a file, not a directory" if candidate == path else f"is under {candidate}, which is a file, not a directory"
        name = f" ({option})" if option else ""
        raise UsageError(f"{what}{name} {path} {where}", f"choose a directory for {what}: a new path, or an existing "
                         "directory", action=action)


def _env_path(env: Mapping[str, str], name: str) -> Optional[Path]:
    value = env.get(ENV[name], "")
    return Path(value).expanduser() if value else None


def _strings(value: Any) -> List[str]:
    """A list argument; one string is one item (not a list of its characters)."""
    return [str(value)] if isinstance(value, (str, Path)) else [str(v) for v in value]


def _channel(value: Any) -> Channel:
    """A channel argument: a :class:`Channel`, or a mapping with its fields (an app's own config)."""
    if isinstance(value, Channel):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("name"), str) and isinstance(value.get("url"), str):
        return Channel(value["name"], value["url"], _strings(value.get("mirrors", [])), _strings(value.get("keys", [])))
    raise UsageError(f"a channel needs a name and a manifest URL, got {value!r}")


def _rate(value: str) -> float:
    """``ACCELSTACK_MIN_RATE``: bytes per second, a plain number (``65536``; ``0`` turns the deadline off)."""
    if not (value.isascii() and value.replace(".", "", 1).isdigit()):
        raise UsageError(f"{ENV['min_rate']} must be a number of bytes per second (65536 is 64 KiB/s, 0 turns the "
                         f"overall deadline off), got {value!r}")
    return float(value)


def _flag(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise UsageError(f"{name} must be 1 or 0, got {value!r}")

