"""Windows: one PowerShell/CIM call for GPUs, VRAM (registry), CPU and its features; nvidia-smi for NVIDIA,
then the registry's DriverVersion for an NVIDIA GPU whose driver version neither of them gave.

Win32_VideoController.AdapterRAM is a 32-bit field that caps at 4 GiB, so the real VRAM comes from
the display class registry key's ``HardwareInformation.qwMemorySize`` (or nvidia-smi); without
either, a full AdapterRAM is only a lower bound (``GPU.vram_at_least``), never the size.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Set

from ..errors import Action
from ..limits import MalformedInput, parse_json
from . import tables
from .common import Probe, check_driver_age, classify_kind, fill_nvidia, nvidia_driver_hint, query_nvidia_smi
from .cpu import normalize_features, x86_64_level
from .report import GPU, HardwareReport

__all__ = ["ADAPTER_RAM_CAP", "NVIDIA_SMI_EXES", "POWERSHELL", "REGISTRY_DRIVER", "REGISTRY_DRIVER_SCRIPT", "SCRIPT", "SYSTEM_DIR", "VULKAN_DLL",
           "gpus", "nvidia_driver_from_windows", "probe"]

SCRIPT = (
    "$ErrorActionPreference='SilentlyContinue';"
    "$o=[ordered]@{};"
    "$o.gpus=@(Get-CimInstance Win32_VideoController | Select-Object Name,PNPDeviceID,DriverVersion,AdapterRAM,Status);"
    "$o.registry=@(Get-ItemProperty 'HKLM:\\SYSTEM\\CurrentControlSet\\Control\\Class\\{4d36e968-e325-11ce-bfc1-08002be10318}\\0*' "
    "| Select-Object DriverDesc,MatchingDeviceId,'HardwareInformation.qwMemorySize');"
    "$o.cpu=Get-CimInstance Win32_Processor | Select-Object -First 1 Name,Manufacturer,NumberOfCores,NumberOfLogicalProcessors;"
    "Add-Type -Namespace W -Name K -MemberDefinition '[DllImport(\"kernel32.dll\")] public static extern bool IsProcessorFeaturePresent(uint f);';"
    "$o.features=[ordered]@{};foreach($f in 13,19,36,37,38,39,40,41,43,46){$o.features[\"$f\"]=[W.K]::IsProcessorFeaturePresent($f)};"
    "$o|ConvertTo-Json -Depth 4 -Compress"
)
POWERSHELL = ["powershell", "-NoProfile", "-NonInteractive", "-Command", SCRIPT]
# The driver version of each display adapter's driver key, read only when WMI and nvidia-smi left an
# NVIDIA GPU's version unknown; a command of its own, so that SCRIPT's recorded command line (and every
# capture made with it) stays as it is. Microsoft documents the key (Class\{ClassGUID}, the Display
# class's GUID: learn.microsoft.com/windows-hardware/drivers/install/system-defined-device-setup-classes-
# available-to-vendors) and both values (DriverVersion and MatchingDeviceId under the device's software
# key: .../install/devpkey-device-driverversion, .../install/devpkey-device-matchingdeviceid). PowerShell's
# JSON rather than `reg query`: reg's /v names one value (this needs two, joined by key), its /s descends
# into the Properties subkey that refuses non-administrators, and its text columns are for people; the
# '0*' wildcard names only the adapters' keys, as SCRIPT's own registry read does.
REGISTRY_DRIVER_SCRIPT = (
    "$ErrorActionPreference='SilentlyContinue';"
    "ConvertTo-Json -Compress -InputObject @(Get-ItemProperty "
    "'HKLM:\\SYSTEM\\CurrentControlSet\\Control\\Class\\{4d36e968-e325-11ce-bfc1-08002be10318}\\0*' "
    "| Select-Object MatchingDeviceId,DriverVersion)"
)
REGISTRY_DRIVER = ["powershell", "-NoProfile", "-NonInteractive", "-Command", REGISTRY_DRIVER_SCRIPT]
# IsProcessorFeaturePresent ids (winnt.h PF_*) -> our feature names.
_PF = {"13": "sse3", "19": "neon", "36": "ssse3", "37": "sse4.1", "38": "sse4.2", "39": "avx", "40": "avx2", "41": "avx512f", "43": "dotprod", "46": "sve"}
VULKAN_DLL = "C:\\Windows\\System32\\vulkan-1.dll"
# Where NVIDIA's driver installs nvidia-smi.exe: the system directory (current, DCH drivers), the NVSMI
# folder before them (Chromium loads NVML from %ProgramW6432%\NVIDIA Corporation\NVSMI, crrev.com/1241aea5).
NVIDIA_SMI_EXES = ("C:\\Windows\\System32\\nvidia-smi.exe", "C:\\Program Files\\NVIDIA Corporation\\NVSMI\\nvidia-smi.exe")
# The system directory, where the Adrenalin driver installs its HIP runtime (amdhip64_<N>.dll).
SYSTEM_DIR = "C:\\Windows\\System32"
# AdapterRAM is a uint32: a value this high means the field is full (4 GiB - 1 MiB, as drivers report it), not the size.
ADAPTER_RAM_CAP = 0xFFF00000
# The names Windows gives an adapter it drives itself, without the vendor's driver.
# compiled on first use (re's cache), not when detection is imported on another OS
_BASIC_ADAPTER = r"Microsoft Basic (Display|Render) (Adapter|Driver)|Standard VGA Graphics Adapter|Video Controller \(VGA Compatible\)"


def probe(p: Probe, report: HardwareReport) -> None:
    facts = p.system.platform()
    report.os.version = facts.win_version or facts.version
    p.timeout = max(p.timeout, 15.0)  # PowerShell + Add-Type compile is slow on a cold start
    res = p.run(POWERSHELL, "powershell")
    data: Dict[str, Any] = {}
    if res.stdout.strip():
        try:
            parsed = parse_json(res.stdout, what="the PowerShell hardware query's output")
            data = parsed if isinstance(parsed, dict) else {}
        except MalformedInput:  # not JSON, or nested past the parser's depth
            p.problem("powershell_garbage", "the PowerShell hardware query printed output that could not be understood",
                      "attach a capture of this machine's detection to a bug report", "warning", action=Action.REPORT_BUG)
    elif not res.timed_out:
        p.problem("powershell_failed", "the PowerShell hardware query failed" + (f": {res.stderr.strip()[:200]}" if res.stderr.strip() else ""), "check that Windows PowerShell is available and not blocked by policy", "warning")
    _cpu(report, data.get("cpu") or {}, data.get("features") or {})
    report.gpus = gpus(p, data)
    if p.system.exists(VULKAN_DLL):
        report.vulkan_loader = VULKAN_DLL


def _cpu(report: HardwareReport, cpu: Dict[str, Any], features: Dict[str, Any]) -> None:
    cpu = cpu if isinstance(cpu, dict) else {}
    raw = [name for pf, name in _PF.items() if features.get(pf) is True]
    if report.os.arch == "x86_64" and "avx2" in raw:
        # Windows exposes no PF_ flag for these; every shipping AVX2 CPU (Haswell+, Excavator+) has them.
        raw += ["fma", "f16c", "bmi1", "bmi2", "lzcnt", "movbe", "xsave", "popcnt", "cx16", "lahf"]
    elif report.os.arch == "x86_64" and "sse4.2" in raw:
        raw += ["popcnt", "cx16", "lahf"]
    report.cpu.features = normalize_features(raw)
    report.cpu.model = str(cpu.get("Name") or "").strip()
    report.cpu.vendor = "intel" if "intel" in str(cpu.get("Manufacturer", "")).lower() else ("amd" if "amd" in str(cpu.get("Manufacturer", "")).lower() else str(cpu.get("Manufacturer") or "").lower())
    report.cpu.physical_cores = cpu.get("NumberOfCores") if isinstance(cpu.get("NumberOfCores"), int) else None
    report.cpu.logical_cores = cpu.get("NumberOfLogicalProcessors") if isinstance(cpu.get("NumberOfLogicalProcessors"), int) else None
    if report.os.arch == "x86_64" and report.cpu.features:
        report.cpu.x86_64_level = x86_64_level(report.cpu.features)


def nvidia_driver_from_windows(version: str) -> str:
    """'31.0.15.3742' -> '537.42': NVIDIA's version is the last five digits of the WDDM version.

    The rule Chromium applies to the registry's driver version (crrev.com/1241aea5, "the actual NVIDIA
    driver version is parsed from the driver version in the Windows registry"); a real machine shows
    it: WMI's 31.0.15.3713 beside nvidia-smi's 537.13 (shared/reference/hardware-dumps/016). The registry's
    DriverVersion is the same string (31.0.15.5222 -> 552.22; the-database/mpv-AnimeJaNai#81 checks 31.0.15.7652 -> 576.52)."""
    digits = "".join(version.split(".")[-2:])
    if len(digits) < 5 or not (digits.isascii() and digits.isdigit()):
        return ""
    d = digits[-5:]
    return f"{int(d[:3])}.{d[3:]}"


def _as_list(value: Any) -> List[Dict[str, Any]]:
    if isinstance(value, dict):
        return [value]
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def gpus(p: Probe, data: Dict[str, Any]) -> List[GPU]:
    registry = _as_list(data.get("registry"))
    found: List[GPU] = []
    for item in _as_list(data.get("gpus")):
        pnp = str(item.get("PNPDeviceID") or "")
        m = re.search(r"VEN_([0-9A-F]{4})&DEV_([0-9A-F]{4})(?:&SUBSYS_([0-9A-F]{8}))?", pnp, re.I)
        if not m:
            continue  # Microsoft Basic Display Adapter, remote display drivers, virtual adapters
        vendor_id, device_id = m.group(1).lower(), m.group(2).lower()
        vendor = tables.PCI_VENDORS.get(vendor_id, "other")
        name = str(item.get("Name") or "").strip()
        known = tables.pci_lookup(vendor_id, device_id)
        # Windows' own driver names the adapter generically: the vendor's driver is not installed
        basic = bool(re.search(_BASIC_ADAPTER, name, re.I)) or not name
        if basic:
            name = tables.pretty_pci_name(vendor, known[0]) if known else f"{vendor.upper() if vendor != 'other' else 'PCI'} device {vendor_id}:{device_id}"
        g = GPU(index=len(found), vendor=vendor, name=name, pci_vendor_id=vendor_id, pci_device_id=device_id, driver="wddm", sources=["Win32_VideoController"])
        if basic:
            g.driver = "basic-display"  # Microsoft Basic Display Adapter: no vendor driver
            g.sources.append("driver: Windows' basic display driver (no vendor driver installed)")
        if m.group(3):
            sub = m.group(3).lower()
            g.pci_subsystem_id = f"{sub[4:]}:{sub[:4]}"
        raw_driver = "" if basic else str(item.get("DriverVersion") or "")
        g.driver_version = nvidia_driver_from_windows(raw_driver) if vendor == "nvidia" else raw_driver
        status = str(item.get("Status") or "OK")
        if status not in ("OK", ""):
            p.problem("gpu_status", f"Windows reports {name} as '{status}'", "open Device Manager: the GPU may be disabled or its driver failed to start", "warning", g.index)
        g.vram_total = _registry_vram(registry, vendor_id, device_id, name)
        if g.vram_total:
            g.sources.append("vram: registry HardwareInformation.qwMemorySize")
        else:
            ram = item.get("AdapterRAM")
            if isinstance(ram, int) and not isinstance(ram, bool) and ram >= ADAPTER_RAM_CAP:
                g.vram_at_least = ram  # the 32-bit field is full: the card has this much or (usually) more
                g.sources.append("vram: unknown, at least AdapterRAM (a 32-bit field capped at 4 GiB)")
            elif isinstance(ram, int) and not isinstance(ram, bool) and ram > 0:
                g.vram_total = ram
                g.sources.append("vram: AdapterRAM (32-bit, exact below 4 GiB)")
        if vendor == "amd":
            g.gfx_target = tables.amd_gfx_target(device_id, name)
        if vendor == "intel":
            g.intel_generation = tables.intel_generation_for(device_id, name)[0]
            if tables.intel_platform(device_id):
                g.sources.append("generation: PCI device id (kernel id list)")
        # an Intel GPU's kind comes from the platform (its PCI id), an NVIDIA one's from its name, never the database's flag: it
        # calls Meteor Lake's iGPU and the unified-memory GB10 discrete
        g.kind = ("discrete" if known[1] else "integrated") if known and vendor not in ("intel", "nvidia") else classify_kind(vendor, name, device_id, g.gfx_target)
        if vendor == "amd" and g.gfx_target and tables.amd_is_integrated(g.gfx_target):
            g.kind = "integrated"
        if vendor == "amd" and not basic:
            _hip_runtime(p, g)
        found.append(g)

    nvidia = [g for g in found if g.vendor == "nvidia"]
    if nvidia:
        # the driver's own nvidia-smi.exe, where the driver installs it, even when it is not on PATH
        smi = query_nvidia_smi(p, next((x for x in NVIDIA_SMI_EXES if p.system.exists(x)), "nvidia-smi")) or []
        registry_versions: Optional[List[Dict[str, Any]]] = None  # read once, and only when a version is still unknown
        for i, g in enumerate(nvidia):
            s = next((s for s in smi if s.name == g.name), smi[i] if i < len(smi) else None)
            if s:
                g.bus_id = s.bus_id
            fill_nvidia(g, s, "windows")
            if not g.driver_version and g.driver != "basic-display":
                if registry_versions is None:
                    registry_versions = _registry_driver_versions(p)
                _driver_from_registry(g, registry_versions)
            win = p.system.platform().win_version
            if g.cuda_driver_version:
                check_driver_age(p, g, "windows", win)
            if g.driver == "basic-display":
                p.problem("nvidia_driver_not_loaded", f"{g.name} has no NVIDIA driver (Windows shows it as a basic display adapter)",
                          nvidia_driver_hint(g.compute_capability, True, "windows", win) + " (from nvidia.com or Windows Update)", "error", g.index,
                          action=Action.UPDATE_DRIVER)
            elif not s and not g.driver_version:
                # the adapter carries NVIDIA's own name, so NVIDIA's driver is installed: only its version is unknown
                g.sources.append("driver: NVIDIA's (the adapter has NVIDIA's name), version unknown")
                p.problem("nvidia_driver_version_unknown",
                          f"{g.name} has NVIDIA's driver installed, but its version could not be read (not in WMI or the registry, and nvidia-smi did not answer)",
                          "run `nvidia-smi` to see the driver version; if it fails, repair the driver: "
                          + nvidia_driver_hint(g.compute_capability, True, "windows", win), "warning", g.index)
    return found


def _registry_driver_versions(p: Probe) -> List[Dict[str, Any]]:
    """The display adapters' driver keys (MatchingDeviceId, DriverVersion); none when the read failed or
    printed what is not JSON (the version then stays unknown, and the report says so)."""
    res = p.run(REGISTRY_DRIVER, "registry")
    if not res.ok or not res.stdout.strip():
        return []
    try:
        return _as_list(parse_json(res.stdout, what="the registry's driver keys"))
    except MalformedInput:  # not JSON, or nested past the parser's depth
        return []


def _driver_from_registry(g: GPU, entries: List[Dict[str, Any]]) -> None:
    """The NVIDIA driver version of the driver keys installed for this GPU's PCI ids, when they agree."""
    ids = re.compile(rf"\\ven_{g.pci_vendor_id}&dev_{g.pci_device_id}(?![0-9a-f])")
    found: Set[str] = set()
    for entry in entries:
        match, raw = entry.get("MatchingDeviceId"), entry.get("DriverVersion")
        if isinstance(match, str) and isinstance(raw, str) and ids.search(match.lower()) and re.fullmatch(r"[0-9]{1,5}(\.[0-9]{1,6}){3}", raw):
            found.add(nvidia_driver_from_windows(raw))
    found.discard("")
    if len(found) == 1:
        g.driver_version = found.pop()
        g.cuda_driver_version = tables.cuda_for_driver(g.driver_version, "windows")
        g.sources.append("driver: registry DriverVersion of the display adapter's driver key (matched by MatchingDeviceId)")


def _hip_runtime(p: Probe, g: GPU) -> None:
    """The HIP runtime the Adrenalin driver carries (its newest ``amdhip64_<N>.dll``), and the driver
    update AMD's ROCm builds of PyTorch need when it is older than theirs (ollama checks the same)."""
    info = tables.amd_hip_runtime_windows()
    found = next((major for major in info["majors"] if p.system.exists(f"{SYSTEM_DIR}\\amdhip64_{major}.dll")), "")
    g.hip_runtime = found
    g.sources.append(f"hip runtime: amdhip64_{found}.dll in the system directory" if found
                     else "hip runtime: no amdhip64_*.dll in the system directory")
    needed = info["needed"]
    # an iGPU whose (often OEM) driver has no HIP runtime at all is rarely the GPU to compute on: the
    # plan still says why ROCm is not offered there, without a warning on every such laptop
    if g.gfx_target in info["targets"] and found != needed and (found or g.kind != "integrated"):
        have = f"HIP runtime {found} (amdhip64_{found}.dll)" if found else "no HIP runtime"
        p.problem("amd_hip_runtime_old",
                  f"{g.name}: the installed AMD driver has {have}; AMD's ROCm builds of PyTorch for Windows need HIP {needed} (amdhip64_{needed}.dll)",
                  info["update"], "warning", g.index, action=Action.UPDATE_DRIVER)


def _registry_vram(registry: List[Dict[str, Any]], vendor_id: str, device_id: str, name: str) -> Optional[int]:
    for entry in registry:
        match = str(entry.get("MatchingDeviceId") or "").lower()
        if f"ven_{vendor_id}&dev_{device_id}" in match or (entry.get("DriverDesc") == name and name):
            value = entry.get("HardwareInformation.qwMemorySize")
            if isinstance(value, int) and value > 0:
                return value
    return None
