"""Where the torch stack's runtimes are, as the engine runs them: an installed one is its
interpreter (the receipt's path), one named by hand a venv or a ``pip --target`` directory. Apart
from the driver, as :mod:`.ggml_runtime` is, so generating loads no install machinery."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, Optional

from ...engine.runtime import Runtime
from ...installer.records import Receipt

__all__ = ["TorchRuntimes", "LOCATOR"]


def _check_engine(python: str, env: Optional[Dict[str, str]] = None) -> None:
    """Names a missing torch (and the install that adds it), else missing engine packages and the
    pip command adding them, before a worker starts (imported here: the check reads the torch
    matrix, which only a torch runtime needs)."""
    from ...installer import torch_check

    torch_check.require_torch(python, env)
    torch_check.check_engine(python, env=env)


class TorchRuntimes:
    def engine_runtime(self, receipt: Receipt, path: Path) -> Runtime:
        _check_engine(str(path), dict(receipt.env))  # a missing diffusers is named with its pip command, not a failed worker start
        return Runtime(path=path.parent, backend="torch", env=dict(receipt.env), python=str(path))

    def runtime_from_dir(self, path: Optional[Path], backend: str) -> Runtime:
        """``--runtime DIR`` (a venv or a ``--target`` dir); without one, this interpreter: its torch
        and engine packages checked either way."""
        if path is None:
            _check_engine(sys.executable)
            return Runtime(path=Path(sys.prefix), backend="torch")
        runtime = Runtime.torch(path).check()
        _check_engine(runtime.python or sys.executable, None if runtime.python else {"PYTHONPATH": str(runtime.path)})
        return runtime


LOCATOR = TorchRuntimes()
