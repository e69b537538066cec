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

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:  # the lazy names below, for type checkers: at run time each loads on first use
    from ..hardware.system import CapturingSystem as CapturingSystem
    from ..hardware.system import LiveSystem as LiveSystem
    from ..hardware.system import ReplaySystem as ReplaySystem
    from .building import manifest_for_builds as manifest_for_builds
    from .building import write_manifest_dir as write_manifest_dir
    from .bundles import check_bundle_output as check_bundle_output
    from .bundles import create_bundle as create_bundle
    from .bundles import install_bundle as install_bundle
    from .detection import detect as detect
    from .direct import GenerateRequest as GenerateRequest
    from .fleet import installed_runtimes as installed_runtimes
    from .fleet import node_labels as node_labels
    from .fleet import node_metrics as node_metrics
    from .installing import install as install
    from .keys import check_trusted_keys as check_trusted_keys
    from .maintenance import cache_usage as cache_usage
    from .maintenance import gc as gc
    from .maintenance import repair as repair
    from .maintenance import rollback as rollback
    from .maintenance import uninstall as uninstall
    from .maintenance import uninstall_preview as uninstall_preview
    from .maintenance import upgrade as upgrade
    from .models import ModelInspection as ModelInspection
    from .models import inspect_model as inspect_model
    from .models import inspect_models as inspect_models
    from .options import Fetcher as Fetcher
    from .options import InstallOptions as InstallOptions
    from .options import NetworkFetcher as NetworkFetcher
    from .options import Services as Services
    from .planning import NO_CHANNEL_LINE as NO_CHANNEL_LINE
    from .planning import hardware_fingerprint as hardware_fingerprint
    from .planning import load_manifests as load_manifests
    from .planning import plan as plan
    from .planning import plan_sources as plan_sources
    from .reports import report_for as report_for
    from .reports import saved_report as saved_report
    from .results import InstallSummary as InstallSummary
    from .running import NoRuntimeError as NoRuntimeError
    from .running import active_receipt as active_receipt
    from .running import generate as generate
    from .running import installed_runtime as installed_runtime
    from .running import verify as verify
    from .session import GenerationSession as GenerationSession
    from .session import open_session as open_session
    from .stacks import default_stack as default_stack
    from .stacks import driver as driver
    from .stacks import locator_for_backend as locator_for_backend
    from .stacks import stack_for_backend as stack_for_backend
    from .stacks import stack_info as stack_info
    from .stacks import stack_names as stack_names
    from .status_check import status as status
    from .verifiers import default_verifier as default_verifier
    from .verifiers import import_verifier as import_verifier


_EXPORTS = {
    "detect": ".detection",
    "plan": ".planning", "hardware_fingerprint": ".planning", "load_manifests": ".planning",
    "plan_sources": ".planning", "NO_CHANNEL_LINE": ".planning", "check_trusted_keys": ".keys",
    "install": ".installing", "InstallSummary": ".results", "InstallOptions": ".options", "Services": ".options",
    "Fetcher": ".options", "NetworkFetcher": ".options",
    "upgrade": ".maintenance", "repair": ".maintenance", "rollback": ".maintenance", "uninstall": ".maintenance",
    "uninstall_preview": ".maintenance", "cache_usage": ".maintenance", "gc": ".maintenance", "status": ".status_check",
    "driver": ".stacks", "stack_names": ".stacks", "locator_for_backend": ".stacks", "stack_for_backend": ".stacks",
    "stack_info": ".stacks", "default_stack": ".stacks",
    "active_receipt": ".running", "installed_runtime": ".running", "verify": ".running", "generate": ".running",
    "open_session": ".session", "GenerationSession": ".session",
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


if not TYPE_CHECKING:  # a type checker sees the names above, and no others
    __getattr__ = lazy_exports(__name__, _EXPORTS, globals())
