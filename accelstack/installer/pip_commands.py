"""The pip commands an install runs, as data: a user's package indexes (a mirror) applied to the
plan's commands, and the commands of an offline bundle (``pip download`` for the target, then an
install of only the bundled wheels, each pinned by its sha256).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion

from ..errors import Action
from ..manifests.plan import PYTHON_PLACEHOLDER, Command, Plan
from .errors import TorchInstallError

__all__ = ["with_indexes", "download_commands", "wheel_pin", "hashed_requirements", "local_install_command"]

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
