"""Small programs run inside the *target* interpreter (which may lack accelstack): what torch
distributions it has, and the cheap post-install check of its torch build."""
from __future__ import annotations

__all__ = ["INSPECT_SCRIPT", "CHECK_SCRIPT", "ENGINE_SCRIPT"]

INSPECT_SCRIPT = r"""
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

CHECK_SCRIPT = r"""
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
engine = {}
for module in want.get("engine", []) if out["ok"] else []:
    try:
        __import__(module)
    except Exception as exc:
        engine[module] = f"{type(exc).__name__}: {exc}"
out["engine_errors"] = engine
print(json.dumps(out))
"""

# which of the torch engine's modules (JSON list) cannot be found: no import, so it answers in a blink
ENGINE_SCRIPT = r"""
import importlib.util, json, sys
missing = [m for m in json.loads(sys.argv[1]) if importlib.util.find_spec(m) is None]
print(json.dumps({"missing": missing, "python": sys.executable}))
"""


