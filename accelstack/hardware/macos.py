"""macOS: ``sysctl`` for CPU and memory facts, ``system_profiler`` for GPUs and Metal support."""
from __future__ import annotations

import re
from typing import Dict, List

from ..domain import Vendor
from ..limits import MalformedInput, parse_json
from . import tables
from .common import Probe, classify_kind
from .cpu import cpu_from_sysctl, parse_sysctl
from .report import GPU, HardwareReport

__all__ = ["PROFILER_JSON", "PROFILER_TEXT", "SYSCTL", "gpus", "parse_profiler", "probe", "readable_chip_key"]

SYSCTL = ["sysctl", "hw", "machdep.cpu", "sysctl.proc_translated"]
PROFILER_JSON = ["system_profiler", "SPDisplaysDataType", "-json"]
PROFILER_TEXT = ["system_profiler", "SPDisplaysDataType"]
_VENDOR_WORDS: Dict[str, Vendor] = {"apple": "apple", "amd": "amd", "ati": "amd", "intel": "intel", "nvidia": "nvidia"}


def probe(p: Probe, report: HardwareReport) -> None:
    facts = p.system.platform()
    report.os.version = facts.mac_version
    res = p.run(SYSCTL, "sysctl")
    values = parse_sysctl(res.stdout) if res.stdout else {}
    # sysctl.proc_translated = 1: this (x86_64) process runs under Rosetta on Apple Silicon.
    report.os.rosetta = values.get("sysctl.proc_translated", "0").strip() == "1"
    if report.os.rosetta:
        p.problem(
            "rosetta",
            "this Python runs under Rosetta (x86_64 on Apple Silicon): Metal/MPS builds cannot be used from it",
            "install a native arm64 Python (python.org or Homebrew on /opt/homebrew) and run again",
            "error",
        )
    report.cpu = cpu_from_sysctl(values, "arm64" if report.os.rosetta else report.os.arch)
    if values.get("hw.memsize", "").isascii() and values.get("hw.memsize", "").isdigit():
        report.memory.ram_total = int(values["hw.memsize"])
    report.gpus = gpus(p, report.os.version)


def gpus(p: Probe, mac_version: str) -> List[GPU]:
    p.timeout = max(p.timeout, 10.0)  # system_profiler is slow on a cold start
    res = p.run(PROFILER_JSON, "system_profiler")
    found = parse_profiler(res.stdout) if res.ok or res.stdout else []
    if not found:
        res = p.run(PROFILER_TEXT, "system_profiler")
        found = parse_profiler(res.stdout) if res.stdout else []
    major = _major(mac_version)
    for g in found:
        if major and major < 13 and g.metal_support.startswith(("Metal 3", "Metal 4")):
            g.metal_support = "Metal 2"  # Metal 3 needs macOS 13 whatever the GPU
        elif major >= 13 and g.metal_support == "Metal" and tables.apple_metal3_gpu(g.name):
            g.metal_support = "Metal 3"  # a bare "supported" on macOS 13+: the GPU is in the Metal3 family
            g.sources.append("metal: Metal3 family on macOS 13+ (Apple feature set tables)")
    return found


def _major(version: str) -> int:
    m = re.match(r"(\d+)", version or "")
    return int(m.group(1)) if m else 0


def parse_profiler(text: str) -> List[GPU]:
    """GPUs from ``system_profiler SPDisplaysDataType`` in JSON or text form, even if cut short."""
    entries: List[Dict[str, str]] = []
    try:
        data = parse_json(text, what="system_profiler output")
    except MalformedInput:
        entries = _salvage(text)
    else:
        # valid JSON of another shape (an old or broken system_profiler) holds no GPUs we can read
        items = data.get("SPDisplaysDataType", []) if isinstance(data, dict) else []
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict):
                entries.append({str(k): str(v) for k, v in item.items() if not isinstance(v, (list, dict))})
    out: List[GPU] = []
    for e in entries:
        name = e.get("sppci_model") or e.get("_name") or e.get("Chipset Model", "")
        if not name:
            continue
        name = readable_chip_key(name)
        vendor_raw = (e.get("spdisplays_vendor") or e.get("sppci_vendor") or e.get("Vendor") or name).lower()
        vid = re.search(r"0x([0-9a-f]{4})", vendor_raw)
        known = tables.PCI_VENDORS.get(vid.group(1)) if vid else None
        words = vendor_raw.replace("sppci_vendor_", "")
        vendor: Vendor = known or next((v for w, v in _VENDOR_WORDS.items() if w in words), None) or "other"
        dev = re.search(r"0x([0-9a-f]{4})", (e.get("spdisplays_device-id") or e.get("Device ID") or "").lower())
        metal = tables.apple_metal(e)
        g = GPU(
            index=len(out),
            vendor=vendor,
            name=name,
            pci_vendor_id=vid.group(1) if vid else ("106b" if vendor == "apple" else ""),
            pci_device_id=dev.group(1) if dev else "",
            metal_support=metal,
            driver="macos",
            sources=["system_profiler SPDisplaysDataType"],
        )
        vram = e.get("spdisplays_vram") or e.get("VRAM (Total)") or e.get("spdisplays_vram_shared") or ""
        m = re.match(r"\s*(\d+)\s*(GB|MB)", vram)
        if m:
            g.vram_total = int(m.group(1)) * (1024 ** 3 if m.group(2) == "GB" else 1024 ** 2)
        if vendor == "apple":
            m = re.search(r"\b(M\d+)(?: (Pro|Max|Ultra))?", name)
            g.apple_family = " ".join(filter(None, m.groups())) if m else name
        elif vendor == "amd":
            g.gfx_target = tables.amd_gfx_target(g.pci_device_id, name)
        elif vendor == "intel":
            g.intel_generation = tables.intel_generation_for(g.pci_device_id, name)[0]
        bus = (e.get("sppci_bus") or e.get("Bus") or "").lower()
        g.kind = "integrated" if "builtin" in bus or "built-in" in bus or vendor in ("apple", "intel") else classify_kind(vendor, name, g.pci_device_id, g.gfx_target)
        if "pcie" in bus and vendor != "apple":
            g.kind = "discrete"
        out.append(g)
    return out


def readable_chip_key(name: str) -> str:
    """Older macOS names a GPU by its unlocalized key ('kHW_AppleM1Item'): give the readable name.

    Known keys come from the data; others are spelled out from their CamelCase
    ('kHW_AppleM2ProItem' -> 'Apple M2 Pro', 'kHW_IntelHDGraphics4000Item' -> 'Intel HD Graphics 4000')."""
    m = re.fullmatch(r"kHW_(\w+?)Item", name.strip())
    if not m:
        return name
    known = tables.apple_chip_key(name.strip())
    if known:
        return known
    body = m.group(1)
    apple = re.fullmatch(r"Apple(M\d+)(Pro|Max|Ultra)?", body)
    if apple:
        return " ".join(filter(None, ["Apple", apple.group(1), apple.group(2)]))
    words = []
    for part in re.split(r"(GeForce|FirePro)", body):  # brand words that are CamelCase themselves
        if part in ("GeForce", "FirePro"):
            words.append(part)
        else:
            words += re.findall(r"[A-Z]{2,}(?=[A-Z][a-z]|\d|$)|[A-Z][a-z]+|\d+[A-Z]?|[A-Za-z]+", part)
    return " ".join(words) if words else name


def _salvage(text: str) -> List[Dict[str, str]]:
    """Key/value pairs from truncated JSON or from the text form; one entry per GPU block."""
    entries: List[Dict[str, str]] = []
    current: Dict[str, str] = {}
    for line in text.splitlines():
        m = re.match(r'\s*"([^"]+)"\s*:\s*"([^"]*)"', line) or re.match(r"\s*([A-Za-z][\w ()-]+):\s*(.+)$", line)
        if not m:
            continue
        key, value = m.group(1).strip(), m.group(2).strip()
        if key in ("_name", "Chipset Model") and (key != "_name" or not current.get("_name")):
            if key == "Chipset Model" or not current:
                if current:
                    entries.append(current)
                current = {}
        if key == "_name" and current.get("_name"):
            continue  # a display's _name inside the GPU entry
        current.setdefault(key, value)
    if current:
        entries.append(current)
    return [e for e in entries if e.get("_name") or e.get("Chipset Model")]
