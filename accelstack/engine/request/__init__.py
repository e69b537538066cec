"""A generate request's inputs and outputs, checked in the parent before any worker starts:
component files, images, LoRAs and embeddings staged for the worker, and the output paths.
"""
__all__: list = []
