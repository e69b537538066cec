"""``verify``: prove that a runtime really generates on this machine (ggml with a probe model,
torch with a short deterministic workload).
"""
__all__: list = []
