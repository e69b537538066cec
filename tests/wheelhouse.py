"""A local wheel folder the torch install tests fill once, and the pip environment that installs from it.

The install tests run real pip for real plans. A plan's pip command names the PyTorch index
(``--index-url https://download.pytorch.org/whl/cpu``), which a test machine may not reach; whether
pip then still finds torch and its dependencies used to depend on how the machine happened to
configure pip (an ``extra-index-url`` kept, an ``index-url`` dropped: 7 tests failed on a fresh
machine). So the tests take their packages from a folder they fill themselves:

- ``fill(requirements)`` runs ``pip download`` (binary wheels, with dependencies) once per set of
  requirements and Python, through whatever indexes this machine's pip is configured with, into
  ``.cache/wheels/<key>/`` in the checkout (git-ignored), renamed into place only when complete;
- ``pip_env(folder)`` is the environment under which every pip the tests start — accelstack's own
  included — installs from that folder alone: no configuration files, no index, find-links only.

Where the download fails (no CPU torch 2.13 wheel reachable from this machine) the caller skips
with pip's reason; nothing depends on a cache the machine may or may not have.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Sequence, Tuple

from accelstack.manifests.torch_types import ENGINE_PACKAGES

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / ".cache" / "wheels"
COMPLETE = ".complete"
# The CPU build by its local version label: PyPI's torch 2.13.0 is the CUDA build (GBs of NVIDIA
# wheels with it), so a machine without the CPU wheel skips instead of downloading those.
# torchvision for Easy Diffusion's pins (tests/compat), the torch engine's packages for the torch plan's
# second command (bundles, the engine's torch tests).
TORCH_CPU_STACK = ("torch==2.13.0+cpu", "torchvision==0.28.*", *ENGINE_PACKAGES)


def _key(requirements: Sequence[str]) -> str:
    ident = "\n".join([sys.version.split()[0], sys.platform, *sorted(requirements)])
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def fill(requirements: Sequence[str], timeout: float = 1800) -> Tuple[Path, str]:
    """The folder holding ``requirements`` and their dependencies as wheels, and ``""``; or a
    missing path and pip's last lines (the reason to skip) when pip could not download them."""
    folder = ROOT / _key(requirements)
    if (folder / COMPLETE).is_file():
        return folder, ""
    partial = folder.with_name(f"{folder.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    res = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                          "--only-binary=:all:", "-d", str(partial), *requirements],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if res.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        lines = [ln for ln in res.stdout.splitlines() if ln.strip() and "is ignored" not in ln]
        return folder, "\n".join(lines[-3:]) or f"pip download exited {res.returncode}"
    (partial / COMPLETE).write_text("\n".join(requirements) + "\n", encoding="utf-8")
    try:
        partial.rename(folder)
    except OSError:  # another run completed it first
        shutil.rmtree(partial, ignore_errors=True)
    return folder, ""


def pip_env(folder: Path) -> Dict[str, str]:
    """Variables under which pip installs only from ``folder``: its configuration files are not
    read (``PIP_CONFIG_FILE`` set to the null device), no index is asked (``PIP_NO_INDEX``, which
    also silences a plan's ``--index-url``), and ``folder`` is the one place it looks."""
    return {"PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(folder)}
