"""The parent's side of a worker: launch it, wait until it is ready, talk to it, watch it, stop it.
"""
__all__: list = []
