"""The library core: the whole pipeline, for both stacks, as a handful of functions an app embeds.

    import accelstack
    report  = accelstack.detect()
    plan    = accelstack.plan(report, stack="ggml")          # or stack="torch", requirements=[...]
    summary = accelstack.install(plan, on_progress=callback)  # stage -> engine verify -> switch
    result  = accelstack.verify(summary.receipt)              # VerifyReport; result.ok

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
    "plan_sources": ".planning", "NO_CHANNEL_LINE": ".planning", "check_trusted_keys": ".keys",
    "install": ".installing", "InstallSummary": ".results", "InstallOptions": ".options", "Services": ".options",
    "Fetcher": ".options", "NetworkFetcher": ".options",
    "upgrade": ".maintenance", "repair": ".maintenance", "rollback": ".maintenance", "uninstall": ".maintenance",
    "uninstall_preview": ".maintenance", "cache_usage": ".maintenance", "gc": ".maintenance", "status": ".maintenance",
    "driver": ".stacks", "stack_names": ".stacks", "locator_for_backend": ".stacks", "stack_for_backend": ".stacks",
    "stack_info": ".stacks", "default_stack": ".stacks",
    "active_receipt": ".running", "installed_runtime": ".running", "verify": ".running", "generate": ".running",
    "default_verifier": ".verifiers", "import_verifier": ".verifiers",
    "inspect_model": ".models", "inspect_models": ".models", "ModelInspection": ".models",
    # what the CLI and the service use on one path only, loaded when that path runs
    "NoRuntimeError": ".running", "install_bundle": ".bundles", "create_bundle": ".bundles",
    "check_bundle_output": ".bundles",
    "report_for": ".reports", "saved_report": ".reports", "GenerateRequest": ".direct",
    "manifest_for_builds": ".building", "write_manifest_dir": ".building",
    "node_labels": ".fleet", "node_metrics": ".fleet", "installed_runtimes": ".fleet",
    "LiveSystem": "..hardware.system", "ReplaySystem": "..hardware.system", "CapturingSystem": "..hardware.system",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS, globals())
