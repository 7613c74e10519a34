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
``verify_programs`` checks it anyway, with the local shapes.

Masked lookups (a gather from a table split by rows, graphc/ops/dims.py) become explicit ops:
the global index goes through a per-device table of local rows (-1 for rows another device
holds; the table has one entry per global row, so an out-of-range index raises IndexError on
every device, as numpy does), rows held elsewhere contribute zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphc.core.errors import GraphcError, VerifyError
from graphc.core.ir import Graph, Node, TensorType, Value, clone_region
from graphc.core.pytree import LEAF, TreeDef
from graphc.core.spec import format_spec, local_shape, parse_spec
from graphc.ops import get_op
from graphc.passes.sharding.local import _owned_rows, local_attrs
from graphc.passes.sharding.redistribute import plan_steps
from graphc.passes.sharding.strategies import Strategy, get_rule


@dataclass
class DeviceProgram:
    device: int
    coord: tuple[int, ...]
    graph: Graph
    in_specs: list[tuple]  # per graph input: the spec its piece follows
    out_specs: list[tuple]  # per graph output
    origin: list[int] | None = None  # per program node: the graph node it was emitted for (-1: an output)


class _Emitter:
    """Builds one device's program."""

    def __init__(self, graph: Graph, mesh, device: int):
        self.mesh = mesh
        self.device = device
        self.coord = mesh.coord(device)
        self.mesh_shape = tuple(mesh.shape)
        self.nodes: list[Node] = []
        self.inputs: list[Value] = []
        self.local: dict[tuple[Value, tuple], Value] = {}  # (global value, spec) -> local value
        self.spec: dict[Value, tuple] = {}  # global value -> spec of its produced piece
        self.loc = None
        self.part = None

    def emit(self, opname: str, *inputs: Value, **attrs) -> Value | tuple[Value, ...]:
        op = get_op(opname)
        types = op.infer_types(tuple(v.type for v in inputs), attrs)
        node = Node(op, inputs, attrs, types, self.loc, self.part)
        self.nodes.append(node)
        return node.outputs[0] if len(node.outputs) == 1 else node.outputs

    def constant(self, value: np.ndarray) -> Value:
        return self.emit("constant", value=np.asarray(value))

    def produced(self, v: Value, local: Value, spec: tuple) -> None:
        self.local[(v, spec)] = local
        self.spec[v] = spec

    def get(self, v: Value, spec: tuple) -> Value:
        """The device's piece of ``v`` in ``spec``, redistributing if needed (each target once)."""
        hit = self.local.get((v, spec))
        if hit is not None:
            return hit
        src = self.spec[v]
        x = self.local[(v, src)]
        for step in plan_steps(v.type.shape, v.type.dtype.itemsize, src, spec, self.mesh):
            x = self._step(x, step)
        self.local[(v, spec)] = x
        return x

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
            return self.emit("all_to_all", x, axis=name, group=group, split_dim=new.dim, split_blocks=new.blocks,
                             concat_dim=old.dim, concat_blocks=old.blocks)
        if step.kind == "slice":
            return self.emit("shard_slice", x, dim=new.dim, blocks=new.blocks, parts=self.mesh_shape[a],
                             index=self.coord[a])
        if step.kind == "zero":
            return self.emit("partial_zero", x, keep=self.coord[a] == 0)
        raise AssertionError(step.kind)  # pragma: no cover

    # --- one node of the graph ----------------------------------------------------------------
    def node(self, node: Node, st: Strategy) -> None:
        self.loc, self.part = node.loc, node.part
        ins = [self.get(v, s) for v, s in zip(node.inputs, st.in_specs)]
        name = node.op.name
        if name == "sharding":  # the constraint is honoured by the specs; the op itself is the identity
            self.produced(node.outputs[0], ins[0], st.out_specs[0])
            return
        if node.regions:  # control flow runs replicated (no finer rule): whole operands, global regions
            types = [o.type for o in node.outputs]
            new = Node(node.op, ins, node.attrs, types, node.loc, node.part, [clone_region(r) for r in node.regions])
            self.nodes.append(new)
            outs = new.outputs
        elif name in ("gather", "scatter_add") and self._masked_split(node, st):
            outs = (self._masked(node, st, ins),)
        else:
            attrs = local_attrs(node, st, self.mesh_shape, self.coord)
            out = self.emit(name, *ins, **attrs)
            outs = out if isinstance(out, tuple) else (out,)
        for o, lo, s in zip(node.outputs, outs, st.out_specs):
            want = TensorType(local_shape(o.type.shape, s, self.mesh_shape), o.type.dtype)
            if lo.type != want:  # pragma: no cover - a rule/lowering mismatch
                raise GraphcError(f"lowering {name} at {node.loc}: local result {lo.type}, expected {want}")
            self.produced(o, lo, s)

    def _masked_split(self, node: Node, st: Strategy) -> bool:
        rule = get_rule(node)
        axis = node.attrs["axis"]
        k = len(node.inputs) - (2 if node.op.name == "scatter_add" else 1)
        return any(rule.inputs[0][axis + j] in rule.masked and any(
            p.is_split and p.dim == axis + j for p in st.in_specs[0]) for j in range(k))

    def _masked(self, node: Node, st: Strategy, ins: list[Value]) -> Value:
        rule = get_rule(node)
        axis = node.attrs["axis"]
        scatter = node.op.name == "scatter_add"
        k = len(node.inputs) - (2 if scatter else 1)
        idx = list(ins[1:1 + k])
        owned = None
        for j in range(k):
            if rule.inputs[0][axis + j] not in rule.masked:
                continue
            table = _owned_rows(node.inputs[0].type.shape[axis + j], st.in_specs[0], axis + j, self.mesh_shape,
                                self.coord)
            if table is None:
                continue
            local = self.emit("gather", self.constant(table), idx[j], axis=0)  # raises on out-of-range
            mine = self.emit("compare", local, self.constant(np.int64(0)), direction="ge")
            idx[j] = self.emit("where", mine, local, self.constant(np.int64(0)))
            owned = mine if owned is None else self.emit("logical_and", owned, mine)
        bshape = np.broadcast_shapes(*(v.type.shape for v in idx))
        if owned.type.shape != bshape:
            owned = self.emit("broadcast_to", owned, shape=bshape)
        target = node.outputs[0].type.ndim if not scatter else ins[-1].type.ndim
        mask = self.emit("reshape", owned, shape=(1,) * axis + bshape + (1,) * (target - axis - len(bshape)))
        if scatter:
            updates = ins[-1]
            zero = self.constant(np.zeros((), updates.type.dtype))
            kept = self.emit("where", mask, updates, zero)
            return self.emit("scatter_add", ins[0], *idx, kept, axis=axis)
        out = self.emit("gather", ins[0], *idx, axis=axis)
        return self.emit("where", mask, out, self.constant(np.zeros((), out.type.dtype)))


def _strategies(graph: Graph, plan) -> tuple[list[tuple], list[Strategy], list[tuple]]:
    """(input specs, node strategies, output specs) of a plan, in graph order."""
    doc = plan.doc
    n_axes = len(doc["mesh"]["axes"])
    ins = [None] * len(graph.inputs)
    for d in doc["inputs"]:
        ins[d["index"]] = parse_spec(d["spec"], n_axes)
    outs = [None] * len(graph.outputs)
    for d in doc["outputs"]:
        outs[d["index"]] = parse_spec(d["spec"], n_axes)
    nodes: list = [None] * len(graph.nodes)
    for d in doc["nodes"]:
        nodes[d["index"]] = Strategy(d["strategy"], tuple(parse_spec(s, n_axes) for s in d["in_specs"]),
                                     tuple(parse_spec(s, n_axes) for s in d["out_specs"]))
    if any(s is None for s in ins + outs + nodes):
        raise GraphcError("the plan does not cover every input, node and output of the graph")
    return ins, nodes, outs


def lower(graph: Graph, plan, mesh) -> list[DeviceProgram]:
    """One program per device of ``mesh`` for ``graph`` partitioned by ``plan``."""
    in_specs, strategies, out_specs = _strategies(graph, plan)
    names = graph.value_names()
    programs = []
    for device in mesh.devices():
        em = _Emitter(graph, mesh, device)
        for v, s in zip(graph.inputs, in_specs):
            local = Value(TensorType(local_shape(v.type.shape, s, em.mesh_shape), v.type.dtype), None, 0, names[v])
            em.inputs.append(local)
            em.produced(v, local, s)
        origin: list[int] = []
        for k, (node, st) in enumerate(zip(graph.nodes, strategies)):
            em.node(node, st)
            origin += [k] * (len(em.nodes) - len(origin))
        em.loc = em.part = None
        outputs = [em.get(v, s) for v, s in zip(graph.outputs, out_specs)]
        origin += [-1] * (len(em.nodes) - len(origin))
        in_tree = TreeDef("tuple", (TreeDef("tuple", (LEAF,) * len(em.inputs)), TreeDef("dict")))
        out_tree = TreeDef("tuple", (LEAF,) * len(outputs))
        g = Graph(f"{graph.name}.dev{device}", em.inputs, em.nodes, outputs, in_tree, out_tree)
        programs.append(DeviceProgram(device, em.coord, g, list(in_specs), list(out_specs), origin))
    return programs


COLLECTIVE_OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


def collective_sequence(g: Graph) -> list[tuple]:
    """(op, group, attrs, operand type) of every collective of a device program, in order."""
    seq = []
    for node in g.nodes:
        if node.op.name in COLLECTIVE_OPS:
            attrs = tuple(sorted((k, v) for k, v in node.attrs.items()))
            seq.append((node.op.name, node.attrs["group"], attrs, str(node.inputs[0].type), node.loc))
    return seq


def verify_programs(programs: list[DeviceProgram]) -> None:
    """Each program verifies; every collective is entered by all members of its group, in the
    same order, with the same attributes and operand types (so none can deadlock or mismatch)."""
    for p in programs:
        p.graph.verify()
    check_collective_order(programs)


def check_collective_order(programs: list[DeviceProgram]) -> None:
    """Every collective of a group is entered by all its members in the same order with the same
    attributes and operand types."""
    by_device = {p.device: p for p in programs}
    per_group: dict[tuple, dict[int, list]] = {}
    for p in programs:
        for entry in collective_sequence(p.graph):
            group = entry[1]
            if p.device not in group:
                raise VerifyError(f"device {p.device} enters {entry[0]} of group {group}, which it is not in")
            per_group.setdefault(group, {}).setdefault(p.device, []).append(entry)
    for group, seqs in per_group.items():
        for d in group:
            if d not in by_device:
                raise VerifyError(f"group {group} names device {d}, which has no program")
        first = [e[:4] for e in seqs.get(group[0], [])]
        for d in group[1:]:
            mine = [e[:4] for e in seqs.get(d, [])]
            if mine != first:
                k = next((i for i, (a, b) in enumerate(zip(first, mine)) if a != b), min(len(first), len(mine)))
                a = first[k] if k < len(first) else "nothing"
                b = mine[k] if k < len(mine) else "nothing"
                raise VerifyError(f"collective #{k} of group {group}: device {group[0]} enters {a}, device {d} enters {b}")


def describe_specs(specs) -> list[str]:
    return [format_spec(s) for s in specs]


def shard_inputs(programs: list[DeviceProgram], arrays: list[np.ndarray], mesh) -> dict[int, list[np.ndarray]]:
    """Every device's pieces of the graph inputs."""
    from graphc.core.spec import shard

    shape = tuple(mesh.shape)
    return {p.device: [shard(a, s, shape, p.coord) for a, s in zip(arrays, p.in_specs)] for p in programs}


def gather_outputs(programs: list[DeviceProgram], outs: dict[int, list[np.ndarray]], graph: Graph, mesh) -> list:
    """The whole graph outputs from every device's pieces."""
    from graphc.core.spec import unshard

    shape = tuple(mesh.shape)
    result = []
    for k, (v, spec) in enumerate(zip(graph.outputs, programs[0].out_specs)):
        pieces = {p.coord: outs[p.device][k] for p in programs}
        result.append(unshard(pieces, spec, shape, v.type.shape).astype(v.type.dtype, copy=False))
    return result


def simulate(programs: list[DeviceProgram], inputs: dict[int, list[np.ndarray]]) -> dict[int, list[np.ndarray]]:
    """Run the device programs in lock step with the reference implementations: the oracle for
    the lowering and for the multi-threaded runtime. The programs of one plan have the same nodes
    in the same order (they differ in constants and local attributes only), so step k of every
    program runs together and a collective sees every member's operand."""
    from graphc.interpreter import run_flat
    from graphc.ops.comm import reference

    envs = {p.device: dict(zip(p.graph.inputs, inputs[p.device])) for p in programs}
    lengths = {len(p.graph.nodes) for p in programs}
    if len(lengths) != 1:
        raise GraphcError("device programs of one plan must have the same number of steps to run in lock step")
    by_device = {p.device: p for p in programs}
    for k in range(lengths.pop()):
        done: set[int] = set()
        for p in programs:
            node = p.graph.nodes[k]
            if p.device in done:
                continue
            env = envs[p.device]
            if node.op.name in COLLECTIVE_OPS:
                group = node.attrs["group"]
                members = [by_device[d].graph.nodes[k] for d in group]
                xs = [envs[d][m.inputs[0]] for d, m in zip(group, members)]
                for d, m, y in zip(group, members, reference(node.op.name, xs, **node.attrs)):
                    envs[d][m.outputs[0]] = y
                    done.add(d)
                continue
            args = [env[v] for v in node.inputs]
            if node.regions:
                outs = node.op.impl(run_flat, node.regions, *args, **node.attrs)
            else:
                outs = node.op.evaluate(*args, **node.attrs)
            for o, y in zip(node.outputs, outs):
                env[o] = np.asarray(y)
            done.add(p.device)
    return {p.device: [envs[p.device][v] for v in p.graph.outputs] for p in programs}
