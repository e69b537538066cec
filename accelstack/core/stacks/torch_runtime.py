"""Where the torch stack's runtimes are, as the engine runs them: an installed one is its
interpreter (the receipt's path), one named by hand a venv or a ``pip --target`` directory. Apart
from the driver, as :mod:`.ggml_runtime` is, so generating loads no install machinery."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from ...engine.runtime import Runtime
from ...installer.records import Receipt

__all__ = ["TorchRuntimes", "LOCATOR"]


def _check_engine(python: str) -> None:
    """Names missing engine packages and the pip command adding them, before a worker starts
    (imported here: the check reads the torch matrix, which only a torch runtime needs)."""
    from ...installer.torch_check import check_engine

    check_engine(python)


class TorchRuntimes:
    def engine_runtime(self, receipt: Receipt, path: Path) -> Runtime:
        _check_engine(str(path))  # a missing diffusers is named with its pip command, not a failed worker start
        return Runtime(path=path.parent, backend="torch", env=dict(receipt.env), python=str(path))

    def runtime_from_dir(self, path: Optional[Path], backend: str) -> Runtime:
        """``--runtime DIR`` (a venv or a ``--target`` dir; its engine packages checked); without
        one, this interpreter."""
        if path is None:
            return Runtime(path=Path(sys.prefix), backend="torch")
        runtime = Runtime.torch(path).check()
        if runtime.python:
            _check_engine(runtime.python)
        return runtime


LOCATOR = TorchRuntimes()
