"""How ``verify --family`` reports: where each family's image goes, and one report of the families' reports."""
from __future__ import annotations

from pathlib import Path
from typing import List, Tuple, Union

from ..serde import to_dict
from ..verdict import VerifyCheck, VerifyReport
from .probe_families import DEFAULT_FAMILY

__all__ = ["family_output", "merge_reports"]


def family_output(output: Union[str, Path], family: str) -> Path:
    """Where a family's probe image goes: ``output`` for SD 1.x, else ``<stem>-<family><suffix>``
    beside it (``verify-cpu.png`` -> ``verify-cpu-flux.png``)."""
    out = Path(output)
    return out if family == DEFAULT_FAMILY else out.with_name(f"{out.stem}-{family}{out.suffix or '.png'}")


def merge_reports(reports: List[Tuple[str, VerifyReport]], seconds: float) -> VerifyReport:
    """One report of the families' reports (``verify(families=...)``): the first one's figures,
    every family's checks named ``<family>:<check>``, each family's own report in ``details["families"]``."""
    first = reports[0][1]
    merged = VerifyReport(ok=all(r.ok for _f, r in reports), reason="; ".join(f"{f}: {r.reason}" for f, r in reports
                                                                               if not r.ok),
                          runtime=first.runtime, backend=first.backend, device=first.device,
                          load_seconds=first.load_seconds, step_seconds=first.step_seconds,
                          its_per_second=first.its_per_second, generate_seconds=first.generate_seconds,
                          probe_seconds=round(sum(r.probe_seconds for _f, r in reports), 3), probe_path=first.probe_path,
                          probe_temporary=first.probe_temporary, image=first.image, total_seconds=round(seconds, 4),
                          pixels=first.pixels)
    for family, r in reports:
        merged.checks += [VerifyCheck(f"{family}:{c.name}", c.ok, c.detail) for c in r.checks]
        if r.cpu_mean_diff is not None and (merged.cpu_mean_diff is None or r.cpu_mean_diff > merged.cpu_mean_diff):
            merged.cpu_mean_diff = r.cpu_mean_diff
        if r.cpu_max_diff is not None:
            merged.cpu_max_diff = max(merged.cpu_max_diff or 0, r.cpu_max_diff)
        if not r.ok and not merged.log_tail:
            merged.log_tail = r.log_tail
    merged.details["families"] = {f: {k: v for k, v in to_dict(r).items() if k != "log_tail"} for f, r in reports}
    return merged
