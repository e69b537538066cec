"""The Vulkan enumeration, kept between runs and keyed by everything its answer depends on.

Enumerating Vulkan devices loads every installed driver in a child process (``vulkan.py``):
130-280 ms with Mesa's drivers installed, ten times all the rest of detection. Its answer changes
only when the loader, a driver, a layer, a GPU or the environment the loader reads changes, so the
child's output is kept in ``<cache>/vulkan-<key>.json`` (``Settings.detect_cache``), with the
inputs it was made from:

- the probe's own source (a new probe is a new command);
- the loader library detection found: its path, link target, size and mtime;
- every driver (ICD) and implicit-layer manifest the loader would read: the files and folders
  named by ``VK_ICD_FILENAMES``/``VK_DRIVER_FILES``/``VK_ADD_DRIVER_FILES`` and the layer
  variables, and the ``vulkan/icd.d`` and ``vulkan/implicit_layer.d`` folders of the XDG config and
  data directories and /etc; each manifest with its size and mtime;
- the library each driver manifest names (``ICD.library_path``), stamped when it is a path: a driver
  rebuilt in place keeps its manifest. A library named bare is found by the dynamic linker and not
  stamped, nor is a loader picked up through ``LD_LIBRARY_PATH`` (its value is in the key, not the
  file it finds): ``accelstack detect --refresh`` after such a change;
- the GPUs on the PCI bus with the driver bound to each, the GPU kernel modules' versions and the
  kernel release: the driver versions detection reads anyway (a new NVIDIA driver rewrites its
  ICD manifest too); under WSL2, the folders the Windows host's drivers are mapped into;
- the environment variables the loader and Mesa's device-select layer read (:data:`ENV_VARS`).

A file whose inputs differ from this machine's is a miss. Only a clean answer (exit 0, in time)
is kept: a crashing or hanging driver is asked again next time, the user may be fixing it. The
file is read as hostile input (size-capped, a regular file, never through a link; anything
unexpected is a miss, never an error) and written with :func:`accelstack.fsio.try_write_bytes`
(a cache that cannot be written changes nothing). ``refresh`` runs the child whatever the cache
holds and keeps its answer.

When the child must run, it is started before the other probes and collected after them, so its
driver loading overlaps the sysfs reads and ``nvidia-smi``.

Only a live machine uses the cache (the core passes the folder): a replay answers from its capture,
and a capture runs the child for real, so a bug report holds what the drivers say now, and its
replay gives the same report as that live run.
"""
from __future__ import annotations

import json
import os
import re
import zlib
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..fsio import try_write_bytes
from ..limits import (
    MAX_DETECT_CACHE_BYTES,
    MAX_DETECT_CACHE_ENTRIES,
    MalformedInput,
    parse_json,
    read_capped,
)
from . import vulkan
from .common import Probe
from .protocol import CommandResult, Finished, PlatformFacts, RunningCommand
from .report import GPU, VulkanDevice

__all__ = ["ANSWER_NAME", "CACHE_FORMAT", "CACHE_VERSION", "ENV_VARS", "HOST_DRIVER_FOLDERS", "MANIFEST_FOLDERS", "MODULE_VERSIONS", "PATH_VARS",
           "Enumeration", "cache_path", "inputs", "load", "start", "store"]

CACHE_FORMAT = "accelstack-detect-cache"
CACHE_VERSION = 1
PREFIX, SUFFIX = "vulkan-", ".json"
ANSWER_NAME = re.compile(r"^vulkan-[0-9a-f]{16}\.json\Z")  # cache_path's names: vulkan-<key>.json
MAX_MANIFEST_BYTES = 64 * 1024  # a driver or layer manifest is a few hundred bytes

# What the Vulkan loader (LoaderInterfaceArchitecture.md: driver and layer discovery, filters) and
# Mesa's device-select layer read from the environment; XDG_* and HOME place the search folders.
ENV_VARS = (
    "VK_ICD_FILENAMES", "VK_DRIVER_FILES", "VK_ADD_DRIVER_FILES", "VK_LOADER_DRIVERS_SELECT",
    "VK_LOADER_DRIVERS_DISABLE", "VK_LOADER_DEVICE_SELECT", "VK_INSTANCE_LAYERS", "VK_LOADER_LAYERS_ENABLE",
    "VK_LOADER_LAYERS_DISABLE", "VK_LOADER_LAYERS_ALLOW", "VK_LAYER_PATH", "VK_ADD_LAYER_PATH",
    "VK_IMPLICIT_LAYER_PATH", "VK_ADD_IMPLICIT_LAYER_PATH", "VK_LOADER_DISABLE_INST_EXT_FILTER",
    "LD_LIBRARY_PATH", "HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "XDG_DATA_HOME", "XDG_DATA_DIRS",
    "MESA_VK_DEVICE_SELECT", "NODEVICE_SELECT", "DISABLE_LAYER_AMD_SWITCHABLE_GRAPHICS_1",
    "__NV_PRIME_RENDER_OFFLOAD", "__VK_LAYER_NV_optimus",
)
# Variables naming manifests or folders of them, which the loader reads instead of (or beside) its own.
PATH_VARS = ("VK_ICD_FILENAMES", "VK_DRIVER_FILES", "VK_ADD_DRIVER_FILES", "VK_IMPLICIT_LAYER_PATH",
             "VK_ADD_IMPLICIT_LAYER_PATH")
MANIFEST_FOLDERS = ("vulkan/icd.d", "vulkan/implicit_layer.d")
MODULE_VERSIONS = ("/sys/module/nvidia/version", "/sys/module/amdgpu/version")
# WSL2: the Windows host's GPU drivers, mapped in (a host driver update changes these folders)
HOST_DRIVER_FOLDERS = ("/usr/lib/wsl/lib", "/usr/lib/wsl/drivers")


def _roots(env: Dict[str, str]) -> List[str]:
    """The folders the loader looks under on Linux, in its order: XDG config, /etc, XDG data."""
    home = env.get("HOME", "")
    config_home = env.get("XDG_CONFIG_HOME") or (f"{home}/.config" if home else "")
    data_home = env.get("XDG_DATA_HOME") or (f"{home}/.local/share" if home else "")
    config_dirs = (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":")
    data_dirs = (env.get("XDG_DATA_DIRS") or "/usr/local/share:/usr/share").split(":")
    roots = [config_home, *config_dirs, "/etc", data_home, *data_dirs]
    return [r.rstrip("/") for r in dict.fromkeys(roots) if r.startswith("/")]


def _stamp(probe: Probe, path: str) -> Optional[List[int]]:
    stamp = probe.system.stat(path)
    return list(stamp) if stamp is not None else None


def _quiet_line(probe: Probe, path: str) -> str:
    """The text of ``path``, stripped; "" when it cannot be read (the key is no place for problems)."""
    try:
        return probe.system.read_text(path).strip()
    except OSError:
        return ""


def _manifests(probe: Probe, folder: str, found: Dict[str, Optional[List[int]]]) -> None:
    for name in probe.list_dir(folder):
        if name.endswith(".json"):
            found[f"{folder}/{name}"] = _stamp(probe, f"{folder}/{name}")


def _driver_libraries(probe: Probe, manifests: Dict[str, Optional[List[int]]]) -> Dict[str, Any]:
    """Each driver manifest's ``ICD.library_path`` and, when it is a path, that library's stamp: a
    driver rebuilt in place (``ninja install`` into /opt) keeps its manifest and changes its library."""
    out: Dict[str, Any] = {}
    for path, stamp in manifests.items():
        # read only what has bytes to read and is small: a FIFO (size 0) is never opened, so never waited on
        if not path.endswith(".json") or stamp is None or not 0 < stamp[0] <= MAX_MANIFEST_BYTES:
            continue
        try:
            doc = parse_json(probe.system.read_text(path), what=path, max_bytes=MAX_MANIFEST_BYTES)
        except (OSError, MalformedInput):
            continue
        icd = doc.get("ICD") if isinstance(doc, dict) else None
        lib = icd.get("library_path") if isinstance(icd, dict) else None
        if isinstance(lib, str) and lib:
            where = lib if lib.startswith("/") else f"{path.rsplit('/', 1)[0]}/{lib}" if "/" in lib else ""
            out[path] = [lib, _stamp(probe, where) if where else None]
    return out


def inputs(probe: Probe, loader: str, facts: PlatformFacts, gpus: List[GPU]) -> Dict[str, Any]:
    """What the enumeration's answer depends on, as plain JSON values (the cache entry's key)."""
    env = {name: value for name in ENV_VARS for value in [probe.system.env(name)] if value is not None}
    found: Dict[str, Optional[List[int]]] = {}
    for name in PATH_VARS:
        for entry in filter(None, env.get(name, "").split(":")):
            found[entry] = _stamp(probe, entry)
            _manifests(probe, entry.rstrip("/"), found)  # a folder of manifests (nothing for a file)
    for root in _roots(env):
        for sub in MANIFEST_FOLDERS:
            _manifests(probe, f"{root}/{sub}", found)
    return {
        "probe": zlib.crc32(vulkan.PROBE_SOURCE.encode("utf-8")),
        "loader": [loader, probe.system.readlink(loader), _stamp(probe, loader)],
        "manifests": found,
        "drivers": _driver_libraries(probe, found),
        "gpus": [[g.bus_id, g.pci_vendor_id, g.pci_device_id, g.driver] for g in gpus],
        "modules": {path: _quiet_line(probe, path) for path in MODULE_VERSIONS},
        "host_drivers": {path: _stamp(probe, path) for path in HOST_DRIVER_FOLDERS},
        "kernel": [facts.release, facts.version],
        "env": env,
    }


def cache_path(folder: Path, key_inputs: Dict[str, Any]) -> Path:
    """``folder/vulkan-<key>.json``; the key is a checksum of the inputs (the file holds them in full)."""
    text = json.dumps(key_inputs, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return folder / f"{PREFIX}{zlib.crc32(text):08x}{zlib.adler32(text):08x}{SUFFIX}"


def load(path: Path, key_inputs: Dict[str, Any]) -> Optional[CommandResult]:
    """The probe's kept answer for exactly these inputs, or None (missing, damaged, planted or stale)."""
    try:
        data = parse_json(read_capped(path, MAX_DETECT_CACHE_BYTES + 1), what=str(path), max_bytes=MAX_DETECT_CACHE_BYTES)
    except (OSError, MalformedInput):
        return None
    if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or data.get("version") != CACHE_VERSION:
        return None
    stdout, stderr = data.get("stdout"), data.get("stderr")
    if data.get("inputs") != key_inputs or data.get("returncode") != 0 or not isinstance(stdout, str) \
            or not isinstance(stderr, str):
        return None
    return CommandResult(vulkan.probe_argv(), returncode=0, stdout=stdout, stderr=stderr)


def store(path: Path, key_inputs: Dict[str, Any], result: CommandResult) -> bool:
    """Keep a clean answer (exit 0, in time) under ``path``; then drop all but the newest entries."""
    if not result.ok:
        return False
    data = {"format": CACHE_FORMAT, "version": CACHE_VERSION, "inputs": key_inputs, "returncode": 0,
            "stdout": result.stdout, "stderr": result.stderr}
    if not try_write_bytes(path, json.dumps(data, sort_keys=True).encode("utf-8")):
        return False
    _prune(path.parent)
    return True


def _prune(folder: Path) -> None:
    """Remove the oldest ``vulkan-*.json`` beyond :data:`MAX_DETECT_CACHE_ENTRIES` (only regular files:
    what else is there is not ours)."""
    entries: List[Tuple[int, str]] = []
    try:
        with os.scandir(folder) as listing:
            for entry in listing:
                if entry.name.startswith(PREFIX) and entry.name.endswith(SUFFIX) and entry.is_file(follow_symlinks=False):
                    entries.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.path))
    except OSError:
        return
    for _, stale in sorted(entries, reverse=True)[MAX_DETECT_CACHE_ENTRIES:]:
        try:
            os.unlink(stale)
        except OSError:
            pass


class Enumeration:
    """The Vulkan devices: being enumerated by the child, or already known from the cache."""

    def __init__(self, probe: Probe, running: RunningCommand, keep: Optional[Tuple[Path, Dict[str, Any]]] = None) -> None:
        self.probe, self.running, self.keep = probe, running, keep

    def devices(self, gpus: List[GPU]) -> Tuple[str, List[VulkanDevice]]:
        """(loader version, devices), each linked to its GPU; waits for the child if it runs."""
        result = self.running.result()
        if self.keep is not None:
            store(*self.keep, result)
            self.keep = None
        version, devices = vulkan.interpret(self.probe, result)
        vulkan.match_gpus(devices, gpus)
        return version, devices


def start(probe: Probe, loader: str, *, facts: PlatformFacts, gpus: List[GPU], cache: Optional[Path],
          refresh: bool, write: bool = True) -> Optional[Enumeration]:
    """Begin enumerating (None without a loader): from ``cache`` when it holds the answer for these
    inputs and ``refresh`` is false, else by starting the child now (its answer is kept in ``cache``
    unless ``write`` is false: a dry run or a support report writes nothing)."""
    if not loader:
        return None
    keep: Optional[Tuple[Path, Dict[str, Any]]] = None
    if cache is not None:
        key_inputs = inputs(probe, loader, facts, gpus)
        path = cache_path(cache, key_inputs)
        hit = None if refresh else load(path, key_inputs)
        if hit is not None:
            return Enumeration(probe, Finished(hit))
        keep = (path, key_inputs) if write else None
    return Enumeration(probe, probe.start(vulkan.probe_argv(), "vulkan_probe"), keep)
