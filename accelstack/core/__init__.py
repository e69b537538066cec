"""The library core: the whole pipeline, for both stacks, as a handful of functions an app embeds.

    import accelstack
    report  = accelstack.detect()
    plan    = accelstack.plan(report, stack="ggml")          # or stack="torch", requirements=[...]
    receipt = accelstack.install(plan, on_progress=callback)  # stage -> engine verify -> switch
    result  = accelstack.verify(receipt)                      # VerifyReport; result.ok

Every function takes ``settings`` (default: ``Settings.resolve()``, from ``ACCELSTACK_*``
variables and the platform's directories) and reports long work through ``on_progress``.
The CLI and the service are skins over these functions. Names load on first use, so reading a
plan or detecting does not import the download or install machinery.
"""
from __future__ import annotations

from ..lazy import lazy_exports

_EXPORTS = {
    "detect": ".detection",
    "plan": ".planning", "hardware_fingerprint": ".planning", "load_manifests": ".planning",
    "InstallSummary": ".lifecycle", "install": ".lifecycle", "install_runtime": ".lifecycle", "plan_and_install": ".lifecycle", "upgrade": ".lifecycle",
    "repair": ".lifecycle", "rollback": ".lifecycle", "uninstall": ".lifecycle", "gc": ".lifecycle", "status": ".lifecycle",
    "active_receipt": ".running", "verify": ".running", "generate": ".running",
    "default_verifier": ".verifiers", "import_verifier": ".verifiers",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
