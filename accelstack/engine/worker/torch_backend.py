"""The torch stack's part of the generation worker: a diffusers pipeline on the best torch device.

Used by :mod:`accelstack.engine.worker.main` when the runtime's backend is ``torch``; it runs inside
the runtime's interpreter (a venv with torch, diffusers, transformers and safetensors), where
accelstack itself may not be installed, so this module imports only the standard library and
accelstack's own standard-library modules at the top; torch and the engine's packages (diffusers,
transformers, safetensors, NumPy: :func:`~accelstack.engine.verification.torch_check.engine_modules`) are
imported by :meth:`TorchBackend.import_runtime`.

The device is picked by :func:`accelstack.engine.verification.torch_check.pick_device` (CUDA > XPU > MPS >
DirectML > CPU, a device wins only if a small computation on it works); weights are fp16 on
CUDA/XPU/MPS and fp32 elsewhere. A model is a diffusers folder (``from_pretrained``; a folder in
the probe model's layout, without configs or tokenizer, is built the way torch verify builds it)
or a single ``.safetensors``/``.ckpt`` file (``from_single_file``).

The backend has the ggml one's surface (:class:`~accelstack.engine.worker.backend.WorkerBackend`),
so the worker's HTTP server, status and progress work unchanged.
"""
from __future__ import annotations

import base64
import importlib.util
import os
import random
import sys
import time
from typing import IO, Any, Dict, List, Sequence, Tuple

from ..config import EngineOptions
from ..errors import GenerationError, ModelLoadError
from ..probes.layout import probe_weights
from ..verification.torch_check import HALF_KINDS, build_probe_pipeline, engine_modules, fixed_prompt_embeds, pick_device
from .backend import WorkerBackend
from .protocol import DeviceInfo, GeneratedImage, GenerateRequest

__all__ = ["TorchBackend", "ENGINE_MODULES", "SAMPLER_CLASSES", "SCHEDULE_CONFIG", "DTYPES", "CPU_GENERATOR_KINDS"]

ENGINE_MODULES = ("diffusers", "transformers", "safetensors")  # imported here and in torch_check next to torch
CPU_GENERATOR_KINDS = ("mps", "directml", "cpu")  # generators on these devices are unsupported or CPU anyway

# accelstack sampler name -> (diffusers scheduler class, extra config)
SAMPLER_CLASSES = {
    "euler": ("EulerDiscreteScheduler", {}),
    "euler_a": ("EulerAncestralDiscreteScheduler", {}),
    "heun": ("HeunDiscreteScheduler", {}),
    "dpm2": ("KDPM2DiscreteScheduler", {}),
    "dpm++2s_a": ("DPMSolverSinglestepScheduler", {}),
    "dpm++2m": ("DPMSolverMultistepScheduler", {}),
    "lcm": ("LCMScheduler", {}),
    "ddim_trailing": ("DDIMScheduler", {"timestep_spacing": "trailing"}),
}
# accelstack scheduler (sigma schedule) name -> scheduler config
SCHEDULE_CONFIG = {
    "discrete": {},
    "karras": {"use_karras_sigmas": True},
    "exponential": {"use_exponential_sigmas": True},
}
DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


class TorchBackend(WorkerBackend):
    """torch + diffusers from the runtime's interpreter (``sd`` is the pipeline)."""

    name = "torch"

    def __init__(self, log_stream: IO[str], lib_dirs: Sequence[str] = (), preload: Sequence[str] = ()) -> None:
        super().__init__(log_stream, lib_dirs, preload)
        self.torch: Any = None
        self.diffusers: Any = None
        self.np: Any = None
        self.kind = ""
        self.device_obj: Any = None
        self.device_name = ""
        self.rejected: Dict[str, str] = {}
        self.dtype: Any = None
        self.tokenizer_free = False
        self._base_scheduler: Any = None

    # -- library -------------------------------------------------------------------------------
    def import_runtime(self) -> None:
        import torch  # from the runtime's interpreter / path

        missing = [m for m in ENGINE_MODULES if importlib.util.find_spec(m) is None]
        if missing:  # every one named, with the command that adds them, not only the first that fails
            raise ImportError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed next to torch "
                              f"(the torch worker needs {', '.join(ENGINE_MODULES)}); add them with: "
                              f"{sys.executable} -m pip install {' '.join(missing)}")
        found = engine_modules()
        self.torch, self.diffusers, self.np = torch, found.diffusers, found.numpy
        self.kind, self.device_obj, self.device_name, self.rejected = pick_device(torch)
        for kind, why in self.rejected.items():
            self.log("WARN", f"device {kind} not used: {why}")
        self.log("INFO", f"torch {torch.__version__} on {self.kind} ({self.device_name})")

    def version(self) -> str:
        try:
            return f"torch {self.torch.__version__}, diffusers {self.diffusers.__version__}"
        except Exception:
            return ""

    def system_info(self) -> str:
        parts = [f"device {self.kind}: {self.device_name}"]
        parts += [f"{k} rejected: {v}" for k, v in self.rejected.items()]
        try:
            parts.append(f"threads {self.torch.get_num_threads()}")
        except Exception:
            pass
        return "; ".join(parts)

    def device(self) -> DeviceInfo:
        info = DeviceInfo(name=self.kind, description=self.device_name, kind="cpu" if self.kind == "cpu" else "gpu")
        try:
            if self.kind == "cuda":
                free, total = self.torch.cuda.mem_get_info(self.device_obj)
                info.memory_free, info.memory_total = int(free), int(total)
            elif self.kind == "xpu":
                info.memory_total = int(self.torch.xpu.get_device_properties(0).total_memory)
        except Exception:
            pass
        return info

    def load_reason(self) -> str:
        return " | ".join(line for lvl, line in list(self.log_tail)[-3:] if lvl in ("ERROR", "WARN"))

    # -- model ---------------------------------------------------------------------------------
    def _dtype(self, options: EngineOptions) -> Any:
        torch = self.torch
        wt = getattr(options, "weight_type", "default") or "default"
        if wt == "default":
            return torch.float16 if self.kind in HALF_KINDS else torch.float32
        if wt not in DTYPES:
            raise ModelLoadError(f"weight type {wt} is not available with the torch worker",
                                 hint=f"use one of: default, {', '.join(DTYPES)} (quantized types are ggml-only)")
        return getattr(torch, DTYPES[wt])

    def load(self, model: str, options: EngineOptions) -> None:
        threads = getattr(options, "threads", "auto")
        if isinstance(threads, int) and threads > 0:
            self.torch.set_num_threads(threads)
        self.dtype = self._dtype(options)
        path = os.path.abspath(os.path.expanduser(model))
        if not os.path.exists(path):
            raise ModelLoadError(f"model {path} does not exist", hint="check the path (use an absolute path if in doubt)")
        SD = self.diffusers.StableDiffusionPipeline
        try:
            if os.path.isdir(path) and os.path.isfile(os.path.join(path, "model_index.json")):
                pipe = SD.from_pretrained(path, torch_dtype=self.dtype, safety_checker=None,
                                          requires_safety_checker=False, local_files_only=True)
                pipe = pipe.to(self.device_obj)
            elif probe_weights(path):  # the probe model (its folder or its file): weights only, SD 1.x
                pipe = build_probe_pipeline(self.torch, path, self.device_obj, self.dtype)
            else:
                pipe = SD.from_single_file(path, torch_dtype=self.dtype, safety_checker=None,
                                           requires_safety_checker=False)
                pipe = pipe.to(self.device_obj)
        except ModelLoadError:
            raise
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else ""
            self.log("ERROR", f"{type(exc).__name__}: {exc}")
            raise ModelLoadError(f"cannot load model {path} with diffusers: {type(exc).__name__}: {first}",
                                 hint="pass a complete diffusers folder or a Stable Diffusion .safetensors/.ckpt "
                                 "file; a single file may need its config, which diffusers fetches once online") from None
        if getattr(options, "vae_tiling", False):
            try:
                pipe.vae.enable_tiling()
            except Exception:
                pass
        pipe.set_progress_bar_config(disable=True)
        self.tokenizer_free = getattr(pipe, "tokenizer", None) is None
        self._base_scheduler = pipe.scheduler
        self.sd = pipe

    # -- generation ----------------------------------------------------------------------------
    def resolve_defaults(self, sampler: str, scheduler: str) -> Tuple[str, str]:
        base = type(self._base_scheduler).__name__
        if sampler == "default":
            sampler = next((k for k, (cls, extra) in SAMPLER_CLASSES.items() if cls == base and not extra), base)
        if scheduler == "default":
            scheduler = "discrete"
        return sampler, scheduler

    def _scheduler_for(self, sampler: str, scheduler: str) -> Any:
        if sampler != "default" and sampler not in SAMPLER_CLASSES:
            raise GenerationError(f"sampler {sampler} is not available with the torch worker",
                                  hint=f"choose one of: default, {', '.join(SAMPLER_CLASSES)}")
        if scheduler != "default" and scheduler not in SCHEDULE_CONFIG:
            raise GenerationError(f"scheduler {scheduler} is not available with the torch worker",
                                  hint=f"choose one of: default, {', '.join(SCHEDULE_CONFIG)}")
        if sampler == "default" and scheduler in ("default", "discrete"):
            return self._base_scheduler
        cls_name, extra = SAMPLER_CLASSES.get(sampler, (type(self._base_scheduler).__name__, {}))
        config: Dict[str, Any] = dict(extra)
        config.update(SCHEDULE_CONFIG.get(scheduler, {}))
        try:
            cls = getattr(self.diffusers, cls_name)
            return cls.from_config(self._base_scheduler.config, **config)
        except Exception as exc:
            raise GenerationError(f"this diffusers cannot make sampler {sampler} with scheduler {scheduler}: {exc}") from None

    def _generator(self, seed: int) -> Any:
        device = "cpu" if self.kind in CPU_GENERATOR_KINDS else self.device_obj
        return self.torch.Generator(device).manual_seed(seed)

    def generate(self, req: GenerateRequest) -> Tuple[List[GeneratedImage], int, str, str]:
        torch = self.torch
        pipe = self.sd
        seed = req.seed if req.seed >= 0 else random.randint(0, 2 ** 31 - 1)
        pipe.scheduler = self._scheduler_for(req.sampler, req.scheduler)
        sampler, scheduler = self.resolve_defaults(req.sampler, req.scheduler)
        steps = req.steps

        def on_step_end(_pipe, i, _t, kwargs):
            self.on_progress(int(i) + 1, steps)
            return kwargs

        kwargs: Dict[str, Any] = {}
        out: List[GeneratedImage] = []
        start = time.perf_counter()
        with torch.inference_mode():
            if self.tokenizer_free:  # no tokenizer: fixed prompt ids, as torch verify does
                embeds = fixed_prompt_embeds(torch, pipe.text_encoder, self.device_obj, self.dtype)
                kwargs = {"prompt_embeds": embeds, "negative_prompt_embeds": torch.zeros_like(embeds)}
            else:
                kwargs = {"prompt": req.prompt, "negative_prompt": req.negative_prompt or None}
            for i in range(req.batch_count):
                self.on_progress(0, steps)
                try:
                    image = pipe(height=req.height, width=req.width, num_inference_steps=steps,
                                 guidance_scale=float(req.cfg_scale), generator=self._generator(seed + i),
                                 output_type="np", callback_on_step_end=on_step_end, **kwargs).images[0]
                except GenerationError:
                    raise
                except Exception as exc:
                    first = str(exc).splitlines()[0] if str(exc) else ""
                    self.log("ERROR", f"{type(exc).__name__}: {exc}")
                    raise GenerationError(f"diffusers failed on {self.kind}: {type(exc).__name__}: {first}") from None
                np = self.np
                rgb = (np.clip(np.nan_to_num(image), 0.0, 1.0) * 255.0).round().astype(np.uint8)
                h, w = rgb.shape[:2]
                out.append(GeneratedImage(width=int(w), height=int(h), seed=seed + i,
                                          pixels_b64=base64.b64encode(rgb[..., :3].tobytes()).decode("ascii")))
        self.library_seconds = round(time.perf_counter() - start, 4)
        return out, seed, sampler, scheduler
