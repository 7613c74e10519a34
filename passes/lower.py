"""Lowering: a graph and its partition plan -> one program per device.

Stage: partitioned (a graph + plan) -> lowered (device programs). Each device program is an
ordinary Graph with local shapes: its inputs are the device's pieces of the graph inputs, its
outputs the device's pieces of the graph outputs (in the plan's output specs). Between the plan's
choices it holds the steps of passes/sharding/redistribute.py as ops of graphc/ops/comm.py:
collectives over the device's group along a mesh axis, or local slices (R -> S) and zeroing
(R -> P). Every op keeps the source location and part of the node it serves, so an error on a
device names the user's line.

Every device program is built by the same walk over the graph, so the collectives of a group
appear in the same order in the programs of all its members (no deadlock by construction);
``ParallelProgram.verify`` (graphc/programs.py) checks it anyway, with the local shapes.

ZeRO (passes/sharding/zero.py): a gradient that its readers in the update want as a shard is
reduce-scattered right after the node that makes it, so the full partial sum is freed there
(ZeRO-2's gradient memory); ``regather`` then makes a ZeRO-3 parameter's all_gather again for
every node that reads it, so each gathered copy is freed after its one use.

Read phases (``read_phase``, passes/sharding/redistribute.py): under a memory limit a forward
value's backward and update readers redistribute it again rather than share the forward pass's
copy, so targets, hubs and redistributed pieces are kept per (value, phase). A recomputed node's
copy (passes/recompute/choices.py) runs in part "recompute", a later part: its operands are
redistributed again there too, and the hub of its results is chosen afresh.

Masked lookups (a gather from a table split by rows, graphc/ops/dims.py) become explicit ops:
the global index goes through a per-device table of local rows (-1 for rows another device
holds; the table has one entry per global row, so an out-of-range index raises IndexError on
every device, as numpy does), rows held elsewhere contribute zeros.
"""

from __future__ import annotations

import numpy as np

from graphc.core.dtypes import additive_identity
from graphc.core.errors import GraphcError, SourceLoc
from graphc.core.ir import Graph, Node, TensorType, Value, clone_region
from graphc.core.pytree import LEAF, TreeDef
from graphc.core.spec import format_spec, local_shape
from graphc.core.traits import IndexedLookup, ShardingConstraint
from graphc.ops import get_op
from graphc.passes.offload import not_runnable
from graphc.passes.recompute.choices import candidates
from graphc.passes.rewrite import Rewriter
from graphc.passes.sharding.local import local_attrs, owned_rows
from graphc.passes.sharding.memory import view_roots
from graphc.passes.sharding.plan import ShardingPlan
from graphc.passes.sharding.redistribute import plan_steps, read_phase, redistribution_time
from graphc.passes.sharding.roles import update_nodes
from graphc.passes.sharding.strategies import Strategy, get_rule
from graphc.passes.sharding.zero import gradients
from graphc.programs import DeviceProgram, ParallelProgram


class _Emitter:
    """Builds one device's program."""

    def __init__(self, graph: Graph, mesh, device: int, redo_later: bool = False):
        self.mesh = mesh
        self.device = device
        self.coord = mesh.coord(device)
        self.mesh_shape = tuple(mesh.shape)
        self.nodes: list[Node] = []
        self.inputs: list[Value] = []
        self.local: dict[tuple, Value] = {}  # (global value, spec[, read phase]) -> local value
        self.spec: dict[Value, tuple] = {}  # global value -> spec of its produced piece
        self.loc: SourceLoc | None = None  # of the node being lowered: every op emitted for it keeps it
        self.part: str | None = None
        self.targets: dict[tuple[Value, str], set[tuple]] = {}  # (global value, read phase) -> reader specs
        self.hubs: dict[tuple[Value, str], tuple] = {}
        self.pieces: dict[Value, list[tuple]] = {}  # global value -> its keys in ``local``
        self.redo_later = redo_later  # the plan has a memory limit (redistribute.read_phase)

    def emit_multi(self, opname: str, *inputs: Value, **attrs) -> tuple[Value, ...]:
        op = get_op(opname)
        types = op.infer_types(tuple(v.type for v in inputs), attrs)
        node = Node(op, inputs, attrs, types, self.loc, self.part)
        self.nodes.append(node)
        return node.outputs

    def emit(self, opname: str, *inputs: Value, **attrs) -> Value:
        (out,) = self.emit_multi(opname, *inputs, **attrs)
        return out

    def constant(self, value: np.ndarray) -> Value:
        return self.emit("constant", value=np.asarray(value))

    def produced(self, v: Value, local: Value, spec: tuple) -> None:
        self.local[(v, spec)] = local
        self.spec[v] = spec
        self.pieces.setdefault(v, []).append((v, spec))

    def recompute(self, node: Node, st: Strategy) -> None:
        """Emit ``node`` again (part "recompute"), and make every later reader of its results read
        the new copy (redistributed again if they want another spec): the original is then dead
        after its last forward reader."""
        for o in node.outputs:
            for key in self.pieces.pop(o, ()):
                self.local.pop(key, None)
            for phase in ("", "later"):  # read_phase's copies
                self.hubs.pop((o, phase), None)
        self.node(node, st, part="recompute")

    def get(self, v: Value, spec: tuple) -> Value:
        """The device's piece of ``v`` in ``spec``, redistributing if needed (each target once per
        read phase: under a memory limit a forward value's backward readers redistribute it
        again, ``read_phase``), through the value's hub spec when its readers want it in several
        (``hub``)."""
        src = self.spec[v]
        if spec == src:
            return self.local[(v, src)]
        phase = read_phase(v.producer.part if v.producer is not None else None, self.part, self.redo_later)
        hit = self.local.get((v, spec, phase))
        if hit is not None:
            return hit
        via = self.hub(v, src, phase)
        if via not in (src, spec):
            x, src = self.get(v, via), via
        else:
            x = self.local[(v, src)]
        for step in plan_steps(v.type.shape, v.type.dtype.itemsize, src, spec, self.mesh):
            x = self._step(x, step)
        self.local[(v, spec, phase)] = x
        self.pieces.setdefault(v, []).append((v, spec, phase))
        return x

    def hub(self, v: Value, src: tuple, phase: str) -> tuple:
        """The spec a value read in several specs (in one read phase) is redistributed to once,
        the readers then redistributing from there: the cheapest such spec, as the planner's
        fan-out item (passes/sharding/problem.py) prices it. ``src`` when there is one reader
        spec."""
        hit = self.hubs.get((v, phase))
        if hit is not None:
            return hit
        wants = sorted(self.targets.get((v, phase), set()) - {src}, key=format_spec)
        best = src
        if len(wants) > 1:
            shape, size = v.type.shape, v.type.dtype.itemsize

            def cost(h):
                first = redistribution_time(shape, size, src, h, self.mesh)
                return first + sum(redistribution_time(shape, size, h, t, self.mesh) for t in wants if t != h)

            best = min([src, *wants], key=cost)
        self.hubs[(v, phase)] = best
        return best

    def scatter_early(self, v: Value) -> None:
        """Redistribute gradient ``v`` now, right after it is made, when its readers want it in
        one spec (or its hub) that a reduce-scatter along a data axis makes: the full partial
        sum is then freed here instead of living until the update (ZeRO-2). The collectives
        serve the update (its part)."""
        src = self.spec[v]
        phase = read_phase(v.producer.part if v.producer is not None else None, "update", self.redo_later)
        wants = self.targets.get((v, phase), set()) - {src}
        if not wants:
            return
        target = next(iter(wants)) if len(wants) == 1 else self.hub(v, src, phase)
        steps = plan_steps(v.type.shape, v.type.dtype.itemsize, src, target, self.mesh)
        data = {a for a, name in enumerate(self.mesh.axis_names) if self.mesh.roles[name] == "data"}
        if target == src or not any(st.kind == "reduce_scatter" and st.axis in data for st in steps):
            return
        part, self.part = self.part, "update"
        self.get(v, target)
        self.part = part

    def _step(self, x: Value, step) -> Value:
        a = step.axis
        name = self.mesh.axis_names[a]
        group = tuple(self.mesh.group(self.device, a))
        new, old = step.dst[a], step.src[a]
        if step.kind == "all_reduce":
            return self.emit("all_reduce", x, axis=name, group=group)
        if step.kind == "reduce_scatter":
            return self.emit("reduce_scatter", x, axis=name, group=group, dim=new.dim, blocks=new.blocks)
        if step.kind == "all_gather":
            return self.emit("all_gather", x, axis=name, group=group, dim=old.dim, blocks=old.blocks)
        if step.kind == "all_to_all":
            return self.emit(
                "all_to_all",
                x,
                axis=name,
                group=group,
                split_dim=new.dim,
                split_blocks=new.blocks,
                concat_dim=old.dim,
                concat_blocks=old.blocks,
            )
        if step.kind == "slice":
            return self.emit(
                "shard_slice", x, dim=new.dim, blocks=new.blocks, parts=self.mesh_shape[a], index=self.coord[a]
            )
        if step.kind == "zero":
            return self.emit("partial_zero", x, keep=self.coord[a] == 0)
        raise AssertionError(step.kind)  # pragma: no cover

    # --- one node of the graph ----------------------------------------------------------------
    def node(self, node: Node, st: Strategy, part: str | None = None) -> None:
        self.loc, self.part = node.loc, part or node.part
        ins = [self.get(v, s) for v, s in zip(node.inputs, st.in_specs)]
        name = node.op.name
        if node.op.has(ShardingConstraint):  # honoured by the specs; the op itself is the identity
            self.produced(node.outputs[0], ins[0], st.out_specs[0])
            return
        if node.regions:  # control flow runs replicated (no finer rule): whole operands, global regions
            types = [o.type for o in node.outputs]
            new = Node(node.op, ins, node.attrs, types, node.loc, self.part, [clone_region(r) for r in node.regions])
            self.nodes.append(new)
            outs = new.outputs
        elif node.op.has(IndexedLookup) and self._masked_split(node, st):
            outs = (self._masked(node, st, ins),)
        else:
            outs = self.emit_multi(name, *ins, **local_attrs(node, st, self.mesh_shape, self.coord))
        for o, lo, s in zip(node.outputs, outs, st.out_specs):
            want = TensorType(local_shape(o.type.shape, s, self.mesh_shape), o.type.dtype)
            if lo.type != want:  # pragma: no cover - a rule/lowering mismatch
                raise GraphcError(f"lowering {name} at {node.loc}: local result {lo.type}, expected {want}")
            self.produced(o, lo, s)

    def _masked_split(self, node: Node, st: Strategy) -> bool:
        rule = get_rule(node)
        assert rule is not None  # gather and scatter_add have rules
        axis = node.attrs["axis"]
        lookup = node.op.trait(IndexedLookup)
        assert lookup is not None  # (only lookups are masked)
        k = lookup.index_count(len(node.inputs))
        return any(
            rule.inputs[0][axis + j] in rule.masked and any(p.is_split and p.dim == axis + j for p in st.in_specs[0])
            for j in range(k)
        )

    def _masked(self, node: Node, st: Strategy, ins: list[Value]) -> Value:
        rule = get_rule(node)
        assert rule is not None
        axis = node.attrs["axis"]
        lookup = node.op.trait(IndexedLookup)
        assert lookup is not None  # (only lookups are masked)
        scatter = lookup.trailing == 1
        k = lookup.index_count(len(node.inputs))
        idx = list(ins[1 : 1 + k])
        owned: Value | None = None
        for j in range(k):
            if rule.inputs[0][axis + j] not in rule.masked:
                continue
            table = owned_rows(
                node.inputs[0].type.shape[axis + j], st.in_specs[0], axis + j, self.mesh_shape, self.coord
            )
            if table is None:
                continue
            local = self.emit("gather", self.constant(table), idx[j], axis=0)  # raises on out-of-range
            mine = self.emit("compare", local, self.constant(np.int64(0)), direction="ge")
            idx[j] = self.emit("where", mine, local, self.constant(np.int64(0)))
            owned = mine if owned is None else self.emit("logical_and", owned, mine)
        assert owned is not None  # _masked_split found a masked index
        bshape = np.broadcast_shapes(*(v.type.shape for v in idx))
        if owned.type.shape != bshape:
            owned = self.emit("broadcast_to", owned, shape=bshape)
        target = node.outputs[0].type.ndim if not scatter else ins[-1].type.ndim
        mask = self.emit("reshape", owned, shape=(1,) * axis + bshape + (1,) * (target - axis - len(bshape)))
        # rows another device owns give the additive identity: -0.0 for floats (x + -0.0 is x for
        # every x, where x + 0.0 turns -0.0 into 0.0), so the partial sums add up to numpy's bits
        if scatter:
            updates = ins[-1]
            kept = self.emit("where", mask, updates, self.constant(additive_identity(updates.type.dtype)))
            return self.emit("scatter_add", ins[0], *idx, kept, axis=axis)
        out = self.emit("gather", ins[0], *idx, axis=axis)
        return self.emit("where", mask, out, self.constant(additive_identity(out.type.dtype)))


def _strategies(graph: Graph, plan: ShardingPlan) -> tuple[list[tuple], list[Strategy], list[tuple]]:
    """(input specs, node strategies, output specs) of a plan, in graph order."""
    ins: list = [None] * len(graph.inputs)
    outs: list = [None] * len(graph.outputs)
    nodes: list = [None] * len(graph.nodes)
    for x in plan.inputs:
        ins[x.index] = x.spec
    for x in plan.outputs:
        outs[x.index] = x.spec
    for n in plan.nodes:
        nodes[n.index] = Strategy(name=n.strategy, in_specs=n.in_specs, out_specs=n.out_specs)
    if any(s is None for s in ins + outs + nodes):
        raise GraphcError("the plan does not cover every input, node and output of the graph")
    return ins, nodes, outs


def _recompute_points(graph: Graph, plan: ShardingPlan) -> dict[int, list[int]]:
    """{node index: the recomputed nodes to emit again right before it, in graph order}, with the
    forward views into their results: readers of a view read the copy's."""
    again = sorted(n.index for n in plan.nodes if n.recompute)
    if not again:
        return {}
    roots = view_roots(graph)
    found = candidates(graph, roots)
    views: dict[Value, list[int]] = {}  # forward views into a value, to make again from its copy
    for k, n in enumerate(graph.nodes):
        if n.part == "forward" and n.outputs and all(o in roots for o in n.outputs):
            views.setdefault(roots[n.outputs[0]], []).append(k)
    at: dict[int, list[int]] = {}
    for k in again:
        if k not in found:
            raise GraphcError(f"the plan recomputes node {k} ({graph.nodes[k].op.name}), which cannot be recomputed")
        at.setdefault(found[k].point, []).append(k)
        at[found[k].point] += [j for o in graph.nodes[k].outputs for j in views.get(o, ())]
    return {p: sorted(set(ks)) for p, ks in at.items()}


def lower_graph(graph: Graph, plan: ShardingPlan) -> ParallelProgram:
    """One program per device of the plan's mesh for ``graph`` partitioned by ``plan``; PlanError for
    a plan that offloads (the runtime here has no host memory tier, passes/offload.py)."""
    if plan.offload is not None:
        raise not_runnable(plan.offload, plan.mesh.profile.name)
    mesh = plan.mesh
    in_specs, strategies, out_specs = _strategies(graph, plan)
    names = graph.value_names()
    redo_later = plan.memory.limit_bytes is not None
    again = _recompute_points(graph, plan)
    copies = {j for js in again.values() for j in js}  # read again by their copies, part "recompute"
    targets: dict[tuple[Value, str], set[tuple]] = {}  # the specs every value is read in, per read phase
    for k, (node, st) in enumerate(zip(graph.nodes, strategies)):
        for part in (node.part, "recompute") if k in copies else (node.part,):
            for v, sp in zip(node.inputs, st.in_specs):
                phase = read_phase(v.producer.part if v.producer is not None else None, part, redo_later)
                targets.setdefault((v, phase), set()).add(sp)
    for v, sp in zip(graph.outputs, out_specs):
        targets.setdefault((v, ""), set()).add(sp)
    grads = gradients(graph, update_nodes(graph)) if any(r == "data" for r in mesh.roles.values()) else set()
    programs = []
    for device in mesh.devices():
        em = _Emitter(graph, mesh, device, redo_later)
        em.targets = targets
        for v, s in zip(graph.inputs, in_specs):
            local = Value(TensorType(local_shape(v.type.shape, s, em.mesh_shape), v.type.dtype), None, 0, names[v])
            em.inputs.append(local)
            em.produced(v, local, s)
        origin: list[int] = []
        for k, (node, st) in enumerate(zip(graph.nodes, strategies)):
            for j in again.get(k, ()):  # recomputed right before their first backward reader
                em.recompute(graph.nodes[j], strategies[j])
                origin += [j] * (len(em.nodes) - len(origin))
            em.node(node, st)
            for o in node.outputs:
                if o in grads:
                    em.scatter_early(o)
            origin += [k] * (len(em.nodes) - len(origin))
        outputs = []
        for v, s in zip(graph.outputs, out_specs):
            em.loc, em.part = (v.producer.loc if v.producer is not None else None), None  # the line that made it
            outputs.append(em.get(v, s))
        origin += [-1] * (len(em.nodes) - len(origin))
        in_tree = TreeDef("tuple", (TreeDef("tuple", (LEAF,) * len(em.inputs)), TreeDef("dict")))
        out_tree = TreeDef("tuple", (LEAF,) * len(outputs))
        g = Graph(f"{graph.name}.dev{device}", em.inputs, em.nodes, outputs, in_tree, out_tree)
        programs.append(DeviceProgram(device, em.coord, g, tuple(in_specs), tuple(out_specs), tuple(origin)))
    return ParallelProgram(
        mesh, tuple(programs), tuple(v.type for v in graph.inputs), tuple(v.type for v in graph.outputs)
    )


def regather(graph: Graph, sources: frozenset[int]) -> Graph:
    """ZeRO-3 on one device program: every ``all_gather`` of the program inputs at positions
    ``sources`` (the parameters kept split along a data axis) is made again right before each
    node that reads its result, so no gathered copy outlives the node that uses it (the runtime
    frees a value after its last reader). Run after CSE, which would merge the copies back."""
    srcs = {graph.inputs[k] for k in sources}
    all_gather = get_op("all_gather")
    gathers = {n for n in graph.nodes if n.op is all_gather and n.inputs[0] in srcs and not n.regions}
    if not gathers:
        return graph
    rw = Rewriter()

    def fresh(v: Value, like: Node) -> Value:
        g = v.producer
        assert g is not None
        node = Node(g.op, [rw.get(x) for x in g.inputs], g.attrs, [o.type for o in g.outputs], g.loc, like.part)
        rw.nodes.append(node)
        return node.outputs[0]

    for node in graph.nodes:
        if node in gathers:
            continue
        copies = {v: fresh(v, node) for v in dict.fromkeys(node.inputs) if v.producer in gathers}
        rw.subst.update(copies)
        rw.keep(node)
        for v in copies:
            del rw.subst[v]
    outputs = []
    for v in graph.outputs:
        if v.producer in gathers:
            last = rw.nodes[-1] if rw.nodes else v.producer
            outputs.append(fresh(v, last))
        else:
            outputs.append(rw.get(v))
    return Graph(graph.name, graph.inputs, rw.nodes, outputs, graph.in_tree, graph.out_tree)


def redistribution_program(ttype: TensorType, src: tuple, dst: tuple, mesh) -> ParallelProgram:
    """One program per device of ``mesh`` that takes a tensor of type ``ttype`` placed by spec
    ``src`` to spec ``dst``: the steps of passes/sharding/redistribute.py, as the lowering emits
    them between a plan's choices (the runtime redistributes a sharded value passed to a step that
    wants it in another spec with it)."""
    in_tree = TreeDef("tuple", (TreeDef("tuple", (LEAF,)), TreeDef("dict")))
    out_tree = TreeDef("tuple", (LEAF,))
    whole = Value(ttype, None, 0, "x")
    identity = Graph("redistribute", [whole], [], [whole], in_tree, out_tree)
    programs = []
    for device in mesh.devices():
        em = _Emitter(identity, mesh, device)
        local = Value(TensorType(local_shape(ttype.shape, src, em.mesh_shape), ttype.dtype), None, 0, "x")
        em.inputs.append(local)
        em.produced(whole, local, tuple(src))
        out = em.get(whole, tuple(dst))
        g = Graph(f"redistribute.dev{device}", em.inputs, em.nodes, [out], in_tree, out_tree)
        programs.append(DeviceProgram(device, em.coord, g, (tuple(src),), (tuple(dst),)))
    return ParallelProgram(mesh, tuple(programs), (ttype,), (ttype,))
