"""``python -m accelstack.schemas``: rewrite the shipped JSON Schema files from the result types."""
from __future__ import annotations

from . import HERE, write

if __name__ == "__main__":
    changed = write()
    print("\n".join(str(p) for p in changed) or f"the schemas in {HERE} are up to date")
