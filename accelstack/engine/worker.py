"""The generation worker: a child process that loads the stack and serves a tiny HTTP API.

    python -m accelstack.engine.worker --ready-file F --parent-pid P [--model M] [--options JSON]
                                       [--backend ggml|torch]

``--backend torch`` generates with torch/diffusers (:mod:`accelstack.engine.torch_engine`)
instead of stable-diffusion.cpp; everything else (HTTP API, status, progress) is shared.

Launched by :mod:`accelstack.engine.supervisor` with the runtime directory first on
``PYTHONPATH`` and the plan's environment applied; the per-launch token arrives in
``ACCELSTACK_WORKER_TOKEN`` (never on the command line, where other users could read it).

It binds 127.0.0.1 on a free port, writes ``{"port", "pid"}`` to the ready file (atomically),
then loads the model. Every request must carry ``Authorization: Bearer <token>``.

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
supervisor's log file) and the last ones are kept to explain a failed load.
"""
from __future__ import annotations

import argparse
import base64
import collections
import hmac
import json
import os
import random
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, urlparse

from ..serde import from_dict, to_dict
from .config import EngineOptions
from .errors import GenerationError, ModelLoadError
from .protocol import (EXIT_CANCELLED, EXIT_LOAD_FAILED, EXIT_OK, EXIT_ORPHANED, DeviceInfo, GeneratedImage,
                       GenerateRequest, GenerateResult, WorkerStatus)

TOKEN_ENV = "ACCELSTACK_WORKER_TOKEN"
# Fault injection for the supervisor's tests: while generating, make /ping and /status this many
# seconds slow, as they are in a worker whose server thread cannot get the GIL during a heavy step.
STATUS_DELAY_ENV = "ACCELSTACK_WORKER_TEST_STATUS_DELAY"
HEARTBEAT_INTERVAL = 1.0
MAX_WAIT = 30.0  # longest a long-polling request may wait
PARENT_POLL_INTERVAL = 0.5
LOG_LEVELS = {0: "DEBUG", 1: "INFO", 2: "WARN", 3: "ERROR"}
DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}


def _rss_bytes() -> Optional[int]:
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    except Exception:
        return None


class GgmlBackend:
    """stable-diffusion.cpp through ``stable_diffusion_cpp`` (imported from the runtime)."""

    name = "ggml"

    def __init__(self, log_stream) -> None:
        self.log_stream = log_stream
        self.log_tail: Deque[Tuple[str, str]] = collections.deque(maxlen=200)
        self.sd = None
        self.sd_cpp = None
        self._callbacks: List[Any] = []  # ctypes callbacks must outlive the C side's pointers
        self.on_progress: Callable[[int, int], None] = lambda step, steps: None
        self.threads = 0
        self.library_seconds: Optional[float] = None
        self.vae_tiling = False
        self.vae_tile_size = 32

    # -- library -------------------------------------------------------------------------------
    def import_runtime(self) -> None:
        import stable_diffusion_cpp.stable_diffusion_cpp as sd_cpp  # from the runtime directory on sys.path

        self.sd_cpp = sd_cpp

        @sd_cpp.sd_log_callback
        def log_cb(level, text, data):  # replaces the bindings' logger, which prints
            line = text.decode("utf-8", errors="replace").rstrip("\n")
            lvl = LOG_LEVELS.get(level, str(level))
            self.log_tail.append((lvl, line))
            try:
                self.log_stream.write(f"[{lvl}] {line}\n")
                self.log_stream.flush()
            except (OSError, ValueError):
                pass

        @sd_cpp.sd_progress_callback
        def progress_cb(step, steps, seconds, data):
            self.on_progress(int(step), int(steps))

        self._callbacks += [log_cb, progress_cb]
        sd_cpp.sd_set_log_callback(log_cb, None)
        sd_cpp.sd_set_progress_callback(progress_cb, None)

    def version(self) -> str:
        try:
            return self.sd_cpp.sd_version().decode() + " " + self.sd_cpp.sd_commit().decode()
        except Exception:
            return ""

    def system_info(self) -> str:
        try:
            return self.sd_cpp.sd_get_system_info().decode().strip()
        except Exception:
            return ""

    def device(self) -> DeviceInfo:
        """The device stable-diffusion.cpp computes on: the first GPU-like one, else the CPU."""
        import ctypes

        try:
            lib = self.sd_cpp._lib
            lib.ggml_backend_dev_count.restype = ctypes.c_size_t
            lib.ggml_backend_dev_get.restype = ctypes.c_void_p
            lib.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
            for fn in (lib.ggml_backend_dev_name, lib.ggml_backend_dev_description):
                fn.restype = ctypes.c_char_p
                fn.argtypes = [ctypes.c_void_p]
            lib.ggml_backend_dev_type.restype = ctypes.c_int
            lib.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
            lib.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                                    ctypes.POINTER(ctypes.c_size_t)]
            devices = []
            for i in range(lib.ggml_backend_dev_count()):
                dev = lib.ggml_backend_dev_get(i)
                free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
                lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
                devices.append(DeviceInfo(
                    name=(lib.ggml_backend_dev_name(dev) or b"").decode(errors="replace"),
                    description=(lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace").strip(),
                    kind=DEVICE_KINDS.get(lib.ggml_backend_dev_type(dev), "other"),
                    memory_total=total.value or None, memory_free=free.value or None))
        except Exception:  # an older library without the device API: name what we know
            return DeviceInfo(name="unknown")
        for kind in ("gpu", "igpu", "accel"):
            for dev in devices:
                if dev.kind == kind:
                    return dev
        return devices[0] if devices else DeviceInfo(name="unknown")

    # -- model ---------------------------------------------------------------------------------
    def load(self, model: str, options: EngineOptions) -> None:
        from stable_diffusion_cpp import StableDiffusion

        threads = options.threads or max(1, int(self.sd_cpp.sd_get_num_physical_cores()))
        self.log_tail.clear()
        try:
            sd = StableDiffusion(
                model_path=model,
                n_threads=threads,
                wtype=options.weight_type,
                offload_params_to_cpu=options.offload_to_cpu,
                diffusion_flash_attn=options.flash_attention,
                vae_decode_only=True,
                verbose=True,  # output goes through our log callback, not print()
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelLoadError(f"cannot load model {model}: {self.load_reason() or exc}") from None
        # A failed load is a NULL context; the bindings only notice later ("NULL pointer access").
        if not getattr(sd, "_model", None) or not sd._model.model:
            raise ModelLoadError(f"cannot load model {model}: {self.load_reason() or 'stable-diffusion.cpp returned no context'}")
        self.sd = sd
        self.threads = threads
        self.vae_tiling = options.vae_tiling
        self.vae_tile_size = options.vae_tile_size

    def _logged_seconds(self) -> Optional[float]:
        """stable-diffusion.cpp's own timing of the last generate_image (from its log line)."""
        for _lvl, line in reversed(self.log_tail):
            if "generate_image completed in " in line:
                try:
                    return float(line.rsplit("completed in ", 1)[1].strip().rstrip("s"))
                except ValueError:
                    return None
        return None

    def load_reason(self) -> str:
        """The runtime's own explanation: its last error lines, else its last warnings."""
        for wanted in ("ERROR", "WARN"):
            lines = [line.strip() for lvl, line in self.log_tail if lvl == wanted and line.strip()]
            if lines:
                return "; ".join(dict.fromkeys(lines[-3:]))
        return ""

    def resolve_defaults(self, sampler: str, scheduler: str) -> Tuple[str, str]:
        """Name what "default" means for the loaded model (reported and embedded in PNGs)."""
        import ctypes

        try:
            lib = self.sd_cpp._lib
            lib.sd_sample_method_name.restype = ctypes.c_char_p
            lib.sd_sample_method_name.argtypes = [ctypes.c_int]
            lib.sd_scheduler_name.restype = ctypes.c_char_p
            lib.sd_scheduler_name.argtypes = [ctypes.c_int]
            model = self.sd.model
            method = self.sd_cpp.sd_get_default_sample_method(model)
            if sampler == "default":
                sampler = lib.sd_sample_method_name(int(method)).decode()
            else:
                from stable_diffusion_cpp.stable_diffusion import SAMPLE_METHOD_MAP

                method = SAMPLE_METHOD_MAP[sampler]
            if scheduler == "default":
                scheduler = lib.sd_scheduler_name(int(self.sd_cpp.sd_get_default_scheduler(model, method))).decode()
        except Exception:
            pass  # an older library: keep "default"
        return sampler, scheduler

    def generate(self, req: GenerateRequest) -> Tuple[List[GeneratedImage], int, str, str]:
        seed = req.seed if req.seed >= 0 else random.randint(0, 2 ** 31 - 1)
        sampler, scheduler = self.resolve_defaults(req.sampler, req.scheduler)
        self.log_tail.clear()  # this job's log lines only (its timing, its errors)
        tile = f"{self.vae_tile_size}x{self.vae_tile_size}"
        try:
            images = self.sd.generate_image(
                prompt=req.prompt, negative_prompt=req.negative_prompt, width=req.width, height=req.height,
                sample_steps=req.steps, cfg_scale=float(req.cfg_scale), sample_method=req.sampler,
                scheduler=req.scheduler, seed=seed, batch_count=req.batch_count, clip_skip=req.clip_skip,
                vae_tiling=self.vae_tiling, vae_tile_size=tile,
            )
        except ValueError as exc:  # the bindings' validation (e.g. a sampler this runtime lacks)
            raise GenerationError(f"the runtime rejected the request: {exc}") from None
        self.library_seconds = self._logged_seconds()
        if not images or len(images) != req.batch_count:
            raise GenerationError(f"the runtime returned {len(images or [])} images for a batch of {req.batch_count}: "
                                  f"{self.load_reason() or 'no reason logged'}")
        out = []
        for i, img in enumerate(images):
            rgb = img.convert("RGB")
            out.append(GeneratedImage(width=rgb.width, height=rgb.height, seed=seed + i,
                                      pixels_b64=base64.b64encode(rgb.tobytes()).decode("ascii")))
        return out, seed, sampler, scheduler


class WorkerState:
    """Everything the HTTP handlers read and the job thread writes (under ``lock``)."""

    def __init__(self, backend: Any, token: str) -> None:  # GgmlBackend or torch_engine.TorchBackend
        self.backend = backend
        self.token = token
        self.lock = threading.Condition()  # guards the state; notified when a phase or a job ends
        self.phase = "starting"
        self.version = 0  # bumped on every change a status reader may wait for
        self.error = ""
        self.error_kind = ""
        self.job = ""
        self.step = 0
        self.steps = 0
        self.images_done = 0
        self.ticks = 0
        self.heartbeat = time.time()
        self.load_seconds: Optional[float] = None
        self.device: Optional[DeviceInfo] = None
        self.runtime_version = ""
        self.system_info = ""
        self.results: Dict[str, Dict[str, Any]] = {}
        self.sampling: List[float] = []  # [start, end] of the sampling loop of the current image
        self.sampling_total = 0.0
        self.stop = threading.Event()
        self.status_delay = float(os.environ.get(STATUS_DELAY_ENV, "0") or 0)

    def changed(self) -> None:
        """Call with the lock held after a change a status reader may wait for."""
        self.version += 1
        self.lock.notify_all()

    def fail(self, message: str, kind: str) -> None:
        with self.lock:
            self.phase, self.error, self.error_kind = "error", message, kind
            self.changed()

    def on_progress(self, step: int, steps: int) -> None:
        """Every callback is activity (``ticks``); those with the job's step count are sampling
        steps (the same callback also reports model loading and VAE tiles)."""
        now = time.perf_counter()
        with self.lock:
            self.ticks += 1
            if self.phase != "generating" or steps != self.steps:
                return
            if step == 0:
                self.sampling = [now, now]
                self.step = 0
            elif self.sampling:
                self.sampling[1] = now
                self.step = step
                if step == steps:
                    self.sampling_total += self.sampling[1] - self.sampling[0]
                    self.sampling = []
                    self.images_done += 1
                    self.step = 0
                self.changed()

    def status(self) -> WorkerStatus:
        with self.lock:
            return WorkerStatus(
                phase=self.phase, pid=os.getpid(), version=self.version, job=self.job, step=self.step,
                steps=self.steps, images_done=self.images_done, ticks=self.ticks,
                heartbeat=self.heartbeat, now=time.time(), load_seconds=self.load_seconds, device=self.device,
                rss_bytes=_rss_bytes(), error=self.error, error_kind=self.error_kind,
                runtime_version=self.runtime_version, system_info=self.system_info)

    def run_job(self, job: str, req: GenerateRequest) -> None:
        start = time.perf_counter()
        try:
            images, seed, sampler, scheduler = self.backend.generate(req)
            result = GenerateResult(job=job, images=images, seconds=round(time.perf_counter() - start, 4),
                                    sampling_seconds=round(self.sampling_total, 4), steps=req.steps * req.batch_count,
                                    seed=seed, sampler=sampler, scheduler=scheduler, device=self.device,
                                    load_seconds=self.load_seconds, library_seconds=self.backend.library_seconds)
            outcome: Dict[str, Any] = {"result": to_dict(result)}
        except GenerationError as exc:
            outcome = {"error": exc.message, "kind": "GenerationError", "hint": exc.hint or ""}
        except Exception as exc:  # never let the job thread die silently
            outcome = {"error": f"{type(exc).__name__}: {exc}", "kind": "GenerationError", "hint": ""}
        with self.lock:
            self.results = {job: outcome}
            self.phase = "ready"
            self.sampling = []
            self.changed()


def _make_handler(state: WorkerState):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # quiet: the supervisor keeps the log for errors
            pass

        def _send(self, code: int, payload: Any) -> None:
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()

        def _authorized(self) -> bool:
            given = self.headers.get("Authorization", "")
            if hmac.compare_digest(given.encode(), f"Bearer {state.token}".encode()):
                return True
            self._send(403, {"error": "bad or missing token", "kind": "Forbidden"})
            return False

        def _body(self) -> Any:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}") if n else {}

        def do_GET(self) -> None:
            if not self._authorized():
                return
            url = urlparse(self.path)
            if url.path in ("/ping", "/status") and state.status_delay and state.phase == "generating":
                time.sleep(state.status_delay)
            query = parse_qs(url.query)
            try:
                wait = min(MAX_WAIT, max(0.0, float(query.get("wait", ["0"])[0])))
            except ValueError:
                wait = 0.0
            if url.path == "/ping":
                with state.lock:
                    self._send(200, {"ok": True, "pid": os.getpid(), "phase": state.phase})
            elif url.path == "/status":
                since = query.get("since", [""])[0]
                if wait and since.lstrip("-").isdigit():  # long poll: answer at the next change
                    with state.lock:
                        state.lock.wait_for(lambda: state.version != int(since), timeout=wait)
                self._send(200, to_dict(state.status()))
            elif url.path == "/result":
                job = query.get("job", [""])[0]
                with state.lock:
                    if wait:  # long poll: answer as soon as the job is done
                        state.lock.wait_for(lambda: job in state.results or state.job != job
                                            or state.phase != "generating", timeout=wait)
                    outcome = state.results.get(job)
                    running = state.job == job and state.phase == "generating"
                if outcome is not None:
                    self._send(200, outcome)
                elif running:
                    self._send(202, {"pending": True})
                else:
                    self._send(404, {"error": f"no job {job!r}", "kind": "NotFound"})
            else:
                self._send(404, {"error": f"no endpoint {url.path}", "kind": "NotFound"})

        def do_POST(self) -> None:
            if not self._authorized():
                return
            path = urlparse(self.path).path
            try:
                body = self._body()
            except ValueError:
                self._send(400, {"error": "the request body is not JSON", "kind": "BadRequest"})
                return
            if path == "/generate":
                self._generate(body)
            elif path == "/cancel":
                with state.lock:
                    busy = state.phase == "generating"
                self._send(200, {"cancelled": busy, "exiting": busy})
                if busy:  # a running step cannot be aborted: end the process (the supervisor restarts it)
                    _exit_soon(EXIT_CANCELLED)
            elif path == "/shutdown":
                with state.lock:
                    state.phase = "stopping"
                    state.changed()
                self._send(200, {"ok": True})
                _exit_soon(EXIT_OK)
            else:
                self._send(404, {"error": f"no endpoint {path}", "kind": "NotFound"})

        def _generate(self, body: Any) -> None:
            try:
                req = from_dict(GenerateRequest, body).validate()
            except Exception as exc:
                self._send(400, {"error": getattr(exc, "message", str(exc)), "kind": "GenerationError",
                                 "hint": getattr(exc, "hint", "") or ""})
                return
            with state.lock:
                if state.phase != "ready" or state.backend.sd is None:
                    self._send(409, {"error": f"worker is {state.phase}, not ready", "kind": "Busy"})
                    return
                job = uuid.uuid4().hex[:12]
                state.phase, state.job, state.step, state.steps = "generating", job, 0, req.steps
                state.images_done = 0
                state.changed()
                state.sampling, state.sampling_total = [], 0.0
            threading.Thread(target=state.run_job, args=(job, req), name="job", daemon=True).start()
            self._send(202, {"job": job})

    return Handler


def _exit_soon(code: int) -> None:
    """Exit after the current response has gone out (from a helper thread, right away)."""
    def bye():
        time.sleep(0.05)
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)

    threading.Thread(target=bye, daemon=True).start()


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


def _write_ready(path: str, payload: Dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(payload, fh)
    os.replace(tmp, path)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="accelstack.engine.worker")
    ap.add_argument("--ready-file", required=True)
    ap.add_argument("--parent-pid", type=int, required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--options", default="{}")
    ap.add_argument("--backend", default="ggml", help="ggml (stable-diffusion.cpp) or torch (diffusers)")
    args = ap.parse_args(argv)
    token = os.environ.pop(TOKEN_ENV, "")
    if not token:
        sys.stderr.write("accelstack worker: no token in the environment; refusing to serve\n")
        return 2
    threading.Thread(target=_watch_parent, args=(args.parent_pid,), name="parent-watch", daemon=True).start()

    if args.backend == "torch":
        from .torch_engine import TorchBackend

        backend: Any = TorchBackend(sys.stderr)
    else:
        backend = GgmlBackend(sys.stderr)
    state = WorkerState(backend, token)
    backend.on_progress = state.on_progress
    server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(state))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    threading.Thread(target=_heartbeat, args=(state,), name="heartbeat", daemon=True).start()
    _write_ready(args.ready_file, {"port": server.server_address[1], "pid": os.getpid()})

    try:
        options = from_dict(EngineOptions, json.loads(args.options)).validate()
        with state.lock:
            state.phase = "loading"
            state.changed()
        backend.import_runtime()
        with state.lock:
            state.device = backend.device()
            state.runtime_version, state.system_info = backend.version(), backend.system_info()
        if args.model:
            start = time.perf_counter()
            backend.load(args.model, options)
            with state.lock:
                state.load_seconds = round(time.perf_counter() - start, 4)
        with state.lock:
            state.phase = "ready"
            state.changed()
    except ModelLoadError as exc:
        state.fail(exc.message, "ModelLoadError")
    except ImportError as exc:
        state.fail(f"cannot import the runtime: {exc}", "RuntimeImportError")
    except Exception as exc:
        state.fail(f"{type(exc).__name__}: {exc}", "WorkerError")

    # Serve until /shutdown or /cancel ends the process; a worker in "error" stays up so the
    # supervisor can read the reason, and exits when asked or when its parent goes away.
    state.stop.wait()
    return EXIT_LOAD_FAILED if state.phase == "error" else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
