"""The real worker, whose /ping and /status answer DELAY seconds late while it generates: what a
worker looks like whose server thread cannot get the GIL during a heavy step. The fault is the
test's, not the product's: test_engine_worker.py starts this script instead of the worker module
(through :class:`engine_helpers.SlowStatusRuntime`), with the supervisor's usual options after DELAY.

    python slow_status_worker.py DELAY [worker options...]
"""
from __future__ import annotations

import sys
import time
from typing import Any
from urllib.parse import urlparse

from accelstack.engine.worker import main as worker
from accelstack.engine.worker import server as worker_server


def slow_handler(delay: float):
    real = worker_server.make_handler

    def make_handler(state: Any):
        class Slow(real(state)):  # type: ignore[misc]
            def _get(self) -> None:
                if urlparse(self.path).path in ("/ping", "/status") and state.phase == "generating":
                    time.sleep(delay)
                super()._get()

        return Slow

    return make_handler


if __name__ == "__main__":
    worker_server.make_handler = slow_handler(float(sys.argv[1]))
    sys.exit(worker.main(sys.argv[2:]))
