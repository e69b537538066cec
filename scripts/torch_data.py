#!/usr/bin/env python3
"""Check accelstack's torch matrix (``accelstack/manifests/data/torch.json``) against what PyPI publishes.

    .venv/bin/python scripts/torch_data.py                 # versions (pip index versions) + wheel metadata
    .venv/bin/python scripts/torch_data.py --no-metadata   # versions only
    .venv/bin/python scripts/torch_data.py --versions-file out.txt --simple-file torch.json  # offline, saved answers

Prints what is missing or stale, one finding a line, and exits 1 when there is any: a torch release
line on PyPI that the matrix lacks, a published patch version missing from a line's ``versions``,
a line whose Python range differs from the wheels' tags, a PyPI (index "pypi") CUDA variant whose
CUDA major differs from the wheel's ``Requires-Dist: nvidia-*-cuXX``. Wheel metadata is read with
HTTP range requests (the zip directory and the METADATA member only, a few hundred KiB per wheel),
as pip's lazy-wheel reader does; at most one wheel per platform of the newest line is read.

AMD's own indexes (a variant with ``device_extra``, e.g. ``rocm-amd`` on https://repo.amd.com/rocm/whl-multi-arch/)
are checked the same way (``amd_findings``, skipped with ``--no-amd``): their simple pages for torch and
torchvision (PEP 691 JSON or PEP 503 HTML) must hold each line the matrix names for each platform
(``win_amd64`` wheels for Windows, ``linux_x86_64`` for Linux), and the newest torch wheel's METADATA
(PEP 658 ``.metadata`` file, else range requests) must offer a ``device-gfxNNNN`` extra for every target
the matrix lists for that platform, and no target it lacks.

A new torch release then is a data change reviewed in minutes: run this, edit torch.json, rerun.
The comparison (``compare``) is pure and is what tests/manifests/test_torch_data_script.py checks.
"""
from __future__ import annotations

import argparse
import html.parser
import json
import re
import struct
import subprocess
import sys
import urllib.parse
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

REPO = Path(__file__).resolve().parents[1]
MATRIX = REPO / "accelstack" / "manifests" / "data" / "torch.json"
SIMPLE_URL = "https://pypi.org/simple/torch/"
_WHEEL = re.compile(r"^torch-(?P<version>[^-]+)-(?P<py>cp\d+)-(?P<abi>cp\d+t?|abi3|none)-(?P<plat>.+)\.whl$")
# linux_x86_64: AMD tags its multi-arch Linux wheels so (TheRock publish_pytorch_to_release_bucket.py); PyPI has none
_PLATFORM = {"manylinux_2_28_x86_64": "linux-x86_64", "manylinux_2_28_aarch64": "linux-arm64", "win_amd64": "windows-x86_64",
             "macosx_14_0_arm64": "macos-arm64", "macosx_11_0_arm64": "macos-arm64", "linux_x86_64": "linux-x86_64"}
_CUDA_DEP = re.compile(r"^nvidia-[a-z0-9-]+-cu(\d+)\b", re.I)
_CUDA_TOOLKIT = re.compile(r"^cuda-toolkit(?:\[[^\]]*\])?==(\d+)\.(\d+)", re.I)
_SYSTEM = {"linux": "Linux", "windows": "Windows", "macos": "Darwin"}


@dataclass
class Wheel:
    """One published torch wheel: what its name and (optionally) its METADATA say."""

    filename: str
    version: str
    python: str  # "3.12"
    free_threaded: bool
    platform: str  # matrix key ("linux-x86_64"), or the wheel tag when unknown
    url: str = ""
    requires_python: str = ""
    cuda: str = ""  # CUDA the wheel requires: "13.2" (cuda-toolkit pin) or "13" (nvidia-*-cu13); "" when none or not read


@dataclass
class Finding:
    kind: str  # "missing-line" | "missing-version" | "python-range" | "pypi-cuda" | "unverified"
    line: str
    text: str

    def __str__(self) -> str:
        return f"{self.kind:16s} torch {self.line}: {self.text}"


def parse_pip_index_versions(text: str) -> List[str]:
    """The versions ``pip index versions torch`` lists ("Available versions: 2.15.0, 2.14.1, ...")."""
    for line in text.splitlines():
        if line.strip().lower().startswith("available versions:"):
            return [v.strip() for v in line.split(":", 1)[1].split(",") if v.strip()]
    return []


def wheel_of(filename: str, url: str = "", requires_python: str = "") -> Optional[Wheel]:
    m = _WHEEL.match(filename)
    if not m:
        return None
    py = m.group("py")[2:]
    return Wheel(filename=filename, version=m.group("version"), python=f"{py[0]}.{py[1:]}", free_threaded=m.group("abi").endswith("t"),
                 platform=_PLATFORM.get(m.group("plat"), m.group("plat")), url=url, requires_python=requires_python)


def wheels_of_simple(doc: dict) -> List[Wheel]:
    """Wheels listed by PyPI's JSON simple API (PEP 691) for torch."""
    out = []
    for f in doc.get("files", []):
        w = wheel_of(f.get("filename", ""), f.get("url", ""), f.get("requires-python") or "")
        if w is not None:
            out.append(w)
    return out


def cuda_of_metadata(text: str, platform: str, python: str = "3.12") -> str:
    """The CUDA a torch METADATA requires on ``platform`` (markers evaluated): "13.2" from a cuda-toolkit
    pin, else the major of its nvidia-*-cuXX requirements ("13"), else "" (a CPU wheel)."""
    from packaging.requirements import InvalidRequirement, Requirement

    env = {"platform_system": _SYSTEM.get(platform.split("-")[0], ""), "python_version": python,
           "sys_platform": {"linux": "linux", "windows": "win32", "macos": "darwin"}.get(platform.split("-")[0], ""), "extra": ""}
    majors, full = set(), ""
    for line in text.splitlines():
        if not line.lower().startswith("requires-dist:"):
            continue
        try:
            req = Requirement(line.split(":", 1)[1].strip())
        except InvalidRequirement:
            continue
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        spec = f"{req.name}{'[' + ','.join(sorted(req.extras)) + ']' if req.extras else ''}{req.specifier}"
        m = _CUDA_TOOLKIT.match(spec)
        if m:
            full = f"{m.group(1)}.{m.group(2)}"
        m = _CUDA_DEP.match(req.name)
        if m:
            majors.add(m.group(1))
    return full or ",".join(sorted(majors))


def _final(v: str) -> Optional[Version]:
    try:
        ver = Version(v)
    except InvalidVersion:
        return None
    return None if ver.is_prerelease or ver.is_devrelease or ver.local else ver


def compare(matrix: dict, versions: Sequence[str], wheels: Iterable[Wheel] = (),
            companions: Optional[Dict[str, Sequence[str]]] = None) -> List[Finding]:
    """What torch.json lacks or gets wrong against PyPI's ``versions``, ``wheels`` and the versions of
    the companion packages (``{"torchvision": [...]}``); pure, so tests give it canned answers."""
    findings: List[Finding] = []
    releases = {r["torch"]: r for r in matrix.get("releases", [])}
    oldest = min((Version(k) for k in releases), default=Version("0"))
    newest = max((Version(k) for k in releases), default=Version("0"))
    by_line: Dict[str, List[Version]] = {}
    for text in versions:
        v = _final(text)
        if v is None or v < oldest:
            continue
        by_line.setdefault(f"{v.major}.{v.minor}", []).append(v)
    for line, vs in sorted(by_line.items(), key=lambda kv: Version(kv[0]), reverse=True):
        rel = releases.get(line)
        if rel is None:
            if Version(line) > newest:  # older gaps (2.3) are deliberate: the matrix keeps the lines that matter
                findings.append(Finding("missing-line", line, f"on PyPI ({', '.join(str(v) for v in sorted(vs))}) but not in torch.json"))
            continue
        known = {Version(k) for k in rel.get("versions", [])}
        for v in sorted(set(vs) - known):
            findings.append(Finding("missing-version", line, f"{v} is on PyPI but not in the line's versions {sorted(map(str, known))}"))
    wheels = list(wheels)
    lines: Dict[str, List[Wheel]] = {}
    for w in wheels:
        v = _final(w.version)
        if v is not None:
            lines.setdefault(f"{v.major}.{v.minor}", []).append(w)
    for line, ws in lines.items():
        rel = releases.get(line)
        if rel is None:
            continue
        pys = sorted({Version(w.python) for w in ws if not w.free_threaded})
        spec = SpecifierSet(rel.get("python", ""))
        outside = [str(p) for p in pys if p not in spec]
        missing = [f"3.{m}" for m in range(8, 20) if Version(f"3.{m}") in spec and pys and Version(f"3.{m}") not in pys]
        if outside or missing:
            findings.append(Finding("python-range", line, f"wheels exist for Python {', '.join(map(str, pys))}; torch.json says {rel.get('python')}"
                                    + (f" (not covered: {', '.join(outside)})" if outside else "")
                                    + (f" (no wheel for: {', '.join(missing)})" if missing else "")))
        cudas = {(w.platform, w.cuda) for w in ws if w.cuda}
        for plat, cuda in sorted(cudas):
            if "." not in cuda:
                continue
            have = [v for v in rel.get("variants", []) if v.get("backend") == "cuda" and v.get("cuda") == cuda and plat in v.get("platforms", {})]
            if not have:
                findings.append(Finding("pypi-cuda", line, f"PyPI's {plat} wheel requires CUDA {cuda}; torch.json has no CUDA {cuda} variant for {plat}"))
            elif not any((v["platforms"][plat].get("index") or v.get("index")) == "pypi" for v in have):
                findings.append(Finding("pypi-cuda", line, f"PyPI's {plat} wheel is the CUDA {cuda} build; mark {have[0]['name']}'s {plat} entry index 'pypi'"))
    for line, rel in releases.items():
        for var in rel.get("variants", []):
            marks = ([("", var["unverified"])] if var.get("unverified") else []) + [
                (p, b["unverified"]) for p, b in var.get("platforms", {}).items() if isinstance(b, dict) and b.get("unverified")]
            for plat, why in marks:
                findings.append(Finding("unverified", line, f"{var['name']}{' on ' + plat if plat else ''}: publication not confirmed ({why})"))
    for name, published in (companions or {}).items():
        lines_out = {f"{v.major}.{v.minor}" for v in (_final(t) for t in published) if v is not None}
        for line, rel in releases.items():
            want = rel.get("companions", {}).get(name)
            if want and want not in lines_out and Version(line) >= Version("2.4"):
                findings.append(Finding("companion", line, f"{name} {want} is named as its companion, but PyPI has no {name} {want}.x"))
    return findings


# -- AMD's own indexes (TheRock multi-arch) ----------------------------------------------------------
_ANY_WHEEL = re.compile(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<version>[^-]+)-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")
_DEVICE_EXTRA = re.compile(r"^Provides-Extra:\s*device-(gfx[0-9a-f]+)\s*$", re.I | re.M)


@dataclass
class IndexFile:
    """One wheel on a simple index page: its name, version line, platform, URL and PEP 658 metadata flag."""

    filename: str
    line: str  # "2.14"
    platform: str
    url: str
    has_metadata: bool = False


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: List[Tuple[str, Dict[str, Optional[str]]]] = []

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Optional[str]]]) -> None:
        if tag == "a":
            d = dict(attrs)
            self.links.append((d.get("href") or "", d))


def index_files(body: bytes, page_url: str) -> List[IndexFile]:
    """The wheels a simple index page lists, PEP 691 JSON or PEP 503 HTML; local versions kept
    (AMD's wheels are ``2.14.0+rocm7.14.0``)."""
    entries: List[Tuple[str, str, bool]] = []
    text = body.decode("utf-8", "replace")
    if text.lstrip().startswith("{"):
        for f in json.loads(text).get("files", []):
            meta = f.get("core-metadata") or f.get("dist-info-metadata")
            entries.append((f.get("filename", ""), f.get("url", ""), bool(meta)))
    else:
        parser = _Anchors()
        parser.feed(text)
        for href, attrs in parser.links:
            name = urllib.parse.unquote(href.split("#")[0].rsplit("/", 1)[-1])
            meta = attrs.get("data-core-metadata") or attrs.get("data-dist-info-metadata")
            entries.append((name, href, bool(meta) and meta != "false"))
    out = []
    for name, href, meta in entries:
        m = _ANY_WHEEL.match(name)
        if not m:
            continue
        try:
            v = Version(m.group("version"))
        except InvalidVersion:
            continue
        out.append(IndexFile(name, f"{v.major}.{v.minor}", _PLATFORM.get(m.group("plat"), m.group("plat")),
                             urllib.parse.urljoin(page_url, href.split("#")[0]), meta))
    return out


def device_extras(metadata: str) -> Set[str]:
    """The gfx targets a torch METADATA offers as ``device-gfxNNNN`` extras."""
    return {m.lower() for m in _DEVICE_EXTRA.findall(metadata)}


def amd_findings(matrix: dict, get: Optional[Callable[[str], bytes]] = None) -> List[Finding]:
    """What torch.json says about AMD's own indexes that the indexes do not bear out (see the module text)."""
    get = get or (lambda url: _get(url, {"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.5"}))
    findings: List[Finding] = []
    by_index: Dict[str, List[Tuple[dict, dict]]] = {}
    for rel in matrix.get("releases", []):
        for var in rel.get("variants", []):
            if var.get("device_extra") and var.get("index", "").startswith(("https://", "http://")):
                by_index.setdefault(var["index"], []).append((rel, var))
    for index, entries in by_index.items():
        pages: Dict[str, List[IndexFile]] = {}
        for package in ("torch", "torchvision"):
            url = index.rstrip("/") + f"/{package}/"
            try:
                pages[package] = index_files(get(url), url)
            except (OSError, ValueError) as exc:
                findings.append(Finding("amd-index", "-", f"could not read {url}: {exc}"))
                pages[package] = []
        if not pages["torch"]:
            continue
        name = entries[0][1]["name"]
        known_lines = {rel["torch"] for rel, _ in entries}
        oldest = min(Version(line) for line in known_lines)
        for line in sorted({f.line for f in pages["torch"]} - known_lines, key=Version, reverse=True):
            if Version(line) > oldest:
                findings.append(Finding("amd-index", line, f"torch {line} is on {index} but torch.json has no {name} for it"))
        for rel, var in entries:
            line = rel["torch"]
            for plat in var.get("platforms", {}):
                have = [f for f in pages["torch"] if f.line == line and f.platform == plat]
                if not have:
                    findings.append(Finding("amd-index", line, f"{name}: {index} has no torch {line} wheel for {plat}"))
                    continue
                if var.get("unverified"):
                    findings.append(Finding("amd-confirmed", line, f"{name}: torch {line} for {plat} is on {index}; drop its 'unverified'"))
                tv = rel.get("companions", {}).get("torchvision")
                if tv and not any(f.line == tv and f.platform == plat for f in pages["torchvision"]):
                    findings.append(Finding("amd-index", line, f"{name}: {index} has no torchvision {tv} wheel for {plat}"))
        newest = max(entries, key=lambda e: Version(e[0]["torch"]))
        rel, var = newest
        for plat, build in var.get("platforms", {}).items():
            wheel = next((f for f in pages["torch"] if f.line == rel["torch"] and f.platform == plat), None)
            if wheel is None:
                continue
            try:
                meta = get(wheel.url + ".metadata").decode("utf-8", "replace") if wheel.has_metadata else wheel_metadata(wheel.url)
            except (OSError, ValueError) as exc:
                findings.append(Finding("amd-extra", rel["torch"], f"could not read the METADATA of {wheel.filename}: {exc}"))
                continue
            offered = device_extras(meta)
            listed = set(build.get("gfx", [])) | set(build.get("gfx_build_only", []))
            for gfx in sorted(listed - offered):
                findings.append(Finding("amd-extra", rel["torch"], f"{name} on {plat} lists {gfx}, but {wheel.filename} has no device-{gfx} extra"))
            for gfx in sorted(offered - listed):
                findings.append(Finding("amd-extra", rel["torch"], f"{wheel.filename} offers device-{gfx}; torch.json lists it neither "
                                                                    f"as release-ready (gfx) nor as build-only (gfx_build_only) on {plat}"))
    return findings


# -- network (not used by the tests) ----------------------------------------------------------------
def _get(url: str, headers: Optional[Dict[str, str]] = None, timeout: float = 60) -> bytes:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - https PyPI URLs only
        return resp.read()


def _range(url: str, start: int, end: Optional[int] = None) -> bytes:
    rng = f"bytes={start}-{'' if end is None else end}" if start >= 0 else f"bytes={start}"
    return _get(url, {"Range": rng})


def wheel_metadata(url: str) -> str:
    """A wheel's ``*.dist-info/METADATA``, read by HTTP range requests (the zip directory, then the member)."""
    tail = _range(url, -65536)
    eocd = tail.rfind(b"PK\x05\x06")
    if eocd < 0:
        raise ValueError("no zip directory at the end of the wheel (zip64 wheels are not handled)")
    cd_size, cd_offset = struct.unpack("<II", tail[eocd + 12:eocd + 20])
    cd = _range(url, cd_offset, cd_offset + cd_size - 1)
    pos = 0
    while pos + 46 <= len(cd) and cd[pos:pos + 4] == b"PK\x01\x02":
        method, = struct.unpack("<H", cd[pos + 10:pos + 12])
        csize, = struct.unpack("<I", cd[pos + 20:pos + 24])
        nlen, elen, clen = struct.unpack("<HHH", cd[pos + 28:pos + 34])
        local, = struct.unpack("<I", cd[pos + 42:pos + 46])
        name = cd[pos + 46:pos + 46 + nlen].decode("utf-8", "replace")
        if name.endswith(".dist-info/METADATA"):
            head = _range(url, local, local + 29)
            lnlen, lelen = struct.unpack("<HH", head[26:30])
            start = local + 30 + lnlen + lelen
            data = _range(url, start, start + csize - 1)
            return (zlib.decompress(data, -15) if method == 8 else data).decode("utf-8", "replace")
        pos += 46 + nlen + elen + clen
    raise ValueError("no METADATA in the wheel's zip directory")


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--matrix", default=str(MATRIX))
    ap.add_argument("--versions-file", help="saved output of `pip index versions torch` (offline)")
    ap.add_argument("--simple-file", help="saved PEP 691 JSON of https://pypi.org/simple/torch/ (offline)")
    ap.add_argument("--no-metadata", action="store_true", help="do not read wheel METADATA (CUDA majors)")
    ap.add_argument("--no-amd", action="store_true", help="do not check AMD's own indexes (variants with device_extra)")
    args = ap.parse_args(argv)
    matrix = json.loads(Path(args.matrix).read_text())
    if args.versions_file:
        text = Path(args.versions_file).read_text()
    else:
        text = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "torch"], capture_output=True, text=True,
                              timeout=300).stdout
    versions = parse_pip_index_versions(text)
    if args.simple_file:
        simple = json.loads(Path(args.simple_file).read_text())
    else:
        simple = json.loads(_get(SIMPLE_URL, {"Accept": "application/vnd.pypi.simple.v1+json"}))
    wheels = wheels_of_simple(simple)
    if not args.no_metadata and wheels:
        newest = max((_final(w.version) for w in wheels if _final(w.version)), default=None)
        seen: Set[Tuple[str, str]] = set()
        for w in wheels:
            if _final(w.version) != newest or (w.version, w.platform) in seen or not w.url:
                continue
            seen.add((w.version, w.platform))
            try:
                w.cuda = cuda_of_metadata(wheel_metadata(w.url), w.platform, w.python)
                print(f"read METADATA of {w.filename}: CUDA {w.cuda or 'none'}", file=sys.stderr)
            except (OSError, ValueError) as exc:
                print(f"could not read METADATA of {w.filename}: {exc}", file=sys.stderr)
            for other in wheels:  # one wheel speaks for its version and platform
                if other.version == w.version and other.platform == w.platform:
                    other.cuda = w.cuda
    companions = {}
    if not args.versions_file:
        for name in ("torchvision", "torchaudio"):
            out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name], capture_output=True, text=True, timeout=300).stdout
            companions[name] = parse_pip_index_versions(out)
    findings = compare(matrix, versions, wheels, companions)
    if not args.no_amd and not args.versions_file:  # saved answers mean offline: AMD's index is not read
        findings += amd_findings(matrix)
    for f in findings:
        print(f)
    if not findings:
        print("torch.json matches PyPI")
    return 1 if any(f.kind not in ("unverified",) for f in findings) else 0


if __name__ == "__main__":
    sys.exit(main())
