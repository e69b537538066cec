"""Model files and the family rules: each format's header read safely, the family told from its tensors,
and what a file needs beside it.
"""
__all__: list = []
