"""The vulkan variant for real: built once (cached by its inputs like the CPU build) where the Vulkan
toolchain is installed (scripts/setup-vulkan.sh), packaged lean, and its ggml Vulkan backend finds
lavapipe only when GGML_VK_VISIBLE_DEVICES names it (ggml skips CPU-type devices on its own).

The first run on a machine compiles for about 5 minutes on 2 cores; later runs reuse the cache.
Set ACCELSTACK_SKIP_VULKAN_BUILD=1 to skip these tests where that build is unwanted.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from accelstack.publisher.build import build_ggml, vulkan_include_dir
from accelstack.publisher.build_cache import build_cache_dir
from accelstack.publisher.variants import missing_toolchain
from accelstack.publisher.wheel_repack import PACKAGING_VERSION
from accelstack.settings import Settings

LAVAPIPE = any(Path(d, "lvp_icd.x86_64.json").exists() for d in ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d"))
pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the lavapipe setup is Linux's"),
    pytest.mark.skipif(bool(os.environ.get("ACCELSTACK_SKIP_VULKAN_BUILD")), reason="ACCELSTACK_SKIP_VULKAN_BUILD is set"),
    pytest.mark.skipif(bool(missing_toolchain("vulkan")) or not LAVAPIPE,
                       reason="no Vulkan toolchain or lavapipe here (scripts/setup-vulkan.sh installs them)"),
    pytest.mark.skipif(vulkan_include_dir(build_cache_dir(Settings.resolve())) is None and not Path("/usr/include/vulkan/vulkan.hpp").exists(),
                       reason="no Vulkan headers (scripts/setup-vulkan.sh puts new enough ones into the build cache)"),
]

# ggml's Vulkan backend, asked through the runtime's own library (ggml is linked into it).
COUNT = """
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
count = lib.ggml_backend_vk_get_device_count()
print(count)
if count:
    buf = ctypes.create_string_buffer(256)
    lib.ggml_backend_vk_get_device_description(0, buf, 256)
    print(buf.value.decode())
"""


@pytest.fixture(scope="module")
def vulkan_runtime(tmp_path_factory):
    result = build_ggml("vulkan", Settings.resolve())
    target = tmp_path_factory.mktemp("ggml-vulkan-runtime")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                    "--no-index", "--target", str(target), result.wheel], check=True)
    return result, target


def test_the_vulkan_variant_is_built_lean_and_links_the_vulkan_loader(vulkan_runtime):
    result, target = vulkan_runtime
    assert result.variant == "vulkan" and result.packaging == PACKAGING_VERSION
    assert any(a.startswith("-DVulkan_INCLUDE_DIR=") for a in result.cmake_args) or Path("/usr/include/vulkan").is_dir()
    with zipfile.ZipFile(result.wheel) as z:
        names = z.namelist()
    assert not [n for n in names if n.endswith(".a") or n.startswith(("include/", "lib/"))]
    libs = [n for n in names if n.endswith(".so")]
    assert len(libs) == len({Path(n).name for n in libs}), f"a library shipped twice: {libs}"
    so = target / "stable_diffusion_cpp" / "lib" / "libstable-diffusion.so"
    needed = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True).stdout
    assert "libvulkan.so.1" in needed
    on_disk = sum((target / n).stat().st_size for n in names)
    assert abs(result.installed_size - on_disk) < 4096  # pip rewrites RECORD with its own entries


def _vk_devices(so: Path, **env: str):
    clean = {k: v for k, v in os.environ.items() if k != "GGML_VK_VISIBLE_DEVICES"}
    done = subprocess.run([sys.executable, "-c", COUNT, str(so)], capture_output=True, text=True, timeout=300,
                          env={**clean, **env})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split("\n", 1)


def test_lavapipe_is_used_only_when_named_by_ggml_vk_visible_devices(vulkan_runtime):
    _result, target = vulkan_runtime
    so = target / "stable_diffusion_cpp" / "lib" / "libstable-diffusion.so"
    count, _rest = _vk_devices(so)
    assert count.strip() == "0", "ggml-vulkan should skip a CPU-type device unless it is named"
    count, description = _vk_devices(so, GGML_VK_VISIBLE_DEVICES="0")
    assert count.strip() == "1" and "llvmpipe" in description
