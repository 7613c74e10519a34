"""passes/stage_cut.py: the banded DP gives the very cut of the whole table (ties broken alike),
and the cache returns what a fresh cut returns, keyed by every input's value."""

import numpy as np
import pytest

from graphc.passes import offload as offloading
from graphc.passes import stage_cut as sc
from graphc.passes.stage_cut import StageMemory, stage_cut


def stage_cut_dense(
    unit_s: np.ndarray, unit_mem: np.ndarray, fixed_mem, S: int, limit: float | None
) -> list[int] | None:
    """The whole table (``best[s, j]``: the slowest stage of the best cut of units 0 .. j into s
    stages), every boundary pair: the reference ``stage_cut`` is tested against."""
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


def _cases(seed: int):
    """Random layer costs: integer times (many equal sums, so the first-minimum rule decides),
    1F1B-like memory, limits from none to tight to impossible, S from 1 to L + 1."""
    rng = np.random.default_rng(seed)
    L = int(rng.integers(1, 14))
    unit_s = rng.integers(1, 4, L).astype(np.float64)
    unit_s[0] += float(rng.integers(0, 3))  # the embedding on the first layer, the head on the last
    unit_s[-1] += float(rng.integers(0, 3))
    unit_mem = rng.integers(1, 5, L).astype(np.float64)
    for S in range(1, L + 2):
        mem = StageMemory(S, int(rng.integers(1, 2 * S + 1)), 0.5, float(rng.integers(0, 3)), 0.0, 0.0, 0.0)
        for limit in (None, *map(float, rng.uniform(2, 4 * L + 4, 3))):
            yield unit_s, unit_mem, mem, S, limit


@pytest.mark.parametrize("seed", range(40))
def test_banded_cut_is_the_whole_tables_cut(seed):
    n_feasible = 0
    for unit_s, unit_mem, mem, S, limit in _cases(seed):
        want = stage_cut_dense(unit_s, unit_mem, mem, S, limit)
        assert sc._banded_cut(unit_s, unit_mem, mem, S, limit) == want, (unit_s, unit_mem, mem, S, limit)
        n_feasible += want is not None
    assert n_feasible  # each seed has cuts that fit


def test_no_cut_into_more_stages_than_layers():
    assert stage_cut(np.ones(3), np.ones(3), lambda s, b, n: 0 * n, 4, None) is None
    assert stage_cut(np.ones(3), np.ones(3), lambda s, b, n: 0 * n, 3, None) == [1, 1, 1]


def test_stage_memory_is_the_block_searchs_formula():
    """per-layer state x layers + the ends' state on the first and last stage + min(k, S - s)
    micro-batches' stash (a fraction of it in host memory) + the recompute work."""
    m = StageMemory(stages=4, microbatches=3, per_unit=10.0, ends=7.0, fraction=0.25, staging=5.0, work=2.0)
    b, n = np.array([4.0, 8.0]), np.array([1, 2])
    for s in range(4):
        flight = min(3, 4 - s)
        ends = 7.0 if s in (0, 3) else 0.0
        want = 10.0 * n + ends + offloading.stash_bytes(flight, b, 0.25, 5.0) + 2.0
        assert np.array_equal(m(s, b, n), want)


def test_cached_cut_is_the_fresh_cut_and_keyed_by_every_input(monkeypatch):
    calls = []
    fresh = sc._banded_cut

    def counted(*args):
        calls.append(args)
        return fresh(*args)

    monkeypatch.setattr(sc, "_banded_cut", counted)
    monkeypatch.setattr(sc, "_cuts", type(sc._cuts)())
    unit_s, unit_mem = np.array([3.0, 1, 1, 1, 2]), np.array([1.0, 1, 1, 1, 2])
    mem = StageMemory(2, 2, 1.0, 0.0, 0.0, 0.0, 0.0)
    first = stage_cut(unit_s, unit_mem, mem, 2, 9.0)
    first.append(99)  # the caller's list is its own: the cache keeps a copy
    again = stage_cut(unit_s.copy(), unit_mem.copy(), StageMemory(2, 2, 1.0, 0.0, 0.0, 0.0, 0.0), 2, 9.0)
    assert again == stage_cut_dense(unit_s, unit_mem, mem, 2, 9.0) == [2, 3] and len(calls) == 1
    # any input changed is a new cut: times, bytes, memory model, stages, limit
    changed = [
        (unit_s * [1, 1, 1, 1, 3], unit_mem, mem, 2, 9.0),
        (unit_s, unit_mem * 2, mem, 2, 9.0),
        (unit_s, unit_mem, StageMemory(2, 1, 1.0, 0.0, 0.0, 0.0, 0.0), 2, 9.0),
        (unit_s, unit_mem, mem, 3, 9.0),
        (unit_s, unit_mem, mem, 2, 7.0),
        (unit_s, unit_mem, mem, 2, None),
    ]
    for args in changed:
        assert stage_cut(*args) == stage_cut_dense(*args)
    assert len(calls) == 1 + len(changed)
    # a plain function is not a value: never cached
    stage_cut(unit_s, unit_mem, lambda s, b, n: n + b, 2, 9.0)
    stage_cut(unit_s, unit_mem, lambda s, b, n: n + b, 2, 9.0)
    assert len(calls) == 3 + len(changed)
