"""A pytest plugin (``-p torchruntime_in_place``) that answers ``import torchruntime`` with accelstack's
compat package before any test module is collected, and checks that it did: torchruntime's own test
suite, run from the installed package's ``torchruntime/tests``, then tests accelstack's answers."""
from __future__ import annotations

import sys

import accelstack.compat.torchruntime as compat

compat.register()
_foreign = sorted(name for name, module in sys.modules.items()
                  if (name == "torchruntime" or name.startswith("torchruntime."))
                  and not getattr(module, "__name__", "").startswith("accelstack.compat.torchruntime"))
assert not _foreign, f"these torchruntime modules are not accelstack's: {_foreign}"
