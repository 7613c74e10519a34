"""Activation recomputation (rematerialization) as a plan choice: keep a forward value for the
backward pass, or free it after its last forward use and compute it again before its first
backward use.

The planner's version of Checkmate (Jain et al., MLSys 2020), simplified to one recomputation per
value (docs/remat.md compares the two). Every forward node whose results the backward pass needs,
directly or through other recomputable nodes, is a *candidate* with a static *recompute point*:
the first backward (or update) node that reads one of its results, or the earliest recompute
point of a candidate consumer that needs it. Recomputing a candidate is a strategy of its item:
``add_recompute`` gives each candidate item a copy of every strategy with ``recompute=True``
(same specs, twice the compute time), so the ILP prices it with the variables it already has, and
the memory model (``MemoryModel.profile``, ``ilp._Model.memory_expr``) gives a value one live
range when kept and two when recomputed:

    kept        [producer, last use]
    recomputed  [producer, last forward use] + [recompute point, last backward use]

A candidate may read a value that is dead by its recompute point only if that value's producer is
recomputed as well (``Candidate.needs``: the ILP row ``r[node] <= r[need]``), Checkmate's
"a recomputed node's operands are in memory" constraint.

Not candidates: nodes with regions (control flow), constants, collectives, sharding pins, nodes
whose result is a view of an operand (a reshape or transpose costs no memory), graph outputs,
nodes whose result is looked into by a forward view that the backward pass reads (the view would
hold the original), and nodes reading a forward view (its root would stay alive).

Lowering (passes/lower.py) emits a second copy of every recomputed node, tagged
``part="recompute"`` (device CSE does not merge it with the original), right before its recompute
point; backward readers read the copy, so the runtime frees the original after its last forward
use (runtime/executor.py frees every value after its last use).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from graphc.core.ir import Graph, Value
from graphc.core.traits import Collective, Constant, DeviceLocal, ShardingConstraint
from graphc.passes.options import PlanOptions, Recompute
from graphc.passes.sharding.memory import RematRanges, view_roots
from graphc.passes.sharding.problem import Problem
from graphc.passes.sharding.strategies import Strategies


def _never_recomputed(op) -> bool:
    """Constants (always in memory), sharding pins (the identity, pinned by the user) and ops
    that meet other devices or depend on the device's place (not pure to run again)."""
    return op.has(Constant) or op.has(ShardingConstraint) or op.has(Collective) or op.has(DeviceLocal)


@dataclass(frozen=True)
class Candidate:
    """A forward node that may be recomputed (graph node indices throughout)."""

    node: int
    point: int  # the node before which its copy runs
    needs: tuple[int, ...]  # candidates that must be recomputed too when it is
    conflicts: tuple[int, ...]  # candidates it reads that are recomputed only after its point
    last_forward: dict[Value, int]  # per result: its last forward reader (the node itself if none)
    last_use: dict[Value, int]  # per result: its last reader when recomputed (backward, or a consumer's point)


def recompute_mode(options: PlanOptions) -> Recompute:
    """What the problem gets of ``options.recompute``: "auto" only under a memory limit (without
    one, recomputing only costs time: "off"), else the option as it is."""
    if options.recompute == "auto" and options.memory_limit is None:
        return "off"
    return options.recompute


def candidates(graph: Graph, roots: dict[Value, Value]) -> dict[int, Candidate]:
    """The recomputation candidates of ``graph`` (top-level nodes), by node index. ``roots`` maps
    every view to the value whose buffer it looks into (``problem.view_roots``)."""
    uses = _Uses(graph, roots)
    point = uses.points()
    found: dict[int, Candidate] = {}
    for k in sorted(point):
        c = uses.candidate(k, point, found)
        if c is not None:
            found[k] = c
    return found


class _Uses:
    """Who reads what in a graph, in node indices, views counted as reads of their root."""

    def __init__(self, graph: Graph, roots: dict[Value, Value]):
        self.nodes = graph.nodes
        self.roots = roots
        self.index = {id(n): k for k, n in enumerate(graph.nodes)}
        self.readers: dict[Value, list[int]] = {}
        for k, n in enumerate(graph.nodes):
            for v in n.inputs:
                self.readers.setdefault(v, []).append(k)
        self.outputs = set(graph.outputs)
        self.views_of: dict[Value, list[Value]] = {}
        for view, root in roots.items():
            self.views_of.setdefault(root, []).append(view)

    def forward(self, k: int) -> bool:
        return self.nodes[k].part == "forward"

    def of(self, v: Value) -> list[int]:
        """The readers of ``v`` and of the views looking into it."""
        out = list(self.readers.get(v, ()))
        for w in self.views_of.get(v, ()):
            out += self.readers.get(w, ())
        return out

    def late(self, v: Value) -> list[int]:
        """The readers of ``v`` (or its views) outside the forward pass."""
        return [r for r in self.of(v) if not self.forward(r)]

    def points(self) -> dict[int, int]:
        """Recompute points, consumers first: a forward value is needed again at its first
        backward reader, or where a forward consumer that needs it (it is dead there when kept)
        is recomputed; nodes that may not be recomputed get none."""
        point: dict[int, int] = {}
        for k in range(len(self.nodes) - 1, -1, -1):
            n = self.nodes[k]
            if not self.forward(k) or n.regions or _never_recomputed(n.op):
                continue
            if any(o in self.roots or o in self.outputs for o in n.outputs):
                continue  # a view costs no memory; an output is kept to the end anyway
            at = [r for o in n.outputs for r in self.late(o)]
            at += [point[r] for o in n.outputs for r in self.needed_by(o, point, max(at, default=-1))]
            if at:
                point[k] = min(at)
        return point

    def needed_by(self, v: Value, point: dict[int, int], last: int) -> list[int]:
        """The forward readers of ``v`` with a recompute point after ``last`` (``v``'s last
        backward reader): recomputed, they need a copy of ``v``."""
        return [r for r in self.readers.get(v, ()) if self.forward(r) and r in point and point[r] > last]

    def candidate(self, k: int, point: dict[int, int], found: dict[int, Candidate]) -> Candidate | None:
        """Node ``k`` as a candidate (``found``: the candidates before it), or None."""
        n = self.nodes[k]
        views = [w for o in n.outputs for w in self.views_of.get(o, ()) if self.forward(self.index[id(w.producer)])]
        if any(w in self.outputs or self.late(w) for w in views):
            return None  # a forward view of it is read later: the original stays alive
        needs: list[int] = []
        conflicts: list[int] = []
        for u in n.inputs:
            p = u.producer
            if p is None or p.op.has(Constant):
                continue  # a graph input or a constant: always in memory
            if u in self.roots:
                if self.roots[u].producer is None:
                    continue  # a view of a graph input
                return None  # a forward view of a forward value: recomputing keeps its root alive
            j = self.index[id(p)]
            if max(self.of(u), default=j) >= point[k]:
                # kept, it is alive at the point; recomputed, its copy must be made by then
                if j in found and found[j].point > point[k]:
                    conflicts.append(j)
                continue
            if j not in found:
                return None
            needs.append(j)
        last_forward = {o: max([k] + [r for r in self.of(o) if self.forward(r)]) for o in n.outputs}
        last_use = {}
        for o in n.outputs:
            late = self.late(o)
            late += [point[r] for r in self.needed_by(o, point, max(late, default=-1))]
            last_use[o] = max(late, default=point[k])
        return Candidate(k, point[k], tuple(sorted(set(needs))), tuple(sorted(set(conflicts))), last_forward, last_use)


def add_recompute(problem: Problem, mode: str) -> None:
    """Give every candidate item of ``problem`` recompute strategies (mode "auto": as well as its
    own; "on": instead of them, for the candidates ``forced`` picks) and record their live ranges
    in ``problem.remat``; "off": nothing. Call before anything measures the problem's memory."""
    if mode == "off":
        return
    found = candidates(problem.graph, view_roots(problem.graph))
    if mode == "on":
        found = {k: found[k] for k in forced(found)}
    if not found:
        return
    pos = {it.index: p for p, it_i in enumerate(problem.order) for it in [problem.items[it_i]] if it.kind == "node"}
    item_of = {it.index: i for i, it in enumerate(problem.items) if it.kind == "node"}
    doubled: dict[Strategies, Strategies] = {}  # repeated layers share their strategy lists: so do their doubles
    for k, c in found.items():
        it = problem.items[item_of[k]]
        new = doubled.get(it.strategies)
        if new is None:
            again = [dataclasses.replace(s, compute_s=2 * s.compute_s, recompute=True) for s in it.strategies]
            new = doubled[it.strategies] = Strategies(again if mode == "on" else [*it.strategies, *again])
        it.strategies = new
        problem.remat[item_of[k]] = RematRanges(
            point=pos[c.point],
            ranges={o: ((pos[k], pos[c.last_forward[o]]), (pos[c.point], pos[c.last_use[o]])) for o in c.last_use},
            needs=tuple(item_of[j] for j in c.needs),
            conflicts=tuple(item_of[j] for j in c.conflicts),
        )


def forced(found: dict[int, Candidate]) -> set[int]:
    """The candidates ``recompute=True`` recomputes: all of them, less those that would read a
    value recomputed only after their own point (``conflicts``; the producer is recomputed, its
    reader kept) and those that need a candidate left out, until nothing changes."""
    chosen = set(found)
    changed = True
    while changed:
        changed = False
        for k in sorted(chosen):
            c = found[k]
            if any(j in chosen for j in c.conflicts) or any(j not in chosen for j in c.needs):
                chosen.discard(k)
                changed = True
    return chosen


__all__ = ["Candidate", "add_recompute", "candidates", "recompute_mode"]
