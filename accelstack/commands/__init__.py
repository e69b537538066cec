"""The CLI's commands, one module each with ``register(subparsers)`` (see :mod:`accelstack.cli`).

Empty on purpose: ``accelstack --help`` and ``--version`` import this package and nothing below it.
"""
__all__: list = []
