"""``detect``: the first step of the core, kept light (importing it loads only the detect stage)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..hardware.detection import detect as _detect
from ..hardware.live import LiveSystem
from ..hardware.protocol import DEFAULT_TIMEOUT, PlatformFacts, System, SystemEnviron
from ..hardware.report import HardwareReport
from ..settings import Settings

__all__ = ["detect", "machine_home"]


def machine_home(system: System, facts: PlatformFacts) -> Path:
    """The rule of ``Settings.home`` applied to the machine ``system`` looks at: its own environment
    (read through the System, so a capture records it and a replay answers it) and OS, so a
    replayed Windows capture gets a Windows home."""
    return Settings.resolve_home(env=SystemEnviron(system), os_name=facts.os_name)


def detect(system: Optional[System] = None, *, settings: Optional[Settings] = None, refresh: bool = False,
           timeout: Optional[float] = None, write_cache: bool = True) -> HardwareReport:
    """What is in this machine (or in a replayed capture, with ``system=ReplaySystem(dir)``).

    Free disk is measured at the runtime home: ``settings.home`` when settings are given (resolved
    here for this machine when not), else, for another System, the home rule applied to that
    machine (:func:`machine_home`). On this machine the Vulkan enumeration is kept in
    ``settings.detect_cache`` between runs and redone when what it depends on changes, or always
    with ``refresh``; a replay never uses it, and a capture runs it for real (the capture then
    holds what the drivers say now); ``write_cache=False`` (a dry run, a support report) keeps
    nothing new there. ``timeout`` (default ``settings.timeouts.detect``) bounds each
    external command."""
    system = LiveSystem() if system is None else system
    live = isinstance(system, LiveSystem)
    if settings is None and live:
        settings = Settings.resolve()
    if timeout is None:
        timeout = settings.timeouts.detect if settings is not None else DEFAULT_TIMEOUT
    if settings is None:
        return _detect(system, home=machine_home, timeout=timeout)
    return _detect(system, home=settings.home, cache=settings.detect_cache if live else None, timeout=timeout,
                   refresh=refresh, write_cache=write_cache)
