"""Install a torch runtime into a Python environment, check it there, and undo it if it fails.

The plan gives exact pip/uv commands (``{python}`` stands for the target interpreter). Before
running them, the distributions the plan will replace are moved aside (a rename within the same
site-packages, so it costs nothing for a multi-GB CUDA torch); if pip fails or the post-install
check fails, the new ones are uninstalled and the old ones moved back. The check runs in the
target interpreter and catches the "no kernel image" failure before generation time: the GPU's
architecture must be in ``torch.cuda.get_arch_list()``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from packaging.requirements import InvalidRequirement, Requirement

from ..errors import AccelstackError
from ..events import ProgressCallback, ProgressEvent, null_progress
from ..manifests.plan import PYTHON_PLACEHOLDER, Plan


class TorchInstallError(AccelstackError):
    """pip failed or the installed torch does not work; what was there before has been restored."""


_INSPECT = r"""
import json, sys
from importlib import metadata
names = set(json.loads(sys.argv[1]))
out = []
for dist in metadata.distributions():
    name = (dist.metadata["Name"] or "").lower().replace("_", "-")
    if name in names:
        files = [str(f) for f in (dist.files or [])]
        out.append({"name": name, "version": dist.version, "location": str(dist.locate_file("")), "files": files})
print(json.dumps({"python": sys.version.split()[0], "prefix": sys.prefix, "dists": out}))
"""

_CHECK = r"""
import json, sys
want = json.loads(sys.argv[1])
out = {"ok": False}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda or ""
    out["hip"] = getattr(torch.version, "hip", None) or ""
    backend = want.get("backend", "cpu")
    if backend in ("cuda", "rocm"):
        out["available"] = bool(torch.cuda.is_available())
        if out["available"]:
            out["device"] = torch.cuda.get_device_name(0)
            major, minor = torch.cuda.get_device_capability(0)
            out["arch_list"] = torch.cuda.get_arch_list()
            out["device_arch"] = f"sm_{major}{minor}" if backend == "cuda" else torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    elif backend == "xpu":
        out["available"] = bool(hasattr(torch, "xpu") and torch.xpu.is_available())
    elif backend == "mps":
        out["available"] = bool(torch.backends.mps.is_available())
    elif backend == "directml":
        import torch_directml
        out["available"] = torch_directml.device_count() > 0
    else:
        out["available"] = True
        x = torch.ones(4, 4) @ torch.ones(4, 4)
        out["matmul"] = float(x.sum())
    out["ok"] = True
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(out))
"""


@dataclass
class TorchCheck:
    ok: bool
    reason: str
    details: Dict[str, object] = field(default_factory=dict)


def _run_json(python: str, code: str, arg: object, timeout: float = 300) -> Dict[str, object]:
    res = subprocess.run([python, "-c", code, json.dumps(arg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    try:
        return json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise TorchInstallError(f"{python} could not run the check: {(res.stderr.strip().splitlines() or ['no output'])[-1]}") from None


def ensure_venv(venv: Path, base_python: str = sys.executable) -> str:
    """Create ``venv`` if it does not exist; return its interpreter."""
    py = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if not py.exists():
        res = subprocess.run([base_python, "-m", "venv", str(venv)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if res.returncode != 0:
            raise TorchInstallError(f"could not create the virtual environment {venv}: {res.stdout.strip()[-300:]}")
    return str(py)


def package_names(plan: Plan) -> List[str]:
    names = []
    for spec in plan.packages:
        try:
            names.append(Requirement(spec).name.lower().replace("_", "-"))
        except InvalidRequirement:
            continue
    return names


def check_torch(python: str, plan: Plan, report_gpus: Optional[List[Dict[str, str]]] = None) -> TorchCheck:
    """Post-install check in the target interpreter: import, build flavour, device, kernels."""
    info = _run_json(python, _CHECK, {"backend": plan.backend})
    if not info.get("ok"):
        return TorchCheck(False, f"torch does not import: {info.get('error', 'unknown error')}", info)
    want_version = plan.torch_version
    got = str(info.get("torch", ""))
    if want_version and not got.startswith(want_version):
        return TorchCheck(False, f"torch {got} is installed but the plan asked for {want_version}", info)
    if plan.backend == "cuda" and not info.get("cuda"):
        return TorchCheck(False, f"torch {got} is not a CUDA build (torch.version.cuda is empty)", info)
    if plan.backend == "rocm" and not info.get("hip"):
        return TorchCheck(False, f"torch {got} is not a ROCm build (torch.version.hip is empty)", info)
    if plan.backend in ("cuda", "rocm", "xpu", "mps", "directml") and not info.get("available"):
        return TorchCheck(False, f"torch {got} cannot use the {plan.backend} device here", info)
    arch = str(info.get("device_arch", ""))
    if arch and arch not in [str(a) for a in info.get("arch_list", [])]:  # type: ignore[union-attr]
        return TorchCheck(False, f"torch {got} has no kernels for {arch} (\"no kernel image is available\"); it was built for {info.get('arch_list')}", info)
    return TorchCheck(True, f"torch {got} works on {info.get('device', plan.backend)}", info)


class _Backup:
    """Moves installed distributions aside and back: the undo log of a torch install."""

    def __init__(self, python: str, names: List[str], where: Path) -> None:
        self.python = python
        self.names = names
        self.where = where
        self.moved: List[tuple] = []
        self.previous: Dict[str, str] = {}

    def stash(self) -> None:
        info = _run_json(self.python, _INSPECT, self.names)
        self.where.mkdir(parents=True, exist_ok=True)
        for dist in info.get("dists", []):  # type: ignore[union-attr]
            self.previous[dist["name"]] = dist["version"]
            location = Path(dist["location"])
            tops = sorted({Path(f).parts[0] for f in dist["files"] if not f.startswith("..") and Path(f).parts})
            for top in tops:
                src = location / top
                if src.exists() and not any(src == m[0] for m in self.moved):
                    dest = self.where / f"{len(self.moved)}-{top}"
                    os.replace(src, dest)
                    self.moved.append((src, dest))

    def restore(self) -> None:
        for src, dest in reversed(self.moved):
            if src.exists():
                shutil.rmtree(src) if src.is_dir() else src.unlink()
            os.replace(dest, src)
        self.moved.clear()

    def discard(self) -> None:
        shutil.rmtree(self.where, ignore_errors=True)
        self.moved.clear()


def install_torch(
    plan: Plan,
    python: str,
    *,
    use_uv: bool = False,
    progress: ProgressCallback = null_progress,
    checker=check_torch,
) -> TorchCheck:
    """Run the plan's commands against ``python``; keep the old torch if the new one fails."""
    if plan.stack != "torch" or not plan.ok or not plan.commands:
        raise TorchInstallError(f"the plan has nothing to install ({plan.summary})", hint="run `accelstack plan --stack torch` to see why")
    names = package_names(plan)
    info = _run_json(python, _INSPECT, names)
    backup_dir = Path(str(info.get("prefix", ""))) / ".accelstack-backup"
    backup = _Backup(python, names, backup_dir)
    backup.stash()
    try:
        for cmd in plan.commands:
            argv = [a.replace(PYTHON_PLACEHOLDER, python) for a in cmd.argv]
            if use_uv and cmd.tool == "pip" and shutil.which("uv"):
                argv = ["uv", "pip"] + argv[argv.index("pip") + 1:] + ["--python", python]
            progress(ProgressEvent("message", "install", task="torch", message="$ " + " ".join(argv)))
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert proc.stdout is not None
            tail: List[str] = []
            errors: List[str] = []
            for line in proc.stdout:
                tail = (tail + [line.rstrip()])[-12:]
                if line.startswith("ERROR:") and len(errors) < 3:
                    errors.append(line.strip())
                progress(ProgressEvent("message", "install", task="pip", message=line.rstrip()))
            if proc.wait() != 0:
                reason = errors[0] if errors else (tail[-1] if tail else "no output")
                raise TorchInstallError(f"pip failed: {reason}", hint="the previous torch (if any) has been restored; see the pip output above")
        result = checker(python, plan)
        if not result.ok:
            raise TorchInstallError(f"the installed torch does not work: {result.reason}", hint="the previous torch (if any) has been restored")
    except BaseException:
        subprocess.run([python, "-m", "pip", "uninstall", "-y", "-q", *names], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        backup.restore()
        backup.discard()
        raise
    backup.discard()
    result.details["previous"] = backup.previous
    return result
