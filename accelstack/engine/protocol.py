"""What the supervisor and the worker say to each other: typed requests, status and results.

This module is imported by the worker, which runs inside the runtime's interpreter, so it uses
only the standard library (and :mod:`accelstack.serde`). Requests are validated here, in the
parent, so bad input fails before any process starts.
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..verdict import DeviceInfo
from .errors import GenerationError

# Names stable-diffusion.cpp 0.4.x accepts ("default" lets it choose for the model).
SAMPLERS = ("default", "euler", "euler_a", "heun", "dpm2", "dpm++2s_a", "dpm++2m", "dpm++2mv2", "ipndm",
            "ipndm_v", "lcm", "ddim_trailing", "tcd", "res_multistep", "res_2s", "er_sde")
SCHEDULERS = ("default", "discrete", "karras", "exponential", "ays", "gits", "sgm_uniform", "simple",
              "smoothstep", "kl_optimal", "lcm", "bong_tangent")
MIN_SIDE, MAX_SIDE, SIDE_MULTIPLE = 64, 4096, 8
MAX_STEPS, MAX_BATCH = 1000, 64

# The per-launch token reaches the worker in this variable (never on its command line).
TOKEN_ENV = "ACCELSTACK_WORKER_TOKEN"

# Worker phases, in the order a healthy worker goes through them.
PHASES = ("starting", "loading", "ready", "generating", "error", "stopping")

# Exit codes the worker uses on purpose (anything else is a crash).
EXIT_OK = 0
EXIT_LOAD_FAILED = 3
EXIT_ORPHANED = 4
EXIT_CANCELLED = 75


@dataclass
class GenerateRequest:
    """One text-to-image job. ``seed`` < 0 picks a random seed (reported back)."""

    prompt: str
    negative_prompt: str = ""
    width: int = 512
    height: int = 512
    steps: int = 20
    cfg_scale: float = 7.0
    sampler: str = "default"
    scheduler: str = "default"
    seed: int = 42
    batch_count: int = 1
    clip_skip: int = -1

    def validate(self) -> GenerateRequest:
        """Raise :class:`GenerationError` naming the bad field and what is allowed."""
        if not isinstance(self.prompt, str):
            raise GenerationError("prompt must be text")
        for name in ("width", "height"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v % SIDE_MULTIPLE or not MIN_SIDE <= v <= MAX_SIDE:
                raise GenerationError(
                    f"{name} {v!r} is not allowed: it must be a multiple of {SIDE_MULTIPLE} between {MIN_SIDE} and {MAX_SIDE}",
                    hint=f"try {name} {max(MIN_SIDE, min(MAX_SIDE, _round8(v)))}" if isinstance(v, int) else None)
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or not 1 <= self.steps <= MAX_STEPS:
            raise GenerationError(f"steps must be an integer between 1 and {MAX_STEPS}, got {self.steps!r}")
        if isinstance(self.batch_count, bool) or not isinstance(self.batch_count, int) or not 1 <= self.batch_count <= MAX_BATCH:
            raise GenerationError(f"batch count must be an integer between 1 and {MAX_BATCH}, got {self.batch_count!r}")
        if isinstance(self.cfg_scale, bool) or not isinstance(self.cfg_scale, (int, float)) or not 0.0 <= self.cfg_scale <= 100.0:
            raise GenerationError(f"cfg scale must be a number between 0 and 100, got {self.cfg_scale!r}")
        if self.sampler not in SAMPLERS:
            raise GenerationError(f"unknown sampler {self.sampler!r}", hint=f"choose one of: {', '.join(SAMPLERS)}")
        if self.scheduler not in SCHEDULERS:
            raise GenerationError(f"unknown scheduler {self.scheduler!r}", hint=f"choose one of: {', '.join(SCHEDULERS)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed >= 2 ** 63:
            raise GenerationError(f"seed must be an integer below 2**63, got {self.seed!r}")
        return self


def _round8(v: int) -> int:
    return int(round(v / SIDE_MULTIPLE)) * SIDE_MULTIPLE


@dataclass
class WorkerStatus:
    """The worker's answer to ``status``. ``ticks`` counts every progress callback (any activity);
    ``step``/``steps`` are the sampling progress of the image being made, after ``images_done``
    images of the job; ``heartbeat`` is the worker's clock at the last beat of its heartbeat
    thread (``now`` is its clock at the answer)."""

    phase: str
    pid: int
    version: int = 0
    job: str = ""
    step: int = 0
    steps: int = 0
    images_done: int = 0
    ticks: int = 0
    heartbeat: float = 0.0
    now: float = 0.0
    load_seconds: Optional[float] = None
    device: Optional[DeviceInfo] = None
    rss_bytes: Optional[int] = None
    error: str = ""
    error_kind: str = ""
    runtime_version: str = ""
    system_info: str = ""


@dataclass
class GeneratedImage:
    """Raw 8-bit RGB pixels, row-major (``pixels`` is base64 on the wire)."""

    width: int
    height: int
    seed: int
    pixels_b64: str = ""

    @property
    def pixels(self) -> bytes:
        return base64.b64decode(self.pixels_b64)


@dataclass
class GenerateResult:
    """What one job produced, with the worker's timings (seconds)."""

    job: str
    images: List[GeneratedImage] = field(default_factory=list)
    seconds: float = 0.0  # the whole generate call in the worker
    sampling_seconds: float = 0.0  # first to last sampling step
    steps: int = 0
    seed: int = 0
    sampler: str = ""
    scheduler: str = ""
    device: Optional[DeviceInfo] = None
    load_seconds: Optional[float] = None
    library_seconds: Optional[float] = None  # stable-diffusion.cpp's own generate_image time
    restarts: int = 0  # set by the supervisor: worker restarts during this job
    extra: Dict[str, str] = field(default_factory=dict)

    @property
    def step_seconds(self) -> float:
        return self.sampling_seconds / self.steps if self.steps else 0.0

    @property
    def its_per_second(self) -> float:
        return self.steps / self.sampling_seconds if self.sampling_seconds > 0 else 0.0
