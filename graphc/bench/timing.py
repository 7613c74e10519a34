"""Timing helpers of the benchmarks: numbers measured in one run and compared with a peer from the
same run. Nothing here is a test; tests never time anything."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphc.autodiff import interpreted_calls
from graphc.bench.bounds import freedom_of_run, outside, reference_with_spreads
from graphc.core.dtypes import is_float
from graphc.core.ir import Graph
from graphc.core.pytree import flatten
from graphc.interpreter import bind_arguments


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


def same(got: Any, want: Any, bounds: Sequence[np.ndarray]) -> str:
    """ "yes" when every float result of ``got`` is within its bound of ``want``'s, else "no (why)".

    The bounds are the computation's own (``result_bounds``, graphc/bench/bounds.py), not fixed
    tolerances: how far a compiled run of the graph may move each result element by adding its
    sums in another order (a spread of about sqrt(K) u times the sum of the terms' magnitudes, not
    of the result: a cancelling sum of large terms may move by many of its own ulps; a result may
    be ``bounds.SIGMAS`` spreads off), by rounding partial sums
    once more per device split and micro-batch, and by regrouping an op, carried through the
    graph from op to op. A 16-bit result is compared at its own rounding: exactly where no such
    error reaches a rounding boundary. NaNs must be at the same places; only float results are
    compared (integers, booleans as before are not)."""
    g, w = flatten(got)[0], flatten(want)[0]
    if len(g) != len(w) or len(w) != len(bounds):
        return f"no ({len(g)} results vs {len(w)})"
    for i, (a, b, bound) in enumerate(zip(g, w, bounds)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"no ({a.dtype}{a.shape} vs {b.dtype}{b.shape})"
        if not is_float(a.dtype):
            continue
        bad = outside(a, b, bound)
        if bad.any():
            with np.errstate(invalid="ignore"):
                off = np.abs(a.astype(np.float64) - b.astype(np.float64))
            worst = np.unravel_index(int(np.argmax(np.where(bad, off - bound, -np.inf))), a.shape)
            return (
                f"no (max abs diff {np.nanmax(off, initial=0.0):.3g}; {int(bad.sum())} of {a.size} elements of result "
                f"{i} beyond their rounding bound, e.g. {off[worst]:.3g} > {float(bound[worst]):.3g})"
            )
    return "yes"


def result_bounds(
    graph: Graph, args: tuple, kwargs: dict, mesh_shape: Sequence[int] = (), microbatches: int = 1
) -> list[np.ndarray]:
    """For each result of ``graph`` called on ``args``, ``kwargs`` (its dynamic arguments), the
    elementwise bound ``same`` holds a compiled run on a mesh of ``mesh_shape`` in
    ``microbatches`` micro-batches to (graphc/bench/bounds.py). Computed on copies of the
    arguments, before a run may write into them."""
    arrays = [np.array(a) for a in bind_arguments(graph, args, kwargs)]
    return reference_with_spreads(graph, arrays, freedom_of_run(mesh_shape, microbatches))[1]


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
