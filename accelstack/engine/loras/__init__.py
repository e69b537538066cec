"""LoRAs: their module names as stable-diffusion.cpp converts them, and whether it can apply them.
"""
__all__: list = []
