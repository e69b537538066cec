"""The folder to put on ``PYTHONPATH`` so that ``import torchruntime`` and ``python -m torchruntime`` are accelstack's.

Its only content is a ``torchruntime`` package whose import registers ``accelstack.compat.torchruntime``
under that name. A folder on ``PYTHONPATH`` comes before site-packages, so an app (and every
subprocess it starts, which inherits the variable) gets accelstack's answers with no change to its
code: ``PYTHONPATH="$(python -m accelstack.compat.torchruntime shim)" python app.py``.
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["SHIM_DIR"]

SHIM_DIR = str(Path(__file__).resolve().parent)
