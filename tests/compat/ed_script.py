"""Written only against torchruntime's API, the way Easy Diffusion calls it (scripts/check_modules.py,
ui/easydiffusion/backends/sdkit3.py and webui.py). The test runs it with its first import line
swapped for accelstack's; nothing else changes. It prints one JSON line of what it saw.

argv: the package list to install (Easy Diffusion's ["torch", "torchvision"], with pins).
"""
import json
import os
import sys

import torchruntime  # the one line an app changes (and its submodule imports follow)


def get_platform_name():  # sdkit3.py
    gpus = torchruntime.device_db.get_gpus()
    torch_platform = torchruntime.platform_detection.get_torch_platform(gpus)
    if torch_platform == "cpu":
        return "cpu"
    if torch_platform.startswith("cu"):
        return "cuda"
    return "vulkan"


before = dict(os.environ)
torchruntime.install(["--upgrade"] + sys.argv[1:])  # check_modules.update_modules()
torchruntime.configure()  # check_modules, before starting the server
torchruntime.info()

import torch  # noqa: E402
from torchruntime.utils import get_device, get_device_name, get_installed_torch_platform  # noqa: E402  webui.py

platform_name, _ = get_installed_torch_platform()
device = get_device(0)
print(json.dumps({
    "platform": get_platform_name(),
    "installed_platform": platform_name,
    "device": str(device),
    "device_name": get_device_name(device),
    "torch": torch.__version__,
    "torch_file": torch.__file__,
    "ones": float(torch.ones(3, device=device).sum()),
    "env_set": sorted(k for k in os.environ if os.environ[k] != before.get(k)),
    "real_torchruntime_loaded": any(m == "torchruntime" or m.startswith("torchruntime.") for m in sys.modules
                                    if getattr(sys.modules[m], "__file__", "") and "accelstack" not in sys.modules[m].__file__),
}))
