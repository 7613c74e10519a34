"""Activation recomputation (rematerialization) as a plan choice: keep a forward value for the
backward pass, or free it after its last forward use and compute it again before its first
backward use.

The planner's version of Checkmate (Jain et al., MLSys 2020), simplified to one recomputation per
value (docs/remat.md compares the two). Every forward node whose results the backward pass needs,
directly or through other recomputable nodes, is a *candidate* with a static *recompute point*:
the first backward (or update) node that reads one of its results, or the earliest recompute
point of a candidate consumer in its segment (passes/recompute/segments.py), so chains inside a
segment are always made producers first; a node of a later segment reading the previous
segment's cut needs it kept as a checkpoint (``Candidate.keeps``). Recomputing a candidate is a strategy of its item:
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
whose result is a view of an operand (a reshape or transpose costs no memory; the lowering makes
the views into a recomputed value again from its copy) and graph outputs (or values returned
through a view). A node reading a view reads the value it looks into.

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
from graphc.passes.recompute.segments import forward_segments
from graphc.passes.sharding.memory import RematRanges
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
    last_late: dict[Value, int]  # per result: its last backward (or update) reader, -1 if none
    copy_readers: dict[Value, tuple[int, ...]]  # per result: the candidates whose copies may read its copy
    keeps: tuple[int, ...] = ()  # nodes of an earlier segment it reads, which must then be kept until its point


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
        readers = self.readers
        for k, n in enumerate(graph.nodes):
            for v in n.inputs:
                got = readers.get(v)
                if got is None:
                    readers[v] = [k]
                else:
                    got.append(k)
        self.outputs = set(graph.outputs)
        self.views_of: dict[Value, list[Value]] = {}
        for view, root in roots.items():
            self.views_of.setdefault(root, []).append(view)
        self.segment = forward_segments(graph, roots)
        self.is_forward = [n.part == "forward" for n in graph.nodes]
        self._of: dict[Value, tuple[int, ...]] = {}
        self._late: dict[Value, tuple[int, ...]] = {}

    def forward(self, k: int) -> bool:
        return self.is_forward[k]

    def of(self, v: Value) -> tuple[int, ...]:
        """The readers of ``v`` and of the views looking into it (found once per value)."""
        got = self._of.get(v)
        if got is None:
            out = list(self.readers.get(v, ()))
            for w in self.views_of.get(v, ()):
                out += self.readers.get(w, ())
            got = self._of[v] = tuple(out)
        return got

    def late(self, v: Value) -> tuple[int, ...]:
        """The readers of ``v`` (or its views) outside the forward pass."""
        got = self._late.get(v)
        if got is None:
            forward = self.is_forward
            got = self._late[v] = tuple([r for r in self.of(v) if not forward[r]])
        return got

    def points(self) -> dict[int, int]:
        """Recompute points, consumers first. A forward value's own point is its first backward
        reader, or the earliest own point of a recomputable reader in its segment (so the chains
        of a segment are made producers first, passes/recompute/segments.py). A value with
        neither (read only by the next segment) may still be recomputed for a reader there: at
        the earliest point of such readers, which its own producers do not follow (they would
        be recomputed for the whole of the later segments' backward pass). Nodes that may not be
        recomputed get none."""
        point: dict[int, int] = {}
        own: set[int] = set()  # nodes whose point is their own (not a later segment's)
        forward = self.is_forward
        never: dict = {}  # op -> _never_recomputed(op)
        for k in range(len(self.nodes) - 1, -1, -1):
            n = self.nodes[k]
            if not forward[k] or n.regions:
                continue
            skip = never.get(n.op)
            if skip is None:
                skip = never[n.op] = _never_recomputed(n.op)
            if skip:
                continue
            if not self.roots.keys().isdisjoint(n.outputs) or not self.outputs.isdisjoint(n.outputs):
                continue  # a view costs no memory; an output is kept to the end anyway
            readers = [r for o in n.outputs for r in self.of(o) if forward[r] and r in point]
            at = [r for o in n.outputs for r in self.late(o)]
            at += [point[r] for r in readers if r in own and self.segment.get(r) == self.segment[k]]
            if at:
                point[k] = min(at)
                own.add(k)
                continue
            later = [point[r] for r in readers if self.segment.get(r) != self.segment[k]]
            if later:
                point[k] = min(later)
        return point

    def candidate(self, k: int, point: dict[int, int], found: dict[int, Candidate]) -> Candidate | None:
        """Node ``k`` as a candidate (``found``: the candidates before it), or None."""
        n = self.nodes[k]
        if any(w in self.outputs for o in n.outputs for w in self.views_of.get(o, ())):
            return None  # returned through a view: the original stays alive
        needs: list[int] = []
        conflicts: list[int] = []
        keeps: list[int] = []
        for u in n.inputs:
            u = self.roots.get(u, u)  # a view is read through the value it looks into
            p = u.producer
            if p is None or p.op.has(Constant) or u in self.outputs:
                continue  # a graph input, a constant or an output: always in memory
            j = self.index[id(p)]
            if max(self.of(u), default=j) >= point[k]:
                # kept, it is alive at the point; recomputed, its copy must be made by then
                if j in found and found[j].point > point[k]:
                    conflicts.append(j)
                continue
            if self.segment.get(j) != self.segment[k]:
                keeps.append(j)  # the previous segment's cut, kept until here as a checkpoint
                continue
            if j not in found or found[j].point > point[k]:
                return None  # dead by its point, and not recomputed by then
            needs.append(j)
        forward = self.is_forward
        last_forward: dict[Value, int] = {}
        last_late: dict[Value, int] = {}
        copies: dict[Value, tuple[int, ...]] = {}
        at = point[k]
        for o in n.outputs:
            early = [r for r in self.of(o) if forward[r]]  # its forward readers (and its views')
            last_forward[o] = max(max(early, default=k), k)
            last_late[o] = max(self.late(o), default=-1)
            # the recomputable ones whose copies, made at or after k's point, read o's copy when both are recomputed
            copies[o] = tuple(sorted({r for r in early if r in point and point[r] >= at}))
        return Candidate(
            k, at, _ascending(needs), _ascending(conflicts), last_forward, last_late, copies, _ascending(keeps)
        )


def _ascending(nodes: list[int]) -> tuple[int, ...]:
    """``nodes`` without repeats, in ascending order (most lists are empty)."""
    return tuple(sorted(set(nodes))) if nodes else ()


def add_recompute(problem: Problem, mode: str) -> None:
    """Give every candidate item of ``problem`` recompute strategies (mode "auto": as well as its
    own; "on": instead of them, for the candidates ``forced`` picks), every value a candidate of a
    later segment reads checkpoint strategies (the same, kept until that candidate's point), and
    record their live ranges in ``problem.remat``; "off": nothing. Call before anything measures
    the problem's memory."""
    if mode == "off":
        return
    roots = problem.memory.roots()  # made once for the problem: its live ranges read them too
    found = candidates(problem.graph, roots)
    if mode == "on":
        found = {k: found[k] for k in forced(found)}
    if not found:
        return
    items = problem.items
    item_of = {it.index: i for i, it in enumerate(items) if it.kind == "node"}
    position = {it_i: p for p, it_i in enumerate(problem.order)}
    order_pos = {k: position[i] for k, i in item_of.items()}
    # the copies made before one program position run in graph order, each in a memory slot of its own
    at_point: dict[int, list[int]] = {}
    for k in sorted(found):
        at_point.setdefault(order_pos[found[k].point], []).append(k)
    grid = problem.memory.set_slots({p: len(ks) for p, ks in at_point.items()}).tolist()
    slot = {k: grid[p] - len(ks) + t for p, ks in at_point.items() for t, k in enumerate(ks)}

    def pos(k: int) -> int:  # the memory position of graph node k
        return grid[order_pos[k]]

    until = _checkpoints(problem.graph, found, roots)  # node -> {value: the candidates reading it as a checkpoint}
    twins: dict[tuple, Strategies] = {}  # repeated layers share their strategy lists: so do their twins
    # items whose own Strategies objects hold one tuple (problem.py ``_fused``) get twins of one
    # object (``Strategies.twin``: objects of their own, sharing the strategies and their specs)
    by_tuple: dict[tuple, tuple[Strategies, tuple]] = {}
    items_of = item_of.__getitem__
    for k in sorted(set(found) | set(until)):
        i = item_of[k]
        it = items[i]
        c = found.get(k)
        held_for = until.get(k)
        kinds = (c is not None, held_for is not None)  # (recomputed, kept as a checkpoint)
        key = (it.strategies, *kinds)
        new = twins.get(key)
        alike = (id(it.strategies.as_tuple), *kinds)
        if new is None and alike in by_tuple:  # another object over the same tuple (fused twins): a twin
            new = twins[key] = by_tuple[alike][0].twin()
        if new is None:
            again, held = [], []  # made only for the kinds the item gets
            if c is not None:
                again = [dataclasses.replace(s, compute_s=2 * s.compute_s, recompute=True) for s in it.strategies]
            if held_for is not None:
                held = [dataclasses.replace(s, checkpoint=True) for s in it.strategies]
            if mode == "on":  # forced: only the twins
                new = Strategies(again if c is not None else held)
            else:
                new = Strategies([*it.strategies, *again, *held])
            twins[key] = new
            by_tuple[alike] = (new, it.strategies.as_tuple)  # the tuple kept: its id is the key
        it.strategies = new
        ranges = {}
        if c is not None:
            for o in c.last_late:
                last = max(
                    [pos(c.last_late[o]) if c.last_late[o] >= 0 else slot[k]]
                    + [slot[r] for r in c.copy_readers[o] if r in slot]
                )
                ranges[o] = ((pos(k), pos(c.last_forward[o])), (slot[k], last))
        problem.remat[i] = RematRanges(
            point=slot[k] if c else -1,
            ranges=ranges,
            needs=tuple(map(items_of, c.needs)) if c else (),
            conflicts=tuple(map(items_of, c.conflicts)) if c else (),
            keeps=tuple(map(items_of, c.keeps)) if c else (),
            checkpoint={v: max(slot[r] for r in readers) for v, readers in held_for.items()} if held_for else {},
        )


def _checkpoints(
    graph: Graph, found: dict[int, Candidate], roots: dict[Value, Value]
) -> dict[int, dict[Value, list[int]]]:
    """{node of an earlier segment that candidates read: {its result they read: those candidates}}:
    kept as a checkpoint, it must live until the last of their copies (``roots``: ``view_roots``)."""
    index = {id(n): k for k, n in enumerate(graph.nodes)}
    until: dict[int, dict[Value, list[int]]] = {}
    for k, c in found.items():
        if not c.keeps:
            continue
        for u in graph.nodes[k].inputs:
            u = roots.get(u, u)
            j = index.get(id(u.producer)) if u.producer is not None else None
            if j in c.keeps:
                until.setdefault(j, {}).setdefault(u, []).append(k)
    return until


def forced(found: dict[int, Candidate]) -> set[int]:
    """The candidates ``recompute=True`` recomputes: all of them, less those that would read a
    value recomputed only after their own point (``conflicts``; the producer is recomputed, its
    reader kept), those reading a checkpoint that is recomputed itself, and those that need a
    candidate left out, until nothing changes."""
    chosen = set(found)
    changed = True
    while changed:
        changed = False
        for k in sorted(chosen):
            c = found[k]
            if (
                any(j in chosen for j in c.conflicts)
                or any(j in chosen for j in c.keeps)
                or any(j not in chosen for j in c.needs)
            ):
                chosen.discard(k)
                changed = True
    return chosen


__all__ = ["Candidate", "add_recompute", "candidates", "recompute_mode"]
