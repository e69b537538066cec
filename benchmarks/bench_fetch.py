"""Benchmark: accelstack's verified fetch against a plain ``requests`` download, on loopback.

    python benchmarks/bench_fetch.py                 # 512 MiB
    python benchmarks/bench_fetch.py --size-mib 64   # quicker

A file of random bytes is generated in a temporary directory (never committed) and served from a
separate process (stdlib http.server with sendfile, Range support and a byte counter). In the
same run it times

  (a) a plain ``requests`` stream to disk, 1 MiB chunks, no hashing;
  (b) ``accelstack.artifacts.fetch`` with sha256 while streaming, size enforcement, a progress
      callback, fsync and the atomic rename into the cache;

and prints each throughput and the ratio b/a (goal: >= 0.9). Then it interrupts downloads at 50%:

  * the server drops the connection at exactly half the file; fetch retries and resumes;
  * a fetching process is killed (SIGKILL) once half the file is on disk; a new fetch resumes;

and prints the bytes fetched after the interruption against the missing half (goal: at most one
chunk more than the missing half).
"""
from __future__ import annotations

import argparse
import functools
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
def _serve(path: str, port_q, sent, drop_at, stop) -> None:
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
            with open(path, "rb") as fh:
                try:
                    while offset < end:
                        n = os.sendfile(self.connection.fileno(), fh.fileno(), offset, min(8 * MiB, end - offset))
                        if n == 0:
                            break
                        offset += n
                        with sent.get_lock():
                            sent.value += n
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


def accelstack_fetch(ref, cache_dir: Path, events: list) -> float:
    from accelstack.artifacts import Cache, fetch

    def progress(event) -> None:
        events.append(event.kind)

    t0 = time.perf_counter()
    fetch([ref], cache=Cache(cache_dir), progress=progress)
    return time.perf_counter() - t0


def _child_fetch(ref_args, cache_dir: str) -> None:
    from accelstack.artifacts import ArtifactRef, Cache, fetch

    fetch([ArtifactRef(*ref_args)], cache=Cache(cache_dir))


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=512, help="file size in MiB (default 512)")
    ap.add_argument("--repeat", type=int, default=4, help="timed runs of each client (default 4)")
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
        port_q, sent, drop_at = ctx.Queue(), ctx.Value("q", 0), ctx.Value("q", -1)
        server = ctx.Process(target=_serve, args=(str(src), port_q, sent, drop_at, stop), daemon=True)
        server.start()
        url = f"http://127.0.0.1:{port_q.get(timeout=30)}/blob.bin"
        out_dir = Path(tempfile.mkdtemp(prefix="accelstack-bench-out-", dir=args.dir)) if args.dir else work
        ref = ArtifactRef("blob.bin", sha, size, [url])
        print(f"file: {args.size_mib} MiB on loopback, {args.repeat} runs each, written to {out_dir}, "
              f"python {sys.version.split()[0]}")

        plain_times, fetch_times, plain_cpu, fetch_cpu = [], [], [], []
        events: list = []

        def run_plain() -> None:
            out = out_dir / "plain.bin"
            c0 = _cpu()
            plain_times.append(plain_requests(url, out))
            plain_cpu.append(_cpu() - c0)
            out.unlink()

        def run_fetch(i: int) -> None:
            cache_dir = out_dir / f"cache{i}"
            events.clear()
            c0 = _cpu()
            fetch_times.append(accelstack_fetch(ref, cache_dir, events))
            fetch_cpu.append(_cpu() - c0)
            assert Cache(cache_dir).blob_path(sha).stat().st_size == size
            shutil.rmtree(cache_dir)

        plain_requests(url, out_dir / "warmup.bin")  # warm the server's page cache and the connection code
        (out_dir / "warmup.bin").unlink()
        for i in range(args.repeat):
            # alternate the order, and start each run with no dirty pages waiting for the disk
            this_fetch = functools.partial(run_fetch, i)
            for run in ((run_plain, this_fetch) if i % 2 == 0 else (this_fetch, run_plain)):
                os.sync()
                run()
        a, b = statistics.median(plain_times), statistics.median(fetch_times)
        ta, tb = size / a / MiB, size / b / MiB
        mib = size / MiB
        print(f"(a) plain requests, no hash   : {ta:8.1f} MiB/s  runs {[round(t, 3) for t in plain_times]} s, "
              f"client CPU {statistics.median(plain_cpu) / mib * 1000:.2f} ms/MiB")
        print(f"(b) accelstack fetch + sha256 : {tb:8.1f} MiB/s  runs {[round(t, 3) for t in fetch_times]} s, "
              f"client CPU {statistics.median(fetch_cpu) / mib * 1000:.2f} ms/MiB; {len(events)} progress events")
        ratio = tb / ta
        best = (size / min(fetch_times)) / (size / min(plain_times))
        print(f"ratio b/a (medians): {ratio:.3f}, best runs: {best:.3f}  (goal >= 0.9: {'met' if ratio >= 0.9 else 'NOT met'})")
        print(f"machine: {os.cpu_count()} CPUs, load average {load0:.2f} at the start; "
              f"sha256 alone: {_sha256_speed():.0f} MiB/s")

        # -- interruption at 50%: the server drops the connection ------------------------------
        half = size // 2
        cache_dir = out_dir / "cache-drop"
        with sent.get_lock():
            sent.value = 0
        with drop_at.get_lock():
            drop_at.value = half
        from accelstack.artifacts import RetryPolicy, fetch

        fetch([ref], cache=Cache(cache_dir), retry=RetryPolicy(backoff_base=0.01))
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
        fetch([ref], cache=Cache(cache_dir))
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
