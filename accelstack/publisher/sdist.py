"""The bindings' source distribution: downloaded once from the package index into the build cache."""
from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import Optional

from ..artifacts.errors import OfflineError
from ..errors import Action
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..subprocesses import run_logged
from .errors import BuildError, BuildTimeout

__all__ = ["SDIST_FILE_NAME", "SDIST_PACKAGE", "SDIST_VERSION", "fetch_sdist", "offline_source_error", "sdist_name"]

log = logging.getLogger(__name__)

SDIST_PACKAGE = "stable-diffusion-cpp-python"
SDIST_VERSION = "0.4.7"
# what fetch_sdist keeps in <build cache>/sdist/: the source (and its sha256), and pip's download log
SDIST_FILE_NAME = re.compile(r"^(stable_diffusion_cpp_python-[^/]+\.tar\.gz(\.sha256)?|download-[^/]+\.log)\Z")


def sdist_name(version: str = SDIST_VERSION) -> str:
    return f"{SDIST_PACKAGE.replace('-', '_')}-{version}.tar.gz"


def offline_source_error(dest: Path, version: str = SDIST_VERSION) -> OfflineError:
    """Offline with the source not downloaded yet: what is missing, and the ways to get it (said
    before anything is downloaded or compiled)."""
    return OfflineError(
        f"offline mode: a local build needs the {SDIST_PACKAGE} {version} source, which is not in the build cache "
        f"({Path(dest) / sdist_name(version)})",
        "install from an offline bundle made on a machine with network access (`accelstack bundle create`), copy "
        f"{sdist_name(version)} into {dest}, or run once without --offline (and with ACCELSTACK_OFFLINE unset) to "
        "download it")


def fetch_sdist(dest: Path, version: str = SDIST_VERSION, progress: ProgressCallback = null_progress, *,
                timeout: float, python: Optional[str] = None) -> Path:
    """The source distribution of ``version``, from the package index with ``python``'s pip (default:
    this interpreter), kept in ``dest``; a copy already there is used as is.

    ``timeout`` (seconds: ``Settings.timeouts.pip``) bounds the download; past it the download is
    stopped and :class:`BuildTimeout` raised.
    """
    dest = Path(dest)
    target = dest / sdist_name(version)
    if target.is_file():
        log.debug("source distribution %s already downloaded", target)
        return target
    dest.mkdir(parents=True, exist_ok=True)
    limit = timeout
    progress(ProgressEvent("message", "build", message=f"downloading {SDIST_PACKAGE}=={version} source"))
    log.info("downloading %s==%s into %s (time limit %.0f s)", SDIST_PACKAGE, version, dest, limit)
    cmd = [python or sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
           "--disable-pip-version-check", "-d", str(dest), f"{SDIST_PACKAGE}=={version}"]
    outcome = run_logged(cmd, log_path=dest / f"download-{version}.log", timeout=limit)
    if outcome.timed_out:
        raise BuildTimeout(
            f"downloading the {SDIST_PACKAGE} {version} source did not finish within {limit:.0f} s",
            hint="check the connection to the package index, or build from a local copy of the source distribution",
            action=Action.CHECK_NETWORK, log=outcome.log)
    if outcome.returncode != 0 or not target.is_file():
        log.info("downloading %s %s failed (exit %s); full output in %s", SDIST_PACKAGE, version,
                    outcome.returncode, outcome.log)
        raise BuildError(
            f"could not download the {SDIST_PACKAGE} {version} source: {outcome.tail(8)[-500:]}",
            hint="check the connection to the package index, or build from a local copy of the source "
                 f"distribution ({sdist_name(version)})",
            action=Action.GIVE_SOURCE, log=outcome.log)
    log.info("downloaded %s in %.1f s", target, outcome.seconds)
    return target
