"""Publisher tooling: build ggml runtime variants from source and publish them as a signed manifest.

Used by release pipelines (``accelstack build ggml``, ``accelstack manifest build``) and, when no
published build fits a machine, by the core to build one locally. The installer never imports it.

Import from the modules: :mod:`.build` runs a build, :mod:`.build_cache` keeps its results,
:mod:`.wheel_repack` packages them, :mod:`.cuda_toolchain` and :mod:`.cuda_isolation` make and fence
a CUDA compiler, :mod:`.pypi_index` reads where a package index publishes a file, :mod:`.variants`
names the backend variants, :mod:`.sdist` fetches the source and :mod:`.publish` writes the manifest.
"""
from __future__ import annotations

__all__: list = []  # nothing re-exported: each module is imported by its own name
