"""``accelstack serve``: the library core as a local HTTP service for apps and a status page.

An app starts ``accelstack serve --json``, reads the URL and the token file from its one line of
output, and drives detect -> plan -> install -> verify over ``/api/v1/`` with live progress
(Server-Sent Events carrying the library's own progress events). The service has no logic of
its own: every answer is a core function's result, as JSON. See docs/serve.md.

Modules: ``security`` (token, Host/Origin checks, CORS, body limits), ``jobs`` (the core's long
functions run one at a time, with events and cancel, a bounded queue; ``job_state`` is one job,
its events and images; ``job_options`` checks what a job is given), ``app`` (the routes and the
page), ``connections`` (bounded connections, request deadlines), ``server`` (bind, serve, stop cleanly).
"""
from __future__ import annotations

from ..lazy import lazy_exports

_EXPORTS = {
    "ServiceConfig": ".server", "Ready": ".server", "Stopped": ".server", "serve": ".server", "token_file": ".server",
    "Jobs": ".jobs", "Job": ".jobs", "KINDS": ".jobs", "HOME_CHANGING": ".jobs",
    "Policy": ".security", "Guard": ".security",
    "JobCancelled": ".errors", "JobConflict": ".errors", "ServiceError": ".errors",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
