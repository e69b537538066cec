"""Benchmark: accelstack's verified fetch against plain ``requests`` downloads, on loopback.

    python benchmarks/bench_fetch.py                 # 512 MiB
    python benchmarks/bench_fetch.py --size-mib 64   # quicker
    python benchmarks/bench_fetch.py --profile       # and where one fetch spends its time (cProfile)

A file of random bytes is generated in a temporary directory (never committed) and served from a
separate process (stdlib http.server with sendfile, Range support, a byte counter and an optional
rate limit). In the same run, alternating, it times and measures the client CPU (user + system,
all threads) of

  (a) a plain ``requests`` stream to disk, 1 MiB chunks, no hashing;
  (c) the same plus ``hashlib.sha256`` over the same bytes: the simplest correct verified download;
  (b) ``accelstack.artifacts.fetch``: sha256 while streaming, size enforcement, a progress
      callback, resumable part file, lock and the atomic rename into the cache;

and prints the goals side by side: client CPU per MiB b / c (goal <= 1.1); throughput b against
the hash-bound limit min(a, sha256 alone) (goal >= 0.9); and, with the server throttled to 100
MiB/s (the realistic case), b / a (goal >= 0.97). Then it interrupts downloads at 50%:

  * the server drops the connection at exactly half the file; fetch retries and resumes;
  * a fetching process is killed (SIGKILL) once half the file is on disk; a new fetch resumes;

and prints the bytes fetched after the interruption against the missing half (goal: at most one
chunk more than the missing half).
"""
from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MiB = 1 << 20


# -- the server (own process, so it does not share the GIL with the client) ----------------------
def _serve(path: str, port_q, sent, drop_at, stop, rate) -> None:
    size = os.path.getsize(path)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            start = 0
            rng = self.headers.get("Range", "")
            if rng.startswith("bytes=") and rng.endswith("-"):
                start = int(rng[6:-1])
            cut = -1
            with drop_at.get_lock():
                if drop_at.value >= 0:
                    cut, drop_at.value = drop_at.value, -1
            self.send_response(206 if start else 200)
            if start:
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            self.send_header("Content-Length", str(size - start))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            self.wfile.flush()
            end = size if cut < 0 else cut
            offset = start
            bps = rate.value  # > 0: a link throttled to this many bytes per second
            step = 256 * 1024 if bps > 0 else 8 * MiB
            t0 = time.perf_counter()
            with open(path, "rb") as fh:
                try:
                    while offset < end:
                        n = os.sendfile(self.connection.fileno(), fh.fileno(), offset, min(step, end - offset))
                        if n == 0:
                            break
                        offset += n
                        with sent.get_lock():
                            sent.value += n
                        if bps > 0:  # pace to the schedule: (bytes so far) / rate seconds after the start
                            ahead = t0 + (offset - start) / bps - time.perf_counter()
                            if ahead > 0:
                                time.sleep(ahead)
                except (BrokenPipeError, ConnectionResetError):
                    pass
            if cut >= 0:
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                self.close_connection = True

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    port_q.put(httpd.server_address[1])
    httpd.timeout = 0.2
    while not stop.is_set():
        httpd.handle_request()


# -- the clients ----------------------------------------------------------------------------------
def plain_requests(url: str, dest: Path) -> float:
    import requests

    t0 = time.perf_counter()
    with requests.get(url, stream=True, timeout=(10, 60)) as r, open(dest, "wb") as fh:
        r.raise_for_status()
        for chunk in r.iter_content(MiB):
            fh.write(chunk)
    return time.perf_counter() - t0


def plain_requests_sha256(url: str, dest: Path) -> float:
    """(c) the simplest correct verified download: (a) plus hashlib.sha256 over the same bytes."""
    import requests

    t0 = time.perf_counter()
    h = hashlib.sha256()
    with requests.get(url, stream=True, timeout=(10, 60)) as r, open(dest, "wb") as fh:
        r.raise_for_status()
        for chunk in r.iter_content(MiB):
            fh.write(chunk)
            h.update(chunk)
    h.hexdigest()
    return time.perf_counter() - t0


def accelstack_fetch(ref, cache_dir: Path, events: list) -> float:
    from accelstack.artifacts import Cache, fetch

    def progress(event) -> None:
        events.append(event.kind)

    t0 = time.perf_counter()
    fetch([ref], cache=Cache(cache_dir), offline=False, progress=progress)
    return time.perf_counter() - t0


def _child_fetch(ref_args, cache_dir: str) -> None:
    from accelstack.artifacts import ArtifactRef, Cache, fetch

    fetch([ArtifactRef(*ref_args)], cache=Cache(cache_dir), offline=False)


def _cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _sha256_speed() -> float:
    block = os.urandom(MiB)
    h = hashlib.sha256()
    t0 = time.perf_counter()
    for _ in range(256):
        h.update(block)
    return 256 / (time.perf_counter() - t0)


def _measure(url: str, ref, out_dir: Path, repeat: int, clients: str = "abc") -> dict:
    """Time and client CPU of each client, ``repeat`` runs, in rotating order, each run starting
    with no dirty pages waiting for the disk."""
    from accelstack.artifacts import Cache

    out: dict = {k: {"time": [], "cpu": [], "events": 0} for k in clients}

    def run(kind: str, i: int) -> None:
        os.sync()
        c0 = _cpu()
        if kind == "b":
            cache_dir = out_dir / f"cache{i}"
            events: list = []
            elapsed = accelstack_fetch(ref, cache_dir, events)
            out["b"]["events"] = len(events)
            assert Cache(cache_dir).blob_path(ref.sha256).stat().st_size == ref.size
            cpu = _cpu() - c0
            shutil.rmtree(cache_dir)
        else:
            dest = out_dir / "plain.bin"
            elapsed = (plain_requests if kind == "a" else plain_requests_sha256)(ref.urls[0], dest)
            cpu = _cpu() - c0
            dest.unlink()
        out[kind]["time"].append(round(elapsed, 3))
        out[kind]["cpu"].append(cpu)

    for i in range(repeat):
        order = clients[i % len(clients):] + clients[: i % len(clients)]
        for kind in order:
            run(kind, i)
    return out


def _profile(ref, out_dir: Path) -> None:
    import cProfile
    import pstats

    cache_dir = out_dir / "cache-profile"
    prof = cProfile.Profile()
    prof.enable()
    accelstack_fetch(ref, cache_dir, [])
    prof.disable()
    shutil.rmtree(cache_dir)
    print("profile of one fetch (this thread; the hashing thread is not profiled), by own time:")
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=512, help="file size in MiB (default 512)")
    ap.add_argument("--repeat", type=int, default=4, help="timed runs of each client (default 4)")
    ap.add_argument("--throttle-mib", type=int, default=100, help="the throttled link's rate in MiB/s (default 100)")
    ap.add_argument("--profile", action="store_true", help="also profile one fetch (cProfile, top functions)")
    ap.add_argument("--dir", help="where to write the downloads (default: the temp dir; try /dev/shm to "
                    "take the disk out of the measurement)")
    args = ap.parse_args()

    from accelstack.artifacts import ArtifactRef, Cache
    from accelstack.artifacts.transport import DEFAULT_CHUNK_SIZE

    size = args.size_mib * MiB
    load0 = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="accelstack-bench-"))
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    server = None
    try:
        src = work / "blob.bin"
        h = hashlib.sha256()
        with open(src, "wb") as fh:
            left = size
            while left:
                block = os.urandom(min(8 * MiB, left))
                h.update(block)
                fh.write(block)
                left -= len(block)
        sha = h.hexdigest()
        port_q, sent, drop_at, rate = ctx.Queue(), ctx.Value("q", 0), ctx.Value("q", -1), ctx.Value("q", 0)
        server = ctx.Process(target=_serve, args=(str(src), port_q, sent, drop_at, stop, rate), daemon=True)
        server.start()
        url = f"http://127.0.0.1:{port_q.get(timeout=30)}/blob.bin"
        out_dir = Path(tempfile.mkdtemp(prefix="accelstack-bench-out-", dir=args.dir)) if args.dir else work
        ref = ArtifactRef("blob.bin", sha, size, [url])
        print(f"file: {args.size_mib} MiB on loopback, {args.repeat} runs each, written to {out_dir}, "
              f"python {sys.version.split()[0]}")

        plain_requests(url, out_dir / "warmup.bin")  # warm the server's page cache and the connection code
        (out_dir / "warmup.bin").unlink()
        sha_speed = _sha256_speed()
        loop = _measure(url, ref, out_dir, args.repeat)
        mib = size / MiB
        ta, tb, tc = (size / statistics.median(loop[k]["time"]) / MiB for k in "abc")
        ca, cb, cc = (statistics.median(loop[k]["cpu"]) / mib * 1000 for k in "abc")
        print(f"(a) plain requests, no hash      : {ta:8.1f} MiB/s, client CPU {ca:.2f} ms/MiB  runs {loop['a']['time']} s")
        print(f"(c) plain requests + sha256      : {tc:8.1f} MiB/s, client CPU {cc:.2f} ms/MiB  runs {loop['c']['time']} s")
        print(f"(b) accelstack fetch (verified)  : {tb:8.1f} MiB/s, client CPU {cb:.2f} ms/MiB  runs {loop['b']['time']} s; "
              f"{loop['b']['events']} progress events")
        best = size / min(loop["b"]["time"]) / MiB
        print(f"best run of (b): {best:.1f} MiB/s = {best / min(ta, sha_speed):.3f} of the hash-bound limit "
              "(on a busy machine the hashing thread waits for a core; the medians show that)")
        limit = min(ta, sha_speed)
        goals = [
            ("client CPU per MiB, b / c", cb / cc, "<=", 1.1),
            ("throughput vs the hash-bound limit min(a, sha256 alone), b / limit", tb / limit, ">=", 0.9),
        ]
        print(f"sha256 alone: {sha_speed:.0f} MiB/s, so the hash-bound limit is {limit:.0f} MiB/s; "
              f"b / a = {tb / ta:.3f}, b / c = {tb / tc:.3f}")

        # -- a link throttled to --throttle-mib MiB/s (the realistic case) --------------------------
        with rate.get_lock():
            rate.value = args.throttle_mib * MiB
        slow = _measure(url, ref, out_dir, max(1, args.repeat // 2), clients="ab")
        with rate.get_lock():
            rate.value = 0
        sa, sb = (size / statistics.median(slow[k]["time"]) / MiB for k in "ab")
        print(f"throttled to {args.throttle_mib} MiB/s: (a) plain {sa:.1f} MiB/s, (b) fetch {sb:.1f} MiB/s "
              f"(runs a {slow['a']['time']} s, b {slow['b']['time']} s)")
        goals.append((f"throughput on a {args.throttle_mib} MiB/s link, b / a", sb / sa, ">=", 0.97))
        for name, value, op, goal in goals:
            met = value <= goal if op == "<=" else value >= goal
            print(f"GOAL {name}: {value:.3f} (goal {op} {goal}: {'met' if met else 'NOT met'})")
        print(f"machine: {os.cpu_count()} CPUs, load average {load0:.2f} at the start, "
              f"{os.getloadavg()[0]:.2f} now")
        if args.profile:
            _profile(ref, out_dir)

        # -- interruption at 50%: the server drops the connection ------------------------------
        half = size // 2
        cache_dir = out_dir / "cache-drop"
        with sent.get_lock():
            sent.value = 0
        with drop_at.get_lock():
            drop_at.value = half
        from accelstack.artifacts import RetryPolicy, fetch

        fetch([ref], cache=Cache(cache_dir), offline=False, retry=RetryPolicy(backoff_base=0.01))
        total = sent.value
        after = total - half
        print(f"connection dropped at 50%: served {total} bytes in all; fetched after the drop {after} "
              f"for a missing half of {size - half} -> overhead {after - (size - half)} bytes "
              f"(goal <= one chunk, {DEFAULT_CHUNK_SIZE})")
        shutil.rmtree(cache_dir)

        # -- interruption at 50%: the fetching process is killed ---------------------------------
        cache_dir = out_dir / "cache-kill"
        part = Cache(cache_dir).part_path(sha)
        child = ctx.Process(target=_child_fetch, args=(("blob.bin", sha, size, [url]), str(cache_dir)))
        child.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and child.is_alive():
            if part.exists() and part.stat().st_size >= half:
                break
            time.sleep(0.001)
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        on_disk = part.stat().st_size if part.exists() else 0
        with sent.get_lock():
            before_resume = sent.value
        fetch([ref], cache=Cache(cache_dir), offline=False)
        after = sent.value - before_resume
        print(f"process killed at {on_disk / size:.1%}: {on_disk} bytes kept on disk; the next run fetched {after} "
              f"bytes for {size - on_disk} missing -> overhead {after - (size - on_disk)} bytes")
        return 0
    finally:
        stop.set()
        if server is not None:
            server.join(5)
            if server.is_alive():
                server.kill()
        shutil.rmtree(work, ignore_errors=True)
        if args.dir and "out_dir" in locals():
            shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
