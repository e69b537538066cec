"""accelstack.compat.torchruntime's whole surface, as torchruntime's callers and tests reach it.

- GPU names from the PCI database still resolve after ``register()`` put accelstack's package
  under the name ``torchruntime`` (the database is found through the installed distribution).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120)


def test_pci_names_resolve_after_register():
    proc = _python("import accelstack.compat.torchruntime as t; t.register()\n"
                   "from accelstack.hardware.tables import pci_lookup\n"
                   "print(pci_lookup('10de', '2786'))")
    assert proc.returncode == 0, proc.stderr
    assert "GeForce RTX 4070" in proc.stdout


def test_register_switches_what_was_imported_before_it_and_says_so():
    """An app module that imported the real torchruntime first (``import torchruntime`` and
    ``from torchruntime.platform_detection import get_torch_platform``) reaches accelstack's package after
    register(); the switch warns that it came late and what it rebound."""
    proc = _python(
        "import warnings, sys, types\n"
        "import torchruntime\n"
        "from torchruntime.platform_detection import get_torch_platform\n"
        "from torchruntime import installer as early_installer\n"
        "real_file = torchruntime.__file__\n"
        "import accelstack.compat.torchruntime as compat\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    compat.register()\n"
        "assert 'accelstack' not in real_file, real_file\n"
        "assert get_torch_platform is compat.platform_detection.get_torch_platform, get_torch_platform\n"
        "assert early_installer is compat.installer\n"
        "assert torchruntime is compat, torchruntime\n"
        "import torchruntime as again\n"
        "assert again is compat\n"
        "print('WARN', [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)])\n")
    assert proc.returncode == 0, proc.stderr
    assert "imported before" in proc.stdout and "__main__" in proc.stdout


def test_python_m_torchruntime_is_accelstacks_with_the_shim_on_pythonpath():
    """An app that runs torchruntime's command line in a subprocess, unchanged, with the documented switch:
    PYTHONPATH set to ``python -m accelstack.compat.torchruntime shim``'s folder (inherited by the subprocess)."""
    shim = subprocess.run([sys.executable, "-m", "accelstack.compat.torchruntime", "shim"], stdout=subprocess.PIPE, text=True,
                          cwd=REPO, timeout=120).stdout.strip()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([shim, os.environ.get("PYTHONPATH", "")])}
    app = ("import subprocess, sys\n"
           "subprocess.run([sys.executable, '-m', 'torchruntime', 'info'], check=True)\n"
           "subprocess.run([sys.executable, '-m', 'torchruntime', 'install', '--help'], check=True)\n"
           "import torchruntime\n"
           "print('imported', torchruntime.__name__)\n")
    proc = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", app], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, cwd=REPO, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "--- RECOMMENDED TORCH PLATFORM ---" in proc.stdout and "(accelstack installs" in proc.stdout
    assert "usage: python -m torchruntime install" in proc.stdout
    assert "imported accelstack.compat.torchruntime" in proc.stdout
