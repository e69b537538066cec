"""`accelstack doctor` (being written: issue 14)."""
from __future__ import annotations

import argparse


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("doctor", help="(not yet available)")
    p.set_defaults(func=lambda args: 2)
