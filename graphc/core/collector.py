"""Python's cycle collector paused while graphc builds large object graphs (tracing, the passes,
planning).

Each of those allocates millions of small objects that live as long as the graph or the problem:
every full collection walks all of them, and collections come more often the more there are (at
60 layers of a small GPT they took a third of the planning time, at 100 layers a third of tracing
and half of the passes: docs/solver.md). What is left behind is freed by reference counting; the
collector runs again after, in the state it was found in (nested uses, and errors, restore it).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cycle collector off for a block, or a function's call (a context manager and a
    decorator); its previous state restored after."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


__all__ = ["collector_paused"]
