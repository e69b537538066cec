"""Model files, known before loading: the core's door to :mod:`accelstack.engine.models.inspection`.

An app asks ``inspect_model(path)`` before it offers a model, so a user hears "this is FLUX.1
[dev]; it still needs ae.safetensors, clip_l.safetensors and t5xxl_fp16.safetensors" instead of a
load that fails after minutes. Reads headers only: no runtime, no GPU, no download.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, List, Union

from ..engine.models.inspection import Companion, ModelInspection, ModelPart, WeightType
from ..engine.models.inspection import inspect_model as _inspect_one

__all__ = ["inspect_model", "inspect_models", "ModelInspection", "ModelPart", "Companion", "WeightType"]


def inspect_model(path: Union[str, Path]) -> ModelInspection:
    """What the model file (or diffusers folder) at ``path`` is: family, size, weight types, the
    parts it holds and the companions it still needs. Raises ``ModelLoadError`` (with the reason)
    for a file that cannot be read as a model."""
    return _inspect_one(path)


def inspect_models(paths: Iterable[Union[str, Path]]) -> List[ModelInspection]:
    """:func:`inspect_model` for each path, in order; the first unreadable one raises."""
    return [_inspect_one(p) for p in paths]
