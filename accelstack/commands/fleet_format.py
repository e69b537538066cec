"""The text of `accelstack detect --format nfd|prometheus`: the library's labels and metrics
(``accelstack.core.fleet``) written in the two file formats fleet tools read.

- NFD's ``local`` feature file (``/etc/kubernetes/node-feature-discovery/features.d/``): ``name=value``
  lines, ``#`` comments, an optional ``# +expiry-time=`` directive (RFC 3339) after which NFD ignores
  the lines below it.
- The Prometheus text exposition format 0.0.4 that the node exporter's textfile collector reads
  (``*.prom``): ``# HELP`` and ``# TYPE`` before each family's samples, label values with ``\\``,
  ``"`` and newlines escaped, help text with ``\\`` and newlines escaped.
"""
from __future__ import annotations

import math
import time
from typing import Any, List, Optional, Sequence

__all__ = ["nfd_text", "prometheus_text", "rfc3339"]


def rfc3339(epoch: float) -> str:
    """``epoch`` as NFD's expiry-time wants it: UTC, whole seconds, ``Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def nfd_text(labels: Sequence[Any], source: str, expires_at: Optional[float] = None) -> str:
    """An NFD feature file of ``labels`` (``NodeLabel``s); ``expires_at`` (epoch seconds) adds the
    ``# +expiry-time=`` directive, so labels of a node whose job stopped do not stay forever."""
    said = " ".join(source.split())  # a comment is one line, whatever the replayed folder is called
    lines = [f"# accelstack detect --format nfd ({said}); written {rfc3339(time.time())}"]
    if expires_at is not None:
        lines.append(f"# +expiry-time={rfc3339(expires_at)}")
    lines += [f"{label.name}={label.value}" for label in labels]
    return "\n".join(lines) + "\n"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if value == int(value) and abs(value) < 2 ** 53 else repr(value)


def prometheus_text(families: Sequence[Any]) -> str:
    """``families`` (``MetricFamily``s) in the Prometheus text format, one blank-line-free block each."""
    lines: List[str] = []
    for f in families:
        lines += [f"# HELP {f.name} {_escape_help(f.help)}", f"# TYPE {f.name} {f.type}"]
        for s in f.samples:
            labels = ",".join(f'{k}="{_escape_value(v)}"' for k, v in s.labels.items())
            lines.append(f"{f.name}{{{labels}}} {_number(s.value)}" if labels else f"{f.name} {_number(s.value)}")
    return "\n".join(lines) + "\n"
