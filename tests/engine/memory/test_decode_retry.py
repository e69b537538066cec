"""A VAE decode that runs out of memory is retried tiled in the same worker (issue 45).

stable-diffusion.cpp's C API (include/stable-diffusion.h) has no call that returns the sampled latent or decodes one:
``generate_image`` samples into a local ``final_latents`` and decodes it (``decode_image_outputs``, src/stable-diffusion.cpp);
when the decode's compute buffer cannot be allocated it logs "decode_first_stage failed for latent N" and returns
NULL, freeing the latent with it. What the same context can do is run ``generate_image`` again with VAE tiling on
(the tiling is read per call: ``sd_ctx->sd->vae_tiling_params = sd_img_gen_params->vae_tiling_params``): the
same seed samples the same latent again, then a tiled decode needs one tile's memory. The retry re-samples, and
the result says so. The bindings turn the NULL into a ValueError (``_image_slice`` on a NULL pointer)."""
from __future__ import annotations

import io
import types

import pytest
from PIL import Image

from accelstack.engine.config import EngineOptions
from accelstack.engine.errors import GenerationError
from accelstack.engine.worker.ggml_backend import DECODE_RETRY, GgmlBackend
from accelstack.engine.worker.protocol import GenerateRequest


def _backend(tmp_path, fails_untiled: bool, fails_tiled: bool = False):
    calls = []
    backend = GgmlBackend(io.StringIO())

    class SD:  # the bindings' StableDiffusion, with a decode budget only a tile fits
        def __init__(self, **kw):
            self._model = types.SimpleNamespace(model=object())

        def generate_image(self, **kw):
            calls.append(kw)
            backend.log("INFO", "sampling completed")
            if (fails_tiled if kw["vae_tiling"] else fails_untiled):
                backend.log("ERROR", "decode_first_stage failed for latent 1")
                raise ValueError("NULL pointer access")  # the bindings' _image_slice on the NULL result
            return [Image.new("RGB", (kw["width"], kw["height"]), (200, 10, 10))]

    backend.bindings = types.SimpleNamespace(StableDiffusion=SD)
    backend.sd_cpp = types.SimpleNamespace(sd_get_num_physical_cores=lambda: 2, sd_embedding_t=None)
    backend.resolve_defaults = lambda sampler, scheduler: ("euler", "discrete")  # type: ignore[method-assign]
    model = tmp_path / "m.safetensors"
    model.write_bytes(b"x")
    backend.load(str(model), EngineOptions(vae_tiling=False).concrete())
    return backend, calls


def test_an_untiled_decode_out_of_memory_is_retried_tiled_with_the_same_seed(tmp_path):
    backend, calls = _backend(tmp_path, fails_untiled=True)
    images, seed, _s, _c = backend.generate(GenerateRequest(prompt="a red cube", width=64, height=64, steps=1, seed=7))
    assert len(images) == 1 and seed == 7
    assert [c["vae_tiling"] for c in calls] == [False, True] and calls[1]["seed"] == 7
    assert backend.notes == {"decode_retry": DECODE_RETRY}  # the result says the image was sampled again
    assert "re-sampled" in DECODE_RETRY and "tiled" in DECODE_RETRY


def test_a_decode_that_fits_is_not_retried_and_a_tiled_failure_is_an_error(tmp_path):
    backend, calls = _backend(tmp_path, fails_untiled=False)
    backend.generate(GenerateRequest(prompt="a red cube", width=64, height=64, steps=1, seed=7))
    assert len(calls) == 1 and backend.notes == {}
    backend, calls = _backend(tmp_path, fails_untiled=True, fails_tiled=True)
    with pytest.raises(GenerationError, match="decode_first_stage failed"):
        backend.generate(GenerateRequest(prompt="a red cube", width=64, height=64, steps=1, seed=7))
    assert [c["vae_tiling"] for c in calls] == [False, True]  # one retry, never a loop


def test_the_workers_result_carries_the_retry(tmp_path):
    """The worker's job result (GenerateResult.extra) names the retry (engine.generation adds it to the warnings)."""
    from accelstack.engine.worker.state import WorkerState

    backend, _calls = _backend(tmp_path, fails_untiled=True)
    state = WorkerState(backend, "token")
    state.run_job("job-1", GenerateRequest(prompt="a red cube", width=64, height=64, steps=1, seed=7))
    outcome = state.results["job-1"]
    assert outcome["result"]["extra"]["decode_retry"] == DECODE_RETRY and len(outcome["result"]["images"]) == 1
