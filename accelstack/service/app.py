"""The HTTP API (``/api/v1/...``) and the status page (``/``), as a Starlette application.

Each route is a thin call of the core (detect, plan, status) or of the job table; what goes over
the wire is ``serde.to_dict`` of the library's own dataclasses, and every failure is one error
document under ``"error"``, of the shape of the CLI's final error line (:mod:`.errors`). The
routes never open a path taken from a request: job ids are looked up in memory, images come
from the job's recorded result.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import inspect
import json
import logging
import re
import threading
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, AsyncIterator, Callable, Dict, Optional, Tuple

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .. import core
from ..domain import STACKS
from ..errors import AccelstackError, UsageError
from ..limits import MalformedInput, parse_json
from ..serde import to_dict
from ..settings import Settings
from .errors import BadRequest, Describe, InternalError, NotFound, ServiceError, describe_error, error_document
from .jobs import Job, Jobs, now_iso
from .security import DIGITS

log = logging.getLogger(__name__)

__all__ = ["API", "KEEPALIVE_SECONDS", "JOB_ID", "MAX_BODY_DEPTH", "Hardware", "resource_bytes", "page_and_policy",
           "error_response", "internal_error", "api", "build_app", "sse"]

API = "/api/v1"
KEEPALIVE_SECONDS = 15.0  # an SSE comment line this often keeps proxies and clients from timing out
JOB_ID = re.compile(r"^[0-9a-f]{16}$")
MAX_BODY_DEPTH = 8


@dataclass
class Hardware:
    """The hardware report, detected once and again only when asked (``?refresh=1``)."""

    detector: Callable[[], Any]
    report: Any = None
    detected_at: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, refresh: bool = False) -> Tuple[Any, str]:
        with self.lock:
            if self.report is None or refresh:
                self.report, self.detected_at = self.detector(), now_iso()
            return self.report, self.detected_at


def resource_bytes(name: str) -> bytes:
    return resources.files(__package__).joinpath(name).read_bytes()


def page_and_policy() -> Tuple[bytes, str]:
    """The page, and a Content-Security-Policy that allows exactly its inline script and style."""
    html = resource_bytes("page.html")
    text = html.decode("utf-8")

    def hashes(tag: str) -> str:
        found = re.findall(rf"<{tag}>(.*?)</{tag}>", text, flags=re.S)
        return " ".join("'sha256-%s'" % base64.b64encode(hashlib.sha256(b.encode()).digest()).decode() for b in found)

    csp = (f"default-src 'none'; script-src {hashes('script')}; style-src {hashes('style')}; img-src 'self' blob:; "
           "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
    return html, csp


def error_response(exc: AccelstackError, status: Optional[int] = None, describe: Describe = error_document) -> JSONResponse:
    if status is None:
        status = exc.status if isinstance(exc, ServiceError) else 400 if isinstance(exc, (UsageError, MalformedInput)) else 500
    return JSONResponse({"error": describe_error(describe, "serve", exc)}, status_code=status)


def internal_error(exc: BaseException, describe: Describe = error_document) -> JSONResponse:
    log.exception("request failed", exc_info=exc)
    return error_response(InternalError(exc, "the service log has the details"), 500, describe)


def api(fn: Callable[..., Any], describe: Describe = error_document) -> Callable[..., Any]:
    """Errors of a route as JSON; a sync route stays sync (Starlette runs it in its thread pool)."""
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def run_async(request: Request) -> Response:
            try:
                return await fn(request)
            except AccelstackError as exc:
                return error_response(exc, describe=describe)
            except Exception as exc:
                return internal_error(exc, describe)
        return run_async

    @functools.wraps(fn)
    def run_sync(request: Request) -> Response:
        try:
            return fn(request)
        except AccelstackError as exc:
            return error_response(exc, describe=describe)
        except Exception as exc:
            return internal_error(exc, describe)
    return run_sync


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "").lower() in ("1", "true", "yes")


def build_app(settings: Settings, hardware: Hardware, jobs: Jobs, *, stop_timeout: float = 120.0,
              describe: Describe = error_document) -> Starlette:
    """The application; the security guard wraps it in :mod:`accelstack.service.server`."""
    page, csp = page_and_policy()
    openapi = resource_bytes("openapi.json")
    def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
        return api(fn, describe)

    def job_of(request: Request) -> Job:
        job_id = request.path_params["job_id"]
        if not JOB_ID.match(job_id):
            raise NotFound(f"there is no job {job_id[:40]!r}", code="not-found")
        return jobs.get(job_id)

    async def index(request: Request) -> Response:
        return Response(page, media_type="text/html; charset=utf-8", headers={"Content-Security-Policy": csp})

    @guarded
    async def spec(request: Request) -> Response:
        return Response(openapi, media_type="application/json")

    @guarded
    def get_hardware(request: Request) -> Response:
        report, at = hardware.get(refresh=_flag(request, "refresh"))
        return JSONResponse({"detected_at": at, "report": to_dict(report)})

    @guarded
    def get_plans(request: Request) -> Response:
        report, at = hardware.get(refresh=_flag(request, "refresh"))
        plans: Dict[str, Any] = {}
        for stack in STACKS:
            try:
                plans[stack] = {"plan": to_dict(core.plan(report, stack, settings=settings)), "error": None}
            except AccelstackError as exc:
                plans[stack] = {"plan": None, "error": describe_error(describe, "plan", exc)}
        return JSONResponse({"detected_at": at, "plans": plans})

    @guarded
    def get_status(request: Request) -> Response:
        report, _ = hardware.get()
        stacks = core.status(report=report, settings=settings, check_upgrades=not _flag(request, "local"))
        return JSONResponse({"home": str(settings.home), "stacks": to_dict(stacks)})

    @guarded
    async def post_job(request: Request) -> Response:
        body = await request.body()
        if not body.strip():
            raise BadRequest("the request body is empty", hint='send a JSON object: {"kind": "verify", "options": {}}',
                             code="bad-request")
        try:
            doc = parse_json(body, what="the request body", max_bytes=len(body), max_depth=MAX_BODY_DEPTH, strict=True)
        except MalformedInput as exc:
            raise BadRequest(exc.message, hint='send a JSON object: {"kind": "verify", "options": {}}', code="bad-request") from None
        if not isinstance(doc, dict) or not set(doc) <= {"kind", "options"}:
            raise BadRequest('the request body must be a JSON object with "kind" and optional "options"', code="bad-request")
        job = await run_in_threadpool(jobs.submit, doc.get("kind"), doc.get("options"))
        return JSONResponse({"job": job.summary()}, status_code=202, headers={"Location": f"{API}/jobs/{job.id}"})

    @guarded
    def list_jobs(request: Request) -> Response:
        return JSONResponse({"jobs": [j.summary(full=False) for j in jobs.all()]})

    @guarded
    def get_job(request: Request) -> Response:
        return JSONResponse({"job": job_of(request).summary()})

    @guarded
    def cancel_job(request: Request) -> Response:
        job = jobs.cancel(job_of(request).id)
        return JSONResponse({"job": job.summary()}, status_code=202)

    @guarded
    def get_session(request: Request) -> Response:
        return JSONResponse({"session": jobs.warm.state()})

    @guarded
    def delete_session(request: Request) -> Response:  # after the running generate job, if one runs
        return JSONResponse({"released": jobs.warm.release(), "session": jobs.warm.state()})

    @guarded
    async def job_events(request: Request) -> Response:
        job = job_of(request)
        start = _resume_from(request)
        return StreamingResponse(_sse(job, start), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @guarded
    def job_image(request: Request) -> Response:
        raw = request.query_params.get("index", "0")
        if not DIGITS.fullmatch(raw) or len(raw) > 4:
            raise BadRequest(f"index must be a small non-negative integer (0 to 9999), got {raw[:20]!r}", code="bad-request")
        return Response(jobs.image(job_of(request).id, int(raw)), media_type="image/png")

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        if status == 405:
            err = ServiceError(f"{request.method} is not allowed on {request.url.path}", code="method-not-allowed")
        else:
            err = NotFound(f"there is no {request.url.path}", hint=f"the API is under {API}/ (see {API}/openapi.json)",
                           code="not-found")
        return error_response(err, status, describe)

    async def on_startup() -> None:
        jobs.start()

    async def on_shutdown() -> None:
        done = await run_in_threadpool(jobs.stop, stop_timeout)
        if not done:
            log.warning("a job did not end within %.0f s of the shutdown; the next run recovers the home", stop_timeout)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await on_startup()
        try:
            yield
        finally:
            await on_shutdown()

    routes = [
        Route("/", index, methods=["GET", "HEAD"]),
        Route(f"{API}/openapi.json", spec, methods=["GET"]),
        Route(f"{API}/hardware", get_hardware, methods=["GET"]),
        Route(f"{API}/plans", get_plans, methods=["GET"]),
        Route(f"{API}/status", get_status, methods=["GET"]),
        Route(f"{API}/jobs", post_job, methods=["POST"]),
        Route(f"{API}/jobs", list_jobs, methods=["GET"]),
        Route(f"{API}/jobs/{{job_id}}", get_job, methods=["GET"]),
        Route(f"{API}/jobs/{{job_id}}", cancel_job, methods=["DELETE"]),
        Route(f"{API}/jobs/{{job_id}}/events", job_events, methods=["GET"]),
        Route(f"{API}/jobs/{{job_id}}/image", job_image, methods=["GET"]),
        Route(f"{API}/session", get_session, methods=["GET"]),
        Route(f"{API}/session", delete_session, methods=["DELETE"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: not_found, 405: not_found})


def _resume_from(request: Request) -> int:
    """Where a stream starts: after ``Last-Event-ID`` (a reconnecting client), else at the first event."""
    last = request.headers.get("last-event-id", "")
    if DIGITS.fullmatch(last) and len(last) < 10:  # anything else is ignored: the stream starts over
        return int(last) + 1
    return 0


def sse(event: str, data: Any, event_id: Optional[int] = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _sse(job: Job, start: int) -> AsyncIterator[bytes]:
    """The job's events from ``start``, live, then one ``result`` or ``error`` event."""
    sent = start
    while True:
        events, done = job.snapshot(sent)
        for i, e in enumerate(events, sent):
            yield sse("progress", e, i)
        sent += len(events)
        if done:
            info = job.summary()
            final = ("result", {"job": job.id, "state": info["state"], "result": info["result"]}) if info["state"] == "succeeded" \
                else ("error", {"job": job.id, "state": info["state"], "error": info["error"]})
            yield sse(final[0], final[1], sent)
            return
        if not await job.changed(sent, KEEPALIVE_SECONDS):
            yield b": keepalive\n\n"

