"""The memory profile of a choice summed on arrays (passes/sharding/memory.py ``_range_table``)
against its definition, every live range added one by one: on a training step with
recomputation choices (some ranges moved by a recomputing or checkpoint strategy), with values
offloaded and stashed away, and with the recomputation ignored (``recompute=False``). Byte counts
are integers, so the two must agree exactly."""

from __future__ import annotations

import numpy as np
import pytest

from graphc.core.mesh import Mesh
from graphc.core.profiles import get_profile
from graphc.models import gpt3
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, optimize_for_planning, state_ties


def _one_by_one(mem, choice, recompute):
    """``MemoryModel._profile`` as its definition reads."""
    delta = np.zeros(mem.size + 1)
    for v, i, a, b in mem.live_ranges():
        if v in mem.offloaded:
            continue
        nb = mem.strategy_bytes(v, i)[choice[i]]
        for first, last in mem.ranges_under(v, i, choice[i], a, b) if recompute else ((a, b),):
            delta[first] += nb
            delta[last + 1] -= nb
        if v in mem.away:
            delta[mem.away[v][0]] -= nb
            delta[mem.away[v][1] + 1] += nb
    for i, at, sizes in mem.transient_terms():
        delta[at] += sizes[choice[i]]
        delta[at + 1] -= sizes[choice[i]]
    return np.cumsum(delta[:-1])


@pytest.fixture(scope="module")
def problem():
    import graphc

    args, kw = gpt3.example_train_specs_small()
    graph = optimize_for_planning(graphc.trace(gpt3.train_step, *args, **kw))
    mesh = Mesh({"dp": 2, "tp": 2}, profile=get_profile("a100-sxm"))
    options = PlanOptions(memory_limit=1 << 30, recompute="auto", zero="auto")
    return build_problem(graph, mesh, options, ties=state_ties(graph))


def test_the_profile_on_arrays_is_the_sum_of_every_range(problem):
    mem = problem.memory
    rng = np.random.default_rng(0)
    live = mem.live_ranges()
    assert problem.remat and any(i in problem.remat for _v, i, _a, _b in live)
    moved = [it.strategies.as_tuple for i, it in enumerate(problem.items) if i in problem.remat]
    assert any(s.recompute for t in moved for s in t) and any(s.checkpoint for t in moved for s in t)
    choices = [[int(rng.integers(len(it.strategies))) for it in problem.items] for _ in range(6)]
    values = [v for v, _i, _a, _b in live]
    for offloaded, away in [((), {}), (values[::7], {v: (2, 9) for v in values[3::11]})]:
        mem.offloaded, mem.away = frozenset(offloaded), away
        for choice in choices:
            for recompute in (True, False):
                want = _one_by_one(mem, choice, recompute)
                np.testing.assert_array_equal(mem._profile(choice, recompute), want)
    mem.offloaded, mem.away = frozenset(), {}
