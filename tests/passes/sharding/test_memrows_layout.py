"""``MemoryRows`` lays every live range's entries out with index arrays (passes/sharding/
memrows.py ``_laid_out``): the same arrays, to the bit and in the same order (the profile's and
the rows' float sums follow it), as the loop over live ranges, their entries and their
recomputation ranges that it replaces, with recomputation twins and checkpoints, ZeRO-3's
gathered copies and offloaded state and activations."""

from __future__ import annotations

import numpy as np
import pytest

from graphc.passes.sharding.memrows import MemoryRows
from tests.passes.sharding.test_memrows import _cases, _problem, offloading_model


def _loop(model) -> tuple[list, list, list, list]:
    """The rows' (first, last, column, bytes), a live range at a time (the reference)."""
    p, mem = model.p, model.p.memory
    first: list[int] = []
    last: list[int] = []
    col: list[int] = []
    nbytes: list[float] = []
    for v, i, a, b in mem.live_ranges():
        g, m = model.of[i], model.maps[i]
        xs = model.x[g]
        per = mem.strategy_bytes(v, i)
        for s in range(1 if xs is None else len(m)):
            item_s = int(m[s])
            nb = float(per[item_s])
            if not nb:
                continue
            c = -1 if xs is None else int(xs[s])
            spans = mem.ranges_under(v, i, item_s, a, b) if i in p.remat else [(a, b)]
            for lo, hi in spans:
                first.append(lo)
                last.append(hi)
                col.append(c)
                nbytes.append(nb)
    for i, at, per_strategy in mem.transient_terms():
        g, m = model.of[i], model.maps[i]
        xs = model.x[g]
        for s in range(1 if xs is None else len(m)):
            nb = float(per_strategy[int(m[s])])
            if nb:
                first.append(at)
                last.append(at)
                col.append(-1 if xs is None else int(xs[s]))
                nbytes.append(nb)
    for a, b, coef in model.offload.ranges():
        for column, mib in coef.items():
            first.append(a)
            last.append(b)
            col.append(int(column))
            nbytes.append(mib * model.MIB)
    return first, last, col, nbytes


def _same(model) -> None:
    rows = MemoryRows(model)
    first, last, col, nbytes = _loop(model)
    assert rows.first.dtype == rows.last.dtype == rows.col.dtype == np.int64 and rows.nbytes.dtype == np.float64
    assert rows.first.tolist() == first and rows.last.tolist() == last and rows.col.tolist() == col
    assert rows.nbytes.tobytes() == np.array(nbytes, dtype=np.float64).tobytes()


@pytest.fixture(scope="module")
def cases():
    return _cases()


def test_the_laid_out_rows_are_the_loops(cases):
    recomputed = transient = False
    for graph, mesh, options in cases:
        problem, model = _problem(graph, mesh, options)
        recomputed |= any(i in problem.remat for _v, i, _a, _b in problem.memory.live_ranges())
        transient |= bool(problem.memory.transient_terms())
        _same(model)
    assert recomputed and transient  # the cases have the ranges the layout is for


@pytest.mark.parametrize("offload", [True, "activations"])
def test_the_laid_out_rows_with_offload_are_the_loops(cases, offload):
    _problem_, model = offloading_model(cases[4], offload)
    assert len(model.offload.o) or len(model.offload.a)
    _same(model)
