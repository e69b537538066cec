"""Run the service: bind, write the token file, serve until stopped, and stop cleanly.

uvicorn (pure-Python ``h11`` protocol, asyncio loop) serves the Starlette app behind the
:class:`~accelstack.service.security.Guard`, with the protocol of :mod:`.connections` (bounded
connections, a deadline for each request, the token holder never closed for room). The socket is bound here, before anything is
announced, so port 0 (any free port) works and the URL printed is the one that answers.

Stopping: SIGINT/SIGTERM, or the ``parent_pid`` process ending, cancels every job first (a
running one stops at its next progress event and the library undoes its work), then uvicorn
stops taking requests, open event streams end with their jobs' final events, and the job
thread is waited for. The token file is removed on the way out: its token dies with the process.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Sequence

import psutil
import uvicorn

from .. import core
from ..errors import AccelstackError, Action, UsageError
from ..settings import Settings
from .app import Hardware, build_app
from .connections import MAX_CONNECTIONS, MAX_PER_PEER, REQUEST_TIMEOUT, Limits, connection_budget, guarded_protocol, raw_response
from .errors import Busy, Describe, error_document
from .jobs import JobListener, Jobs
from .security import Guard, Policy, check_bind, check_origin, error_body, new_token, url_host, write_token_file

log = logging.getLogger(__name__)

__all__ = ["MAX_BODY", "PARENT_POLL_SECONDS", "ServiceConfig", "Ready", "Stopped", "token_file", "bind", "serve"]

MAX_BODY = 64 * 1024  # job options are a few hundred bytes; a prompt at most a few KB
PARENT_POLL_SECONDS = 0.5


@dataclass
class ServiceConfig:
    """How to run the service; the CLI's ``accelstack serve`` fills it from its arguments.

    ``settings`` are resolved once by the caller, the documented way: ``Settings.resolve(...)`` in
    an app, ``commands.common.settings_from_args`` (the same flags as every command) for
    ``accelstack serve``; every job runs with them."""

    settings: Settings
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port (the URL announced names it)
    allow_remote: bool = False
    cors_origins: Sequence[str] = ()
    parent_pid: Optional[int] = None
    models_dir: Optional[Path] = None  # what generate jobs may name (by file name)
    detector: Optional[Callable[[], Any]] = None  # default: core.detect(settings=...)
    max_body: int = MAX_BODY
    stop_timeout: float = 120.0  # seconds a cancelled job gets to undo its work at shutdown
    describe: Describe = error_document  # how errors are written; `accelstack serve`: the CLI's error line
    on_job: Optional[JobListener] = None  # told when each job starts and ends (the serve command's log)
    max_connections: int = MAX_CONNECTIONS  # in all (fewer where the descriptor limit is low)
    max_per_peer: int = MAX_PER_PEER  # from one address
    request_timeout: float = REQUEST_TIMEOUT  # seconds for a whole request, headers and body


@dataclass
class Ready:
    """What an app needs to talk to the service, announced once it listens."""

    url: str
    token_file: Path
    token: str
    page_url: str  # the status page, with the token in its fragment

    def to_dict(self) -> dict:
        return {"url": self.url, "token_file": str(self.token_file)}


@dataclass
class Stopped:
    reason: str  # "signal SIGTERM", "parent process 123 ended"
    clean: bool = True  # False: a job did not end within stop_timeout


def token_file(settings: Settings, port: int) -> Path:
    return settings.state_dir / "service" / f"token-{port}"


def bind(host: str, port: int) -> socket.socket:
    addr = "127.0.0.1" if host.lower() == "localhost" else host.strip("[]")
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if hasattr(socket, "SO_REUSEADDR") and not hasattr(socket, "SO_EXCLUSIVEADDRUSE"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # POSIX: reuse a port in TIME_WAIT
        sock.bind((addr, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port} ({exc.strerror or exc})",
                         hint="choose another port, or 0 for any free one") from None
    return sock


def serve(config: ServiceConfig, on_ready: Callable[[Ready], None]) -> Stopped:
    """Serve until a signal or the parent's end; ``on_ready`` is called once requests are answered."""
    check_bind(config.host, config.allow_remote)
    cors_origins = frozenset(check_origin(o) for o in config.cors_origins)
    parent = _parent(config.parent_pid)
    sock = bind(config.host, config.port)
    port = sock.getsockname()[1]
    token = new_token()
    try:
        path = write_token_file(token_file(config.settings, port), token)
    except OSError as exc:
        sock.close()
        raise AccelstackError(f"cannot write the token file under {config.settings.state_dir} ({exc.strerror or exc})",
                              hint="choose a writable runtime home", action=Action.CHOOSE_HOME) from None
    try:
        s = config.settings
        detector = config.detector
        if detector is None:
            detector = lambda: core.detect(settings=s)
        hardware = Hardware(detector)
        jobs = Jobs(s, lambda: hardware.get()[0], models_dir=config.models_dir, describe=config.describe,
                    listener=config.on_job)
        app = build_app(s, hardware, jobs, stop_timeout=config.stop_timeout, describe=config.describe)
        policy = Policy(token=token, port=port, host=config.host, allow_remote=config.allow_remote,
                        cors_origins=cors_origins, max_body=config.max_body, describe=config.describe)
        url = f"http://{url_host(config.host)}:{port}/"
        ready = Ready(url=url, token_file=path, token=token, page_url=f"{url}#token={token}")
        jobs.warm.announce(url, port)  # a loaded worker is registered for other processes' installs (issue 46)
        busy = Busy("the service is serving the token holder on every connection it can hold", code="busy",
                    hint="try again in a moment")
        limits = Limits(total=connection_budget(config.max_connections), per_peer=config.max_per_peer,
                        request_timeout=config.request_timeout)
        protocol = guarded_protocol(limits, policy.token_ok, raw_response(503, "Service Unavailable",
                                                                          error_body(busy, config.describe), "retry-after: 1\r\n"))
        # backlog: also how many connections asyncio accepts at once, before any is closed for room;
        # the budget leaves descriptors for both, so accept never fails for want of one
        uv = uvicorn.Config(Guard(app, policy), http=protocol, ws="none", loop="asyncio", lifespan="on", log_config=None,
                            access_log=False, proxy_headers=False, server_header=False, backlog=limits.total,
                            timeout_graceful_shutdown=int(config.stop_timeout) + 10)
        server = _Server(uv, jobs, lambda: on_ready(ready))
        if parent is not None:
            threading.Thread(target=_watch_parent, args=(parent, server), name="accelstack-parent", daemon=True).start()
        server.run(sockets=[sock])
        if not server.started:
            raise AccelstackError("the service could not start", hint="run it again with ACCELSTACK_LOG=debug to see why",
                                  action=Action.REPORT_BUG)
        return Stopped(server.reason or "stopped", clean=not jobs.alive())
    finally:
        sock.close()
        with contextlib.suppress(OSError):
            path.unlink()


class _Server(uvicorn.Server):
    """uvicorn's server, with jobs cancelled before it stops, and signal handlers of our own (no
    signal raised again after a clean stop: SIGTERM is the normal way to stop a service)."""

    def __init__(self, config: uvicorn.Config, jobs: Jobs, ready: Callable[[], None]) -> None:
        super().__init__(config)
        self.jobs, self.ready, self.reason = jobs, ready, ""

    def handle_exit(self, sig: int, frame: Any) -> None:
        if not self.reason:
            self.reason = f"signal {signal.Signals(sig).name}"
        self.jobs.cancel_all()
        super().handle_exit(sig, frame)

    def stop_for(self, reason: str) -> None:
        self.reason = reason
        self.jobs.cancel_all()
        self.should_exit = True

    async def startup(self, sockets: Optional[List[socket.socket]] = None) -> None:
        await super().startup(sockets=sockets)
        if not self.should_exit:
            self.ready()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGBREAK] if hasattr(signal, "SIGBREAK") else [])
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _parent(pid: Optional[int]) -> Any:
    if pid is None:
        return None
    try:
        proc = psutil.Process(pid)
        if proc.status() != psutil.STATUS_ZOMBIE:
            return proc
    except psutil.Error:
        pass
    raise UsageError(f"the parent process {pid} is not running", hint="pass the id of the app that starts the service")


def _watch_parent(proc: Any, server: Any) -> None:
    """Stop the service when the app that started it ends (a crash leaves no orphan service)."""
    while not server.should_exit:
        time.sleep(PARENT_POLL_SECONDS)
        try:
            alive = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            alive = False
        if not alive:
            log.info("parent process %d ended: stopping", proc.pid)
            server.stop_for(f"parent process {proc.pid} ended")
            return
