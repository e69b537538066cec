"""accelstack.compat.torchruntime's whole surface, as torchruntime's callers and tests reach it.

- GPU names from the PCI database still resolve after ``register()`` put accelstack's package
  under the name ``torchruntime`` (the database is found through the installed distribution).
"""
from __future__ import annotations

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
