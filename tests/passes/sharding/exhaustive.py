"""The oracle the ILP is tested against: every combination of strategies, on small problems."""

import itertools

from graphc.passes.sharding.problem import Problem


def exhaustive(p: Problem, memory_limit: int | None = None) -> tuple[float, list[int]] | None:
    """The cheapest assignment whose peak fits ``memory_limit`` and whose recomputation is allowed,
    by enumerating every combination (small problems only): (total seconds, choice)."""
    best: tuple[float, list[int]] | None = None
    for combo in itertools.product(*(range(len(it.strategies)) for it in p.items)):
        choice = list(combo)
        if memory_limit is not None and p.memory.peak(choice)[0] > memory_limit:
            continue
        if not p.recompute_allowed(choice):
            continue
        t = p.evaluate(choice)["total_s"]
        if best is None or t < best[0] - 1e-15:
            best = (t, choice)
    return best
