"""Remembered probe images: the digest of the image a runtime made in an earlier passing ``verify``.

``verify``'s ``deterministic`` check needs the probe image twice from the same inputs. The first
verify of a runtime generates it twice in one process (on 2 cores that second generation is 1.4 s
of a 5 s verify). A passing verify then keeps the image's sha256 in the probe cache under a key
of everything the image depends on (the probe, the request, the runtime's version, build features
and device, the engine options and the device-selecting environment). A later verify with the
same key generates once and compares with that digest: the same bytes again, from another
process, is the same check made across processes. When they differ (a new driver, a changed
runtime the key cannot see) the second generation runs as before and decides, and a passing
verify replaces the record: a mismatch never fails a runtime on its own.

A record is a cache of a few hundred bytes. One written by someone else can only make verify skip
its second generation if it holds the digest of exactly the image this runtime generates now, which
is what an earlier run would have written; an unreadable, oversized, damaged or foreign record (a
link, a FIFO, another key) is ignored. Failing to write one changes nothing.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from ... import fsio
from ...limits import MalformedInput, parse_json, read_capped
from ..config import EngineOptions
from ..worker.protocol import DeviceInfo, GenerateRequest

__all__ = ["RECORD_NAME", "VERIFY_IMAGE_NAME", "ImageRecord", "RECORD_FORMAT", "DEVICE_ENV", "record_key", "record_path", "recall", "remember", "image_digest"]

log = logging.getLogger(__name__)

RECORD_FORMAT = 1
MAX_RECORD_BYTES = 16 * 1024
MAX_WHEN = 2 ** 33  # seconds since the epoch: the year 2242
RECORD_PREFIX = "image-"  # <probe cache>/image-<first 32 hex digits of the key>.json
RECORD_NAME = re.compile(r"^image-[0-9a-f]{32}\.json\Z")
# the image each record is of, beside it: verify-<backend>.png (verification.probe_verify.default_output)
VERIFY_IMAGE_NAME = re.compile(r"^verify-[a-z0-9-]+\.png\Z")
# the environment that picks or changes a device: part of the key (CUDA_VISIBLE_DEVICES=1 is another GPU)
DEVICE_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HSA_OVERRIDE_GFX_VERSION",
              "GGML_VK_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "ONEAPI_DEVICE_SELECTOR", "VK_ICD_FILENAMES",
              "VK_DRIVER_FILES")


@dataclass
class ImageRecord:
    """The digest of a probe image a passing verify saw, and when (seconds since the epoch)."""

    key: str
    digest: str
    when: float


def image_digest(pixels: bytes) -> str:
    return hashlib.sha256(pixels).hexdigest()


def record_key(*, backend: str, runtime_version: str, system_info: str, device: Optional[DeviceInfo],
               options: EngineOptions, env: Mapping[str, str], request: GenerateRequest, probe: Mapping[str, Any]) -> str:
    """sha256 of everything the probe image depends on that verify can name. ``options`` is the
    engine options; ``probe`` names the probe (format, seed, dtype, parameters)."""
    dev = None if device is None else {"name": device.name, "description": device.description, "kind": device.kind,
                                       "memory_total": device.memory_total}
    material = {"format": RECORD_FORMAT, "backend": backend, "runtime": runtime_version, "system": system_info,
                "device": dev, "options": dataclasses.asdict(options),
                "env": {k: env[k] for k in DEVICE_ENV if k in env}, "request": dataclasses.asdict(request),
                "probe": dict(probe)}
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()


def record_path(root: Path, key: str) -> Path:
    return Path(root) / f"{RECORD_PREFIX}{key[:32]}.json"


def recall(root: Path, key: str) -> Optional[ImageRecord]:
    """The record kept for ``key`` under ``root``, or None (none, unreadable, damaged or another key's)."""
    path = record_path(root, key)
    try:
        doc = parse_json(read_capped(path, MAX_RECORD_BYTES + 1), what=f"probe image record {path}",
                         max_bytes=MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None
    except (OSError, MalformedInput) as exc:
        log.info("ignoring %s: %s", path, exc)
        return None
    if not isinstance(doc, dict) or doc.get("format") != RECORD_FORMAT or doc.get("key") != key:
        return None
    digest, when = doc.get("sha256"), doc.get("when")
    if not isinstance(digest, str) or len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
        return None
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not 0 <= when < MAX_WHEN:
        return None  # also what time.localtime() could not show
    return ImageRecord(key=key, digest=digest, when=float(when))


def remember(root: Path, key: str, digest: str) -> Optional[Path]:
    """Keep ``digest`` for ``key``; the path, or None when it could not be written (a read-only
    cache is not an error)."""
    path = record_path(root, key)
    doc = {"format": RECORD_FORMAT, "key": key, "sha256": digest, "when": round(time.time(), 3),
           "what": "the probe image of a passing accelstack verify (see accelstack.engine.probes.record)"}
    if fsio.try_write_bytes(path, (json.dumps(doc, indent=1) + "\n").encode()):
        return path
    log.info("could not keep the probe image record %s", path)
    return None
