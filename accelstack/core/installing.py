"""``install``: the one entry point that puts a runtime on this machine, for both stacks.

    summary = accelstack.install()                       # detect, plan, install, verify, activate
    summary = accelstack.install(plan)                   # a plan made (and maybe shown) before
    summary = accelstack.install(stack="torch", requirements=["torch>=2.4"])
    summary = accelstack.install(dry_run=True)           # what it would do, touching nothing

It takes the home's lock (a dry run takes nothing and touches nothing), runs ``recover`` first so
a killed run never leaves a mess, verifies the staged runtime before switching to it, and reports
progress only through ``on_progress``. How it runs is :class:`~.options.InstallOptions` (given as
``options=`` or as its fields' keywords); what it uses to reach the world is
:class:`~.options.Services`. The stack's driver (:mod:`.stacks`) does the stack's own part.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Sequence

from ..events import ProgressCallback, ProgressEvent, null_progress
from ..hardware.report import HardwareReport
from ..installer.transaction import Verifier
from ..manifests.plan import Plan
from ..settings import Settings
from .context import InstallJob, home_of
from .detection import detect
from .fallback import install_with_fallback
from .options import InstallOptions, Services
from .planning import NO_CHANNEL_LINE, DocumentFetcher, TrustedSet, plan_sources
from .planning import plan as make_plan
from .results import InstallSummary
from .stacks import default_stack, driver, stack_info

__all__ = ["install", "InstallSummary", "InstallOptions", "Services"]


def install(plan: Optional[Plan] = None, *, stack: Optional[str] = None, requirements: Sequence[str] = (),
            backend: Optional[str] = None, report: Optional[HardwareReport] = None, settings: Optional[Settings] = None,
            services: Optional[Services] = None, on_progress: Optional[ProgressCallback] = None,
            force: bool = False, dry_run: bool = False, verifier: Optional[Verifier] = None,
            trusted: Optional[TrustedSet] = None, prefer_remembered: bool = False, fallback: bool = True) -> InstallSummary:
    """Install ``plan`` (or, without one, the plan for ``stack``, ``requirements`` and ``backend``
    made here from the trusted manifests), verify it, and make it active; the whole story comes
    back (``summary.receipt``, ``changed``, ``previous``, ``timings``, ``notes``).

    Without a plan, the manifests are fetched and verified once for both the plan and the install,
    and a build (ggml or torch) that fails verify gives way to the plan's next candidate. How it runs
    is said by keyword, one way only: ``force``, ``dry_run``, ``verifier``, ``trusted``,
    ``prefer_remembered``, ``fallback`` (the fields of :class:`InstallOptions`)."""
    s = settings or Settings.resolve()
    opts = InstallOptions(force=force, dry_run=dry_run, verifier=verifier, trusted=trusted,
                          prefer_remembered=prefer_remembered, fallback=fallback)
    svc = services or Services()
    progress = on_progress or null_progress
    report = report if report is not None else detect(svc.system, settings=s, write_cache=not opts.dry_run)
    job = InstallJob(report, s, opts, svc, progress)
    if plan is not None:
        return _install_plan(plan, job)
    name = stack or default_stack()
    d, known = driver(name), stack_info(name)
    d.check_request(report, s.backend if backend is None else backend, s)  # before any download or build
    trusted = opts.trusted
    docs = _KeptDocuments(job.fetcher)  # read once: for the request's check, then for the install
    if trusted is None:  # the sources `plan` reads too; nothing is written until the request is known good
        trusted = plan_sources(s, name, record=False, progress=progress, prefer_remembered=opts.prefer_remembered,
                               fetcher=docs)
    notes = []
    if known.reads_channels and not trusted.channels:  # said once: the result's notes show it, the log too
        notes.append(NO_CHANNEL_LINE)
        progress(ProgressEvent("message", "plan", message=NO_CHANNEL_LINE, extra={"level": "debug"}))
    p = make_plan(report, name, requirements=requirements, backend=backend, settings=s,
                  manifests=trusted.manifests, on_progress=progress)
    if p.status == "unsatisfiable":  # a refused request (a bogus --backend) leaves no home behind
        raise d.unsatisfiable(p, trusted)
    if not opts.dry_run:
        home_of(s).ensure()  # an unusable home is said plainly before any manifest version is recorded in it
        if opts.trusted is None:  # the same documents verified again, their versions recorded now
            trusted = plan_sources(s, name, record=True, prefer_remembered=opts.prefer_remembered, fetcher=docs)
    job = dataclasses.replace(job, options=dataclasses.replace(opts, trusted=trusted))
    if opts.dry_run or not (opts.fallback and d.retries_candidates and p.ok):
        summary = _install_plan(p, job)
    else:  # a build that fails verify here gives way to the plan's next candidate (issue 12)
        summary = install_with_fallback(p, lambda candidate: _install_plan(candidate, job),
                                        lambda variant: make_plan(report, name, requirements=requirements, backend=variant,
                                                                  settings=s, manifests=trusted.manifests,
                                                                  on_progress=progress),
                                        progress)
    summary.notes = notes + summary.notes
    return summary


def _install_plan(plan: Plan, job: InstallJob) -> InstallSummary:
    d = driver(plan.stack)
    return d.dry_run(plan, job) if job.options.dry_run else d.install(plan, job)


class _KeptDocuments:
    """The documents of ``fetcher``, each read from it once (an install verifies the channels'
    manifests before and after it knows the request is good, from the same bytes)."""

    def __init__(self, fetcher: DocumentFetcher) -> None:
        self.fetcher = fetcher
        self.kept: Dict[str, Optional[bytes]] = {}

    def document(self, url: str) -> bytes:
        if url not in self.kept:
            self.kept[url] = self.fetcher.document(url)
        found = self.kept[url]
        assert found is not None
        return found

    def optional_document(self, url: str) -> Optional[bytes]:
        if url not in self.kept:
            self.kept[url] = self.fetcher.optional_document(url)
        return self.kept[url]
