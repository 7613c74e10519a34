"""Pipeline stages by dynamic programming over per-layer costs (as Alpa): the contiguous cut of a
step's layers into S stages whose slowest stage is fastest, every stage within a memory limit.
The block search (passes/scale.py) cuts the stamped layers with it.

The search asks for thousands of cuts (GPT-3 175B on 1,024 devices: 8,425, 7,110 of them
distinct), so ``stage_cut`` keeps the last ``CACHED_CUTS`` results by their inputs' values (the
memory function is a frozen dataclass there, ``StageMemory``, so equal layouts give equal keys),
and its table covers only the boundaries a cut into S non-empty stages can have (the band ``s ..
s + L - S`` after stage s), read as slices of the stage spans and bytes made once: the same cut
as the whole table (tests/passes/test_stage_cut.py's ``stage_cut_dense``), in (L - S + 1)^2 entries per stage
instead of (L + 1)^2. Those 8,425 cuts, replayed: 8.3 s of CPU with the whole table, 3.3 s so
(loaded machine).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graphc.passes import offload as offloading

# Results kept by ``stage_cut`` (a cut is a short list; the keys hold the layers' costs as bytes).
CACHED_CUTS = 4096

_cuts: OrderedDict[tuple, list[int] | None] = OrderedDict()


@dataclass(frozen=True)
class StageMemory:
    """A pipeline stage's bytes per device (the block search's model, passes/scale.py
    ``compose``): ``n_units`` layers' state; the state outside the layers, ``ends`` on the first
    and last stage (a tied embedding), ``first`` on the first, ``last`` on the last and ``every``
    on each (one stage holds each once: passes/state_layout.py ``EndStates``); the micro-batches
    in flight at stage ``s`` of ``stages`` under 1F1B (``min(k, S - s)``) each stashing
    ``unit_bytes`` (``fraction`` of it in host memory, ``staging`` bytes in transit:
    passes/offload.py ``stash_bytes``), and ``work`` (a layer's activations, recomputed)."""

    stages: int
    microbatches: int
    per_unit: float
    ends: float
    fraction: float
    staging: float
    work: float
    first: float = 0.0
    last: float = 0.0
    every: float = 0.0

    def __call__(self, s: int, unit_bytes, n_units):
        flight = min(self.microbatches, self.stages - s)
        ends = self.every + (self.ends if s in (0, self.stages - 1) else 0.0)
        ends += (self.first if s == 0 else 0.0) + (self.last if s == self.stages - 1 else 0.0)
        stash = offloading.stash_bytes(flight, unit_bytes, self.fraction, self.staging)
        return self.per_unit * n_units + ends + stash + self.work


def stage_cut(
    unit_s: np.ndarray, unit_mem: np.ndarray, fixed_mem: Callable, S: int, limit: float | None
) -> list[int] | None:
    """Layers per stage: the contiguous cut of the units into ``S`` stages whose slowest stage is
    fastest (the first such cut, as ``stage_cut_dense`` picks it), each stage's memory
    ``fixed_mem(s, unit bytes, units)`` within ``limit``. None when no cut fits. With a
    ``StageMemory`` (a value: equal ones price equally) the result is cached by the inputs' values;
    any other callable is asked afresh."""
    if not isinstance(fixed_mem, StageMemory):
        return _banded_cut(unit_s, unit_mem, fixed_mem, S, limit)
    unit_s, unit_mem = np.asarray(unit_s, dtype=np.float64), np.asarray(unit_mem, dtype=np.float64)
    key = (unit_s.tobytes(), unit_mem.tobytes(), fixed_mem, S, limit)
    if key in _cuts:
        _cuts.move_to_end(key)
        got = _cuts[key]
        return None if got is None else list(got)
    got = _banded_cut(unit_s, unit_mem, fixed_mem, S, limit)
    _cuts[key] = None if got is None else list(got)
    if len(_cuts) > CACHED_CUTS:
        _cuts.popitem(last=False)
    return got


def _banded_cut(unit_s, unit_mem, fixed_mem, S: int, limit: float | None) -> list[int] | None:
    """``stage_cut_dense`` over the band of reachable boundaries only: after stage s (s = 1 .. S)
    the last boundary ``j`` is in ``s .. s + W - 1`` (``W = L - S + 1``; at least one unit per
    stage before it and after it), the previous one ``i`` in ``s - 1 .. s + W - 2``. Every entry
    outside the band is infinite in the whole table (too few units before it, or ``i >= j``), so
    each row's first minimum, and so the cut, is the same."""
    L = len(unit_s)
    W = L - S + 1
    if S < 1 or W < 1:
        return None
    t = np.concatenate([[0.0], np.cumsum(unit_s)])
    mem = np.concatenate([[0.0], np.cumsum(unit_mem)])
    j, i = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")  # stage [i, j), as the whole table
    span = np.where(i < j, t[j] - t[i], np.inf)
    seg_mem, seg_n = mem[j] - mem[i], j - i
    prev = np.full(W, np.inf)  # best[s - 1, i] over the band of stage s - 1
    prev[0] = 0.0
    rows = np.arange(W)
    args = []
    for s in range(1, S + 1):
        band = (slice(s, s + W), slice(s - 1, s - 1 + W))  # j in s .. s + W - 1, i in s - 1 .. s + W - 2
        cost = np.maximum(prev[None, :], span[band])
        if limit is not None:
            cost = np.where(fixed_mem(s - 1, seg_mem[band], seg_n[band]) <= limit, cost, np.inf)
        arg = np.argmin(cost, axis=1)
        prev = cost[rows, arg]
        args.append(arg + (s - 1))
    if not np.isfinite(prev[W - 1]):
        return None
    bounds = [L]
    for s in range(S, 0, -1):
        bounds.append(int(args[s - 1][bounds[-1] - s]))
    bounds = bounds[::-1]
    return [bounds[s + 1] - bounds[s] for s in range(S)]


__all__ = ["CACHED_CUTS", "StageMemory", "stage_cut"]
