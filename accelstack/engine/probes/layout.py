"""Where the probe model's weights are inside its folder (standard library only: the worker uses it).

A probe folder holds one safetensors file, ``probe.safetensors``, and the marker ``probe.json``
(written last: the folder is complete). The file holds the three parts of SD 1.x under the
prefixes stable-diffusion.cpp itself gives a diffusers folder's files as it reads them
(``unet.``, ``vae.``, ``te.``: ``ModelLoader::init_from_diffusers_file`` in its ``model.cpp``), so
it loads the same tensors, converted by the same rules, as the diffusers layout would; one file
instead of three because stable-diffusion.cpp's loader waits on a 200 ms tick per file it reads
(``load_tensors``), which cost 0.2 s of every verify here (1.61 s load with three files, 1.41 s
with one, same bytes).
"""
from __future__ import annotations

import os
from typing import Dict, Optional

__all__ = ["MARKER", "WEIGHTS", "GGUF_WEIGHTS", "PREFIXES", "probe_weights", "split_parts"]

MARKER = "probe.json"
WEIGHTS = "probe.safetensors"
GGUF_WEIGHTS = "probe.gguf"  # a family probe whose matrices are block-quantized (engine.probes.gguf)
PREFIXES: Dict[str, str] = {"unet": "unet.", "vae": "vae.", "text_encoder": "te."}


def probe_weights(path: str) -> Optional[str]:
    """The weights file of the probe at ``path`` (its folder or the file itself), or None when
    ``path`` is not a complete probe."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    names = (WEIGHTS, GGUF_WEIGHTS) if os.path.isdir(path) else (os.path.basename(path),)
    if not set(names) <= {WEIGHTS, GGUF_WEIGHTS} or not os.path.isfile(os.path.join(folder, MARKER)):
        return None
    return next((w for w in (os.path.join(folder, n) for n in names) if os.path.isfile(w)), None)


def split_parts(tensors: Dict[str, object]) -> Dict[str, Dict[str, object]]:
    """``{part: {name without its prefix: value}}`` of a probe file's tensors (for diffusers)."""
    parts: Dict[str, Dict[str, object]] = {part: {} for part in PREFIXES}
    for name, value in tensors.items():
        for part, prefix in PREFIXES.items():
            if name.startswith(prefix):
                parts[part][name[len(prefix):]] = value
                break
    return parts
