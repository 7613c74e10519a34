"""Axis roles: what each mesh axis may split, from its name and a dataflow analysis of the graph.

    role (graphc.core.roles.axis_role)  may split
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

**ZeRO** (``zero=True``, passes/sharding/zero.py): a data axis may also split any dim of the
training state (the state inputs and the outputs tied to them) and of every operand and result
of the update part: the optimizer state, the gradients as the update reads them and the update
itself can then be sharded along the data axis (ZeRO-1/2), and so can the parameters (ZeRO-3).
The forward and backward still see the data axis split only batch dims: a sharded parameter is
gathered before its use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from graphc.core.ir import Graph, Node, Value
from graphc.core.mesh import Mesh
from graphc.core.profile import INTER_NODE_ROLES
from graphc.core.profiles import cluster_figures
from graphc.core.pytree import call_arguments
from graphc.core.roles import axis_role
from graphc.ops.dims import DimRule

BATCH, SEQ = 1, 2  # bits of a dim's kind
RESTRICTED = {"data": BATCH, "seq": SEQ}  # role -> the kind of dim it may split


class _DimClasses:
    """A union-find over the dims of values: dim ``d`` of value ``v`` is the integer
    ``slot(v, d)`` (the value's first slot plus ``d``), so the classes of a large graph are a
    list of integers, not a dict of (value, dim) pairs the cycle collector walks."""

    def __init__(self) -> None:
        self.first: dict[Value, int] = {}  # a value's dim 0; its dims follow
        self.parent: list[int] = []

    def slot(self, v: Value, d: int) -> int:
        """The integer of dim ``d`` of ``v`` (given one on first use)."""
        b = self.first.get(v)
        if b is None:
            b = self.first[v] = len(self.parent)
            self.parent.extend(range(b, b + v.type.ndim))
        return b + d

    def find(self, x: int) -> int:
        parent = self.parent
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:  # path compression
            parent[x], x = root, parent[x]
        return root

    def union(self, a: int, b: int) -> None:
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
    classes: _DimClasses
    labelled: set[int]  # dims (``classes.slot``) some rule labels
    batch: set[int]  # class roots
    seq: set[int]
    state: frozenset[Value]  # state inputs and the outputs tied to them
    zero: frozenset[Value] = frozenset()  # values a data axis may split anywhere (ZeRO, module doc)
    update: frozenset[Node] = frozenset()  # the update's nodes (``update_nodes``), with ZeRO
    warnings: list[str] = field(default_factory=list)
    _kinds: dict[Value, tuple[int, ...]] = field(default_factory=dict, repr=False)
    restricted: bool = field(init=False, repr=False, compare=False)  # some axis splits only some kinds of dims
    # every slot's kind (``_kinds_of_slots``), made once
    _slot_kinds: list[int] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.restricted = any(r in RESTRICTED for r in self.roles)

    def kinds(self, v: Value) -> tuple[int, ...]:
        """Per dim of ``v``: BATCH | SEQ bits (0 for a dim of neither kind)."""
        hit = self._kinds.get(v)
        if hit is None:
            first = self.classes.first.get(v)
            if first is None:  # no rule labels a dim of it: each dim is a class of its own
                hit = self._kinds[v] = (0,) * v.type.ndim
                return hit
            if self._slot_kinds is None:
                self._slot_kinds = self._kinds_of_slots()
            hit = self._kinds[v] = tuple(self._slot_kinds[first : first + v.type.ndim])
        return hit

    def _kinds_of_slots(self) -> list[int]:
        """Every dim's kind by its slot (``_DimClasses.slot``): all roots found at once, by
        pointer jumping over the parent array (the classes are complete once the roles are made)."""
        parent = np.asarray(self.classes.parent, dtype=np.int64)
        while len(parent):
            grand = parent[parent]
            if np.array_equal(grand, parent):
                break
            parent = grand
        kinds = np.zeros(len(parent), dtype=np.int64)
        if self.batch:
            kinds[np.isin(parent, np.fromiter(self.batch, dtype=np.int64))] |= BATCH
        if self.seq:
            kinds[np.isin(parent, np.fromiter(self.seq, dtype=np.int64))] |= SEQ
        return kinds.tolist()

    def allows(self, axis: int, v: Value, d: int, zero: bool = True) -> bool:
        """``zero``: the ZeRO values may be split anywhere along a data axis (an input's or an
        output's spec, an update node's strategy; not the forward's or the backward's)."""
        need = RESTRICTED.get(self.roles[axis])
        if need is None:
            return True
        if need == BATCH and zero and v in self.zero:
            return True
        return v not in self.state and bool(self.kinds(v)[d] & need)

    def value_key(self, v: Value, zero: bool = False):
        """What the strategies of a node depend on of its operand or result ``v`` (``zero``: an
        update node, ZeRO on): its dims' kinds (and whether ZeRO may split it), or () when no
        axis is restricted."""
        if not self.restricted:
            return ()
        if zero:
            return (self.kinds(v), v in self.zero)
        return self.kinds(v)


def free_roles(mesh: Mesh) -> tuple[str, ...]:
    return tuple("free" for _ in mesh.axis_names)


def axis_roles(
    graph: Graph,
    mesh: Mesh,
    rules: dict[Node, DimRule | None],
    ties: list[tuple[int, int]],
    free_axes: bool = False,
    zero: bool = False,
) -> AxisRoles:
    """The roles of ``mesh``'s axes (all "free" with ``free_axes``) and the batch / sequence dims
    of ``graph`` (see the module doc); ``zero``: data axes may split the training state and the
    update."""
    roles = free_roles(mesh) if free_axes else tuple(mesh.roles[name] for name in mesh.axis_names)
    classes = _DimClasses()
    labelled: set[int] = set()
    _unite(classes, labelled, graph.nodes, rules)
    state_pos = state_inputs(graph, ties)
    state = {graph.inputs[i] for i in state_pos} | {graph.outputs[o] for i, o in ties}
    batch: set = set()
    seq: set = set()
    for k, v in enumerate(graph.inputs):
        if k in state_pos:
            continue
        first = classes.first.get(v)
        if first is None:  # no rule labels a dim of it
            continue
        dims = [d for d in range(v.type.ndim) if first + d in labelled]
        if not dims:
            continue
        b = dims[0]
        batch.add(classes.find(first + b))
        if b + 1 < v.type.ndim and first + b + 1 in labelled and (v.type.dtype.kind in "iu" or v.type.ndim >= 3):
            seq.add(classes.find(first + b + 1))
    zero_values: frozenset[Value] = frozenset()
    update = update_nodes(graph) if zero and "data" in roles else frozenset()
    if update:  # a training step: ZeRO shards its state and update
        zero_values = frozenset(state) | {v for node in update for v in (*node.inputs, *node.outputs)}
    out = AxisRoles(roles, classes, labelled, batch, seq, frozenset(state), zero_values, update)
    out.warnings += _unusable_axes(graph, mesh, out) + _beyond_a_node(mesh)
    return out


def update_nodes(graph: Graph) -> frozenset[Node]:
    """The nodes of a training step's update: those autodiff tags "update" (they read the
    gradients), and the untagged or forward nodes only the update reads (``b1 * m`` of Adam, which
    reads no gradient and is traced before them)."""
    update = {node for node in graph.nodes if node.part == "update"}
    if not update:
        return frozenset()
    read: set[Value] = set()  # values some node reads
    others: dict[Value, int] = {}  # value -> how many of its reads are by nodes not (yet) in the update
    for node in graph.nodes:
        read.update(node.inputs)
        if node not in update:
            for v in node.inputs:
                others[v] = others.get(v, 0) + 1
    outputs = set(graph.outputs)
    for node in reversed(graph.nodes):  # readers before the nodes whose results they read
        if node in update or node.part == "backward" or not node.outputs or node.regions:
            continue
        if all(o not in outputs and o in read and not others.get(o) for o in node.outputs):
            update.add(node)
            for v in node.inputs:
                others[v] -= 1
    return frozenset(update)


def _unite(classes: _DimClasses, labelled: set[int], nodes: list[Node], rules: dict[Node, DimRule | None]) -> None:
    """For each node with a rule: put the dims that carry one label of the rule as their primary
    label in one class; every dim with a splittable label, alternatives included, is
    ``labelled``. An alternative label relates dims without making them one (a reshape's
    ``[b*s] -> [b, s]`` can cut the merged dim by s with b blocks, but s is not the batch dim), so
    it unites nothing. Which dims those are is read from each rule once (``_rule_places``; equal
    nodes share a rule)."""
    cache: dict[int, tuple] = {}
    first, label = classes.first, labelled.add
    find, parent = classes.find, classes.parent
    for node in nodes:
        rule = rules.get(node)
        if rule is None:
            continue
        known = cache.get(id(rule))
        if known is None or known[0] is not rule:
            known = cache[id(rule)] = (rule, *_rule_places(rule))
        _rule, operands, pairs = known
        ins, outs = node.inputs, node.outputs
        bases = []  # each operand's or result's slot of dim 0, given in the order of the places
        for is_in, i, dims in operands:
            v = ins[i] if is_in else outs[i]
            b = first.get(v)
            if b is None:  # ``classes.slot(v, 0)``, inlined: most results are new here
                b = first[v] = len(parent)
                parent.extend(range(b, b + len(v.type.shape)))
            bases.append(b)
            for d in dims:
                label(b + d)
        for k1, d1, k2, d2 in pairs:  # ``classes.union``, inlined: a pair per label and node
            a, b = bases[k1] + d1, bases[k2] + d2
            ra, rb = parent[a], parent[b]  # a root, or (mostly, after path compression) its child
            if parent[ra] != ra:
                ra = find(a)
            if parent[rb] != rb:
                rb = find(b)
            if ra != rb:  # the later place (mostly a new result's dim, a root) joins the first's class
                parent[rb] = ra


def _rule_places(rule: DimRule) -> tuple[list, list]:
    """The operands and results of ``rule``'s splittable labels in first-seen order (is an operand,
    index, the dims of its labels), and the pairs of dims ``_unite`` puts in one class (a label's
    first primary place with each of its others: (operand's position in that list, dim) twice)."""
    ok = set(rule.labels())
    dims_of: dict[tuple[str, int], list[int]] = {}
    for side, i, d, label, _f in rule.occurrences():
        if label in ok:
            dims_of.setdefault((side, i), []).append(d)
    position = {place: k for k, place in enumerate(dims_of)}
    operands = [(side == "in", i, tuple(dims)) for (side, i), dims in dims_of.items()]
    first: dict[str, tuple[int, int]] = {}
    pairs = []
    for side, i, d, label, _f in rule.occurrences(primary_only=True):
        if label not in ok:
            continue
        at = (position[(side, i)], d)
        if label in first:
            pairs.append((*first[label], *at))
        else:
            first[label] = at
    return operands, pairs


def _beyond_a_node(mesh: Mesh) -> list[str]:
    """A warning when the axes the profile prices on the link inside a node (tp, sp: not
    ``INTER_NODE_ROLES``, nor given a link of their own) make groups that do not divide a node of
    the profile's cluster: some group spans two nodes, and its collectives cross the network at
    the node link's price. (The mesh search skips such meshes, passes/search.py.)"""
    node = cluster_figures(mesh.profile).node_size
    links = mesh.links
    inner = [
        (name, n)
        for name, n in zip(mesh.axis_names, mesh.shape)
        if n > 1 and axis_role(name) not in INTER_NODE_ROLES and links[name] == mesh.profile.link
    ]
    size = math.prod(n for _name, n in inner)
    if node is None or node % size == 0:
        return []
    axes = ",".join(f"{name}={n}" for name, n in inner)
    return [
        f"mesh axes {axes} are priced on the link inside a node of {mesh.profile.name}, but a group of {size} "
        f"devices does not divide its node of {node}: some group spans two nodes (--link prices their network)"
    ]


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
