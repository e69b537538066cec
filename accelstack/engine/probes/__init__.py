"""The probe models ``verify`` generates with: synthesized here from a seed, never downloaded.
"""
__all__: list = []
