"""Fuzz suite (issue 10): shared settings live in :mod:`tests.fuzz.fuzzing` (import ``FUZZ``)."""
