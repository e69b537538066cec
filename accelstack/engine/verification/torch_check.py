"""torch verify: a short, deterministic diffusion-like workload on the best device, checked on the CPU.

Runs as a script inside the *target* interpreter (the runtime's venv, where torch lives)::

    <python> /path/to/accelstack/engine/verification/torch_check.py [--probe DIR] [--device KIND]

and prints one JSON object. The script part imports only the standard library and torch (and,
when installed, diffusers/transformers/safetensors), so it runs in any interpreter that has
torch, with or without accelstack installed. The parent side,
:func:`accelstack.engine.verification.torch_verify.verify_torch`, starts the script with a timeout and
turns its JSON into a :class:`~accelstack.engine.report.VerifyReport`.

Device order: CUDA (also ROCm builds, which answer as ``torch.cuda``) > XPU > MPS > DirectML >
CPU. A device wins only if a small computation on it succeeds, so an installed
``torch-directml`` never wins over a working CUDA, and a CUDA that is "available" but broken
(no kernel image for this GPU) falls through to the next one with its error recorded.

The workload: conv2d, scaled-dot-product attention and group norm in float32, and a float16
matmul; each is computed on the device and on the CPU from the same seeded inputs and compared
as ``max|device - cpu| / max|cpu|`` against a tolerance, with the device time per call.
With ``--probe`` and diffusers importable, one 64x64 step of a Stable Diffusion pipeline runs on
the probe model, whose output must be finite and not constant.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

if __name__ == "__main__" and sys.path and \
        os.path.realpath(sys.path[0] or os.curdir) == os.path.dirname(os.path.realpath(__file__)):
    # Run as a script, Python put this folder first on sys.path: accelstack's modules here (kernels.py) would
    # shadow what torch and diffusers import (diffusers probes for Hugging Face's optional `kernels` package).
    del sys.path[0]

try:
    from ..probes.layout import probe_weights, split_parts
except ImportError:  # run as a script in the target interpreter: the probes' layout module, loaded by its file
    import importlib.util
    from pathlib import Path

    _spec = importlib.util.spec_from_file_location("_accelstack_probe_layout",
                                                   Path(__file__).resolve().parents[1] / "probes" / "layout.py")
    assert _spec is not None and _spec.loader is not None
    _layout = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_layout)
    probe_weights, split_parts = _layout.probe_weights, _layout.split_parts

__all__ = ["DEVICE_ORDER", "HALF_KINDS", "TOLERANCES", "RESULT_MARK", "pick_device", "workload", "build_probe_pipeline",
           "fixed_prompt_embeds", "diffusers_step", "run_check", "engine_modules", "EngineModules", "main"]

DEVICE_ORDER = ("cuda", "xpu", "mps", "directml", "cpu")
HALF_KINDS = ("cuda", "xpu", "mps")  # devices that compute the pipeline in float16
TOLERANCES = {"conv2d": 1e-2, "sdpa": 1e-2, "group_norm": 1e-2, "matmul_fp16": 2e-2}
RESULT_MARK = "ACCELSTACK_TORCH_CHECK "


def _candidates(torch: Any) -> List[Tuple[str, Any, str]]:
    """(kind, device, name) for each device kind this torch offers, in DEVICE_ORDER."""
    found: List[Tuple[str, Any, str]] = []
    errors: Dict[str, str] = {}
    for kind in DEVICE_ORDER:
        try:
            if kind == "cuda" and torch.cuda.is_available():
                name = torch.cuda.get_device_name(0)
                if getattr(torch.version, "hip", None):
                    name += " (ROCm)"
                found.append(("cuda", torch.device("cuda", 0), name))
            elif kind == "xpu" and hasattr(torch, "xpu") and torch.xpu.is_available():
                found.append(("xpu", torch.device("xpu", 0), torch.xpu.get_device_name(0)))
            elif kind == "mps" and getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
                found.append(("mps", torch.device("mps"), "Apple GPU (MPS)"))
            elif kind == "directml":
                try:
                    import torch_directml
                except ImportError:
                    continue
                found.append(("directml", torch_directml.device(), torch_directml.device_name(0)))
            elif kind == "cpu":
                found.append(("cpu", torch.device("cpu"), "CPU"))
        except Exception as exc:  # a broken backend reports, it does not stop the search
            errors[kind] = f"{type(exc).__name__}: {exc}"
    _candidates.errors = errors  # type: ignore[attr-defined]
    return found


def pick_device(torch: Any) -> Tuple[str, Any, str, Dict[str, str]]:
    """The first device in DEVICE_ORDER on which a tiny computation works, and why others lost."""
    rejected: Dict[str, str] = {}
    cands = _candidates(torch)
    rejected.update(getattr(_candidates, "errors", {}))
    for kind, device, name in cands:
        try:
            x = torch.ones(8, 8, device=device)
            value = float((x @ x).sum().cpu())
            if value != 512.0:
                raise RuntimeError(f"wrong result {value} for a known product")
            return kind, device, name, rejected
        except Exception as exc:
            rejected[kind] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    raise RuntimeError("no usable torch device, not even the CPU")


def _sync(torch: Any, kind: str) -> None:
    if kind == "cuda":
        torch.cuda.synchronize()
    elif kind == "xpu":
        torch.xpu.synchronize()
    elif kind == "mps":
        torch.mps.synchronize()


def _rel_err(torch: Any, got: Any, ref: Any) -> float:
    got = got.detach().float().cpu()
    ref = ref.detach().float().cpu()
    if not bool(torch.isfinite(got).all()):
        return float("inf")
    scale = float(ref.abs().max()) or 1.0
    return float((got - ref).abs().max()) / scale


def workload(torch: Any, device: Any, kind: str, repeats: int = 3) -> List[Dict[str, Any]]:
    """The four operations, each on ``device`` and on the CPU, compared and timed."""
    F = torch.nn.functional  # imported by ``import torch``
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(2, 64, 64, 64, generator=g)
    w = torch.randn(64, 64, 3, 3, generator=g) / 24.0
    q, k, v = (torch.randn(2, 8, 1024, 64, generator=g) for _ in range(3))
    gx = torch.randn(2, 128, 64, 64, generator=g) * 3 + 1
    gw, gb = torch.randn(128, generator=g), torch.randn(128, generator=g)
    a = (torch.randn(512, 512, generator=g) / 8).half()
    b = (torch.randn(512, 512, generator=g) / 8).half()
    ops = {
        "conv2d": (lambda t: F.conv2d(t[0], t[1], padding=1), (x, w), None),
        "sdpa": (lambda t: F.scaled_dot_product_attention(t[0], t[1], t[2]), (q, k, v), None),
        "group_norm": (lambda t: F.group_norm(t[0], 32, t[1], t[2]), (gx, gw, gb), None),
        "matmul_fp16": (lambda t: t[0] @ t[1], (a, b), lambda t: t[0].float() @ t[1].float()),
    }
    results = []
    for name, (fn, inputs, ref_fn) in ops.items():
        entry: Dict[str, Any] = {"name": name, "tolerance": TOLERANCES[name]}
        try:
            ref = (ref_fn or fn)(inputs)
            dev_inputs = tuple(t.to(device) for t in inputs)
            out = fn(dev_inputs)  # warm-up (kernel selection, compilation)
            _sync(torch, kind)
            t0 = time.perf_counter()
            for _ in range(repeats):
                out = fn(dev_inputs)
            _sync(torch, kind)
            entry["seconds"] = round((time.perf_counter() - t0) / repeats, 6)
            err = _rel_err(torch, out, ref)
            entry["error"] = err if err != float("inf") else None
            entry["ok"] = err <= TOLERANCES[name]
            if not entry["ok"]:
                entry["detail"] = "non-finite output" if err == float("inf") else f"relative error {err:.3g}"
        except Exception as exc:
            entry.update(ok=False, detail=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        results.append(entry)
    return results


SD1_UNET = dict(sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
                block_out_channels=(320, 640, 1280, 1280), cross_attention_dim=768, attention_head_dim=8,
                down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"))
SD1_VAE = dict(in_channels=3, out_channels=3, latent_channels=4, layers_per_block=2, sample_size=512,
               block_out_channels=(128, 256, 512, 512),
               down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4)


class EngineModules(NamedTuple):
    """What generating with torch imports next to it (the torch worker's engine packages)."""

    diffusers: Any
    transformers: Any
    load_file: Any  # safetensors.torch.load_file
    numpy: Any  # diffusers depends on it: its images are NumPy arrays


def engine_modules() -> EngineModules:
    """Import diffusers, transformers, safetensors and NumPy, which only this script and the torch
    worker use, in the runtime's interpreter (ImportError names the one missing)."""
    import diffusers
    import numpy
    import transformers
    from safetensors.torch import load_file  # type: ignore

    return EngineModules(diffusers, transformers, load_file, numpy)


def build_probe_pipeline(torch: Any, path: str, device: Any, dtype: Any) -> Any:
    """A ``StableDiffusionPipeline`` from the probe model (its folder or its ``probe.safetensors``:
    SD 1.x weights under the prefixes ``unet.``, ``vae.``, ``te.``, no configs, no tokenizer), on
    ``device`` in ``dtype``. Shared with the torch generation worker
    (:mod:`accelstack.engine.worker.torch_backend`)."""
    diffusers, transformers, load_file, _np = engine_modules()
    weights_file = probe_weights(path)
    if weights_file is None:
        raise RuntimeError(f"{path} is not a complete accelstack probe model (no probe.json and probe.safetensors)")
    parts: Dict[str, Any] = split_parts(load_file(weights_file))
    unet = diffusers.UNet2DConditionModel(**SD1_UNET)
    unet.load_state_dict(parts["unet"])
    vae = diffusers.AutoencoderKL(**SD1_VAE)
    vae.load_state_dict(parts["vae"])
    text = transformers.CLIPTextModel(transformers.CLIPTextConfig(
        vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
        num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu"))
    weights = parts["text_encoder"]
    if not any(k.startswith("text_model.") for k in text.state_dict()):  # transformers >= 5 drops the prefix
        weights = {k[len("text_model."):] if k.startswith("text_model.") else k: v for k, v in weights.items()}
    missing, unexpected = text.load_state_dict(weights, strict=False)
    missing = [m for m in missing if not m.endswith("position_ids")]
    if missing or unexpected:
        raise RuntimeError(f"text encoder keys do not match: missing {missing[:3]}, unexpected {unexpected[:3]}")
    scheduler = diffusers.EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                                 num_train_timesteps=1000)
    return diffusers.StableDiffusionPipeline(vae=vae, text_encoder=text, tokenizer=None, unet=unet,
                                             scheduler=scheduler, safety_checker=None, feature_extractor=None,
                                             requires_safety_checker=False).to(device, dtype)


def fixed_prompt_embeds(torch: Any, text_encoder: Any, device: Any, dtype: Any) -> Any:
    """Prompt embeddings without a tokenizer: fixed token ids (start, then end tokens) through
    the text encoder."""
    ids = torch.tensor([[49406] + [49407] * 76], device=device)
    return text_encoder(ids)[0].to(dtype)


def diffusers_step(torch: Any, device: Any, kind: str, probe: str) -> Dict[str, Any]:
    """One 64x64 step of a StableDiffusionPipeline on the probe model (no tokenizer needed:
    the prompt is given as fixed token ids run through the text encoder)."""
    try:
        np = engine_modules().numpy
    except ImportError as exc:
        return {"ran": False, "ok": True, "detail": f"skipped: {exc.name or exc} is not installed"}

    t0 = time.perf_counter()
    try:
        dtype = torch.float16 if kind in HALF_KINDS else torch.float32
        pipe = build_probe_pipeline(torch, probe, device, dtype)
        text = pipe.text_encoder
        load_seconds = time.perf_counter() - t0
        with torch.no_grad():
            embeds = fixed_prompt_embeds(torch, text, device, dtype)
            t1 = time.perf_counter()
            image = pipe(prompt_embeds=embeds, negative_prompt_embeds=torch.zeros_like(embeds), height=64, width=64,
                         num_inference_steps=1, guidance_scale=7.0, output_type="np",
                         generator=torch.Generator("cpu").manual_seed(42)).images[0]
        finite = bool(np.isfinite(image).all())
        spread = float(np.nanmax(image) - np.nanmin(image)) if finite else 0.0
        ok = finite and spread > 0
        return {"ran": True, "ok": ok, "shape": list(image.shape), "finite": finite, "spread": round(spread, 5),
                "load_seconds": round(load_seconds, 3), "step_seconds": round(time.perf_counter() - t1, 3),
                "detail": "" if ok else ("non-finite pixels" if not finite else "constant image")}
    except Exception as exc:
        return {"ran": True, "ok": False, "detail": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}


def run_check(probe: Optional[str] = None, device_kind: Optional[str] = None) -> Dict[str, Any]:
    start = time.perf_counter()
    try:
        import torch
    except ImportError as exc:
        return {"ok": False, "reason": f"torch cannot be imported: {exc}", "torch_version": ""}
    out: Dict[str, Any] = {"torch_version": torch.__version__, "cuda_version": getattr(torch.version, "cuda", None),
                           "hip_version": getattr(torch.version, "hip", None)}
    try:
        if device_kind:
            cands = {k: (d, n) for k, d, n in _candidates(torch)}
            if device_kind not in cands:
                return {**out, "ok": False, "reason": f"device {device_kind} is not available to this torch"}
            device, name = cands[device_kind]
            kind, rejected = device_kind, {}  # type: Tuple[str, Dict[str, str]]
        else:
            kind, device, name, rejected = pick_device(torch)
    except Exception as exc:
        return {**out, "ok": False, "reason": str(exc)}
    out.update(device_kind=kind, device_name=name, rejected=rejected)
    ops = workload(torch, device, kind)
    out["ops"] = ops
    bad = [f"{o['name']}: {o.get('detail', 'failed')}" for o in ops if not o.get("ok")]
    if probe:
        out["diffusers"] = step = diffusers_step(torch, device, kind, probe)
        if not step.get("ok"):
            bad.append(f"diffusers step: {step.get('detail')}")
    out["ok"] = not bad
    out["reason"] = "; ".join(bad)
    out["seconds"] = round(time.perf_counter() - start, 3)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="accelstack torch check (runs inside the target interpreter)")
    ap.add_argument("--probe", default=None, help="probe model folder for the diffusers step")
    ap.add_argument("--device", default=None, choices=DEVICE_ORDER, help="force a device kind")
    args = ap.parse_args(argv)
    result = run_check(args.probe, args.device)
    sys.stdout.write(RESULT_MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
