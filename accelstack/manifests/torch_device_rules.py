"""Two rules on top of the torch checks, for the CUDA reasons a person acts on (issue 27).

- When no torch CUDA wheel has kernels for a GPU's architecture, that is the reason, said first:
  a Kepler GTX 680 on driver 331 is not told to update a driver that would change nothing.
- When Windows shows NVIDIA's own driver but its version could not be read (WMI without it, no
  nvidia-smi answer), the CUDA build this GPU runs with the oldest driver is planned, and the plan
  says so: the install's device check confirms it, where refusing CUDA would have left the NVIDIA
  card to DirectML or Vulkan.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from packaging.version import Version

from .hw_rules import driver_floor, driver_unread, hw_rules, unread_driver_check, unread_driver_note
from .machine import Device, cuda_kernels_for, sm_name, version_of
from .torch_checks import TorchChecks
from .torch_matrix import CudaToolkit

__all__ = ["TorchDeviceRules", "driver_unread"]


class TorchDeviceRules(TorchChecks):
    """:class:`TorchChecks` with the architecture first and an unread Windows driver planned for."""

    _lowest: Dict[int, Optional[Tuple[Version, str]]]

    def device_problem(self, dev: Device, backend: str) -> Optional[Tuple[str, str]]:
        if backend == "cuda" and not dev.jetson:
            arch = self.no_kernels_anywhere(dev)
            if arch:
                return ("kernels", arch)
            if driver_unread(dev) and self.lowest_floor(dev) is not None:
                return None  # planned for by driver_fail
        return super().device_problem(dev, backend)

    def no_kernels_anywhere(self, dev: Device) -> str:
        """Why no torch CUDA wheel runs on ``dev``'s architecture ('' when one has kernels for it)."""
        if not dev.cc:
            return ""
        builds = [b for rel in self.matrix.releases for v in rel.variants if v.backend == "cuda"
                  for p, b in v.platforms.items() if p in self.m.platforms]
        if not builds or any(cuda_kernels_for(dev.cc, b.sm, b.ptx) is not None for b in builds):
            return ""
        arch = hw_rules().architecture(dev.cc)
        what = f"{arch.name} " if arch is not None else ""
        branch = f" (R{arch.last_branch} is the last driver branch for {arch.name} GPUs)" if arch is not None and arch.last_branch else ""
        return (f"no torch CUDA wheel has kernels for {sm_name(dev.cc)}, the {what}architecture of {dev.name} (compute capability "
                f"{dev.cc}), whatever the driver{branch}; use the CPU, or a GPU of a newer architecture")

    def floor_of(self, tk: CudaToolkit, native: bool) -> str:
        """The oldest driver that runs a build of toolkit ``tk``, by NVIDIA's rules (those cuda_driver_check applies)."""
        os_name = self.m.driver_os
        return driver_floor(tk.cuda, tk.driver.get(os_name, ""), native=native, os_name=os_name,
                            policy=self.request.cuda_driver)[0]

    def lowest_floor(self, dev: Device) -> Optional[Tuple[Version, str]]:
        """(driver floor, variant) of the CUDA build that runs on ``dev`` with the oldest driver."""
        cache = self.__dict__.setdefault("_lowest", {})
        if dev.rank in cache:
            return cache[dev.rank]
        best: Optional[Tuple[Version, str]] = None
        for rel in self.matrix.releases:
            for var in rel.variants:
                build = next((var.platforms[p] for p in self.m.platforms if p in var.platforms), None)
                tk = self.matrix.toolkit(var.cuda) if var.backend == "cuda" else None
                if build is None or tk is None:
                    continue
                kernels = cuda_kernels_for(dev.cc, build.sm, build.ptx) if dev.cc else ""
                if kernels is None:
                    continue
                floor = self.floor_of(tk, bool(kernels) and not kernels.startswith("compute_"))
                if not floor:
                    continue
                if best is None or version_of(floor) < best[0]:
                    best = (version_of(floor), var.name)
        cache[dev.rank] = best
        return best

    def driver_fail(self, dev: Device, tk: Optional[CudaToolkit], vname: str, *, native: bool = False) -> Tuple[Optional[Tuple[str, str]], str]:
        lowest = self.lowest_floor(dev) if driver_unread(dev) and tk is not None else None
        if tk is None or lowest is None:
            return super().driver_fail(dev, tk, vname, native=native)
        why, how = unread_driver_check(dev, vname, self.floor_of(tk, native), lowest)
        return (("driver", why) if why else None), how

    def unread_note(self, dev: Optional[Device], backend: str) -> str:
        """The plan's note when it chose CUDA for a GPU whose driver version could not be read."""
        if dev is None or backend != "cuda" or not driver_unread(dev):
            return ""
        return unread_driver_note(dev, self.lowest_floor(dev))
