"""Where a generation's images go: their file names, and the checks that refuse, before any work, a
path they could not be written to. Kept light (no model checks, no planner): the CLI runs it before
it starts the worker."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Union

from ... import fsio
from ..errors import GenerationError, OutputPathError

__all__ = ["output_paths", "check_outputs", "check_not_inputs", "output_error", "INPUT_FIELDS", "NAME_MAX"]


def output_paths(output: Union[str, Path], count: int) -> List[Path]:
    """``count`` file names from ``output``: itself for one image; ``%d`` or ``{n}`` in it is
    replaced by 1..count; otherwise ``name-1.png``, ``name-2.png``... A name that is not a .png is
    an :class:`OutputPathError` (a usage error, as every unusable output path is)."""
    text = str(output)
    if not text:
        raise OutputPathError("the output path is empty", hint="name the output something.png")
    if "%d" in text or "{n}" in text:
        paths = [Path(text.replace("%d", str(i)).replace("{n}", str(i))) for i in range(1, count + 1)]
    else:
        p = Path(text)
        paths = [p] if count == 1 else [p.with_name(f"{p.stem}-{i}{p.suffix}") for i in range(1, count + 1)]
    for path in paths:
        if path.suffix.lower() != ".png":
            if os.path.isdir(text):
                raise output_error(Path(text), "it is an existing folder", f"name a file, such as {Path(text) / 'image.png'}")
            raise OutputPathError(f"output {path} must be a .png file", hint="name the output something.png")
    return paths


NAME_MAX = 255  # bytes of one path component on the usual file systems (ext4, APFS, NTFS in UTF-16 units)


def output_error(path: Path, reason: str, hint: str) -> GenerationError:
    return OutputPathError(f"cannot write the image to {path}: {reason}", hint=hint)


def check_outputs(paths: List[Path]) -> List[Path]:
    """Refuse, before any work, output paths the images could not be written to: an existing
    folder or non-regular file (a FIFO would block the write), a path under a file, a name too long,
    a folder that cannot be created or written. Missing parent folders are created when writing,
    so the nearest existing ancestor must be a writable folder. Nothing is created here."""
    for path in paths:
        text = str(path)
        if "\x00" in text:
            raise output_error(Path(text.replace("\x00", "?")), "the path contains a NUL character",
                               "choose another output path")
        for part in path.parts:
            if len(os.fsencode(part)) > NAME_MAX:
                raise output_error(path, f"a name in it is longer than {NAME_MAX} bytes", "use a shorter file name")
        problem = fsio.output_problem(path)
        if problem is not None:
            reason, hint = problem
            if reason == "it is an existing folder":
                hint = f"name a file, such as {path / 'image.png'}"
            raise output_error(path, reason, hint)
    return paths


# a request's files: an output path that is one of them would overwrite it with the result
INPUT_FIELDS = ("init_image", "control_image", "mask_image", "diffusion_model", "vae", "clip_l", "clip_g", "t5xxl", "llm", "taesd",
                "control_net")


def check_not_inputs(paths: List[Path], request: Any, model: Union[str, Path, None] = None) -> List[Path]:
    """Refuse, before any work, an output path that is one of the run's input files (``-o`` naming the
    ``--init-image``): the result would replace the user's picture. Compared as the same file where
    both exist, else by their absolute, normalized paths."""
    given = [("--model", str(model))] if model else []
    given += [(f"--{name.replace('_', '-')}", getattr(request, name, "") or "") for name in INPUT_FIELDS]
    given += [("--ref-image", path) for path in getattr(request, "ref_images", None) or []]
    for path in paths:
        for flag, source in given:
            if source and _same(path, source):
                raise output_error(path, f"it is the {flag} of this run, which the image would overwrite",
                                   "write the result to another file")
    return paths


def _same(a: Union[str, Path], b: Union[str, Path]) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return os.path.normpath(os.path.abspath(a)) == os.path.normpath(os.path.abspath(b))
