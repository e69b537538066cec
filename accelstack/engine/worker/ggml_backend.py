"""The ggml side of the generation worker: stable-diffusion.cpp through its Python bindings.

Runs inside the worker process (:mod:`accelstack.engine.worker.main`), importing
``stable_diffusion_cpp`` from the runtime directory. The bindings print through a log callback
that this backend replaces, so the runtime's log lines reach the worker's log (stderr) and the
last ones explain a failed load. :mod:`accelstack.engine.worker.torch_backend` has the same surface.
"""
from __future__ import annotations

import base64
import ctypes
import os
import random
import sys
from pathlib import Path
from typing import IO, Any, Dict, List, Optional, Sequence, Tuple

from ...serde import plural
from ..config import EngineOptions
from ..errors import GenerationError, ModelLoadError
from ..memory.converted import ConvertedCache
from ..probes.layout import probe_weights
from .backend import WorkerBackend, load_runtime_libraries
from .protocol import COMPONENT_FLAGS, DeviceInfo, GeneratedImage, GenerateRequest, read_pixels

__all__ = ["GgmlBackend", "initialized_backends", "INIT_MARK", "LOG_LEVELS", "DEVICE_KINDS"]

LOG_LEVELS = {0: "DEBUG", 1: "INFO", 2: "WARN", 3: "ERROR"}
DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
# stable-diffusion.cpp's line for the ggml backend it creates for the model (ggml_extend.hpp):
# "Initializing backend: Vulkan0", "Initializing backend: CUDA0", "Initializing backend: CPU".
INIT_MARK = "Initializing backend: "
CONVERTED_MARK = "loading converted weights "  # the worker's log line when the cache had them
# src/stable-diffusion.cpp decode_image_outputs: the VAE decode failed (its compute buffer not allocated: out of memory)
DECODE_FAILED_MARK = "decode_first_stage failed"
DECODE_RETRY = ("the untiled VAE decode ran out of memory: re-sampled with the same seed and decoded tiled "
                "(stable-diffusion.cpp keeps no latent to decode again)")


def initialized_backends(lines: List[str]) -> List[str]:
    """The ggml backends stable-diffusion.cpp initialized, in order, from its log lines."""
    return [line.split(INIT_MARK, 1)[1].strip() for line in lines if INIT_MARK in line]


def _levers(options: EngineOptions) -> Dict[str, Any]:
    """The low-VRAM levers the planner (engine.memory.plan) or the user set, as the bindings' arguments
    (stable_diffusion_cpp 0.4.7); only those turned on, so a runtime whose bindings predate one still loads."""
    levers = {"keep_clip_on_cpu": options.keep_clip_on_cpu is True, "keep_vae_on_cpu": options.keep_vae_on_cpu is True,
              "max_vram": float(options.max_vram) if isinstance(options.max_vram, (int, float)) else 0.0,
              "enable_mmap": options.enable_mmap is True,
              "lora_apply_mode": "" if options.lora_apply_mode == "auto" else options.lora_apply_mode}
    return {k: v for k, v in levers.items() if v}


class GgmlBackend(WorkerBackend):
    """stable-diffusion.cpp through ``stable_diffusion_cpp`` (imported from the runtime)."""

    name = "ggml"

    def __init__(self, log_stream: IO[str], lib_dirs: Sequence[str] = (), preload: Sequence[str] = ()) -> None:
        super().__init__(log_stream, lib_dirs, preload)
        self.bindings: Any = None  # the ``stable_diffusion_cpp`` package (its Python wrapper)
        self.sd_cpp: Any = None  # the bindings' ctypes module
        self._callbacks: List[Any] = []  # ctypes callbacks must outlive the C side's pointers
        self.threads = 0
        self.notes: Dict[str, str] = {}  # the last generate's notes for its result (GenerateResult.extra)
        self.vae_tiling = False
        self.vae_tile_size = 32
        self.initialized: List[str] = []  # ggml backends the loaded model runs on (from the runtime's log)

    # -- library -------------------------------------------------------------------------------
    def import_runtime(self) -> None:
        for path in load_runtime_libraries(self.lib_dirs, self.preload):  # a CUDA build's cudart and cuBLAS
            self.log("INFO", f"loaded {path}")
        # The one import of the bindings, from the runtime directory on sys.path: their package
        # imports its ctypes API and its Python wrapper (StableDiffusion, the sampler names).
        import stable_diffusion_cpp.stable_diffusion_cpp as sd_cpp

        self.bindings, self.sd_cpp = sys.modules["stable_diffusion_cpp"], sd_cpp

        @sd_cpp.sd_log_callback
        def log_cb(level, text, data):  # replaces the bindings' logger, which prints
            self.log(LOG_LEVELS.get(level, str(level)), text.decode("utf-8", errors="replace").rstrip("\n"))

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
        """The device stable-diffusion.cpp computes on. Once a model is loaded: the ggml device it
        initialized (its log says which), so a GPU build that fell back to its CPU backend says "CPU".
        Before: the first GPU-like device ggml registered, else the CPU."""
        devices = self.devices()
        if self.initialized:
            name = self.initialized[0]
            for dev in devices:
                if dev.name == name:
                    return dev
            return DeviceInfo(name=name, kind="cpu" if name.upper() == "CPU" else "other")
        for kind in ("gpu", "igpu", "accel"):
            for dev in devices:
                if dev.kind == kind:
                    return dev
        return devices[0] if devices else DeviceInfo(name="unknown")

    def devices(self) -> List[DeviceInfo]:
        """The devices ggml registered ([] with an older library that lacks the device API)."""
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
        except Exception:  # an older library without the device API
            return []
        return devices

    # -- model ---------------------------------------------------------------------------------
    def load(self, model: str, options: EngineOptions) -> None:
        model = probe_weights(model) or model  # the probe's folder: its weights file
        threads = options.threads or max(1, int(self.sd_cpp.sd_get_num_physical_cores()))
        self.log_tail.clear()
        # The bindings (0.4.7) build the embeddings array from ``self._embedding_items``, an attribute
        # they never set (their list is a local), so embedding_paths fails with an AttributeError: a
        # subclass provides the same items, built as they build them (name: the file name's stem).
        items = [self.sd_cpp.sd_embedding_t(name=os.path.splitext(os.path.basename(p))[0].encode("utf-8"),
                                            path=p.encode("utf-8")) for p in options.embeddings]
        self._callbacks.append(items)  # the C side reads the names and paths while it loads
        factory = type("StableDiffusion", (self.bindings.StableDiffusion,), {"_embedding_items": items})
        # Component files the parent checked (engine.request.components), each as the bindings' argument:
        # a diffusion model given alone is the worker's model, loaded as diffusion_model_path.
        files = {argument: getattr(options, name) for name, (_flag, argument) in COMPONENT_FLAGS.items()
                 if getattr(options, name) and name != "diffusion_model"}
        if options.weight_type not in ("default", "auto") and options.converted_dir:  # converted once, then reused
            model = self._converted(model, options.weight_type, options.converted_dir) or model
        if options.diffusion_model:
            files["diffusion_model_path"] = model
        try:
            sd = factory(
                model_path="" if options.diffusion_model else model,
                **files,
                n_threads=threads,
                wtype=options.weight_type,
                offload_params_to_cpu=options.offload_to_cpu,
                **_levers(options),
                diffusion_flash_attn=options.flash_attention,
                chroma_use_dit_mask=options.chroma_dit_mask,
                embedding_paths=list(options.embeddings),  # staged and checked by the parent (engine.request.companions)
                vae_decode_only=not options.vae_encode,  # img2img encodes its init image
                verbose=True,  # output goes through our log callback, not print()
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelLoadError(f"cannot load model {model}: {self.load_reason() or exc}") from None
        # A failed load is a NULL context; the bindings only notice later ("NULL pointer access"),
        # and their object frees it when dropped (a segfault): it is forgotten before the error.
        if not getattr(sd, "_model", None) or not sd._model.model:
            if getattr(sd, "_model", None) is not None:
                sd._model.model = None
            raise ModelLoadError(f"cannot load model {model}: {self.load_reason() or 'stable-diffusion.cpp returned no context'}")
        self.sd = sd
        self.initialized = initialized_backends([line for _lvl, line in self.log_tail])
        self.threads = threads
        self.vae_tiling = options.vae_tiling is True  # the parent resolves "auto" (engine.memory.plan) before
        self.vae_tile_size = options.vae_tile_size if isinstance(options.vae_tile_size, int) else 32

    def _converted(self, source: str, weight_type: str, root: str) -> Optional[str]:
        """``source`` converted to ``weight_type``: from the converted-weights cache, else converted now by
        stable-diffusion.cpp's own convert (src/convert.cpp) into it; None: convert on load, as before."""
        cache = ConvertedCache(root)
        try:
            found = cache.lookup(Path(source), weight_type)
            if found is not None:
                self.log("INFO", f"{CONVERTED_MARK}{found} ({weight_type} of {source}, from the cache)")
                return str(found)
            type_id = int(self.bindings.stable_diffusion.GGML_TYPE_MAP[weight_type])
            made = cache.store(Path(source), weight_type, lambda out: bool(self.sd_cpp.convert(
                source.encode("utf-8"), b"", str(out).encode("utf-8"), type_id, b"", False)))
        except (OSError, KeyError, ValueError, AttributeError) as exc:  # no convert in these bindings, a bad folder
            self.log("WARN", f"the converted-weights cache is not used: {exc}")
            return None
        if made is None:
            self.log("WARN", f"converting {source} to {weight_type} into the cache failed (a full disk?): converting on load")
            return None
        self.log("INFO", f"converted {source} to {weight_type} once, into the cache: {made}")
        return str(made)

    def _generate_image(self, req: GenerateRequest, seed: int, tiling: bool, tile: str, images_in: Dict[str, Any]) -> Any:
        return self.sd.generate_image(
            prompt=req.prompt, negative_prompt=req.negative_prompt, width=req.width, height=req.height,
            sample_steps=req.steps, cfg_scale=float(req.cfg_scale), sample_method=req.sampler,
            scheduler=req.scheduler, seed=seed, batch_count=req.batch_count, clip_skip=req.clip_skip,
            vae_tiling=tiling, vae_tile_size=tile, **images_in, **self._guidance(req),
        )

    def _decode_failed(self) -> bool:
        return any(DECODE_FAILED_MARK in line for _lvl, line in self.log_tail)

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
                method = self.bindings.stable_diffusion.SAMPLE_METHOD_MAP[sampler]
            if scheduler == "default":
                scheduler = lib.sd_scheduler_name(int(self.sd_cpp.sd_get_default_scheduler(model, method))).decode()
        except Exception:
            pass  # an older library: keep "default"
        return sampler, scheduler

    @staticmethod
    def _images(req: GenerateRequest) -> Dict[str, Any]:
        """The init and control images as the bindings take them (PIL images, Pillow being in the
        runtime), from the pixels the parent read and checked; no image: the bindings' defaults."""
        from PIL import Image

        out: Dict[str, Any] = {}
        if req.init_pixels:
            out["init_image"] = Image.frombytes("RGB", (req.width, req.height), read_pixels(req.init_pixels, req))
            out["strength"] = float(req.strength)
        if req.mask_pixels:  # white: redrawn (the bindings take it as one channel)
            out["mask_image"] = Image.frombytes("RGB", (req.width, req.height), read_pixels(req.mask_pixels, req))
        if req.ref_pixels:  # edits: FLUX.1 Kontext, Qwen-Image-Edit, FLUX.2 (checked by engine.request.images)
            out["ref_images"] = [Image.frombytes("RGB", (req.width, req.height), read_pixels(p, req)) for p in req.ref_pixels]
        if req.control_pixels:
            out["control_image"] = Image.frombytes("RGB", (req.width, req.height), read_pixels(req.control_pixels, req))
            out["control_strength"] = float(req.control_strength)
        return out

    @staticmethod
    def _guidance(req: GenerateRequest) -> Dict[str, Any]:
        """Distilled guidance and flow shift as resolved by the parent (engine.request.defaults): the family's or
        the user's; None: the bindings' own (guidance 3.5, flow shift inf: the runtime's choice for the model)."""
        return {name: float(getattr(req, name)) for name in ("guidance", "flow_shift") if getattr(req, name) is not None}

    def generate(self, req: GenerateRequest) -> Tuple[List[GeneratedImage], int, str, str]:
        seed = req.seed if req.seed >= 0 else random.randint(0, 2 ** 31 - 1)
        sampler, scheduler = self.resolve_defaults(req.sampler, req.scheduler)
        self.log_tail.clear()  # this job's log lines only (its timing, its errors)
        tile = f"{self.vae_tile_size}x{self.vae_tile_size}"
        # The folder the prompt's <lora:NAME:WEIGHT> tags resolve in: the parent's private staging
        # of the checked files (the bindings read it at each generate_image).
        self.sd.lora_model_dir = req.lora_dir
        images_in = self._images(req)
        self.notes = {}
        error: Optional[ValueError] = None
        try:
            images = self._generate_image(req, seed, self.vae_tiling, tile, images_in)
        except ValueError as exc:  # the bindings' validation (e.g. a sampler this runtime lacks), or a NULL result
            images, error = None, exc
        if not images and not self.vae_tiling and self._decode_failed():
            # The C API keeps no latent (generate_image frees it with its NULL): the same context samples it
            # again (same seed) and decodes it tiled, the tiling being read per call (issue 45).
            self.log("WARN", DECODE_RETRY)
            self.notes = {"decode_retry": DECODE_RETRY}
            try:
                images, error = self._generate_image(req, seed, True, tile, images_in), None
            except ValueError as exc:
                images, error = None, exc
        if error is not None and not self._decode_failed():
            raise GenerationError(f"the runtime rejected the request: {error}") from None
        self.library_seconds = self._logged_seconds()
        if not images or len(images) != req.batch_count:
            raise GenerationError(f"the runtime returned {plural(len(images or []), 'image')} for a batch of {req.batch_count}: "
                                  f"{self.load_reason() or 'no reason logged'}")
        out = []
        for i, img in enumerate(images):
            rgb = img.convert("RGB")
            out.append(GeneratedImage(width=rgb.width, height=rgb.height, seed=seed + i,
                                      pixels_b64=base64.b64encode(rgb.tobytes()).decode("ascii")))
        return out, seed, sampler, scheduler

