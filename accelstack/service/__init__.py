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

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:  # the lazy names below, for type checkers: at run time each loads on first use
    from .errors import JobCancelled as JobCancelled
    from .errors import JobConflict as JobConflict
    from .errors import ServiceError as ServiceError
    from .jobs import HOME_CHANGING as HOME_CHANGING
    from .jobs import KINDS as KINDS
    from .jobs import Job as Job
    from .jobs import Jobs as Jobs
    from .security import Guard as Guard
    from .security import Policy as Policy
    from .server import Ready as Ready
    from .server import ServiceConfig as ServiceConfig
    from .server import Stopped as Stopped
    from .server import serve as serve
    from .server import token_file as token_file


_EXPORTS = {
    "ServiceConfig": ".server", "Ready": ".server", "Stopped": ".server", "serve": ".server", "token_file": ".server",
    "Jobs": ".jobs", "Job": ".jobs", "KINDS": ".jobs", "HOME_CHANGING": ".jobs",
    "Policy": ".security", "Guard": ".security",
    "JobCancelled": ".errors", "JobConflict": ".errors", "ServiceError": ".errors",
}

__all__ = sorted(_EXPORTS)

if not TYPE_CHECKING:  # a type checker sees the names above, and no others
    __getattr__ = lazy_exports(__name__, _EXPORTS, globals())
