"""Shared hypothesis settings for the fuzz suite (issue 10).

Every fuzz target imports ``FUZZ`` (or ``fuzz(n)`` for its own example count) so runs are seeded
(``derandomize=True``: a failure reproduces on every machine), bounded (explicit ``max_examples``)
and free of timing flakiness (``deadline=None``; hang detection is an explicit elapsed-time check
in the tests, with a generous bound). Examples that found a bug are kept as plain tests.
"""
from __future__ import annotations

import copy
import time
import tracemalloc
from contextlib import contextmanager
from typing import Any, Callable, Iterator, List

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

# A hang detector, not a speed test: one call of a parser on one input must return within this.
CALL_BOUND_S = 5.0
# Peak memory traced during one call; hostile input must not make a parser allocate past it.
MEMORY_BOUND_BYTES = 256 * 1024 * 1024

_SUPPRESSED = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
               HealthCheck.function_scoped_fixture]


def fuzz(max_examples: int) -> settings:
    """Seeded, bounded hypothesis settings with ``max_examples`` examples."""
    return settings(max_examples=max_examples, derandomize=True, deadline=None, database=None,
                    suppress_health_check=_SUPPRESSED, print_blob=True)


FUZZ = fuzz(200)


class Counter:
    """Counts examples a target ran (reported in the issue's closing note)."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


@contextmanager
def bounded(what: str = "call", time_s: float = CALL_BOUND_S,
            memory_bytes: int = MEMORY_BOUND_BYTES) -> Iterator[List[float]]:
    """Assert the body returns within ``time_s`` and traces at most ``memory_bytes`` at its peak.

    Yields a list that receives ``[elapsed_s, peak_bytes]`` when the body ends. The body catches
    the typed errors it expects itself, so the bounds are checked for rejected inputs too.
    """
    figures: List[float] = []
    started_tracing = not tracemalloc.is_tracing()
    if started_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    start = time.monotonic()
    try:
        yield figures
    finally:
        elapsed = time.monotonic() - start
        _, peak = tracemalloc.get_traced_memory()
        if started_tracing:
            tracemalloc.stop()
        figures[:] = [elapsed, float(peak)]
    assert elapsed < time_s, f"{what} took {elapsed:.1f} s (bound {time_s} s): a hang"
    assert peak < memory_bytes, f"{what} peaked at {peak} bytes traced (bound {memory_bytes})"


def node_mutation(values: Any, max_path: int) -> Any:
    """A strategy of functions that change one node of a JSON document: a node reached by up to
    ``max_path`` drawn steps is replaced by a value drawn from ``values``, or removed."""

    @st.composite
    def strategy(draw: Any) -> Callable[[Any], Any]:
        choices: List[int] = draw(st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=max_path))
        remove = draw(st.booleans())
        value = draw(values)

        def mutate(doc: Any) -> Any:
            node, parent, key = doc, None, None
            for c in choices:
                if isinstance(node, dict) and node:
                    parent, key = node, sorted(node)[c % len(node)]
                elif isinstance(node, list) and node:
                    parent, key = node, c % len(node)
                else:
                    break
                node = parent[key]
            if parent is None:
                return copy.deepcopy(value)
            if remove:
                del parent[key]
            else:
                parent[key] = copy.deepcopy(value)  # the same drawn value may be placed twice
            return doc

        return mutate

    return strategy()
