"""Where the ggml stack's runtimes are, as the engine runs them: the active one from its receipt,
or one named by hand. Apart from the driver so that `accelstack generate` and `verify` load
neither the install, download nor build machinery (tests/engine/request/test_generate_imports.py)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ...engine.runtime import Runtime
from ...errors import UsageError

if TYPE_CHECKING:  # a runtime named by hand reads no receipt: the records' module is not loaded for it
    from ...installer.records import Receipt

__all__ = ["GgmlRuntimes", "LOCATOR"]


class GgmlRuntimes:
    def engine_runtime(self, receipt: Receipt, path: Path) -> Runtime:
        return Runtime(path=path, backend=receipt.backend, env=dict(receipt.env))

    def runtime_from_dir(self, path: Optional[Path], backend: str) -> Runtime:
        """``--runtime DIR`` (a directory the bindings import from) with ``--backend``."""
        if path is None:
            raise UsageError("a ggml runtime named by hand needs its directory (--runtime DIR)")
        return Runtime(path=path, backend=backend or "cpu").check()


LOCATOR = GgmlRuntimes()
