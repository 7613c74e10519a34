"""Solve the auto-sharding problem, shrunk, exactly with an integer linear program.

Shrinking (``shrink=True``; passes/sharding/groups.py) puts items into *groups* that share one strategy variable; each
member maps the group's strategy index to its own:

* **tying repeated structure**: items that are indistinguishable after a few rounds of
  Weisfeiler-Lehman refinement (op, attributes, types, source line, part, strategies, and the
  same of their neighbours) share a variable: the 12 (or 48) blocks of a transformer, built by
  one Python loop, become one block's worth of variables, plus the few boundary nodes whose
  neighbourhood differs;
* **followers** (only when tying leaves more than FOLLOW_ABOVE_GROUPS groups): an elementwise
  or shape node follows the producer of its largest operand: for
  each of the producer group's strategies it takes its cheapest strategy that reads that operand
  as it is (no redistribution); a node that cannot follow every choice keeps its own variable,
  and so does one whose producer may leave a partial sum (carry it on, or reduce it first?).

Tying and following are the usual heuristics (Alpa merges followers too); with ``shrink=False``
every item has its own variable and the ILP is exact for the cost model (tested against
exhaustive search).

ILP (HiGHS by default, see milp.py and docs/solver.md for the measurements): one-hot binaries
``x[g, s]``; for every pair of groups joined by edges, continuous ``y[s, t] >= 0`` with
``sum_t y[s, t] = x[g, s]`` and ``sum_s y[s, t] = x[h, t]`` (the tight linearization of
``x[g, s] * x[h, t]``, over classes of strategies the edges cannot tell apart); objective =
compute + redistribution time. A local search seeds the incumbent, so a time limit that
runs out still leaves a plan, with its proven gap. The
per-device memory limit is enforced lazily: solve, measure the plan's liveness peak, add the
constraint "live bytes at that program point <= limit", solve again, until the plan fits. When
no plan fits, a second ILP (minimize the peak, same lazy points) finds the smallest memory that
any plan needs, and ``MemoryLimitError`` names it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from graphc.core.collector import collector_paused
from graphc.core.errors import MemoryLimitError, TimeLimitError
from graphc.core.ir import Value
from graphc.core.units import fmt_bytes
from graphc.passes.sharding.groups import Group
from graphc.passes.sharding.memrows import (
    REPAIR_SHARE,
    TIME_SHARE,
    add_lp_rows,
    add_run_rows,
    held_over,
    lp_start,
    repaired,
    smallest_bytes,
)
from graphc.passes.sharding.milp import FOUND_KEPT, HELD_GAP, REL_GAP, Milp, solve_milp
from graphc.passes.sharding.offload_terms import OffloadTerms, use
from graphc.passes.sharding.problem import Problem


@dataclass
class Solution:
    choice: list[int]  # strategy per item
    objective: float
    status: str
    bound: float
    gap: float
    seconds: float
    stats: dict = field(default_factory=dict)
    shared: list[int] = field(default_factory=list)  # per item: the items sharing its ILP variable, itself included
    offload: tuple = ()  # the parameters whose optimizer state is in host memory (offload_terms.py)


# --- ILP -----------------------------------------------------------------------------------------
DISTINCT_TIE_ROWS = True  # equal tie rows added once (``_Model._add_ties``; tests compare optima without)


def objective_terms(p: Problem, groups: list[Group], of: list[int]):
    """Per-group cost vectors and per-group-pair edge matrices.

    Repeated layers make most terms repeats: the items of a tied group share one strategy map,
    and their edges share cost tables (``CostModel.edge_table``), so equal terms are counted first
    and each distinct one is added once, times its count (``_edge_sums``)."""
    maps = {}
    for g in groups:
        for i, m in g.members:
            maps[i] = m
    vec = _compute_vectors(p, groups, of, maps)
    pair = _edge_sums(p, groups, of, maps, vec)
    fold_single_sides(groups, vec, pair)
    return vec, pair, maps


def fold_single_sides(groups: list[Group], vec: list[np.ndarray], pair: dict) -> None:
    """Fold each pair matrix with a single-strategy side into the other side's vector (in place)."""
    for gu, gv in list(pair):
        m = pair[(gu, gv)]
        if groups[gu].size == 1:
            vec[gv] += m[0]
            del pair[(gu, gv)]
        elif groups[gv].size == 1:
            vec[gu] += m[:, 0]
            del pair[(gu, gv)]


def _edge_sums(p: Problem, groups: list[Group], of: list[int], maps: dict, vec: list[np.ndarray]) -> dict:
    """{(gu, gv): matrix, gu < gv} of the edges' redistribution times between two groups (an edge
    within one group adds its diagonal to ``vec``), every edge of the problem at once.

    An edge's *term* is told apart by (its ends' groups, its cost table, its ends' Strategies
    objects, result and operand, its ends' maps): equal terms are counted, and each distinct one
    adds its count times its part of the table (the table's rows and columns for the groups'
    strategies) to its pair's matrix, the terms in the order first met, each entry's additions one
    by one (``np.add.at``): the sums a loop over the terms makes, to the bit. Tables are looked up
    once per (ends' strategy tuples, shared by repeated layers' fused nodes, problem.py ``_fused``;
    result and operand; type; deferral). The keys are rows of object ids and small integers,
    numbered for all edges at once (``_numbered``)."""
    items, edges = p.items, p.edges
    if not edges:
        return {}
    n = len(items)
    strategies = [it.strategies for it in items]
    mapped = _ids([maps[i] for i in range(n)])
    item = _numbered([np.asarray(of, dtype=np.int64), _ids(strategies), mapped])
    tup = _numbered([_ids([s.as_tuple for s in strategies])])
    src = np.array([e.src for e in edges], dtype=np.int64)
    dst = np.array([e.dst for e in edges], dtype=np.int64)
    src_out = np.array([e.src_out for e in edges], dtype=np.int64)
    dst_in = np.array([e.dst_in for e in edges], dtype=np.int64)
    deferred = np.array([e.deferred for e in edges], dtype=np.int64)
    types = [e.value.type for e in edges]
    at, by_object = np.unique(_ids(types), return_index=True, return_inverse=True)[1:]
    equal: dict = {}  # equal types, one number (types are mostly shared objects: few distinct)
    kind = np.array([equal.setdefault(types[k], len(equal)) for k in at.tolist()], dtype=np.int64)[by_object]
    made = _numbered([tup[src], src_out, tup[dst], dst_in, kind, deferred])
    firsts, which = np.unique(made, return_index=True, return_inverse=True)[1:]
    tables: list = [None] * len(firsts)
    for j in np.argsort(firsts).tolist():  # looked up in the order of the edges
        tables[j] = p.costs.edge_table(edges[int(firsts[j])])
    table = _numbered([_ids([t[0] for t in tables])])
    key = _numbered([item[src], src_out, item[dst], dst_in, table[which]])
    first, count = np.unique(key, return_index=True, return_counts=True)[1:]
    order = np.argsort(first, kind="stable")  # the terms in the order first met
    first, count = first[order], count[order]
    w = which[first]  # per term: its table lookup
    gu, gv = np.asarray(of, dtype=np.int64)[src[first]], np.asarray(of, dtype=np.int64)[dst[first]]
    # per term: its part, (table, rows, cols): rows = the producer index at the producer's map
    ui_id = _ids([t[1] for t in tables])[w]
    vi_id = _ids([t[2] for t in tables])[w]
    part = _numbered([table[w], ui_id, mapped[src[first]], vi_id, mapped[dst[first]]])
    for k in np.flatnonzero(gu == gv).tolist():  # within one group: the diagonal, into its vector, in order
        e = edges[int(first[k])]
        small, ui, vi = tables[int(w[k])]
        vec[int(gu[k])] += int(count[k]) * small[ui[maps[e.src]], vi[maps[e.dst]]]
    nonzero = np.zeros(int(part.max()) + 1, dtype=bool)
    subs: dict[int, np.ndarray] = {}  # part number -> its matrix (the parts of repeated layers repeat)
    for k in np.unique(part, return_index=True)[1].tolist():
        small, ui, vi = tables[int(w[k])]
        e = edges[int(first[k])]
        sub = subs[int(part[k])] = small[ui[maps[e.src]][:, None], vi[maps[e.dst]]]
        nonzero[part[k]] = sub.any()
    kept = np.flatnonzero((gu != gv) & nonzero[part])  # the terms between two groups whose part is not all 0
    if not len(kept):
        return {}
    flip = gu[kept] > gv[kept]
    lo, hi = np.where(flip, gv[kept], gu[kept]), np.where(flip, gu[kept], gv[kept])
    pair_of = _numbered([lo, hi])
    numbers, slot_first, slot = np.unique(pair_of, return_index=True, return_inverse=True)
    rank = np.empty(len(numbers), dtype=np.int64)
    rank[np.argsort(slot_first, kind="stable")] = np.arange(len(numbers))  # pairs in the order first met
    slot = rank[slot]
    sizes = np.array([g.size for g in groups], dtype=np.int64)
    firsts_of = np.sort(slot_first)
    shapes = list(zip(sizes[lo[firsts_of]].tolist(), sizes[hi[firsts_of]].tolist()))
    keys = list(zip(lo[firsts_of].tolist(), hi[firsts_of].tolist()))
    # each (part, transposed or not) once, its entries in a row, in its pair's orientation
    oriented = _numbered([part[kept], flip.astype(np.int64)])
    distinct, one, which_one = np.unique(oriented, return_index=True, return_inverse=True)
    rows = []
    for k, f in zip(kept[one].tolist(), flip[one].tolist()):
        sub = subs[int(part[k])]
        rows.append((sub.T if f else sub).ravel())
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    start = (np.cumsum(lengths) - lengths)[which_one]
    return _ordered_sums(dict(zip(keys, range(len(keys)))), shapes, np.concatenate(rows), start, count[kept], slot)


def _ids(objects: list) -> np.ndarray:
    return np.array([id(x) for x in objects], dtype=np.int64)


def _numbered(columns: list[np.ndarray]) -> np.ndarray:
    """Per row of these integer columns, a number from 0 up, equal exactly when the rows are: the
    rows by mixed radix of their columns (renumbered from 0 before the radix would pass 2**62, and
    at the end), in the rows' lexicographic order. A column of small non-negative integers (edge
    ends, numbers made here) is its own digit; others (object ids) are numbered by their distinct
    values first (the same order: numbering keeps it)."""
    code = np.zeros(len(columns[0]), dtype=np.int64)
    size = 1
    for col in columns:
        col = np.asarray(col, dtype=np.int64)
        if len(col) and 0 <= col.min() and col.max() < 4 * len(col) + 16:
            radix = int(col.max()) + 1
        else:
            distinct, col = np.unique(col, return_inverse=True)
            radix = len(distinct)
        if size * radix >= 2**62:
            code = np.unique(code, return_inverse=True)[1]
            size = int(code.max()) + 1
        code = code * radix + col.reshape(-1)
        size *= radix
    return np.unique(code, return_inverse=True)[1].reshape(-1)


def _starts(lengths: np.ndarray) -> np.ndarray:
    """Per entry of segments of these lengths laid end to end, its position in its segment."""
    return np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def _ordered_sums(slot: dict, shapes: list[tuple[int, int]], pool: np.ndarray, start, counts, at) -> dict:
    """{group pair: matrix} of the terms ``counts[t]`` times the entries of ``pool`` from
    ``start[t]`` on (as many as the matrix has, in a row) of pair number ``at[t]``: per pair its
    first term, plus each later one in order (``np.add.at`` adds an entry's terms one by one, in
    the order given: the same sums, to the bit, as ``m = m + term`` term by term)."""
    where = np.asarray(at, dtype=np.int64)
    if not len(where):
        return {}
    sizes = np.array([r * c for r, c in shapes], dtype=np.int64)
    offset = np.cumsum(sizes) - sizes
    lengths = sizes[where]
    inside = _starts(lengths)
    dst = np.repeat(offset[where], lengths) + inside
    val = pool[np.repeat(np.asarray(start, dtype=np.int64), lengths) + inside]
    val = val * np.repeat(np.asarray(counts, dtype=np.float64), lengths)
    first = np.zeros(len(where), dtype=bool)  # each pair's first term is its matrix, the later ones are added
    first[np.unique(where, return_index=True)[1]] = True
    once = np.repeat(first, lengths)
    out = np.zeros(int(sizes.sum()))
    out[dst[once]] = val[once]
    np.add.at(out, dst[~once], val[~once])
    return {key: out[offset[k] : offset[k] + sizes[k]].reshape(shapes[k]) for key, k in slot.items()}


def _compute_vectors(p: Problem, groups: list[Group], of: list[int], maps: dict) -> list[np.ndarray]:
    """Per group: the compute time of its members under each of its strategies, summed (in the
    members' order, each distinct term once times its count, all in one ``np.add.at``). Terms are
    told apart by their items' Strategies objects (each holds compute times of its own,
    ``Strategies.compute_times``); a term's values, its times at its map, are equal for every
    object over one strategy tuple with that map: read once per (strategy tuple, map), which
    repeated layers share, and laid out for all terms at once."""
    items = p.items
    sizes = np.array([g.size for g in groups], dtype=np.int64)
    offset = np.cumsum(sizes) - sizes
    out = np.zeros(int(sizes.sum()))
    if maps:
        # a term per distinct (group, Strategies object, map), numbered for all members at once,
        # in the order first met, with its count
        member = list(maps)
        strategies = [items[i].strategies for i in member]
        map_ids = _ids(list(maps.values()))
        group = np.asarray(of, dtype=np.int64)[member]
        term = _numbered([group, _ids(strategies), map_ids])
        first, count = np.unique(term, return_index=True, return_counts=True)[1:]
        order = np.argsort(first, kind="stable")
        first, count = first[order], count[order]
        # per term, its values' number: its (strategy tuple, map), whose values are made once
        shape = _numbered([_ids([strategies[k].as_tuple for k in first.tolist()]), map_ids[first]])
        by_tuple: dict[int, np.ndarray] = {}
        values = []
        for k in first[np.unique(shape, return_index=True)[1]].tolist():
            key = id(strategies[k].as_tuple)
            t = by_tuple.get(key)
            t = t if t is not None else by_tuple.setdefault(key, p.costs.compute_times(member[k]))
            values.append(t[maps[member[k]]])
        vlen = np.array([len(v) for v in values], dtype=np.int64)  # a value per group strategy
        lengths = vlen[shape]
        inside = _starts(lengths)
        val = np.concatenate(values)[np.repeat((np.cumsum(vlen) - vlen)[shape], lengths) + inside]
        val = val * np.repeat(count.astype(np.float64), lengths)
        np.add.at(out, np.repeat(offset[group[first]], lengths) + inside, val)
    return [out[a : a + s] for a, s in zip(offset.tolist(), sizes.tolist())]


@collector_paused()
def solve(
    p: Problem,
    groups: list[Group],
    of: list[int],
    memory_limit: int | None = None,
    time_limit_s: float = 60.0,
    solver_name: str = "highs",
    progress=None,
    offload: bool | str = False,
) -> Solution:
    """The cheapest assignment of strategies to ``groups`` (from ``shrink_groups``) under the memory
    limit, by the ILP described in the module docstring, within ``time_limit_s`` seconds in all.

    When time runs out the best plan found so far is returned (status "time limit", with its
    proven gap); a local search seeds the solver, so there is always one unless memory rules
    every plan out."""
    start = time.perf_counter()
    deadline = start + time_limit_s
    vec, pair, maps = objective_terms(p, groups, of)
    sizes = [len(it.strategies) for it in p.items]
    stats = {
        "items": len(p.items),
        "edges": len(p.edges),
        "vars_unshrunk": sum(sizes) + sum([sizes[e.src] * sizes[e.dst] for e in p.edges]),
        "groups": len(groups),
        "group_edges": len(pair),
    }
    if progress:
        progress(f"ILP: {len(p.items)} items -> {len(groups)} groups, {len(pair)} group edges")
    model = _Model(p, groups, of, vec, pair, maps, solver_name, offload=offload)
    stats["variables"] = model.milp.n
    stats["constraints"] = model.milp.num_rows
    points: list[int] = []
    # the relaxation first (memrows.py): its rows, its plan; before the local search, which takes
    # no time limit, so that a short limit goes to the LP (its plan is often optimal: 0.4 s at
    # 1,000 layers, the local search's 0.5 s then leaving it none, and its plan 16% off)
    left = deadline - time.perf_counter()
    if memory_limit is not None:
        stats["lp_memory_points"] = add_lp_rows(model, memory_limit, TIME_SHARE * left, points)
    else:  # all the time left: the integer solve would need this LP at its root too
        lp_start(model, left)
    guess = model.local_search()
    sol = model.run(deadline - time.perf_counter(), guess)
    reserved: set[tuple[int, int]] = set()  # (point, buffer bytes) rows added for redistribution buffers
    fits: Solution | None = None  # the last plan whose values fit the limit
    if memory_limit is not None:
        for _round in range(100):
            if sol is None:
                break
            peak, at = p.memory.peak(sol.choice)
            room = memory_limit
            if peak <= memory_limit:
                fits = sol  # the values fit: the redistribution buffers are bounded where it can be done
                # the buffers held at each peak over the limit take their room off its row (this plan's
                # buffers: the row may rule out a plan with fewer there, so when no plan is left, or
                # only ones over the limit, the last plan whose values fit stands, docs/remat.md)
                held = [h for h in held_over(p, sol.choice, memory_limit) if h[1:] not in reserved]
                if not held:
                    break
                reserved.update(h[1:] for h in held)
                for _peak, at, buffers in held[1:]:  # all of this plan's held peaks in one round
                    points.append(at)
                    model.add_memory_point(at, memory_limit - buffers)
                peak, at, buffers = held[0]
                room = memory_limit - buffers
            elif sol.status != "optimal" or at in points:
                raise TimeLimitError(
                    f"the time limit ran out before a plan within {fmt_bytes(memory_limit)} per device was found "
                    f"(the best so far needs {fmt_bytes(peak)}; the solver had {time_limit_s:.1f} s): raise the time limit"
                )
            points.append(at)
            model.add_memory_point(at, room)
            if room == memory_limit:  # every other run of positions over the limit gets its row too
                add_run_rows(model, p.memory.profile(sol.choice), memory_limit, points)
            if progress:
                progress(
                    f"ILP: memory {peak / 2**20:.1f} MiB > limit at point {at}; re-solving with {len(points)} point(s)"
                )
            gap = HELD_GAP if room < memory_limit else REL_GAP  # a held round's rows are heuristic (milp.py)
            sol = model.run(deadline - time.perf_counter(), model.last_choice, sol.bound * model.SCALE, gap)
        if fits is not None and (sol is None or p.memory.peak(sol.choice)[0] > memory_limit):
            sol = fits
        if sol is None and model.last_status == "infeasible":
            minimum = min_memory(p, groups, of, maps, solver_name, max(1.0, deadline - time.perf_counter()), offload)
            raise MemoryLimitError(
                f"no plan fits in {fmt_bytes(memory_limit)} per device on mesh {p.mesh}: the smallest per-device "
                f"memory any plan needs is {fmt_bytes(minimum)} ({minimum} bytes)",
                min_memory_bytes=minimum,
            )
    if sol is None:
        raise TimeLimitError(
            f"the time limit ran out before the sharding ILP found a plan (the solver had {time_limit_s:.1f} s, "
            f"status {model.last_status}): raise the time limit"
        )
    stats["memory_points"] = len(points)
    stats["variables"] = model.milp.n
    stats["constraints"] = model.milp.num_rows
    sol.stats = stats
    members = [len(g.members) for g in groups]
    sol.shared = [members[g] for g in of]
    sol.seconds = time.perf_counter() - start
    use(p, sol.offload)  # the memory model drops what the returned plan offloads
    return sol


def _classes(m: np.ndarray) -> tuple[np.ndarray, int]:
    """Equal rows of ``m`` share a class: (class per row, number of classes), the classes numbered
    in the rows' lexicographic order, as ``np.unique(m, axis=0, return_inverse=True)`` numbers them
    (the columns' order follows it), by a stable lexsort: a fifth of its time on the small pair
    matrices here, where its structured-array set-up dominated (tests/passes/sharding/
    test_solver.py compares the two)."""
    rows = m.shape[0]
    if not rows:
        return np.zeros(0, dtype=np.intp), 0
    order = np.lexsort(m.T[::-1]) if m.shape[1] else np.arange(rows)
    ranked = m[order]
    starts = np.empty(rows, dtype=bool)
    starts[0] = True
    starts[1:] = (ranked[1:] != ranked[:-1]).any(axis=1)
    inv = np.empty(rows, dtype=np.intp)
    inv[order] = np.cumsum(starts) - 1
    return inv, int(inv[order[-1]]) + 1


class _Model:
    """The ILP of the module doc as a ``Milp``; ``run`` solves it as it stands,
    ``add_memory_point`` adds a lazy memory constraint.

    Columns: ``x[g]`` one-hot per group of more than one strategy; per pair of groups joined by
    edges, ``y[a, b]`` over the *classes* of the pair matrix: strategies of one group whose row
    (or column) of edge costs is the same are one class, as the edge cannot tell them apart, and
    ``sum_b y[a, b] = sum of x[gu, s] over the s in class a`` is still the tight linearization.
    Costs are in microseconds, memory in MiB, for well-scaled coefficients."""

    SCALE = 1e6
    MIB = float(2**20)

    def __init__(self, p, groups, of, vec, pair, maps, backend: str, priced: bool = True, offload: bool | str = False):
        self.p, self.groups, self.of, self.maps = p, groups, of, maps
        self.vec, self.pair, self.backend = vec, pair, backend
        self.last_status: str | None = None
        self.last_choice: list[int] | None = None  # per group, of the last solution
        self.found: list[np.ndarray] = []  # plans the solver found, best first: the next round's start
        self.lp_bound: float | None = None  # the LP relaxation's optimum, when solved (memrows.add_lp_rows)
        self._live: list[tuple[Value, int, int, int]] | None = None
        m = self.milp = Milp()
        self.x: list[np.ndarray | None] = []
        for v, g in zip(vec, groups):
            if g.size == 1:
                m.offset += float(v[0]) * self.SCALE
                self.x.append(None)
                continue
            xs = m.add_vars(v * self.SCALE, integer=True)
            m.add_row(xs, np.ones(len(xs)), 1.0, 1.0)
            self.x.append(xs)
        self.y: list[tuple[int, int, np.ndarray, np.ndarray, np.ndarray]] = []
        for (gu, gv), mat in sorted(pair.items()):
            self._add_pair(gu, gv, mat)
        self._add_ties()
        self._add_recompute_needs()
        self.offload = OffloadTerms(self, priced, offload)

    def _add_pair(self, gu: int, gv: int, mat: np.ndarray) -> None:
        m = self.milp
        rc, nr = _classes(mat)
        cc, nc = _classes(mat.T)
        rep_r = np.array([np.flatnonzero(rc == a)[0] for a in range(nr)])
        rep_c = np.array([np.flatnonzero(cc == b)[0] for b in range(nc)])
        ids = m.add_vars(mat[np.ix_(rep_r, rep_c)].reshape(-1) * self.SCALE, integer=False).reshape(nr, nc)
        xu, xv = self.x[gu], self.x[gv]
        assert xu is not None and xv is not None  # single-strategy sides were folded into vectors
        for a in range(nr):
            xs = xu[rc == a]
            m.add_row(np.concatenate([ids[a], xs]), np.concatenate([np.ones(nc), -np.ones(len(xs))]), 0.0, 0.0)
        for b in range(nc):
            xs = xv[cc == b]
            m.add_row(np.concatenate([ids[:, b], xs]), np.concatenate([np.ones(nr), -np.ones(len(xs))]), 0.0, 0.0)
        self.y.append((gu, gv, rc, cc, ids))

    def _add_ties(self) -> None:
        """Tied input/output items: equal strategy index (= equal spec). Each distinct row once:
        repeated layers' ties join the same two groups by the same maps (equal rows)."""
        p, maps = self.p, self.maps
        done: set[tuple] = set()
        # (groups, maps, strategies) -> the rows' (key, coefficients, constant): equal for tied layers
        made: dict[tuple, list[tuple[tuple, dict[int, float], float]]] = {}
        for a, b in p.ties:
            ga, gb = self.of[a], self.of[b]
            ends = (ga, id(maps[a]), gb, id(maps[b]), len(p.items[a].strategies))
            rows = made.get(ends)
            if rows is None:
                rows = made[ends] = self._tie_rows(a, b)
            for key, coef, const in rows:
                if key in done and DISTINCT_TIE_ROWS:
                    continue
                done.add(key)
                self.milp.add_row(list(coef), list(coef.values()), -const, -const)

    def _tie_rows(self, a: int, b: int) -> list[tuple[tuple, dict[int, float], float]]:
        """(key, coefficients, constant) of the rows tying items ``a`` and ``b``: one per strategy
        index but those whose both sides are fixed."""
        maps, rows = self.maps, []
        ga, gb = self.of[a], self.of[b]
        for k in range(len(self.p.items[a].strategies)):
            coef: dict[int, float] = {}
            const = 0.0
            for g, i, sign in ((ga, a, 1.0), (gb, b, -1.0)):
                xs = self.x[g]
                for s in np.flatnonzero(maps[i] == k):
                    if xs is None:
                        const += sign
                    else:
                        coef[int(xs[s])] = coef.get(int(xs[s]), 0.0) + sign
            coef = {j: c for j, c in coef.items() if c}
            if not coef:
                continue  # both sides fixed (single-strategy groups aligned by _tie)
            rows.append(((tuple(sorted(coef.items())), const), coef, const))
        return rows

    def _add_recompute_needs(self) -> None:
        """A recomputed item whose operand is dead by its recompute point needs that operand's
        producer recomputed too (passes/recompute/choices.py): ``r[item] - r[need] <= 0``; one whose
        operand is recomputed only after its point needs it kept: ``r[item] + r[other] <= 1``.
        One row per distinct pair of groups (tied layers give the same row)."""
        p, done = self.p, set()
        pairs = [(i, j, -1.0, 0.0, False) for i, rr in p.remat.items() for j in rr.needs]
        pairs += [(i, j, 1.0, 1.0, False) for i, rr in p.remat.items() for j in rr.conflicts]
        # issue 30: a recomputed item reading a value of an earlier segment needs it kept as a checkpoint
        pairs += [(i, j, -1.0, 0.0, True) for i, rr in p.remat.items() for j in rr.keeps]
        marked: dict[tuple, list[int]] = {}  # (group, map, strategy tuple, kind) -> the group strategies marked
        met: set[tuple] = set()  # (both sides, kind of row): tied layers' pairs make the same row
        for i, j, other, bound, checkpoint in pairs:
            sides = tuple(
                (self.of[item], id(self.maps[item]), id(p.items[item].strategies.as_tuple), checkpoint and item == j)
                for item in (i, j)
            )
            if (sides, other, bound) in met:  # the same coefficients and constant: a row added or not needed
                continue
            met.add((sides, other, bound))
            coef: dict[int, float] = {}
            const = 0.0
            for item, sign, side in ((i, 1.0, sides[0]), (j, other, sides[1])):
                g, m, sts = self.of[item], self.maps[item], p.items[item].strategies
                xs = self.x[g]
                kept = side[3]  # kept as a checkpoint, or recomputed
                ss = marked.get(side)
                if ss is None:
                    ss = marked[side] = [
                        s
                        for s in range(self.groups[g].size)
                        if (sts[int(m[s])].checkpoint if kept else sts[int(m[s])].recompute)
                    ]
                for s in ss:
                    if xs is None:
                        const += sign
                    else:
                        coef[int(xs[s])] = coef.get(int(xs[s]), 0.0) + sign
            coef = {c: v for c, v in coef.items() if v}
            key = (tuple(sorted(coef.items())), bound - const)
            if key in done or (not coef and const <= bound):
                continue
            done.add(key)
            self.milp.add_row(list(coef), list(coef.values()), -np.inf, bound - const)

    def point(self, choice: list[int]) -> np.ndarray:
        """The column values of a per-group choice."""
        z = np.zeros(self.milp.n)
        for g, xs in enumerate(self.x):
            if xs is not None:
                z[xs[choice[g]]] = 1.0
        for gu, gv, rc, cc, ids in self.y:
            z[ids[rc[choice[gu]], cc[choice[gv]]]] = 1.0
        return z

    def local_search(self, rounds: int = 30) -> list[int]:
        """A good per-group choice, fast: single-group moves (each group to its cheapest strategy
        given its neighbours) until none improves, from two starts, the better one kept: a greedy
        sweep in group order, and everything replicated (no communication at all, so no chain
        of redistributions a single move cannot undo). Each broken tie weighs as a large cost, so
        the result usually honours them (a choice that breaks none is priced as without them)."""
        n = len(self.groups)
        nbr: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(n)]
        for (gu, gv), mat in self.pair.items():
            nbr[gu].append((gv, mat))
            nbr[gv].append((gu, mat.T))
        big = 1e3 * (
            1.0 + sum(float(v.max()) for v in self.vec if v.size) + sum(float(m.max()) for m in self.pair.values())
        )
        # one penalty per pair of groups, counting the ties a choice breaks (a step of L layers has
        # a tie per parameter and state array, 36,000 at 1,000 layers, between 49 pairs of groups)
        broken: dict[tuple[int, int], np.ndarray] = {}
        for a, b in self.p.ties:
            ga, gb = self.of[a], self.of[b]
            if ga != gb:
                mat = self.maps[a][:, None] != self.maps[b][None, :]
                known = broken.get((ga, gb))
                broken[(ga, gb)] = mat.astype(np.int64) if known is None else known + mat
        for (ga, gb), count in broken.items():
            mat = big * count
            nbr[ga].append((gb, mat))
            nbr[gb].append((ga, mat.T))
        greedy = [-1] * n
        for g in range(n):
            c = self.vec[g].copy()
            for h, mat in nbr[g]:
                if greedy[h] >= 0:
                    c += mat[:, greedy[h]]
            greedy[g] = int(np.argmin(c))
        starts = [greedy, self._replicated()]
        best, best_cost = greedy, np.inf
        for choice in starts:
            choice = self._improve(list(choice), nbr, rounds)
            cost = sum(float(self.vec[g][choice[g]]) for g in range(n)) + sum(
                float(mat[choice[g], choice[h]]) for g in range(n) for h, mat in nbr[g] if g < h
            )
            if cost < best_cost:
                best, best_cost = choice, cost
        return best

    def _replicated(self) -> list[int]:
        """Per group, the strategy that replicates every member (the first one if none does)."""
        out = []
        for g in self.groups:
            i, m = g.members[0]
            sts = self.p.items[i].strategies
            whole = [
                s
                for s in range(g.size)
                if all(q.kind == "R" for spec in sts[m[s]].in_specs + sts[m[s]].out_specs for q in spec)
            ]
            out.append(whole[0] if whole else 0)
        return out

    def _improve(self, choice: list[int], nbr, rounds: int) -> list[int]:
        for _round in range(rounds):
            changed = False
            for g in range(len(choice)):
                if self.groups[g].size == 1:
                    continue
                c = self.vec[g].copy()
                for h, mat in nbr[g]:
                    c += mat[:, choice[h]]
                s = int(np.argmin(c))
                if c[s] < c[choice[g]] * (1 - 1e-12) - 1e-15:
                    choice[g], changed = s, True
            if not changed:
                break
        return choice

    def memory_expr(self, at: int):
        """(constant bytes, {(group, s): bytes}) live at program point ``at``."""
        if self._live is None:
            self._live = self.p.memory.live_ranges()
        const = 0.0
        coef: dict[tuple[int, int], float] = {}
        remat = self.p.remat
        for v, i, a, b in self._live:
            if i not in remat and not a <= at <= b:
                continue
            g = self.of[i]
            m = self.maps[i]
            sizes = self.p.memory.strategy_bytes(v, i)[m].tolist()
            if i in remat:  # kept or recomputed, by strategy: live over different ranges
                ranges = [self.p.memory.ranges_under(v, i, int(s), a, b) for s in m]
                sizes = [nb if any(x <= at <= y for x, y in r) else 0 for nb, r in zip(sizes, ranges)]
                if not any(sizes):
                    continue
            if self.groups[g].size == 1:
                const += sizes[0]
                continue
            for s, nb in enumerate(sizes):
                coef[(g, s)] = coef.get((g, s), 0.0) + nb
        for i, pos, per_strategy in self.p.memory.transient_terms():  # ZeRO-3's gathered copies
            if pos != at:
                continue
            g, m = self.of[i], self.maps[i]
            if self.groups[g].size == 1:
                const += float(per_strategy[m[0]])
                continue
            for s, item_s in enumerate(m):
                coef[(g, s)] = coef.get((g, s), 0.0) + float(per_strategy[item_s])
        return const, coef

    def add_memory_point(self, at: int, limit: float) -> None:
        const, coef = self.memory_expr(at)
        cols = np.array([int(self.x[g][s]) for g, s in coef], dtype=np.int64)
        nb = np.array(list(coef.values()), dtype=float)
        floor = smallest_bytes(self, const, cols, nb)  # offload_terms.py: valid cover rows
        self.offload.add_cover_rows(at, (floor - limit) / self.MIB)
        idx, val = self.offload.memory_terms(at)
        self.milp.add_row(
            idx + cols.tolist(), val + (nb / self.MIB).tolist(), -np.inf, (float(limit) - const) / self.MIB
        )

    def run(
        self, time_limit_s: float, start: list[int] | None = None, bound: float | None = None, gap: float = REL_GAP
    ) -> Solution | None:
        """Solve from the cheapest of ``start`` and earlier runs' plans that meet the rows now, to ``gap``."""
        z = self.milp.cheapest_feasible(([self.point(start)] if start is not None else []) + self.found)
        if start is not None and bound is not None:  # a lazy round: the last plan, repaired, may be cheaper
            fixed = repaired(self, self.point(start), REPAIR_SHARE * time_limit_s)
            z = self.milp.cheapest_feasible([p for p in (z, fixed) if p is not None])
        # the LP optimum bounds every round (rows only raise it): a start meeting it is optimal as is
        known = max((b for b in (bound, self.lp_bound) if b is not None), default=None)
        res = solve_milp(self.milp, self.backend, time_limit_s, gap, start=z, known_bound=known)
        self.last_status, self.found = res.status, (res.found + self.found)[:FOUND_KEPT]
        if res.x is None:
            if z is None:
                return None
            res.x, res.objective = z, float(self.milp.cost @ z) + self.milp.offset
        res.bound = min(res.objective, max(res.bound, self.trivial_bound()))
        gchoice = [0 if xs is None else int(np.argmax(res.x[xs])) for xs in self.x]
        self.last_choice = gchoice
        choice = [0] * len(self.p.items)
        for gi, g in enumerate(self.groups):
            for i, m in g.members:
                choice[i] = int(m[gchoice[gi]])
        obj, bound = res.objective / self.SCALE, res.bound / self.SCALE
        gap = 0.0 if obj <= 0 else max(0.0, (obj - bound) / obj)
        return Solution(choice, obj, res.status, bound, gap, res.seconds, offload=self.offload.chosen(res.x))

    def trivial_bound(self) -> float:
        """Every group at its cheapest strategy, no edge costs: a lower bound (scaled)."""
        return self.milp.offset + sum(float(v.min()) * self.SCALE for v, xs in zip(self.vec, self.x) if xs is not None)


def min_memory(p: Problem, groups, of, maps, solver_name: str, time_limit_s: float, offload: bool | str = False) -> int:
    """The smallest per-device peak over all plans (lazy program points, as in ``solve``)."""
    model = _Model(p, groups, of, [np.zeros(g.size) for g in groups], {}, maps, solver_name, False, offload)
    choice = [0] * len(p.items)
    peak = model.milp.add_vars([1.0], integer=False, upper=2.0**60 / model.MIB)[0]
    deadline = time.perf_counter() + time_limit_s
    points: set[int] = set()
    best = None
    for _round in range(200):
        _peak, at = p.memory.peak(choice)
        if at in points:
            break
        points.add(at)
        const, coef = model.memory_expr(at)
        oi, ov = model.offload.memory_terms(at)
        idx = [peak, *oi] + [int(model.x[g][s]) for g, s in coef]
        val = np.concatenate([[1.0], -np.array(ov), -np.array(list(coef.values())) / model.MIB])
        model.milp.add_row(idx, val, const / model.MIB, np.inf)
        res = solve_milp(model.milp, solver_name, deadline - time.perf_counter())
        if res.x is None:
            break
        for gi, g in enumerate(groups):
            xs = model.x[gi]
            s = 0 if xs is None else int(np.argmax(res.x[xs]))
            for i, m in g.members:
                choice[i] = int(m[s])
        model.offload.chosen(res.x)
        best = p.memory.peak(choice)[0]
    return int(best if best is not None else p.memory.peak(choice)[0])


__all__ = ["Solution", "min_memory", "solve"]
