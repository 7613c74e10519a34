"""Timing helpers of the benchmarks: numbers measured in one run and compared with a peer from the
same run. Nothing here is a test; tests never time anything."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from graphc.autodiff import interpreted_calls
from graphc.core.dtypes import is_low_float
from graphc.core.ir import Graph
from graphc.core.pytree import flatten


def timed(fn: Callable[[], Any], repeat: int, warmup: int = 1) -> tuple[list[float], Any]:
    """Seconds of each of ``repeat`` calls after ``warmup`` untimed ones, and the last result."""
    result = None
    for _ in range(warmup):
        result = fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return times, result


def direct_call(fn: Callable, args: tuple, kwargs: dict) -> tuple[str, Any]:
    """Call ``fn(*args, **kwargs)`` as it is, once: (the name of that baseline, its result). The
    name is "numpy" when the call ran as plain numpy, and "graphc's interpreter" when graphc's
    transforms inside it (a training step calling graphc.value_and_grad) traced and interpreted
    it: timing that against graphc is a speed-up over graphc itself, not over numpy."""
    before = interpreted_calls()
    result = fn(*args, **kwargs)
    return ("numpy" if interpreted_calls() == before else "graphc's interpreter"), result


def times_of(fn: Callable[[], Any], repeat: int) -> list[float]:
    """Seconds of ``repeat`` (at least one) calls, no warm-up."""
    return timed(fn, max(1, repeat), warmup=0)[0]


def fmt(times: list[float]) -> str:
    """The median and half the spread, in ms."""
    med = statistics.median(times)
    spread = (max(times) - min(times)) / 2
    return f"{med * 1e3:10.2f} ms  ± {spread * 1e3:7.2f}  (n={len(times)})"


def fmt_range(times: list[float]) -> str:
    """The median, min and max, in ms."""
    med = statistics.median(times)
    return f"{med * 1e3:9.2f} ms (min {min(times) * 1e3:.2f}, max {max(times) * 1e3:.2f}, n={len(times)})"


def same(got: Any, want: Any, computed_in: np.dtype | None = None) -> str:
    """ "yes" when two results (pytrees of arrays) agree to float32/float64 tolerance, else why not.
    bfloat16 and float16 results (rounded at every op, ops/precision.py) agree within 8 of their
    ulps at the leaf's largest magnitude: partial sums rounded on a mesh move a result by a few.
    ``computed_in``: the 16-bit float the computation ran in (``narrowest_float``), whose tolerance
    every float leaf gets: a float32 leaf made from 16-bit values (Adam's float32 moments of
    bfloat16 gradients) carries their rounding."""
    g, w = flatten(got)[0], flatten(want)[0]
    for a, b in zip(g, w):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"no ({a.dtype}{a.shape} vs {b.dtype}{b.shape})"
        low = a.dtype if is_low_float(a.dtype) else computed_in if a.dtype.kind == "f" else None
        if low is not None:
            scale = float(np.max(np.abs(b.astype(np.float32)), initial=0.0))
            tol = 8 * float(ml_dtypes.finfo(low).eps)
            a, b = a.astype(np.float32), b.astype(np.float32)
            if not np.allclose(a, b, rtol=tol, atol=tol * scale):
                return f"no (max abs diff {np.max(np.abs(a - b)):.3g})"
            continue
        tol = 1e-4 if a.dtype == np.float32 else 1e-6
        if a.dtype.kind == "f" and not np.allclose(a, b, rtol=tol, atol=tol):
            return f"no (max abs diff {np.max(np.abs(a - b)):.3g})"
    return "yes"


def narrowest_float(graph: Graph) -> np.dtype | None:
    """The coarsest 16-bit float (bfloat16 before float16) any input or node result of ``graph``
    has, or None: what ``same`` compares the graph's results at."""
    values = [*graph.inputs, *(v for node in graph.nodes for v in node.outputs)]
    low = {v.type.dtype for v in values if is_low_float(v.type.dtype)}
    return max(low, key=lambda d: float(ml_dtypes.finfo(d).eps)) if low else None


def interleaved(
    contenders: dict[Any, Callable[[], Any]], rounds: int, rotate: bool = True, settle_s: float = 0.0
) -> dict[Any, list[float]]:
    """Seconds of each contender per round; each round calls every contender once (so a busy
    moment of the machine hits them alike), the order rotating from round to round unless
    ``rotate`` is False. One untimed warm-up call each. ``settle_s``: an untimed pause before each
    call, for contenders that leave threads spinning after they return (OpenBLAS's workers
    busy-wait for a while after a multi-threaded call: on this machine a GPT forward right after
    one ran 1.25x slower, docs/performance.md)."""
    for fn in contenders.values():
        fn()
    names = list(contenders)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        turn = r % len(names) if rotate else 0
        for n in names[turn:] + names[:turn]:
            if settle_s:
                time.sleep(settle_s)
            start = time.perf_counter()
            contenders[n]()
            times[n].append(time.perf_counter() - start)
    return times


def per_call(fn: Callable[[], Any], calls: int) -> Callable[[], Any]:
    """``fn`` called ``calls`` times: timing it gives ``calls`` times the per-call cost."""

    def many():
        for _ in range(calls):
            fn()

    return many
