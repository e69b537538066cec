"""``import torchruntime`` with the shim folder on PYTHONPATH: accelstack's compat package, registered in its place.

``register()`` puts ``accelstack.compat.torchruntime`` (and its submodules) in ``sys.modules`` under
the name ``torchruntime``; the import that ran this file then returns that package, and
``python -m torchruntime`` runs its ``__main__``.
"""
from __future__ import annotations

import accelstack.compat.torchruntime as _compat

__all__: list = []

_compat.register()
