"""The installer: the runtime home, the install transaction and its destinations (a ggml runtime
directory, a torch Python environment), repair and maintenance. Its modules are imported by name."""
from __future__ import annotations

from typing import List

__all__: List[str] = []
