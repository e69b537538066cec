"""CPU facts: vendor, model, normalized feature flags and the x86-64 micro-architecture level.

Parsers take text (``/proc/cpuinfo``, ``sysctl`` output) so each source can be tested alone.
Feature names are normalized across OSes: ``sse4.2``, ``avx2``, ``avx512vnni``, ``neon``, ``sve``...
"""
from __future__ import annotations

import re
from typing import Dict, Iterable, List, Optional, Set

from .report import CPUInfo

__all__ = ["KEEP", "cpu_from_sysctl", "normalize_features", "parse_proc_cpuinfo", "parse_sysctl", "x86_64_level"]

# /proc/cpuinfo and sysctl spellings -> our names. Flags not listed keep their own name
# if they are in KEEP, and are dropped otherwise (the raw list is hundreds long).
_ALIASES = {
    "pni": "sse3",
    "sse4_1": "sse4.1",
    "sse4_2": "sse4.2",
    "sse4.1": "sse4.1",
    "sse4.2": "sse4.2",
    "avx512_vnni": "avx512vnni",
    "avx512_bf16": "avx512bf16",
    "avx512_fp16": "avx512fp16",
    "avx_vnni": "avxvnni",
    "amx_tile": "amx",
    "amx_bf16": "amx",
    "amx_int8": "amx",
    "abm": "lzcnt",
    "lahf_lm": "lahf",
    "asimd": "neon",
    "neon": "neon",
    "asimdhp": "fp16",
    "fphp": "fp16",
    "asimddp": "dotprod",
    "feat_dotprod": "dotprod",
    "feat_bf16": "bf16",
    "feat_i8mm": "i8mm",
    "feat_fp16": "fp16",
    "feat_sme": "sme",
    "avx1.0": "avx",
    "avx2.0": "avx2",
    "fma3": "fma",
    "sse3": "sse3",
    "ssse3": "ssse3",
}
KEEP = {
    "sse", "sse2", "sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "cx16", "lahf", "movbe", "xsave",
    "avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "lzcnt", "avxvnni",
    "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512vnni", "avx512bf16", "avx512fp16",
    "amx", "neon", "sve", "sve2", "fp16", "dotprod", "bf16", "i8mm", "sme",
}
_LEVELS = [
    (2, {"cx16", "lahf", "popcnt", "sse3", "ssse3", "sse4.1", "sse4.2"}),
    (3, {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave"}),
    (4, {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}),
]
_ARM_IMPLEMENTERS = {
    "0x41": "arm", "0x61": "apple", "0x51": "qualcomm", "0x48": "hisilicon", "0xc0": "ampere",
    "0x4e": "nvidia", "0x46": "fujitsu", "0x43": "cavium", "0x50": "apm", "0x6d": "microsoft",
}


def normalize_features(raw: Iterable[str]) -> List[str]:
    out: Set[str] = set()
    for flag in raw:
        f = flag.strip().lower()
        if not f:
            continue
        f = _ALIASES.get(f, f)
        if f in KEEP:
            out.add(f)
    return sorted(out)


def x86_64_level(features: Iterable[str]) -> int:
    have = set(features)
    level = 1
    for lvl, needed in _LEVELS:
        if needed <= have:
            level = lvl
        else:
            break
    return level


def _vendor(text: str) -> str:
    t = text.strip().lower()
    if "intel" in t:
        return "intel"
    if "amd" in t or "authenticamd" in t:
        return "amd"
    if "apple" in t:
        return "apple"
    return t


def parse_proc_cpuinfo(text: str, arch: str) -> CPUInfo:
    """Parse Linux ``/proc/cpuinfo`` (x86 ``flags`` or ARM ``Features``); tolerant of garbage.

    Only the first processor block is parsed field by field (a 192-thread server repeats the same
    block 192 times); counts come from a scan for ``processor`` and ``physical id`` lines.
    """
    first = text.split("\n\n", 1)[0]
    fields: Dict[str, str] = {}
    for line in first.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    if not fields.get("flags") and not fields.get("features"):  # ARM puts Features per core, model last
        for line in text.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields.setdefault(key.strip().lower(), value.strip())
    processors = len(re.findall(r"^processor\s*:", text, re.M))
    sockets = len(set(re.findall(r"^physical id\s*:\s*(\S+)", text, re.M))) or 1
    raw = (fields.get("flags") or fields.get("features") or "").split()
    features = normalize_features(raw)
    cpu = CPUInfo(features=features, logical_cores=processors or None)
    if arch == "x86_64":
        cpu.vendor = _vendor(fields.get("vendor_id", ""))
        cpu.model = fields.get("model name", "")
        cpu.x86_64_level = x86_64_level(features) if features else None
        cores = _int(fields.get("cpu cores", ""))
        if cores:
            cpu.physical_cores = cores * sockets
    else:
        implementer = fields.get("cpu implementer", "").lower()
        cpu.vendor = _ARM_IMPLEMENTERS.get(implementer, implementer)
        cpu.model = fields.get("model name", "") or fields.get("hardware", "")
        if not cpu.model and implementer:
            cpu.model = f"ARM implementer {implementer} part {fields.get('cpu part', '?')}"
    return cpu


def parse_sysctl(text: str) -> Dict[str, str]:
    """``sysctl`` output (``name: value`` lines) -> dict; unknown-key errors are skipped."""
    out: Dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key and " " not in key.strip():
            out[key.strip()] = value.strip()
    return out


def cpu_from_sysctl(values: Dict[str, str], arch: str) -> CPUInfo:
    """macOS: features from ``machdep.cpu.*features`` (Intel) or ``hw.optional.*`` (Apple Silicon)."""
    raw: List[str] = []
    for key in ("machdep.cpu.features", "machdep.cpu.leaf7_features", "machdep.cpu.extfeatures"):
        raw += values.get(key, "").split()
    for key, value in values.items():
        if key.startswith("hw.optional.") and value.strip() == "1":
            name = key[len("hw.optional."):]
            name = name.split(".")[-1]  # hw.optional.arm.FEAT_BF16 -> FEAT_BF16
            raw.append(re.sub(r"_0$", "", name))  # hw.optional.avx2_0 -> avx2
    features = normalize_features(raw)
    if arch == "arm64" and "neon" not in features and any(k.startswith("hw.optional.arm") for k in values):
        features = sorted(set(features) | {"neon"})  # every Apple Silicon core has Advanced SIMD
    brand = values.get("machdep.cpu.brand_string", "")
    cpu = CPUInfo(
        vendor=_vendor(brand) if brand else ("apple" if arch == "arm64" else ""),
        model=brand,
        physical_cores=_int(values.get("hw.physicalcpu", "")),
        logical_cores=_int(values.get("hw.logicalcpu", "")),
        features=features,
    )
    if arch == "x86_64" and features:
        cpu.x86_64_level = x86_64_level(features)
    return cpu


def _int(text: str) -> Optional[int]:
    try:
        return int(text.strip())
    except (ValueError, AttributeError):
        return None
