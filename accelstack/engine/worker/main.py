"""The generation worker: a child process that loads the stack and serves a tiny HTTP API.

    python -m accelstack.engine.worker.main --ready-file F --parent-pid P --token-file T [--model M]
                                       [--options JSON] [--backend ggml|torch] [--await-model SECONDS]
                                       [--load-file FILE] [--lib-dir DIR]... [--preload FILE]...

``--await-model`` is for a model still being written when the worker starts (``verify`` starts
it while the probe is synthesized): the file appears whole, renamed into place, and the worker
waits up to SECONDS for it after importing the runtime, then loads it.

``--load-file`` is for a worker started before its model and options are known (``generate``
starts it while the caller's checks and the memory plan run): FILE, in the supervisor's private
folder, appears whole within ``--await-model`` SECONDS and holds ``{"model", "options"}``, which
replace ``--model`` and ``--options``.

``--backend torch`` generates with torch/diffusers (:mod:`accelstack.engine.worker.torch_backend`)
instead of stable-diffusion.cpp; everything else (HTTP API, status, progress) is shared.
``--lib-dir`` and ``--preload`` are the runtime's outside libraries (its note, read by the
parent: :meth:`Runtime.worker_command`), loaded in order before the bindings.

Launched by :mod:`accelstack.engine.supervision.supervisor` (through the bootstrap of
:meth:`Runtime.worker_command`, which skips ``accelstack/__init__`` and its dependencies) with the
runtime directory first on ``PYTHONPATH`` and the plan's environment applied. Everything it is told
comes from its options; the token is in the file ``--token-file`` names (in the supervisor's
private folder, removed once read), never on the command line, where other users could read it.

It listens on a free port of 127.0.0.1 and writes ``{"port", "pid"}`` to the ready file
(atomically) at once. A thread then imports the runtime, waits for the model and loads it;
meanwhile (once the runtime is imported, or after ``SERVER_HEAD_START`` s) the main thread imports
the HTTP server and serves on that socket: the server's imports overlap the wait for the model and
its loading (native code, which releases the GIL) instead of delaying both. Every request must
carry ``Authorization: Bearer <token>``.

    GET  /ping            {"ok", "pid", "phase"}
    GET  /status[?wait=S&since=V]  WorkerStatus (phase, step/steps, ticks, heartbeat, device,
                          memory, version); with wait and since, answers as soon as the state's
                          version differs from V (a phase change, a step), or after S seconds
    POST /generate        GenerateRequest -> 202 {"job"}; 409 while busy or not ready
    GET  /result?job=ID[&wait=S]  GenerateResult, or {"error", "kind"}; 202 while running
                          (with wait, answers as soon as the job ends, or after S seconds)
    POST /cancel          stops the running job; stable-diffusion.cpp cannot abort a step, so a
                          worker that is generating answers, then exits with EXIT_CANCELLED and
                          the supervisor starts a fresh one
    POST /shutdown        answers, then exits 0

The worker exits on its own when its parent dies (it polls its parent pid). Generation runs on
a job thread; the bindings' ctypes calls release the GIL, so the server answers while a step runs.

The worker never prints on purpose: stable-diffusion.cpp's log lines go to stderr (the
supervisor's log file) and the last ones are kept to explain a failed load. This module is the
entry point; the backends (:mod:`~accelstack.engine.worker.ggml_backend`,
:mod:`~accelstack.engine.worker.torch_backend`, both a :mod:`~accelstack.engine.worker.backend`), the shared
state (:mod:`~accelstack.engine.worker.state`) and the HTTP API
(:mod:`~accelstack.engine.worker.server`) live beside it. It runs in the runtime's interpreter, so
it imports only the standard library and accelstack's stdlib-only modules.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple, Type

from ... import fsio
from ...limits import MalformedInput, parse_json, read_capped
from ...serde import from_dict
from ..config import EngineOptions
from ..errors import ModelLoadError
from .backend import WorkerBackend
from .ggml_backend import GgmlBackend
from .protocol import EXIT_LOAD_FAILED, EXIT_OK, EXIT_ORPHANED, LISTEN_BACKLOG, MAX_TOKEN_BYTES
from .state import WorkerState
from .torch_backend import TorchBackend

__all__ = ["main", "WORKER_BACKENDS", "read_token"]

HEARTBEAT_INTERVAL = 1.0
PARENT_POLL_INTERVAL = 0.5
# The runtime's import goes first; the HTTP server (30-45 ms of imports) follows once it is done, or
# after this long (torch takes seconds), overlapping the wait for the model or its native load.
SERVER_HEAD_START = 1.0
AWAIT_MODEL_POLL = 0.005  # a stat every 5 ms while verify writes the probe (about 0.3 s)
MAX_LOAD_FILE_BYTES = 256 * 1024  # a model path and the engine options (their embeddings' paths included)
# ``--backend`` -> the stack's side of the worker (a runtime's StackTraits.stack names one)
WORKER_BACKENDS: Dict[str, Type[WorkerBackend]] = {cls.name: cls for cls in (GgmlBackend, TorchBackend)}


def _watch_parent(parent_pid: int) -> None:
    """Exit when the parent is gone: re-parenting changes our ppid (on every OS Python runs on)."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(EXIT_ORPHANED)
        time.sleep(PARENT_POLL_INTERVAL)


def _heartbeat(state: WorkerState) -> None:
    while not state.stop.is_set():
        with state.lock:
            state.heartbeat = time.time()
        state.stop.wait(HEARTBEAT_INTERVAL)


def listen() -> socket.socket:
    """A socket listening on a free port of 127.0.0.1 (the server adopts it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def _write_ready(path: str, payload: Dict[str, Any]) -> None:
    """The supervisor waits for this file: it appears whole (a file of this launch, so no fsync)."""
    fsio.write_text(path, json.dumps(payload), durable=False)


def read_token(path: str) -> str:
    """The token in ``path``, which is removed (a token stays in the worker's memory only); "" when
    there is none to read."""
    if not path:
        return ""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_TOKEN_BYTES + 1)
    except OSError:
        return ""
    try:
        os.unlink(path)
    except OSError:
        pass
    return "" if len(raw) > MAX_TOKEN_BYTES else raw.decode("ascii", "replace").strip()


def _await_model(path: str, seconds: float, what: str = "the model") -> None:
    """Wait until ``path`` exists (it is renamed into place whole); ModelLoadError after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise ModelLoadError(f"{what} {path} did not appear within {seconds:g} s")
        time.sleep(AWAIT_MODEL_POLL)


def read_load_file(path: str) -> Tuple[str, Dict[str, Any]]:
    """The model and options of a load file (``--load-file``); ModelLoadError when it is not one."""
    try:
        data = parse_json(read_capped(path, MAX_LOAD_FILE_BYTES + 1), what="the worker's load file",
                          max_bytes=MAX_LOAD_FILE_BYTES)
    except (OSError, MalformedInput) as exc:
        raise ModelLoadError(f"cannot read the worker's load file {path}: {getattr(exc, 'message', None) or exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), str) or not isinstance(data.get("options"), dict):
        raise ModelLoadError(f"the worker's load file {path} does not hold a model and its options")
    return data["model"], data["options"]


def _load(state: WorkerState, backend: WorkerBackend, args: argparse.Namespace, imported: threading.Event) -> None:
    """Import the runtime (then set ``imported``), wait for the model and its options, load them;
    a failure becomes the state's error, which the server reports."""
    try:
        options = from_dict(EngineOptions, json.loads(args.options)).validate()
        with state.lock:
            state.phase = "loading"
            state.changed()
        backend.import_runtime()
        with state.lock:
            state.device = backend.device()
            state.runtime_version, state.system_info = backend.version(), backend.system_info()
        imported.set()
        model = args.model
        if args.load_file:  # the caller's checks ran while the runtime was imported: now its order
            _await_model(args.load_file, args.await_model, "the worker's load file")
            model, given = read_load_file(args.load_file)
            options = from_dict(EngineOptions, given).validate()
        elif model and args.await_model > 0:
            _await_model(model, args.await_model)
        if model:
            start = time.perf_counter()
            backend.load(model, options)
            with state.lock:
                state.load_seconds = round(time.perf_counter() - start, 4)
                state.device = backend.device()  # what the model was loaded onto (a GPU build may fall back)
        with state.lock:
            state.phase, state.step, state.steps = "ready", 0, 0  # step/steps: the loading's, until now
            state.changed()
    except ModelLoadError as exc:
        state.fail(exc.message, "ModelLoadError")
    except ImportError as exc:
        state.fail(f"cannot import the runtime: {exc}", "RuntimeImportError")
    except Exception as exc:
        state.fail(f"{type(exc).__name__}: {exc}", "WorkerError")
    finally:
        imported.set()


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="accelstack.engine.worker.main")
    ap.add_argument("--ready-file", required=True)
    ap.add_argument("--parent-pid", type=int, required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--options", default="{}")
    ap.add_argument("--token-file", default="", help="the file holding the token requests must carry (removed once read)")
    ap.add_argument("--backend", default=GgmlBackend.name, choices=sorted(WORKER_BACKENDS),
                    help="ggml (stable-diffusion.cpp) or torch (diffusers)")
    ap.add_argument("--await-model", type=float, default=0.0, metavar="SECONDS",
                    help="wait up to SECONDS for the model file to appear before loading it")
    ap.add_argument("--load-file", default="", metavar="FILE",
                    help="the model and options come from FILE, which appears within --await-model seconds")
    ap.add_argument("--lib-dir", action="append", default=[], metavar="DIR", help="a folder of the runtime's outside libraries")
    ap.add_argument("--preload", action="append", default=[], metavar="FILE",
                    help="a library to load before the runtime (in the order given)")
    args = ap.parse_args(argv)
    token = read_token(args.token_file)
    if not token:
        sys.stderr.write("accelstack worker: no token (--token-file names none to read); refusing to serve\n")
        return 2
    threading.Thread(target=_watch_parent, args=(args.parent_pid,), name="parent-watch", daemon=True).start()

    backend = WORKER_BACKENDS[args.backend](sys.stderr, args.lib_dir, args.preload)
    state = WorkerState(backend, token)
    backend.on_progress = state.on_progress
    # The port is known before anything loads (a crash while loading follows the ready file: the
    # supervisor blames the model, not the runtime); requests wait in the queue until it serves.
    listener = listen()
    _write_ready(args.ready_file, {"port": listener.getsockname()[1], "pid": os.getpid()})
    imported = threading.Event()
    threading.Thread(target=_load, args=(state, backend, args, imported), name="load", daemon=True).start()
    imported.wait(SERVER_HEAD_START)
    from .server import make_server  # here: its imports overlap the model's wait or load

    server = make_server(state, sock=listener)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    threading.Thread(target=_heartbeat, args=(state,), name="heartbeat", daemon=True).start()

    # Serve until /shutdown or /cancel ends the process; a worker in "error" stays up so the
    # supervisor can read the reason, and exits when asked or when its parent goes away.
    state.stop.wait()
    return EXIT_LOAD_FAILED if state.phase == "error" else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
