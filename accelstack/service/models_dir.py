"""The service's models directory: what a generate job may name, and only that.

A job names a model, a component, an image or a folder by its place in the directory, never by a path
of the machine: ``sd15.safetensors``, or ``unet/flux1-dev.gguf`` in a ComfyUI-style tree (``unet/``,
``diffusion_models/``, ``checkpoints/``, ``vae/``, ``clip/``, ``text_encoders/``, ``loras/`` …).
No escape: a name is '/'-separated parts, none empty, hidden, ``.`` or ``..``, with no backslash and
no drive; every folder it passes through is a real folder of the tree, never a link (a link to a
folder elsewhere would take the name out of the directory). The entry it names may be a link the
owner put there (``probe -> ~/models/probe``), as at the top; a folder named as a folder (``lora_dir``)
is a real folder too. A refusal lists what fits the field: model files for a model, images for an
image, folders for a folder — never a folder or a PNG as a model.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Literal

__all__ = ["IMAGE_SUFFIXES", "MAX_DEPTH", "MODEL_SUFFIXES", "ModelsDir", "NameRefused", "What"]

What = Literal["model", "image", "folder"]
#: Weights files the engines load (sd.cpp: safetensors, gguf, ckpt/pt/pth/bin; Flux's .sft).
MODEL_SUFFIXES = (".safetensors", ".gguf", ".ckpt", ".pt", ".pth", ".bin", ".sft")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
MAX_DEPTH = 4  # folders below the directory a name may pass through (ComfyUI's trees are 1-2 deep)
MAX_LISTED = 40  # names a refusal lists; "… and N more" after them
_WORDS = {"model": "model", "image": "image", "folder": "folder"}


class NameRefused(Exception):
    """A name that is not one of the directory's (``choices``: what fits the field, for the hint)."""

    def __init__(self, message: str, choices: List[str]) -> None:
        super().__init__(message)
        self.message = message
        self.choices = choices

    @property
    def hint(self) -> str:
        shown = self.choices[:MAX_LISTED]
        more = f" … and {len(self.choices) - MAX_LISTED} more" if len(self.choices) > MAX_LISTED else ""
        return f"choose one of: {', '.join(shown) or '(none)'}{more}"


class ModelsDir:
    """One models directory (``root``), read on each request: files added while the service runs count."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def resolve(self, name: str, what: What) -> Path:
        """The entry ``name`` names, or :class:`NameRefused` (with the choices for ``what``)."""
        parts = name.split("/")
        bad = (not name or "\\" in name or ":" in name or "\x00" in name
               or any(p in ("", ".", "..") or p.startswith(".") for p in parts) or len(parts) > MAX_DEPTH + 1)
        where = self.root
        if not bad:
            for part in parts[:-1]:
                where = where / part
                if where.is_symlink() or not where.is_dir():
                    bad = True
                    break
        target = where / parts[-1]
        if not bad:
            if what == "folder":
                bad = target.is_symlink() or not target.is_dir()
            else:
                bad = not target.exists()
        if bad:
            raise NameRefused(f"there is no {_WORDS[what]} {name!r} in the service's models directory", self.choices(what))
        return target

    def choices(self, what: What) -> List[str]:
        """The names that fit ``what``, sorted: model files (and model folders: a link the owner put
        there, or a diffusers folder with model_index.json), images, or real folders."""
        found: List[str] = []
        for top, dirs, files in os.walk(self.root, followlinks=False):
            rel = Path(top).relative_to(self.root)
            depth = len(rel.parts)
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for d in list(dirs):
                path = Path(top, d)
                name = (rel / d).as_posix()
                linked = path.is_symlink()
                if what == "folder" and not linked:
                    found.append(name)
                elif what == "model" and (linked or (path / "model_index.json").is_file()):
                    found.append(name)
                if linked or depth >= MAX_DEPTH or (what == "model" and (path / "model_index.json").is_file()):
                    dirs.remove(d)  # never through a link; a diffusers folder is one model
            if what == "folder":
                continue
            suffixes = MODEL_SUFFIXES if what == "model" else IMAGE_SUFFIXES
            found.extend((rel / f).as_posix() for f in files if not f.startswith(".") and f.lower().endswith(suffixes))
        return sorted(found)
