"""Reading torchruntime's pip commands back: which ones install torch, from which platform's index.

``installer.run_commands`` does not run a torch command as it is: its torch packages and the
platform its index names become accelstack's plan, installed as one transaction (the previous
torch comes back if pip or the check fails); every other command runs as given.
"""
from __future__ import annotations

import subprocess
from typing import List, Optional, Sequence, Tuple

from packaging.requirements import InvalidRequirement, Requirement

from .errors import CompatUsageError

__all__ = ["PYTORCH_INDEX", "TORCH_PACKAGES", "is_torch", "torch_command", "run_plain"]

PYTORCH_INDEX = "https://download.pytorch.org/whl"
TORCH_PACKAGES = ("torch", "torchvision", "torchaudio")
# options a torch command may carry: none changes the plan (it names exact versions and their dependencies)
_TAKEN = ("--upgrade", "-U", "-q", "--quiet", "--no-cache-dir", "--no-deps", "--no-warn-script-location")


def is_torch(arg: str) -> bool:
    try:
        return Requirement(arg.strip()).name.lower() in TORCH_PACKAGES
    except InvalidRequirement:
        return False


def torch_command(cmd: Sequence[str]) -> Optional[Tuple[List[str], str, bool, List[str]]]:
    """(torch requirements, platform, uv, other packages) when ``cmd`` is a pip/uv install of torch
    packages, else None. The platform is the last part of a download.pytorch.org index URL ("cu128");
    "" without one. A pip option other than the index and --upgrade raises :class:`~.errors.CompatUsageError`."""
    args = list(cmd)
    if args[:3] == ["uv", "pip", "install"]:
        uv, rest = True, args[3:]
    elif len(args) >= 4 and args[1:4] == ["-m", "pip", "install"]:
        uv, rest = False, args[4:]
    else:
        return None
    if not any(is_torch(a.strip()) for a in rest if not a.startswith("-")):
        return None
    where, reqs, others = "", [], []  # type: Tuple[str, List[str], List[str]]
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg in ("--index-url", "-i") and i + 1 < len(rest):
            url = rest[i + 1].rstrip("/")
            where = url[len(PYTORCH_INDEX) + 1:] if url.startswith(PYTORCH_INDEX + "/") else url
            i += 2
            continue
        if arg.startswith("-") and arg not in _TAKEN:
            raise CompatUsageError(f"the pip option {arg!r} is not taken by accelstack's install",
                                   hint="torch commands take package names, an index URL and --upgrade")
        if not arg.startswith("-"):
            (reqs if is_torch(arg) else others).append(arg.strip())
        i += 1
    return reqs, where, uv, others


def run_plain(cmd: Sequence[str]) -> None:
    """A command that installs no torch: run as torchruntime runs it (its exit status is not looked at)."""
    print("> ", cmd)
    subprocess.run(cmd)
