"""pip's output, read: download progress as events, and a failure as the typed error that names
its root cause.

pip prints its real cause (an index that does not resolve, refused the connection, a proxy, TLS,
a missing package, a conflict, a full disk) somewhere in the middle; its last line is often a
consequence ("No matching distribution", "conflicting dependencies"). :func:`pip_failure` finds
the cause; :class:`PipOutput` turns the lines into progress events and keeps them for it.
"""
from __future__ import annotations

import re
import time
import urllib.parse
from pathlib import Path
from typing import List, Optional, Sequence

from .. import artifacts  # its network probe, loaded when pip failed without saying why
from ..events import ProgressCallback, ProgressEvent
from .errors import PipConflictError, PipDiskFullError, PipError, PipHashMismatchError, PipNetworkError, PipNotFoundError

__all__ = ["PipOutput", "pip_failure", "searched_indexes", "redact"]

# -- pip's output: download progress -----------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_DOWNLOADING = re.compile(r"^\s*Downloading\s+(\S+)(?:\s+\((\d+(?:\.\d+)?)\s*([kKMGT]?i?B)\))?\s*$")
_RAW = re.compile(r"^\s*Progress\s+(\d+)\s+of\s+(\d+)\s*$")  # pip >= 24.1, --progress-bar raw
_RICH = re.compile(r"(\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)\s+([kKMGT]?i?B)\b")  # pip >= 22 rich bar: "1.2/2.5 GB"
_RICH_SIZE = re.compile(r"^[\s\-\\|/━╸╺]*(\d+(?:\.\d+)?)\s+([kKMGT]?i?B)\s")  # the same without a known size
_UNITS = {"B": 1, "kB": 1000, "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3, "TB": 1000 ** 4,
          "KiB": 1024, "kiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3, "TiB": 1024 ** 4}


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS.get(unit, 1))


class PipOutput:
    """Reads pip's output line by line: each download becomes ``start``/``advance``/``end`` events
    of stage ``download`` (task: the file name, ``done``/``total`` in bytes, at most one advance
    every ``interval`` seconds), every other line a ``message`` event of ``stage``; the lines are
    kept (without progress redraws and terminal escapes) for :func:`pip_failure`."""

    def __init__(self, progress: ProgressCallback, stage: str, interval: float = 0.25) -> None:
        self.progress = progress
        self.stage = stage
        self.interval = interval
        self.lines: List[str] = []
        self.files: List[str] = []
        self._task = ""
        self._total: Optional[int] = None
        self._done = 0
        self._sent = 0.0

    def feed(self, raw: str) -> None:
        text = _ANSI.sub("", raw).replace("\r", "").rstrip()
        if not text.strip():
            return
        m = _DOWNLOADING.match(text)
        if m:
            self._finish(True)
            url = m.group(1)
            self._task = Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path)).name or url
            self._total = _bytes(m.group(2), m.group(3)) if m.group(2) else None
            self._done, self._sent = 0, time.monotonic()
            self.files.append(self._task)
            self._keep(text)
            self.progress(ProgressEvent("start", "download", task=self._task, total=self._total, extra={"unit": "B"}))
            return
        if self._task and self._progress_line(text):
            return
        self._finish(not text.lstrip().startswith(("ERROR", "WARNING: Retrying")))  # a broken download is not done
        self._keep(text)
        self.progress(ProgressEvent("message", self.stage, task="pip", message=text))

    def _progress_line(self, text: str) -> bool:
        raw = _RAW.match(text)
        if raw:
            self._advance(int(raw.group(1)), int(raw.group(2)))
            return True
        rich = _RICH.search(text)
        if rich:
            total = _bytes(rich.group(2), rich.group(3))
            if self._total is not None and abs(total - self._total) <= _UNITS.get(rich.group(3), 1) // 10 + 1:
                total = self._total  # the same size, rounded: keep the more exact one
            self._advance(min(_bytes(rich.group(1), rich.group(3)), total), total)
            return True
        size = _RICH_SIZE.match(text)
        if size:
            self._advance(_bytes(size.group(1), size.group(2)), self._total)
            return True
        return False

    def _advance(self, done: int, total: Optional[int]) -> None:
        self._done, self._total = done, total
        now = time.monotonic()
        if now - self._sent >= self.interval or (total is not None and done >= total):
            self._sent = now
            self.progress(ProgressEvent("advance", "download", task=self._task, done=done, total=total, extra={"unit": "B"}))

    def _finish(self, ok: bool) -> None:
        if not self._task:
            return
        done = self._total if ok and self._total is not None else self._done
        self.progress(ProgressEvent("end", "download", task=self._task, done=done, total=self._total, ok=ok,
                                    extra={"unit": "B"}))
        self._task = ""

    def _keep(self, text: str) -> None:
        self.lines.append(text)
        if len(self.lines) > 2000:
            del self.lines[:1000]

    def close(self, ok: bool = True) -> None:
        """The command ended: a download still open ended with it."""
        self._finish(ok)


# -- pip's output: why it failed ---------------------------------------------------------------------

# (kind, what it means, hint, patterns in pip's lines); the first kind found in any line wins
_NETWORK = [
    ("insecure-index", "pip ignored a plain-HTTP package index",
     "use the index's https:// address, or pass pip --trusted-host for a mirror you control",
     ["is not a trusted or secure host and is being ignored"]),
    ("proxy", "pip could not go through the proxy",
     "check the proxy settings (HTTPS_PROXY / HTTP_PROXY, pip's proxy option) and that the proxy is running",
     ["ProxyError", "Cannot connect to proxy", "407 Proxy Authentication Required", "Tunnel connection failed"]),
    ("dns", "a package index's host name does not resolve (DNS)",
     "check the network connection and the index URL; without network, install from an offline bundle",
     ["Name or service not known", "Temporary failure in name resolution", "nodename nor servname provided",
      "getaddrinfo failed", "No address associated with hostname", "[Errno -2]", "[Errno -3]", "[Errno 11001]",
      "NameResolutionError"]),
    ("tls", "the TLS (HTTPS) connection to a package index failed",
     "check the system's CA certificates (pip's --cert / PIP_CERT for a corporate proxy) and the machine's clock",
     ["CERTIFICATE_VERIFY_FAILED", "SSLCertVerificationError", "SSLError", "problem confirming the ssl certificate"]),
    ("connection-refused", "a package index refused the connection",
     "check the index URL and its port, and that the server (or mirror) is running",
     ["Connection refused", "[Errno 111]", "[Errno 61]", "ConnectionRefusedError", "[WinError 10061]"]),
    ("unreachable", "the network or a package index's host is unreachable",
     "check the network connection; without network, install from an offline bundle",
     ["Network is unreachable", "No route to host", "[Errno 101]", "[Errno 113]"]),
    ("timeout", "a package index did not answer in time",
     "try again; on a slow line raise pip's --timeout (PIP_DEFAULT_TIMEOUT)",
     ["ReadTimeoutError", "ConnectTimeoutError", "Read timed out", "timed out. (connect timeout"]),
    ("connection-lost", "the connection broke during a download",
     "try again; downloads that break repeatedly point to a proxy or an unstable connection",
     ["Connection reset by peer", "RemoteDisconnected", "IncompleteRead", "Connection broken", "ProtocolError"]),
]
_HTTP_ERROR = re.compile(r"HTTP error (\d{3}) while getting (\S+)|(\d{3}) (?:Client|Server) Error: .*? for url: (\S+)")
_NOT_FOUND = re.compile(r"No matching distribution found for (.+)$")
_VERSIONS = re.compile(r"Could not find a version that satisfies the requirement (.+?) \(from versions: (.*)\)\s*$")
_INDEXES = re.compile(r"^Looking in indexes: (.+)$")


def _first(lines: Sequence[str], needles: Sequence[str]) -> str:
    for line in lines:
        if any(n in line for n in needles):
            return line.strip()
    return ""


_CAUSE_TEXT = [re.compile(p) for p in (r"Failed to establish a new connection: [^'\")]+", r"Cannot connect to proxy",
                                        r"\[SSL[^\]]*\][^'\")]*", r"Read timed out[^'\")]*", r"\d{3} Proxy Authentication Required",
                                        r"Connection reset by peer", r"The repository located at \S+ is not a trusted or secure host")]


def _quote(line: str, width: int = 240) -> str:
    """The telling part of one of pip's lines: urllib3's reason rather than its retry bookkeeping."""
    for pattern in _CAUSE_TEXT:
        m = pattern.search(line)
        if m:
            return m.group(0).strip()
    line = re.sub(r"<[\w.]+ object at 0x[0-9a-f]+>: ", "", re.sub(r"^\s*(ERROR|WARNING): ", "", line.strip()))
    return line if len(line) <= width else line[:width] + "…"


def searched_indexes(lines: Sequence[str], argv: Sequence[str]) -> List[str]:
    """The indexes pip searched: its own "Looking in indexes" line, else the command's, else PyPI."""
    for line in lines:
        m = _INDEXES.match(line.strip())
        if m:
            return [u.strip() for u in m.group(1).split(",") if u.strip()]
    urls = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--index-url", "-i", "--extra-index-url")]
    if "--no-index" in argv:
        return urls
    return urls if any(a in ("--index-url", "-i") for a in argv) else ["https://pypi.org/simple", *urls]


def _unreachable(indexes: Sequence[str], where: str, then: str, after: str, proxied: bool) -> Optional[PipNetworkError]:
    """The network error for the first of ``indexes`` that cannot be reached at all, if any (none
    is tried behind a proxy)."""
    if proxied:
        return None
    for url in indexes:
        kind, why = artifacts.host_problem(url)
        if kind:
            what, hint = next((w, h) for k, w, h, _ in _NETWORK if k == kind)
            return PipNetworkError(f"pip failed: {what}: {redact([why])[0]}; indexes searched: {where}{then}",
                                   f"{hint}{after}", kind=kind, cause=why, code=f"pip-{kind}")
    return None


def pip_failure(lines: Sequence[str], argv: Sequence[str], after: str, *, proxied: bool) -> PipError:
    """The error for a pip command that failed with output ``lines``: the root cause, not the last
    line (a host that does not resolve ends in "No matching distribution", or in "conflicting
    dependencies" when another index has other versions), quoted, with what to do about it.
    ``proxied`` (:attr:`Settings.proxied <accelstack.settings.Settings.proxied>`): pip goes through
    a proxy, so an index pip says nothing about is not tried directly."""
    after = f"; {after}" if after else ""
    indexes = searched_indexes(lines, argv)
    links = [m.group(1) for m in (re.match(r"^Looking in links: (.+)$", line.strip()) for line in lines) if m]
    where = ", ".join(redact(indexes + links)) or "no index"
    cause = _first(lines, ["No space left on device", "[Errno 28]"])
    if cause:
        return PipDiskFullError(f"pip failed: the disk is full ({_quote(cause)})", f"free disk space and try again{after}",
                                kind="disk-full", cause=cause)
    cause = _first(lines, ["DO NOT MATCH THE HASHES", "Expected sha256", "hash mismatch"])
    if cause:
        got = _first(lines, ["Got        ", "Got "])
        return PipHashMismatchError(f"pip failed: a downloaded file does not match its hash ({_quote(cause)}"
                                    + (f"; {_quote(got)}" if got else "") + ")",
                                    f"try again; if it repeats, the index or a proxy serves changed files{after}",
                                    kind="hash-mismatch", cause=cause)
    last = [line.strip() for line in lines if line.startswith("ERROR:")]
    then = f" (pip then said: {_quote(last[0])})" if last else ""
    for kind, what, hint, needles in _NETWORK:
        cause = _first(lines, needles)
        if cause:  # the root cause, even when pip ends with "no matching distribution" or a conflict
            return PipNetworkError(f"pip failed: {what}: {_quote(cause)}; indexes searched: {where}{then}",
                                   f"{hint}{after}", kind=kind, cause=cause, code=f"pip-{kind}")
    cause = next((line.strip() for line in lines if _HTTP_ERROR.search(line)), "")
    http = _HTTP_ERROR.search(cause)
    if http:
        status, url = http.group(1) or http.group(3), http.group(2) or http.group(4)
        hint = {"401": "the index wants credentials: put them in the index URL or pip's keyring",
                "403": "the index refuses this file: check credentials and the mirror's access rules",
                "404": "the index lists a file it does not serve: the mirror may be incomplete or mid-sync; try again later"
                }.get(status, "the index's server failed: try again later" if status.startswith("5") else "check the index")
        return PipNetworkError(f"pip failed: HTTP {status} for {redact([url])[0]} ({_quote(cause)})", f"{hint}{after}",
                               kind=f"http-{status}", cause=cause, code=f"pip-http-{status}")
    cause = _first(lines, ["requires a different Python"])
    if cause:
        return PipNotFoundError(f"pip failed: {_quote(cause.replace('ERROR: ', ''))}",
                                f"use a Python version the package supports for the target environment{after}",
                                kind="python", cause=cause)
    missing = next((m for m in (_NOT_FOUND.search(line) for line in lines) if m), None)
    if missing:
        versions = next((m for m in (_VERSIONS.search(line) for line in lines) if m), None)
        listed = versions.group(2).strip() if versions else ""
        if listed and listed != "none":
            return PipNotFoundError(f"pip failed: no version of {missing.group(1)} fits (available on {where}: {listed})",
                                    f"ask for one of the available versions, or add an index that has it{after}",
                                    kind="no-matching-version", cause=missing.group(0))
        unreachable = _unreachable(indexes, where, then, after, proxied)
        if unreachable is not None:
            return unreachable
        return PipNotFoundError(f"pip failed: no package {missing.group(1)} on {where}",
                                f"check the package name, or name an index (a mirror) that has it{after}",
                                kind="not-found", cause=missing.group(0))
    if _first(lines, ["ResolutionImpossible", "conflicting dependencies"]):
        unreachable = _unreachable(indexes, where, then, after, proxied)  # an index it could not reach leaves other versions
        if unreachable is not None:
            return unreachable
        start = next((i for i, line in enumerate(lines) if "The conflict is caused by" in line), None)
        detail = [] if start is None else [line.strip() for line in lines[start + 1:start + 7]
                                           if line.strip() and not line.startswith(("To fix", "ERROR"))]
        cannot = _first(lines, ["Cannot install", "conflicting dependencies"])
        return PipConflictError(f"pip failed: the requirements conflict ({_quote(cannot.replace('ERROR: ', ''))}"
                                + (f": {'; '.join(detail)}" if detail else "") + ")",
                                f"loosen or drop one of the conflicting requirements{after}", kind="conflict", cause=cannot)
    errors = [line.strip() for line in lines if line.startswith("ERROR:")]
    reason = errors[0] if errors else (lines[-1].strip() if lines else "no output")
    return PipError(f"pip failed: {_quote(reason)}", after[2:] or None, kind="other", cause=reason)


def redact(argv: Sequence[str]) -> List[str]:
    """``argv`` for logs and progress: a password or token in an index URL (``https://user:token@host``) hidden."""
    return [re.sub(r"(?<=://)([^/@\s:]+):[^/@\s]+@", r"\1:***@", a) for a in argv]
