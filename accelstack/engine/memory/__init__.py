"""Memory: what a generation needs, what the device has, and the ``auto`` settings that make it fit.
"""
__all__: list = []
