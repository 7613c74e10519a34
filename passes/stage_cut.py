"""Pipeline stages by dynamic programming over per-layer costs (as Alpa): the contiguous cut of a
step's layers into S stages whose slowest stage is fastest, every stage within a memory limit.
The block search (passes/scale.py) cuts the stamped layers with it."""

from __future__ import annotations

import numpy as np


def stage_cut(unit_s: np.ndarray, unit_mem: np.ndarray, fixed_mem, S: int, limit: float | None) -> list[int] | None:
    """Layers per stage: the contiguous cut of the units into ``S`` stages whose slowest stage is
    fastest, each stage's memory ``fixed_mem(s, units)`` + in-flight share within ``limit``, by
    dynamic programming (``best[s, j]``: the slowest stage of the best cut of units 0 .. j into s
    stages). None when no cut fits."""
    L = len(unit_s)
    t = np.concatenate([[0.0], np.cumsum(unit_s)])
    mem = np.concatenate([[0.0], np.cumsum(unit_mem)])
    best = np.full((S + 1, L + 1), np.inf)
    arg = np.zeros((S + 1, L + 1), dtype=np.int64)
    best[0, 0] = 0.0
    j, i = np.meshgrid(np.arange(L + 1), np.arange(L + 1), indexing="ij")  # stage [i, j)
    span = np.where(i < j, t[j] - t[i], np.inf)
    for s in range(1, S + 1):
        cost = np.maximum(best[s - 1][None, :], span)
        if limit is not None:
            cost = np.where(fixed_mem(s - 1, mem[j] - mem[i], j - i) <= limit, cost, np.inf)
        arg[s] = np.argmin(cost, axis=1)
        best[s] = cost[np.arange(L + 1), arg[s]]
    if not np.isfinite(best[S, L]):
        return None
    bounds = [L]
    for s in range(S, 0, -1):
        bounds.append(int(arg[s, bounds[-1]]))
    bounds = bounds[::-1]
    return [bounds[s + 1] - bounds[s] for s in range(S)]


__all__ = ["stage_cut"]
