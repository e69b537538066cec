"""The worker: the child process that loads a stack and generates, and the protocol both sides speak.

It runs in the runtime's interpreter (``python -m accelstack.engine.worker.main``), so these modules
import the standard library, the stack and each other, never the supervisor's dependencies.
"""
__all__: list = []
