"""What a plan says about the choices it did not make (``ShardingPlan.explain``).

For every input, node and output the plan keeps its best alternatives: another strategy ``s`` of
that item, every other choice held fixed (a state input and the output it is tied to take one
spec, so they move together). Each is priced in the solver's own model, alternative minus chosen:

    delta_s            the ILP objective (``Problem.evaluate``): the item's compute plus the
                       redistribution of every edge at it, ZeRO-3's gathers and the gradient
                       buckets' shares included, priced as the solver priced them (its bucket
                       estimate: call ``find_alternatives`` before ``CostModel.rebucket``)
    step_delta_s       the predicted step: compute plus the plan's collectives of the values at
                       the item, each redistribution once (passes/sharding/collectives.py), in
                       the buckets the plan fills
    peak_delta_bytes   the per-device liveness peak (``MemoryModel.peak``: what a memory limit
                       bounds)

and ``ruled_out`` names the first of these that keeps the solver from taking it:

    exceeds the memory limit L by X      its peak is over the limit
    shares one ILP variable with ...      shrinking gave it one variable with repeated items
    the solver stopped ...                the time limit ran out before optimality
    within the solver's stopping gap      cheaper by less than the gap the solver stops at
    (None)                                allowed, and slower (or as fast): the text says by how much

An input also lists the specs that were never candidates (``ruled_out_specs``): the chosen spec
with one mesh axis's placement changed, and why the planner did not generate it (a pin, a dim
that does not split evenly, the axis's role, ZeRO's choice of dim or stage, the tie to its
output).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from graphc.core.collector import collector_paused
from graphc.core.ir import Value
from graphc.core.spec import R, S, Spec, format_spec
from graphc.core.units import fmt_bytes
from graphc.passes.sharding.collectives import redistribution_steps
from graphc.passes.sharding.costs import CostModel
from graphc.passes.sharding.items import Edge
from graphc.passes.sharding.memory import local_nbytes
from graphc.passes.sharding.milp import REL_GAP
from graphc.passes.sharding.problem import Problem
from graphc.passes.sharding.records import Alternative, RuledOut
from graphc.passes.sharding.roles import BATCH, RESTRICTED

TOP = 3  # alternatives kept per item


@dataclass(frozen=True)
class Solved:
    """What the solver did, as far as an explanation names it."""

    objective_s: float
    status: str  # "optimal", or how it stopped
    gap: float
    memory_limit: int | None
    shared: list[int]  # per item: the items sharing its ILP variable (``Solution.shared``; [] none shared)


@collector_paused()
def find_alternatives(
    problem: Problem,
    choice: list[int],
    solved: Solved,
    plan_share_bytes: int,
    top: int = TOP,
    reuse: bool = True,
    costs: CostModel | None = None,
) -> dict[int, tuple[Alternative, ...]]:
    """{item: its ``top`` cheapest alternatives by the objective} for every input, node and output
    with more than one strategy (a fan-out is not a choice the plan reports).
    ``plan_share_bytes``: the gradient bucket share of the plan's collectives; ``costs``: the
    objective's cost model as the solver priced it (default ``problem.costs``; a
    ``CostModel.snapshot`` taken before the problem was re-bucketed).

    The items of repeated layers price their alternatives alike: an item whose ``_Pricer.context``
    (everything the objective's and the step's deltas read: its strategies and choice, and per
    edge the cost table, the other end's spec and table index, and the redistributions its
    values share with other readers) equals one priced before takes over that one's deltas,
    order of alternatives and step deltas (``reuse``; False prices every item, as the tests
    compare). The peak is the item's own: it depends on where the item's values live."""
    pricer = _Pricer(problem, choice, plan_share_bytes, costs)
    priced: dict[tuple, _Priced] = {}
    out: dict[int, tuple[Alternative, ...]] = {}
    for i, it in enumerate(problem.items):
        if len(it.strategies) < 2 or it.kind == "fanout":
            continue
        context = pricer.context(i) if reuse else None
        known = priced.get(context) if context is not None else None
        if known is None:
            known = _price(pricer, i, top)
            if context is not None:
                priced[context] = known
        alts = []
        for s in known.order:
            st = it.strategies[s]
            moved = pricer.moved(i, s)
            peak = pricer.peak_with(moved)
            delta = float(known.delta[s])
            step = known.steps[s]
            alts.append(
                Alternative(
                    out_specs=tuple(st.out_specs) if it.kind != "output" else tuple(st.in_specs),
                    delta_s=delta,
                    strategy=st.name if it.kind == "node" else None,
                    compute_delta_s=float(known.compute[s]),
                    comm_delta_s=float(known.comm[s]),
                    step_delta_s=step,
                    peak_delta_bytes=peak - pricer.peak,
                    ruled_out=_ruled_out(delta, peak, solved, [i, *pricer.partner_of(i)]),
                )
            )
        out[i] = tuple(alts)
    return out


@dataclass(frozen=True)
class _Priced:
    """An item's deltas by strategy (compute, redistribution, their sum with the chosen and the
    ruled-out strategies at infinity), its ``top`` alternatives in order, and their step deltas."""

    compute: np.ndarray
    comm: np.ndarray
    delta: np.ndarray
    order: tuple[int, ...]
    steps: dict[int, float]


def _price(pricer: _Pricer, i: int, top: int) -> _Priced:
    it = pricer.p.items[i]
    compute, comm = pricer.objective_deltas(i)
    delta = compute + comm
    delta[pricer.choice[i]] = np.inf
    chosen = it.strategies[pricer.choice[i]]
    if i in pricer.p.remat:  # the other specs; keeping or recomputing is reported apart
        delta[[st.recompute != chosen.recompute for st in it.strategies]] = np.inf
    order: list[int] = []
    for s in np.argsort(delta, kind="stable")[:top]:
        if not np.isfinite(delta[s]):
            break
        order.append(int(s))
    steps = {s: pricer.step_delta(pricer.moved(i, s), float(compute[s]), float(delta[s])) for s in order}
    return _Priced(compute, comm, delta, tuple(order), steps)


def _ruled_out(delta: float, peak: int, solved: Solved, items: list[int]) -> str | None:
    """Why the solver did not take an alternative of ``delta`` seconds and ``peak`` bytes."""
    limit = solved.memory_limit
    if limit is not None and peak > limit:
        return f"exceeds the memory limit {fmt_bytes(limit)} by {fmt_bytes(peak - limit)}"
    if delta > 0 or abs(delta) <= 1e-9 * max(abs(solved.objective_s), 1e-9):
        return None  # slower, or as fast (a tie the solver broke)
    shared = max((solved.shared[i] for i in items), default=1) if solved.shared else 1
    if shared > 1:
        return (
            f"shares one ILP variable with {shared - 1} other item(s) of the same structure (repeated layers, "
            "elementwise followers), which take one strategy together; --no-shrink gives each its own"
        )
    if solved.status != "optimal":
        return f"the solver stopped ({solved.status}, gap {solved.gap:.2%}) before it found this"
    gap = max(REL_GAP, solved.gap)  # a held-buffer round stops at a wider gap (milp.HELD_GAP)
    if -delta <= gap * abs(solved.objective_s):
        return f"cheaper by less than the gap the solver stops at ({gap:.2%} of the objective)"
    return "cheaper and within every constraint: the solver missed it (please report this plan)"


class _Pricer:
    """Prices moving one item (and its tied partner) to another strategy: the objective's compute
    and redistribution, the predicted step, the memory peak."""

    def __init__(
        self, problem: Problem, choice: list[int], plan_share_bytes: int, costs: CostModel | None = None
    ) -> None:
        self.p = problem
        self.costs = problem.costs if costs is None else costs  # the objective's, at the solver's bucket share
        self.choice = choice
        self.work = list(choice)  # choice with some items moved, restored after each use
        self.plan_share = plan_share_bytes
        self.incident: dict[int, list[Edge]] = {}
        for e in problem.edges:
            self.incident.setdefault(e.src, []).append(e)
            self.incident.setdefault(e.dst, []).append(e)
        self.partner: dict[int, int] = {}
        for a, b in problem.ties:
            self.partner[a], self.partner[b] = b, a
        prof = problem.memory.profile(choice)
        self.prof = prof
        self.peak = int(prof.max()) if len(prof) else 0
        # the peak before / from each position: max(prof[:k]) and max(prof[k:])
        self.before = np.concatenate([[-np.inf], np.maximum.accumulate(prof)])
        self.after = np.concatenate([np.maximum.accumulate(prof[::-1])[::-1], [-np.inf]])
        self._range_max = _RangeMax(prof)
        self.ranges: dict[int, list[tuple[Value, int, int]]] = {}
        for v, i, a, b in problem.memory.live_ranges():
            self.ranges.setdefault(i, []).append((v, a, b))
        self.transients: dict[int, list[tuple[int, np.ndarray]]] = {}
        for i, at, sizes in problem.memory.transient_terms():
            self.transients.setdefault(i, []).append((at, sizes))
        # The plan redistributes a value once per (spec read in, read phase): the first edge in
        # program order of each such key that moves anything (src != dst) pays, and a ZeRO-3
        # regather pays every time (collectives.redistribution_steps). Moving an item changes
        # only its own edges, so the keys they leave or join are all a step delta needs.
        self.regathered = set(problem.gathers)
        self.position = {id(e): k for k, e in enumerate(problem.edges)}
        self._spec_ids: dict[int, int] = {}  # id(spec tuple) -> a small int per distinct spec
        self._spec_values: dict[Spec, int] = {}
        self._partial: list[bool] = []  # per spec id: has a P (an all-reduce may start from it)
        self._zero_split: list[bool] = []  # per spec id: split along a ZeRO axis (a regather gathers it)
        self.mesh_shape = tuple(problem.mesh.shape)
        self._nbytes: dict[tuple[int, int], int] = {}  # (id(value), spec id) -> bytes per device
        self._item_bytes: dict[tuple[int, int, int], int] = {}  # (id(value), item, strategy) -> bytes
        # per Strategies object (shared by equal items): (it, per strategy the spec ids of its
        # results, and of its operands)
        self._ids: dict[int, tuple] = {}
        self._at: tuple | None = None  # _edges_at's last answer
        self._labels: dict[int, tuple] = {}  # id(Strategies) -> (it, its content's label: _label)
        self._contents: dict[tuple, int] = {}
        self.active: dict[tuple, list[Edge]] = {}  # key -> its edges that move data, in program order
        # key -> its edges that pay every time (a ZeRO-3 regather from a spec split along a ZeRO
        # axis), in program order: with the first of ``active``, the only ones of a key that pay
        self.again: dict[tuple, list[Edge]] = {}
        for e in problem.edges:
            key, moves, src = self._read(e)
            if moves:
                self.active.setdefault(key, []).append(e)
                if (e.src, e.dst) in self.regathered and self._zero_split[src]:
                    self.again.setdefault(key, []).append(e)
        # per value (by id): a label of its readers that move data, by (spec read in, phase) and
        # how many (``context``: the counts ``_counted_per_edge`` reads)
        readers: dict[int, list] = {}
        for (value, dst, phase), moving in self.active.items():
            readers.setdefault(value, []).append((dst, phase, len(moving)))
        labels: dict[tuple, int] = {}
        self._sharing = {v: labels.setdefault(tuple(sorted(r)), len(labels)) for v, r in readers.items()}
        self._keys: dict[tuple[int, str], list[int]] = {}  # (id(value), phase) -> spec ids of its keys
        for value, dst, phase in self.active:
            self._keys.setdefault((value, phase), []).append(dst)

    def _spec_id(self, spec: Spec) -> int:
        got = self._spec_ids.get(id(spec))  # strategies hold their specs for the problem's life
        if got is None:
            got = self._spec_values.get(spec)
            if got is None:
                got = self._spec_values[spec] = len(self._spec_values)
                self._partial.append(any(q.kind == "P" for q in spec))
                self._zero_split.append(any(spec[a].is_split for a in self.p.zero_axes))
            self._spec_ids[id(spec)] = got
        return got

    def _read(self, e: Edge) -> tuple[tuple, bool, int]:
        """(the key of the redistribution ``e`` shares: value, spec read in, phase; whether it moves
        data; the id of its source spec) under ``work``: the chosen plan, or an alternative."""
        src = self._ids_of(e.src)[1][self.work[e.src]][e.src_out]
        dst = self._ids_of(e.dst)[2][self.work[e.dst]][e.dst_in]
        return (id(e.value), dst, e.phase), src != dst, src

    def _ids_of(self, item: int) -> tuple:
        """(the item's Strategies, per strategy the spec ids of its results, of its operands)."""
        strategies = self.p.items[item].strategies
        got = self._ids.get(id(strategies))
        if got is None or got[0] is not strategies:
            outs = [tuple(self._spec_id(q) for q in st.out_specs) for st in strategies]
            ins = [tuple(self._spec_id(q) for q in st.in_specs) for st in strategies]
            got = self._ids[id(strategies)] = (strategies, outs, ins)
        return got

    def _label(self, i: int) -> int:
        """A small int per distinct content of item ``i``'s strategies, as pricing reads it: the
        compute times, the spec ids of every result and operand (and so the item's rows and
        columns of its edges' tables), which recompute. Remembered per Strategies object (the
        fused nodes of repeated layers each have one of their own, with equal content)."""
        strategies = self.p.items[i].strategies
        got = self._labels.get(id(strategies))
        if got is None or got[0] is not strategies:
            _it, outs, ins = self._ids_of(i)
            content = (
                strategies.compute_times.tobytes(),
                tuple(outs),
                tuple(ins),
                tuple(st.recompute for st in strategies),
            )
            got = self._labels[id(strategies)] = (strategies, self._contents.setdefault(content, len(self._contents)))
        return got[1]

    def partner_of(self, i: int) -> list[int]:
        return [self.partner[i]] if i in self.partner else []

    def moved(self, i: int, s: int) -> dict[int, int]:
        """{item: strategy} of the alternative: ``i`` at ``s``, its tied partner at the same index."""
        return {i: s, **{j: s for j in self.partner_of(i)}}

    def objective_deltas(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(compute, redistribution) of the objective, per strategy of ``i``, minus the chosen's."""
        p, choice = self.p, self.choice
        if i not in self.partner:  # one row of each edge's cost table
            comm = np.zeros(len(p.items[i].strategies))
            for e in self.incident.get(i, []):
                comm += self.costs.edge_times_at(e, i, choice)
            compute = self.costs.compute_times(i)
            return compute - compute[choice[i]], comm - comm[choice[i]]
        j = self.partner[i]
        edges = list({id(e): e for e in (*self.incident.get(i, []), *self.incident.get(j, []))}.values())
        now = sum(self.costs.edge_time(e, choice[e.src], choice[e.dst]) for e in edges)
        n = len(p.items[i].strategies)
        compute = self.costs.compute_times(i) + self.costs.compute_times(j)
        comm = np.zeros(n)
        for s in range(n):
            at = {i: s, j: s}
            comm[s] = sum(
                self.costs.edge_time(e, at.get(e.src, choice[e.src]), at.get(e.dst, choice[e.dst])) for e in edges
            )
        return compute - compute[choice[i]], comm - now

    def peak_with(self, moved: dict[int, int]) -> int:
        """The liveness peak per device with the ``moved`` items at their strategies: the chosen
        profile, plus the change of their values' bytes over their live ranges."""
        p, choice = self.p, self.choice
        changes: list[tuple[int, int, float]] = []  # (first, last position, bytes)
        for item, s in moved.items():
            c = choice[item]
            for v, a, b in self.ranges.get(item, []):
                old, new = self._bytes(v, item, c), self._bytes(v, item, s)
                ranges = p.memory.ranges_under
                if old == new and ranges(v, item, c, a, b) == ranges(v, item, s, a, b):
                    continue
                changes += [(x, y, -old) for x, y in ranges(v, item, c, a, b)]
                changes += [(x, y, new) for x, y in ranges(v, item, s, a, b)]
            for at, sizes in self.transients.get(item, []):
                changes.append((at, at, float(sizes[s] - sizes[c])))
        changes = [x for x in changes if x[2]]
        if not changes:
            return self.peak
        lo = min(x for x, _y, _n in changes)
        hi = max(y for _x, y, _n in changes)
        outside = max(self.before[lo], self.after[hi + 1])  # the peak away from the changes
        growth = sum(nb for _x, _y, nb in changes if nb > 0)
        if growth == 0 and outside >= self.peak:
            return self.peak  # nothing grows, and the peak lies away from the changes
        if self._range_max(lo, hi) + growth <= outside:
            return int(outside)  # even all growth at the highest point stays below it
        # the changes add a step function to the profile: per step, its highest point plus the step
        steps: dict[int, float] = {}
        for x, y, nb in changes:
            steps[x] = steps.get(x, 0.0) + nb
            steps[y + 1] = steps.get(y + 1, 0.0) - nb
        bounds = sorted(steps)
        inside, level = -np.inf, 0.0
        for first, end in zip(bounds, bounds[1:]):
            level += steps[first]
            inside = max(inside, self._range_max(first, end - 1) + level)
        return int(max(inside, self.before[lo], self.after[hi + 1]))

    def _bytes(self, v: Value, item: int, s: int) -> int:
        """``MemoryModel.value_bytes``, remembered by value, item and strategy, and by value and spec."""
        at = (id(v), item, s)
        known = self._item_bytes.get(at)
        if known is not None:
            return known
        spec = self.p.memory.value_spec(v, item, s)
        key = (id(v), self._spec_id(spec))
        got = self._nbytes.get(key)
        if got is None:
            got = self._nbytes[key] = local_nbytes(v.type, spec, self.mesh_shape)
        self._item_bytes[at] = got
        return got

    def step_delta(self, moved: dict[int, int], compute_delta: float, delta: float) -> float:
        """The predicted step's change (``delta``: the objective's). The two differ only where the
        plan counts a redistribution otherwise than the objective's one per edge: an edge whose
        redistribution another edge shares (same value, spec read in and phase: only the first
        pays), a ZeRO-3 regather, a deferred all-reduce (priced in the buckets the plan fills).
        For those the plan's redistributions of the moved items' edges, and of the edges that
        share one with them, are counted before and after the move."""
        mine, before = self._edges_at(tuple(moved))
        for i, s in moved.items():
            self.work[i] = s
        try:
            after = [self._read(e) for e in mine]
            if self._counted_per_edge(mine, before, after):
                return delta
            mine_ids = {id(e): e for e in mine}
            edges = dict(mine_ids)
            for key, _moves, _src in before + after:
                edges.update((id(e), e) for e in self._payers(key, mine_ids))
            ordered = sorted(edges.values(), key=lambda e: self.position[id(e)])
            then = self._seconds(ordered)
        finally:
            for i in moved:
                self.work[i] = self.choice[i]
        return compute_delta + then - self._seconds(ordered)

    def context(self, i: int) -> tuple:
        """What pricing item ``i``'s alternatives reads, other than where its values live: two
        items of equal context have equal ``objective_deltas`` and equal ``step`` results for
        every strategy. Per moved item (``i``, and its tied partner, which moves with it): its
        strategies (``_label``), choice and whether it may be recomputed; per edge at them, in
        the order ``step`` reads them: which moved item each end is (or neither), the cost table
        (one object per distinct table), both ends' table indices and spec ids under the plan,
        the operand and result it joins, deferred, phase, regathered, which of the moved items'
        values it carries, and how the value's readers that move data share its redistributions
        (``_sharing``); per value and phase they carry, the edges of each redistribution key that
        may pay (``_payers``: their specs, deferred, regathered, and where they fall among the
        moved items' edges in program order)."""
        moved = (i, *self.partner_of(i))
        choice = self.choice
        parts: list = [(self._label(m), choice[m], m in self.p.remat) for m in moved]
        mine = list({id(e): e for m in moved for e in self.incident.get(m, ())}.values())
        mine_ids = {id(e): e for e in mine}
        values: dict[int, int] = {}
        phases: dict[tuple[int, str], None] = {}
        for e in mine:
            table, ui, vi = self.costs.edge_table(e)
            (_v, dst, _phase), _moves, src = self._read(e)
            parts.append(
                (
                    moved.index(e.src) if e.src in moved else -1,
                    moved.index(e.dst) if e.dst in moved else -1,
                    id(table),
                    int(ui[choice[e.src]]),
                    int(vi[choice[e.dst]]),
                    src,
                    dst,
                    e.src_out,
                    e.dst_in,
                    e.deferred,
                    e.phase,
                    (e.src, e.dst) in self.regathered,
                    values.setdefault(id(e.value), len(values)),
                    self._sharing.get(id(e.value), -1),
                )
            )
            phases[(id(e.value), e.phase)] = None
        # the program order of the moved items' edges and the payers: the order ``step`` sums in
        order = [(self.position[id(e)], k) for k, e in enumerate(mine)]
        for value, phase in phases:
            for dst in self._keys.get((value, phase), ()):
                for e in self._payers((value, dst, phase), mine_ids):
                    order.append((self.position[id(e)], len(parts)))
                    parts.append(
                        (values[value], phase, dst, self._read(e)[2], e.deferred, (e.src, e.dst) in self.regathered)
                    )
        parts.append(tuple(k for _position, k in sorted(order)))
        return tuple(parts)

    def _payers(self, key: tuple, mine: dict[int, Edge]) -> list[Edge]:
        """The edges of ``key`` (``active``) other than ``mine`` that may pay in the plan, before
        or after a move of ``mine``'s items: the first of them (it pays when none of ``mine``
        comes first) and the regathers (they pay every time). The others never pay either way
        (``redistribution_steps`` skips them), so leaving them out keeps the sum, term for term,
        and a value read in one spec by every layer costs per move what one reader does."""
        first = next((e for e in self.active.get(key, ()) if id(e) not in mine), None)
        payers = [] if first is None else [first]
        return payers + [e for e in self.again.get(key, ()) if id(e) not in mine and e is not first]

    def _edges_at(self, items: tuple[int, ...]) -> tuple[list[Edge], list]:
        """(the edges at ``items``, how the chosen plan reads each: ``_read``), remembered for the
        last items asked about (an item's alternatives are priced one after another)."""
        if self._at is None or self._at[0] != items:
            mine = list({id(e): e for i in items for e in self.incident.get(i, [])}.values())
            self._at = (items, mine, [self._read(e) for e in mine])
        return self._at[1], self._at[2]

    def _counted_per_edge(self, mine: list[Edge], before: list, after: list) -> bool:
        """Whether the plan counts the redistributions of ``mine`` (the moved items' edges) as the
        objective does, before and after the move: no deferred all-reduce (a deferred edge from a
        partial sum), no ZeRO-3 regather (from a spec split along a ZeRO axis), and none sharing
        its key with another edge that moves data."""
        for e, (_k, _m, src_before), (_k2, _m2, src_after) in zip(mine, before, after):
            if e.deferred and (self._partial[src_before] or self._partial[src_after]):
                return False
            if (e.src, e.dst) in self.regathered and (self._zero_split[src_before] or self._zero_split[src_after]):
                return False
        moving_before: dict[tuple, int] = {}
        for key, moves, _src in before:
            moving_before[key] = moving_before.get(key, 0) + moves
        for state in (before, after):
            count: dict[tuple, int] = {}
            for key, moves, _src in state:
                count[key] = count.get(key, 0) + moves
            for key, n in count.items():
                others = len(self.active.get(key, ())) - moving_before.get(key, 0)  # not moved
                if n and n + others > 1:
                    return False
        return True

    def _seconds(self, edges: list[Edge]) -> float:
        steps = redistribution_steps(self.p, self.work, edges, self.plan_share, self.regathered)
        return sum(t for _e, _st, t in steps)


class _RangeMax:
    """``max(values[a : b + 1])`` in constant time (a sparse table: the maxima of every run of
    2**k values), so a memory peak under a move costs per live range it changes, not per
    program position."""

    def __init__(self, values: np.ndarray) -> None:
        self.levels = [np.asarray(values, dtype=np.float64)]
        width = 1
        while 2 * width <= len(values):
            last = self.levels[-1]
            self.levels.append(np.maximum(last[:-width], last[width:]))
            width *= 2

    def __call__(self, a: int, b: int) -> float:
        k = (b - a + 1).bit_length() - 1
        level = self.levels[k]
        return float(max(level[a], level[b - (1 << k) + 1]))


def ruled_out_specs(problem: Problem, i: int, spec: Spec, tied: Collection[int] | None = None) -> tuple[RuledOut, ...]:
    """The specs of input item ``i`` one mesh axis away from ``spec`` (R or an even S(d) there)
    that are not among its strategies, each with why the planner did not generate it.
    ``tied``: the items of ``problem.ties`` (a set, for callers that ask for every input)."""
    if tied is None:
        tied = {k for tie in problem.ties for k in tie}
    it = problem.items[i]
    v = it.value
    assert v is not None  # an input item holds its value
    have = {st.out_specs[0] for st in it.strategies}
    out: list[RuledOut] = []
    for a, n in enumerate(problem.mesh.shape):
        if n == 1:
            continue
        for q in (R, *(S(d) for d in range(v.type.ndim))):
            cand = spec[:a] + (q,) + spec[a + 1 :]
            if cand in have or any(r.spec == cand for r in out):
                continue
            if q.is_split and any(x.is_split and x.dim == q.dim for b, x in enumerate(spec) if b != a):
                continue  # not a spec: a dim splits over one axis
            out.append(RuledOut(spec=cand, reason=_why_not(problem, i, a, q, cand, tied)))
    return tuple(out)


def _why_not(problem: Problem, i: int, a: int, q, cand: Spec, tied: Collection[int]) -> str:
    """Why input item ``i`` has no strategy with spec ``cand`` (``q`` on axis ``a``)."""
    it = problem.items[i]
    v = it.value
    assert v is not None
    name, n = problem.mesh.axis_names[a], problem.mesh.shape[a]
    if it.pinned:
        return f"pinned to {it.pinned}"
    roles = problem.roles
    if q.is_split:
        size = v.type.shape[q.dim]
        if size % n:
            return f"not divisible: dim {q.dim} has size {size}, which {name}={n} does not split evenly"
        if roles is not None and not roles.allows(a, v, q.dim):
            role = roles.roles[a]
            if v in roles.state:
                hint = (
                    "zero='auto' or 1-3 (--zero auto|1|2|3) lets ZeRO shard a training step's state along it"
                    if problem.zero == 0
                    else "ZeRO shards state only where a training step updates it, and this graph has no update"
                )
                return f"axis role: {name} is a {role} axis, which splits no model state ({hint})"
            kind = "batch" if RESTRICTED[role] == BATCH else "sequence"
            return f"axis role: {name} is a {role} axis, which splits only {kind} dims (--free-axes lifts the roles)"
        if a in problem.zero_axes and any(st.out_specs[0][a].is_split for st in it.strategies):
            kept = next(format_spec(st.out_specs[0]) for st in it.strategies if st.out_specs[0][a].is_split)
            return f"ZeRO shards state along its lowest dim that splits evenly ({kept}): any dim saves the same"
    if problem.zero in (1, 2, 3) and a in problem.zero_axes:
        return f"zero={problem.zero} keeps only the specs of ZeRO stage {problem.zero}"
    if i in tied:
        return "its tied output (the state returned updated) cannot be returned in it"
    return "not a candidate: the planner splits only dims some op's sharding rule can split"


__all__ = ["TOP", "Solved", "find_alternatives", "ruled_out_specs"]
