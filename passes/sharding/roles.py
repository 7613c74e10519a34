"""Axis roles: what each mesh axis may split, from its name and a dataflow analysis of the graph.

    role (graphc.core.mesh.axis_role)   may split
    data   dp, data, batch              batch dims only; model state stays replicated
    seq    sp, seq                      sequence dims only; model state stays replicated
    model  tp, model, mp                anything
    free   any other name               anything
    pipe   pp, pipe                     pipeline stages (passes/pipeline.py plans them)

Partial sums (P) are allowed on every axis: summing over a batch dim (a weight gradient) leaves
the data axis partial, which is data parallelism's gradient all-reduce.

**Dim classes.** Two dims are in one class when some op's dimension rule gives them one label
(graphc/ops/dims.py), so that splitting one splits the other: a union-find over (value, dim)
across the whole graph. Only primary labels unite: an alternative label (a reshape splitting H
inside the 3 blocks of a fused QKV dim, or s inside the b blocks of a ``[b*s]`` dim) relates two
dims without making them one, and a strategy that uses it must be allowed on both. The batch
dim of x flows to the batch dim of every activation, of the gradient of every activation, and
into the summed label of every weight gradient.

**Batch and sequence dims.** The *data inputs* are the graph inputs that are not model state
(``state_inputs``). The batch dim of a data input is its first dim that some rule labels (dim 0
of ``x[batch, ...]``, dim 1 of a time-major ``xs[time, batch, ...]`` that the model indexes by
time); the classes of those dims are the batch classes. The dim right after it is a sequence dim
when the input holds token ids (integers, ``[batch, seq]``) or has 3 or more dims
(``[batch, seq, features]``).

``free_axes=True`` (``graphc compile --free-axes``) gives every axis the role "free".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from graphc.core.ir import Graph, Node, Value
from graphc.core.mesh import Mesh
from graphc.core.pytree import call_arguments
from graphc.ops.dims import DimRule

BATCH, SEQ = 1, 2  # bits of a dim's kind
RESTRICTED = {"data": BATCH, "seq": SEQ}  # role -> the kind of dim it may split


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[tuple[Value, int], tuple[Value, int]] = {}

    def find(self, x: tuple[Value, int]) -> tuple[Value, int]:
        parent = self.parent
        root = x
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(x, x) != root:  # path compression
            parent[x], x = root, parent[x]
        return root

    def union(self, a: tuple[Value, int], b: tuple[Value, int]) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


def state_inputs(graph: Graph, ties: list[tuple[int, int]]) -> set[int]:
    """Positions of the graph inputs that are model state, not data: the inputs a training step
    returns updated (``ties``); when nothing is tied, the leaves of the first argument if it is a
    container and other arguments follow it (``f(params, x)``, a method's ``self``)."""
    if ties:
        return {i for i, _o in ties}
    args = call_arguments(graph.in_tree)
    if len(args) < 2 or args[0][0].kind == "leaf":
        return set()
    tree, first = args[0]
    return set(range(first, first + tree.num_leaves))


@dataclass
class AxisRoles:
    """The roles of a mesh's axes and the dim kinds of a graph's values: which placements each
    axis allows. ``allows(a, v, d)``: may axis ``a`` split dim ``d`` of value ``v``?"""

    roles: tuple[str, ...]  # per mesh axis
    classes: _UnionFind
    labelled: set[tuple[Value, int]]
    batch: set[tuple[Value, int]]  # class roots
    seq: set[tuple[Value, int]]
    state: frozenset[Value]  # state inputs and the outputs tied to them
    warnings: list[str] = field(default_factory=list)
    _kinds: dict[Value, tuple[int, ...]] = field(default_factory=dict, repr=False)

    @property
    def restricted(self) -> bool:
        return any(r in RESTRICTED for r in self.roles)

    def kinds(self, v: Value) -> tuple[int, ...]:
        """Per dim of ``v``: BATCH | SEQ bits (0 for a dim of neither kind)."""
        hit = self._kinds.get(v)
        if hit is None:
            out = []
            for d in range(v.type.ndim):
                root = self.classes.find((v, d))
                out.append((BATCH if root in self.batch else 0) | (SEQ if root in self.seq else 0))
            hit = self._kinds[v] = tuple(out)
        return hit

    def allows(self, axis: int, v: Value, d: int) -> bool:
        need = RESTRICTED.get(self.roles[axis])
        if need is None:
            return True
        return v not in self.state and bool(self.kinds(v)[d] & need)

    def key(self, values) -> tuple:
        """What the strategies of a node with these operands and results depend on."""
        if not self.restricted:
            return ()
        return tuple(self.kinds(v) for v in values)


def free_roles(mesh: Mesh) -> tuple[str, ...]:
    return tuple("free" for _ in mesh.axis_names)


def axis_roles(
    graph: Graph,
    mesh: Mesh,
    rules: dict[Node, DimRule | None],
    ties: list[tuple[int, int]],
    free_axes: bool = False,
) -> AxisRoles:
    """The roles of ``mesh``'s axes (all "free" with ``free_axes``) and the batch / sequence dims
    of ``graph`` (see the module doc)."""
    roles = free_roles(mesh) if free_axes else tuple(mesh.roles[name] for name in mesh.axis_names)
    classes = _UnionFind()
    labelled: set[tuple[Value, int]] = set()
    for node in graph.nodes:
        rule = rules.get(node)
        if rule is not None:
            _unite(classes, labelled, node, rule)
    state_pos = state_inputs(graph, ties)
    state = {graph.inputs[i] for i in state_pos} | {graph.outputs[o] for i, o in ties}
    batch: set = set()
    seq: set = set()
    for k, v in enumerate(graph.inputs):
        if k in state_pos:
            continue
        dims = [d for d in range(v.type.ndim) if (v, d) in labelled]
        if not dims:
            continue
        b = dims[0]
        batch.add(classes.find((v, b)))
        if b + 1 < v.type.ndim and (v, b + 1) in labelled and (v.type.dtype.kind in "iu" or v.type.ndim >= 3):
            seq.add(classes.find((v, b + 1)))
    out = AxisRoles(roles, classes, labelled, batch, seq, frozenset(state))
    out.warnings += _unusable_axes(graph, mesh, out)
    return out


def _unite(classes: _UnionFind, labelled: set, node: Node, rule: DimRule) -> None:
    """Put the dims that carry one label of ``rule`` as their primary label in one class; every
    dim with a splittable label, alternatives included, is ``labelled``. An alternative label
    relates dims without making them one (a reshape's ``[b*s] -> [b, s]`` can cut the merged dim
    by s with b blocks, but s is not the batch dim), so it unites nothing."""
    ok = set(rule.labels())
    for side, i, d, label, _f in rule.occurrences():
        if label in ok:
            labelled.add((node.inputs[i] if side == "in" else node.outputs[i], d))
    first: dict[str, tuple[Value, int]] = {}
    for side, i, d, label, _f in rule.occurrences(primary_only=True):
        if label not in ok:
            continue
        key = (node.inputs[i] if side == "in" else node.outputs[i], d)
        if label in first:
            classes.union(first[label], key)
        else:
            first[label] = key


def _unusable_axes(graph: Graph, mesh: Mesh, roles: AxisRoles) -> list[str]:
    """A warning per data / seq axis that cannot split any input's batch / sequence dim evenly:
    the planner replicates along it (every device of the axis computes the same)."""
    warnings = []
    for a, (name, role) in enumerate(zip(mesh.axis_names, roles.roles)):
        need = RESTRICTED.get(role)
        n = mesh.shape[a]
        if need is None or n == 1:
            continue
        what = "batch" if need == BATCH else "sequence"
        sizes = sorted(
            {
                v.type.shape[d]
                for v in graph.inputs
                if v not in roles.state
                for d in range(v.type.ndim)
                if roles.kinds(v)[d] & need
            }
        )
        if any(s % n == 0 for s in sizes):
            continue
        found = f"{what} dims of size {', '.join(map(str, sizes))}" if sizes else f"no {what} dim in the inputs"
        warnings.append(
            f"mesh axis {name}={n} ({role} role) splits only {what} dims, and there are {found}: "
            f"it replicates the work (pass free_axes=True / --free-axes to let it split anything)"
        )
    return warnings
