"""Publisher tooling: build ggml runtime variants from source and publish them as a signed manifest.

Used by release pipelines (``accelstack build ggml``, ``accelstack manifest build``) and, when no
published build fits a machine, by the core to build one locally. The installer never imports it.
"""
