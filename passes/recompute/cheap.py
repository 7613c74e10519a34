"""Recompute cheap elementwise values in the backward pass instead of keeping them from the forward.

A training step's forward kernels write out every intermediate the backward reads. For the tanh
GELU of a transformer's MLP that is four arrays the size of the hidden layer:

    saved for the backward: 0.5*u, u*u, tanh(z), 1 + tanh(z)     (u = x @ w + b)

Three of them are one multiply or add away from a value that is worth keeping. The backward can
recompute those inside its own fused kernel, as XLA duplicates cheap producers into consumer
fusions:

    saved for the backward: u, tanh(z)

which halves the bytes kept from the forward to the backward and the memory traffic of writing
and reading them (tests/passes/test_recompute.py; graphc bench runtime, the GPT step's peak memory).

A value ``v`` made by a forward node is recomputed for its backward users when

* its op is cheap elementwise arithmetic (``Elementwise.cost`` at most CHEAP: no exp, tanh, log, sqrt, pow: those cost
  more than the bytes they save), and
* every backward user is itself fusable, so the recomputation lands inside a fused kernel
  rather than becoming a pass over memory of its own, and
* it saves bytes: its operands are kept anyway (graph inputs, constants, values the backward
  already reads), or one operand ``u`` would be newly kept and the values recomputed from it
  outweigh it (0.5*u and u*u, 16 MiB, for u, 8 MiB).

The decisions run to a fixed point (recomputing 1 + tanh(z) needs only tanh(z), kept anyway).
Forward users keep the original value; the backward users read a clone placed before the first
of them (and after the values it reads). Assumes: a verified graph whose nodes carry parts
(``graphc.value_and_grad`` of a traced function); other graphs are returned unchanged.
Guarantees: the output verifies and computes the same values bit for bit (the same ops on the
same operands).
"""

from __future__ import annotations

import functools
import heapq

from graphc.core.ir import Graph, Node, Value
from graphc.core.traits import CHEAP, Constant, Elementwise
from graphc.passes.fuse import fusable
from graphc.passes.rewrite import Rewriter, apply_to_graph, finish


def _cheap(op) -> bool:
    """Elementwise arithmetic about as cheap as the load and store of its result."""
    ew = op.trait(Elementwise)
    return ew is not None and ew.cost <= CHEAP


# how many cheap ops deep a recomputation may reach for values that are not kept (g * d / std from
# d and std: 2)
RECOMPUTE_DEPTH = 3


class _Choice:
    """Which forward values the backward recomputes, decided on one block."""

    def __init__(self, inputs: list[Value], nodes: list[Node], outputs: list[Value], users: dict[Value, list[Node]]):
        self.uses = users
        self.returned = set(outputs)
        self.inputs = set(inputs)
        # forward values the backward reads: what the step keeps from its forward to its backward
        self.kept: set[Value] = set()
        for node in nodes:
            if node.part == "backward":
                continue
            for v in node.outputs:
                for u in users.get(v, ()):
                    if u.part == "backward":
                        self.kept.add(v)
                        break
        self.recomputed: set[Value] = set()

    def free(self, v: Value) -> bool:
        """Whether reading ``v`` in the backward costs no extra bytes."""
        p = v.producer
        return v in self.inputs or v in self.kept or v in self.returned or (p is not None and p.op.has(Constant))

    @staticmethod
    def cheap(v: Value) -> bool:
        p = v.producer
        return p is not None and _cheap(p.op) and len(p.outputs) == 1 and fusable(p) and p.part != "backward"

    def candidate(self, v: Value) -> bool:
        if not self.cheap(v) or v in self.returned:
            return False
        return all(fusable(u) for u in self.uses[v] if u.part == "backward")

    def chain(self, v: Value, depth: int = RECOMPUTE_DEPTH) -> tuple[set[Value], set[Value]]:
        """(the values to recompute to get ``v`` in the backward: ``v`` and the cheap operands that
        are not free, up to ``depth`` ops deep; the operands this leaves to keep)."""
        if self.free(v) and depth < RECOMPUTE_DEPTH:
            return set(), set()
        if depth == 0 or not self.cheap(v):
            return set(), {v}
        ops, keep = {v}, set()
        for u in v.producer.inputs:  # type: ignore[union-attr]
            more, needs = self.chain(u, depth - 1)
            ops |= more
            keep |= needs
        return ops, keep

    def recompute(self, values: list[Value]) -> None:
        """Recompute ``values`` (in graph order: a chain reads what the ones before it left kept)."""
        for v in values:
            ops, keep = self.chain(v)
            self.kept -= ops
            self.recomputed |= ops
            self.kept |= keep

    def run(self, order: dict[Value, int]) -> set[Value]:
        """The fixed point: first every candidate that needs no newly kept operand (``pure``), in
        graph order; when none is left, the candidates of the one operand whose recomputation
        saves the most bytes (ties: the earliest operand); until no operand saves any.

        Incremental: a decision changes which values are kept only near it, and a candidate's
        chain reads whether values at most RECOMPUTE_DEPTH ops before it are kept, so only the
        candidates within that many ops after a changed value are looked at again (linear in
        the block; the same decisions as rescanning every kept value after each one)."""
        self.order = order
        self.pure: set[Value] = set()
        self.operand_of: dict[Value, Value] = {}  # candidate -> the one operand it would newly keep
        self.groups: dict[Value, set[Value]] = {}  # operand -> its candidates
        self.heap: list[tuple[int, int, int]] = []  # (-gain, order of the operand, id) per group, lazily
        self.by_id: dict[int, Value] = {}
        for v in list(self.kept):
            self._update(v)
        while True:
            if self.pure:
                self._recompute_near(sorted(self.pure, key=order.__getitem__))
                continue
            best = self._best()
            if best is None or self._gain(best) <= 0:
                return self.recomputed
            self._recompute_near(sorted(self.groups[best], key=order.__getitem__))

    def _gain(self, u: Value) -> int:
        return sum(v.type.nbytes for v in self.groups[u]) - u.type.nbytes

    def _best(self) -> Value | None:
        """The operand of the largest gain (ties: the earliest), dropping stale heap entries."""
        while self.heap:
            g, _o, key = self.heap[0]
            u = self.by_id[key]
            if self.groups.get(u) and -g == self._gain(u):
                return u
            heapq.heappop(self.heap)  # stale: the group changed since
        return None

    def _update(self, v: Value) -> None:
        """Re-file ``v``: pure, a candidate of one operand, or neither."""
        self.pure.discard(v)
        touched = set()
        u = self.operand_of.pop(v, None)
        if u is not None:
            self.groups[u].discard(v)
            touched.add(u)
        if v in self.kept and self.candidate(v):
            needs = self.chain(v)[1]
            if not needs:
                self.pure.add(v)
            elif len(needs) == 1:
                u = next(iter(needs))
                self.operand_of[v] = u
                self.groups.setdefault(u, set()).add(v)
                touched.add(u)
        for u in touched:
            if self.groups[u]:
                self.by_id[id(u)] = u
                heapq.heappush(self.heap, (-self._gain(u), self.order[u], id(u)))

    def _recompute_near(self, values: list[Value]) -> None:
        """``recompute``, then re-file the candidates it may have changed."""
        changed: set[Value] = set()
        for v in values:
            ops, keep = self.chain(v)
            changed |= ops | (keep - self.kept)
            self.kept -= ops
            self.recomputed |= ops
            self.kept |= keep
        for v in self._after(changed):
            self._update(v)

    def _after(self, changed: set[Value]) -> set[Value]:
        """``changed`` and the forward values up to RECOMPUTE_DEPTH ops after them: the values whose
        candidacy or chain reads whether a changed value is kept."""
        seen, frontier = set(changed), set(changed)
        for _ in range(RECOMPUTE_DEPTH):
            nxt: set[Value] = set()
            for v in frontier:
                for n in self.uses.get(v, ()):
                    if n.part != "backward":
                        nxt.update(o for o in n.outputs if o not in seen)
            seen |= nxt
            frontier = nxt
        return seen


def _clone(v: Value, chosen: set[Value], rw: Rewriter, clones: dict[Value, Value]) -> Value:
    """The backward's copy of ``v`` (and of the recomputed values it reads), emitted now into ``rw``;
    a value not recomputed as it is. (A function of the module, not a closure calling itself: that
    would be a cycle holding ``rw``, and the values it replaced, for the collector.)"""
    if v not in chosen:
        return rw.get(v)
    if v not in clones:
        p = v.producer
        assert p is not None
        operands = [_clone(u, chosen, rw, clones) for u in p.inputs]
        copy = Node(p.op, operands, p.attrs, [v.type], p.loc, "backward")
        rw.nodes.append(copy)
        clones[v] = copy.outputs[0]
    return clones[v]


def _recompute_block(
    inputs: list[Value], nodes: list[Node], outputs: list[Value], users: dict[Value, list[Node]]
) -> tuple[list[Node], list[Value]]:
    order = {v: i for i, n in enumerate(nodes) for v in n.outputs}
    order.update({v: -1 for v in inputs})
    chosen = _Choice(inputs, nodes, outputs, users).run(order)
    if not chosen:
        return nodes, outputs
    rw = Rewriter()
    clones: dict[Value, Value] = {}
    for node in nodes:
        if node.part != "backward" or chosen.isdisjoint(node.inputs):
            rw.keep(node)
            continue
        operands = [_clone(v, chosen, rw, clones) for v in node.inputs]
        new = Node(node.op, operands, node.attrs, [o.type for o in node.outputs], node.loc, node.part, node.regions)
        for old, out in zip(node.outputs, new.outputs):
            rw.subst[old] = out
        rw.nodes.append(new)
    return finish(rw, nodes, outputs)


def recompute_cheap(graph: Graph) -> Graph:
    """Recompute cheap elementwise forward values in the backward where that keeps fewer bytes
    from the forward to the backward (see the module docstring)."""
    if not any(n.part == "backward" for n in graph.nodes):
        return graph
    return apply_to_graph(graph, functools.partial(_recompute_block, users=graph.users()))
