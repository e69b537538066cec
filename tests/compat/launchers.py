"""Launcher code written only against torchruntime's API, the way real launchers call it.

- ``ed_device_picker``: Easy Diffusion (ui/easydiffusion/backends/sdkit3.py, scripts/check_modules.py):
  the platform of the GPUs found, its backend family, and the first discrete NVIDIA GPU's architecture
  as ``int(arch * 10)``.
- ``fooocus_dependency_resolver``: the FooocusPlus forks' launch_support.dependency_resolver(): imports
  ``get_torch_platform, get_nvidia_arch`` from ``torchruntime.platform_detection`` and picks torch
  versions from the platform and the architecture of the set of device names.
- ``fooocus_install_torch``: FooocusPlus's launch.prepare_environment(): the installer builders
  (``get_install_commands``, ``get_pip_commands``, ``run_commands``) with its package list, pip options
  and the leading spaces it writes.
- ``fooocus_install_xformers``: the same launcher's ``torchruntime.install(['--no-deps', 'xformers==...'])``.

The tests import these after ``register()``; nothing here names accelstack.
"""
from __future__ import annotations

import torchruntime  # the app's own import: accelstack's package once registered


def ed_device_picker():
    gpus = torchruntime.device_db.get_gpus()
    torch_platform = torchruntime.platform_detection.get_torch_platform(gpus)
    family = "cpu" if torch_platform == "cpu" else ("cuda" if torch_platform.startswith("cu") else "other")
    nvidia = [g for g in gpus if g.vendor_id == torchruntime.consts.NVIDIA and g.is_discrete]
    arch = int(torchruntime.gpu_db.get_nvidia_arch([nvidia[0].device_name]) * 10) if nvidia else 0
    return {"platform": torch_platform, "family": family, "arch": arch, "gpus": [g.device_name for g in gpus]}


def fooocus_dependency_resolver():
    from torchruntime.device_db import get_gpus
    from torchruntime.platform_detection import get_nvidia_arch, get_torch_platform

    torch_ver, torch_platform_ver = "2.7.1", "cu128"
    gpu_infos = get_gpus()
    torchruntime_platform = get_torch_platform(gpu_infos)
    device_names = set(gpu.device_name for gpu in gpu_infos)
    arch_version = get_nvidia_arch(device_names)
    if torchruntime_platform == "xpu":
        torch_ver = "2.3.1"
    elif torchruntime_platform.startswith("cu"):
        if arch_version >= 10:  # Blackwell
            torch_ver, torch_platform_ver = "2.10.0", "cu130"
        elif arch_version < 7.5:  # what cu128 dropped
            torch_ver, torch_platform_ver = "2.5.1", "cu124"
    else:
        torch_platform_ver = torchruntime_platform
    return {"torch_ver": torch_ver, "torch_platform_ver": torch_platform_ver, "arch": arch_version,
            "torchruntime_platform": torchruntime_platform}


def fooocus_install_torch(torch_platform_ver, torch_ver, torchvision_ver, torchaudio_ver):
    from torchruntime.installer import get_install_commands, get_pip_commands, run_commands

    packages = ["--no-warn-script-location", "torch==" + torch_ver, " torchvision==" + torchvision_ver]
    if torchaudio_ver:
        packages.append(" torchaudio==" + torchaudio_ver)
    cmds = get_install_commands(torch_platform_ver, packages)
    cmds = get_pip_commands(cmds)
    run_commands(cmds)
    return cmds


def fooocus_install_xformers(xformers_ver):
    torchruntime.install(["--no-deps", "xformers==" + xformers_ver])
