"""The real worker, whose model loading dies of SIGSEGV at once: what stable-diffusion.cpp does on
some damaged files early in a load. The fault is the test's: test_engine_hostile_worker.py starts
this script instead of the worker module (through :class:`engine_helpers.CrashOnLoadRuntime`), with
the supervisor's usual options.

    python crash_on_load_worker.py [worker options...]
"""
from __future__ import annotations

import os
import signal
import sys
from typing import Any

from accelstack.engine.worker import ggml_backend
from accelstack.engine.worker import main as worker


def crash(self: Any, model: str, options: Any) -> None:
    os.kill(os.getpid(), signal.SIGSEGV)


if __name__ == "__main__":
    ggml_backend.GgmlBackend.load = crash  # type: ignore[method-assign]
    sys.exit(worker.main(sys.argv[1:]))
