"""``ShardingPlan``: what the auto-sharding solver chose, what it costs, and why; a frozen value.

Fields, each a small frozen dataclass or tuple of them:

    graph              name, hash (of the text IR it was made for), node count
    mesh               the Mesh (axes, links, machine profile)
    options            how it was planned (memory limit, pins, time limit, solver, ...)
    inputs / outputs   per graph input / output: name, type, spec, pinned, best alternatives
    nodes              per node: strategy, operand and result specs, compute time, pins, warning,
                       best alternatives
    collectives        every redistribution in program order: kind, mesh axes, bytes, time, where
    cost               compute_s, comm_s, total_s; model flops and MFU (``Cost``)
    memory             limit_bytes, peak_bytes (one per device), peak_at
    solver             name, status, objective, bound, gap, seconds, problem sizes
    ties, warnings, timing

JSON is a view of it: ``to_json() -> str`` and ``ShardingPlan.from_json(str)`` (version
``PLAN_VERSION``). A plan file can be hand-edited (set a node's ``"pinned": true`` after changing
its ``strategy``, or pin an input's ``spec``) and re-solved around the pins (``graphc compile
--plan FILE``); ``check(graph)`` refuses a plan made for another graph.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from graphc.core.errors import PlanError
from graphc.core.files import atomic_write, check_record, dump_document, read_document
from graphc.core.ir import Graph, print_graph
from graphc.core.mesh import Mesh, MeshError
from graphc.core.spec import Spec, SpecError, format_spec, parse_spec
from graphc.core.traits import Contraction
from graphc.core.units import fmt_bytes, fmt_rate, fmt_time
from graphc.ops.dims import default_cost
from graphc.passes.sharding.problem import local_nbytes
from graphc.passes.sharding.redistribute import bucketed_step_time, plan_steps
from graphc.passes.sharding.zero import zero_report

PLAN_VERSION = 2


def graph_hash(graph: Graph) -> str:
    """The hash a plan is made for: of the graph's text IR."""
    return hashlib.sha256(print_graph(graph).encode()).hexdigest()[:32]


def check_made_for(graph: Graph, name: str, made_for: str, what: str) -> None:
    """PlanError unless ``graph`` hashes to ``made_for``: a plan is followed only on its graph."""
    h = graph_hash(graph)
    if h != made_for:
        raise PlanError(
            f"stale {what}: it was made for graph @{name} with hash {made_for}, but the graph now hashes to {h} "
            "(the model or its arguments changed); recompile the plan"
        )


def _frozen(d: Mapping | None) -> Mapping:
    return MappingProxyType(dict(d or {}))


@dataclass(frozen=True)
class Alternative:
    """Another choice for one input, output or node, every other choice held fixed."""

    out_specs: tuple[Spec, ...]
    delta_s: float  # its compute + redistribution time minus the chosen one's
    strategy: str | None = None  # nodes
    compute_s: float = 0.0
    comm_s: float = 0.0
    memory_delta_bytes: int | None = None  # inputs: bytes each device holds, minus the chosen spec's


@dataclass(frozen=True)
class TensorChoice:
    """The spec chosen for a graph input (what each device is given) or output (what it returns)."""

    index: int
    name: str
    type: str
    spec: Spec
    pinned: bool = False
    alternatives: tuple[Alternative, ...] = ()
    # inputs: the ZeRO stage of its parameter's group (passes/sharding/zero.py), and the bytes per
    # device its split along the ZeRO axes saves (a parameter's: its gradients' too)
    zero: int = 0
    zero_saved_bytes: int = 0


@dataclass(frozen=True)
class NodeChoice:
    """The strategy chosen for one node: its operand and result specs and the share of its work."""

    index: int
    name: str
    op: str
    loc: str | None
    part: str | None
    types: tuple[str, ...]
    strategy: str
    in_specs: tuple[Spec, ...]
    out_specs: tuple[Spec, ...]
    compute_s: float
    pinned: bool = False
    warning: str | None = None
    alternatives: tuple[Alternative, ...] = ()
    # recomputed before the backward pass instead of kept (passes/sharding/remat.py); the bytes
    # of its results each device no longer holds from the forward to the backward pass
    recompute: bool = False
    recompute_saved_bytes: int = 0


@dataclass(frozen=True)
class Collective:
    """One redistribution step: a collective along one mesh axis (or a local slice / zeroing)."""

    kind: str
    axes: tuple[str, ...]
    bytes: int  # of the whole logical tensor
    local_bytes: int  # each device's bytes before the step (after, for all_gather)
    tensor: str
    node: str  # the consumer it serves
    node_index: int | None
    op: str
    loc: str | None
    part: str | None
    src: Spec
    dst: Spec
    time_s: float


@dataclass(frozen=True)
class Cost:
    """The predicted step, and how much of the devices' peak it uses.

    ``mfu`` (model flops utilization) = ``model_flops / (total_s x devices x peak_flops)``:
    ``model_flops`` is the work of one step, every node of the graph counted once as on one device
    (the unsharded work: neither the work replicated devices repeat nor recomputation counts);
    ``peak_flops`` is the profile's matmul rate of one device for ``peak_dtype``, the dtype that
    carries most of the step's contraction flops. None in plans written before it existed."""

    compute_s: float
    comm_s: float
    total_s: float
    model_flops: float | None = None
    peak_dtype: str | None = None
    peak_flops: float | None = None
    mfu: float | None = None


@dataclass(frozen=True)
class Memory:
    """Per-device memory of a plan. ``peak_bytes`` is the liveness peak of the values under their
    specs (what ``limit_bytes`` bounds: the ILP's memory model); ``held_bytes`` adds the buffers
    the plan's redistributions make (a collective's result, a local slice's copy, a gradient
    bucket), live from the first reader that needs them to the last: what the runtime holds."""

    limit_bytes: int | None
    peak_bytes: tuple[int, ...]  # one per device
    peak_at: str | None
    held_bytes: tuple[int, ...] = ()  # one per device; () in plans written before it: peak_bytes
    recompute_saved_bytes: int = 0  # the peak with every recomputed value kept, minus peak_bytes

    @property
    def held(self) -> tuple[int, ...]:
        return self.held_bytes or self.peak_bytes


@dataclass(frozen=True)
class SolverStats:
    name: str
    status: str
    objective_s: float
    bound_s: float
    gap: float
    seconds: float
    build_s: float = 0.0
    sizes: Mapping[str, int] = field(default_factory=dict)  # items, groups, variables, constraints, ...


@dataclass(frozen=True)
class ShardingPlan:
    graph_name: str
    graph_hash: str
    n_nodes: int
    mesh: Mesh
    inputs: tuple[TensorChoice, ...]
    outputs: tuple[TensorChoice, ...]
    nodes: tuple[NodeChoice, ...]
    collectives: tuple[Collective, ...]
    cost: Cost
    memory: Memory
    solver: SolverStats
    options: Mapping[str, Any] = field(default_factory=dict)
    ties: tuple[tuple[int, int], ...] = ()
    warnings: tuple[str, ...] = ()
    timing: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "options", _frozen(self.options))
        object.__setattr__(self, "timing", _frozen(self.timing))

    def with_timing(self, **seconds: Any) -> ShardingPlan:
        """The same plan with more entries in ``timing`` (trace, optimize, plan seconds, cached)."""
        return dataclasses.replace(self, timing={**self.timing, **seconds})

    # --- reading ---------------------------------------------------------------------------
    def input_specs(self) -> list[Spec]:
        return [x.spec for x in sorted(self.inputs, key=lambda x: x.index)]

    def output_specs(self) -> list[Spec]:
        return [x.spec for x in sorted(self.outputs, key=lambda x: x.index)]

    def node_choices(self) -> list[NodeChoice]:
        return sorted(self.nodes, key=lambda n: n.index)

    def check(self, graph: Graph) -> None:
        """Refuse a plan made for a different graph."""
        check_made_for(graph, self.graph_name, self.graph_hash, "plan")

    def pins(self) -> tuple[dict[int, Spec], dict[int, Spec], dict[int, str]]:
        """(input pins, output pins, node pins) marked ``"pinned": true`` in the plan."""
        ins = {x.index: x.spec for x in self.inputs if x.pinned}
        outs = {x.index: x.spec for x in self.outputs if x.pinned}
        nodes = {n.index: n.strategy for n in self.nodes if n.pinned}
        return ins, outs, nodes

    # --- files -----------------------------------------------------------------------------
    def to_json(self) -> str:
        return dump_document(_plan_doc(self))

    @classmethod
    def from_json(cls, text: str, source: str = "<plan>") -> ShardingPlan:
        doc = read_document(text, source, "plan", PLAN_VERSION, error=PlanError)
        try:
            plan = _plan_from_doc(doc)
        except (KeyError, TypeError, ValueError, AttributeError, SpecError, MeshError) as exc:
            raise PlanError(f"{source}: not a complete graphc plan ({type(exc).__name__}: {exc})") from None
        check_record(plan, source, PlanError)  # a hand-edited value of the wrong type is named here
        devices = plan.mesh.size
        if len(plan.memory.peak_bytes) != devices or len(plan.memory.held_bytes) not in (0, devices):
            raise PlanError(f"{source}: memory.peak_bytes and held_bytes need one entry per device ({devices})")
        return plan

    def save(self, path: str, make_dirs: bool = False) -> None:
        atomic_write(path, self.to_json(), make_dirs=make_dirs)

    @classmethod
    def load(cls, path: str) -> ShardingPlan:
        try:
            with open(path) as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as exc:  # missing, a folder, not UTF-8 text
            raise PlanError(f"cannot read plan {path}: {getattr(exc, 'strerror', None) or exc}") from None
        return cls.from_json(text, path)

    # --- for people ------------------------------------------------------------------------
    def summary(self, top: int = 12) -> str:
        return _summary(self, top)

    def explain(self, name: str) -> str:
        """Why a tensor (or node) got its spec: its cost against the best alternatives, holding
        every other choice fixed (compute of its node + the redistributions it causes)."""
        return _explain(self, name)

    def __repr__(self) -> str:
        return f"<ShardingPlan @{self.graph_name} total {fmt_time(self.cost.total_s)}, {len(self.collectives)} collectives>"


# --- JSON -------------------------------------------------------------------------------------------


def _specs(xs) -> list[str]:
    return [format_spec(s) for s in xs]


def _alt_doc(a: Alternative) -> dict:
    d: dict[str, Any] = {"out_specs": _specs(a.out_specs), "delta_s": a.delta_s}
    if a.strategy is not None:
        d.update(strategy=a.strategy, compute_s=a.compute_s, comm_s=a.comm_s)
    if a.memory_delta_bytes is not None:
        d["memory_delta_bytes"] = a.memory_delta_bytes
    return d


def _alt_from(d: dict, n_axes: int) -> Alternative:
    return Alternative(
        tuple(parse_spec(s, n_axes) for s in d["out_specs"]),
        d["delta_s"],
        d.get("strategy"),
        d.get("compute_s", 0.0),
        d.get("comm_s", 0.0),
        d.get("memory_delta_bytes"),
    )


def _tensor_doc(x: TensorChoice) -> dict:
    return {
        "index": x.index,
        "name": x.name,
        "type": x.type,
        "spec": format_spec(x.spec),
        "pinned": x.pinned,
        "alternatives": [_alt_doc(a) for a in x.alternatives],
        "zero": x.zero,
        "zero_saved_bytes": x.zero_saved_bytes,
    }


def _tensor_from(d: dict, n_axes: int) -> TensorChoice:
    return TensorChoice(
        d["index"],
        d["name"],
        d["type"],
        parse_spec(d["spec"], n_axes),
        bool(d.get("pinned")),
        tuple(_alt_from(a, n_axes) for a in d.get("alternatives", ())),
        int(d.get("zero", 0)),
        int(d.get("zero_saved_bytes", 0)),
    )


def _node_doc(n: NodeChoice) -> dict:
    return {
        "index": n.index,
        "name": n.name,
        "op": n.op,
        "loc": n.loc,
        "part": n.part,
        "types": list(n.types),
        "strategy": n.strategy,
        "in_specs": _specs(n.in_specs),
        "out_specs": _specs(n.out_specs),
        "compute_s": n.compute_s,
        "pinned": n.pinned,
        "warning": n.warning,
        "alternatives": [_alt_doc(a) for a in n.alternatives],
        **({"recompute": True, "recompute_saved_bytes": n.recompute_saved_bytes} if n.recompute else {}),
    }


def _node_from(d: dict, n_axes: int) -> NodeChoice:
    return NodeChoice(
        d["index"],
        d["name"],
        d["op"],
        d.get("loc"),
        d.get("part"),
        tuple(d.get("types", ())),
        d["strategy"],
        tuple(parse_spec(s, n_axes) for s in d["in_specs"]),
        tuple(parse_spec(s, n_axes) for s in d["out_specs"]),
        d["compute_s"],
        bool(d.get("pinned")),
        d.get("warning"),
        tuple(_alt_from(a, n_axes) for a in d.get("alternatives", ())),
        bool(d.get("recompute", False)),
        d.get("recompute_saved_bytes", 0),
    )


def _collective_doc(c: Collective) -> dict:
    return {
        "kind": c.kind,
        "axes": list(c.axes),
        "bytes": c.bytes,
        "local_bytes": c.local_bytes,
        "tensor": c.tensor,
        "node": c.node,
        "node_index": c.node_index,
        "op": c.op,
        "loc": c.loc,
        "part": c.part,
        "from": format_spec(c.src),
        "to": format_spec(c.dst),
        "time_s": c.time_s,
    }


def _collective_from(d: dict, n_axes: int) -> Collective:
    return Collective(
        d["kind"],
        tuple(d["axes"]),
        d["bytes"],
        d["local_bytes"],
        d["tensor"],
        d["node"],
        d.get("node_index"),
        d["op"],
        d.get("loc"),
        d.get("part"),
        parse_spec(d["from"], n_axes),
        parse_spec(d["to"], n_axes),
        d["time_s"],
    )


def _plan_doc(p: ShardingPlan) -> dict:
    s = p.solver
    return {
        "version": PLAN_VERSION,
        "graph": {"name": p.graph_name, "hash": p.graph_hash, "nodes": p.n_nodes},
        "mesh": p.mesh.to_json(),
        "options": dict(p.options),
        "inputs": [_tensor_doc(x) for x in p.inputs],
        "outputs": [_tensor_doc(x) for x in p.outputs],
        "nodes": [_node_doc(n) for n in p.nodes],
        "collectives": [_collective_doc(c) for c in p.collectives],
        "cost": dataclasses.asdict(p.cost),
        "memory": {
            "limit_bytes": p.memory.limit_bytes,
            "peak_bytes": list(p.memory.peak_bytes),
            "peak_at": p.memory.peak_at,
            "held_bytes": list(p.memory.held),
            "recompute_saved_bytes": p.memory.recompute_saved_bytes,
        },
        "solver": {
            "name": s.name,
            "status": s.status,
            "objective_s": s.objective_s,
            "bound_s": s.bound_s,
            "gap": s.gap,
            "seconds": s.seconds,
            "build_s": s.build_s,
            **dict(s.sizes),
        },
        "ties": [list(t) for t in p.ties],
        "warnings": list(p.warnings),
        "timing": dict(p.timing),
    }


_SOLVER_FIELDS = ("name", "status", "objective_s", "bound_s", "gap", "seconds", "build_s")


def _plan_from_doc(doc: dict) -> ShardingPlan:
    mesh = Mesh.from_json(doc["mesh"])
    n = len(mesh.shape)
    s = doc["solver"]
    m = doc["memory"]
    return ShardingPlan(
        graph_name=doc["graph"]["name"],
        graph_hash=doc["graph"]["hash"],
        n_nodes=doc["graph"]["nodes"],
        mesh=mesh,
        inputs=tuple(_tensor_from(d, n) for d in doc["inputs"]),
        outputs=tuple(_tensor_from(d, n) for d in doc["outputs"]),
        nodes=tuple(_node_from(d, n) for d in doc["nodes"]),
        collectives=tuple(_collective_from(d, n) for d in doc["collectives"]),
        cost=Cost(**doc["cost"]),
        memory=Memory(
            m["limit_bytes"],
            tuple(m["peak_bytes"]),
            m.get("peak_at"),
            tuple(m.get("held_bytes", ())),
            m.get("recompute_saved_bytes", 0),
        ),
        solver=SolverStats(
            s["name"],
            s["status"],
            s["objective_s"],
            s["bound_s"],
            s["gap"],
            s["seconds"],
            s.get("build_s", 0.0),
            {k: v for k, v in s.items() if k not in _SOLVER_FIELDS},
        ),
        options=doc.get("options", {}),
        ties=tuple(tuple(t) for t in doc.get("ties", ())),
        warnings=tuple(doc.get("warnings", ())),
        timing=doc.get("timing", {}),
    )


# --- reports ----------------------------------------------------------------------------------------


def _summary(p: ShardingPlan, top: int) -> str:
    axes = ", ".join(f"{name}={size}" for name, size in zip(p.mesh.axis_names, p.mesh.shape))
    c, m, s = p.cost, p.memory, p.solver
    sizes = s.sizes
    lines = [
        f"plan for @{p.graph_name} on mesh ({axes}): {p.n_nodes} nodes, {len(p.collectives)} collectives",
        f"predicted step {fmt_time(c.total_s)} = compute {fmt_time(c.compute_s)} + communication {fmt_time(c.comm_s)}",
        *_mfu_lines(p),
        f"memory per device: peak {fmt_bytes(m.peak_bytes[0])}"
        + (f" of {fmt_bytes(m.limit_bytes)}" if m.limit_bytes else " (no limit)")
        + (f", at {m.peak_at}" if m.peak_at else "")
        + f"; with redistribution buffers {fmt_bytes(m.held[0])}",
        *_recompute_lines(p, top),
        f"solver {s.name}: {s.status}, objective {fmt_time(s.objective_s)}, gap {s.gap:.2%}, "
        f"{s.seconds:.2f} s, {sizes.get('variables', '?')} variables / {sizes.get('constraints', '?')} constraints "
        f"(unshrunk {sizes.get('vars_unshrunk', '?')}; {sizes.get('items', '?')} items -> {sizes.get('groups', '?')} groups)",
    ]
    lines += _collective_lines(p.collectives, top)
    costly = sorted(p.nodes, key=lambda n: -n.compute_s)[:top]
    lines.append(f"  {'node':<8}{'op':<12}{'compute':>10}  {'strategy':<22} out spec        where")
    for n in costly:
        lines.append(
            f"  {n.name:<8}{n.op:<12}{fmt_time(n.compute_s):>10}  {n.strategy:<22} "
            f"{', '.join(_specs(n.out_specs)):<15} {n.loc or ''} {n.part or ''}"
        )
    lines += _zero_lines(p, top)
    specs = [f"{x.name}: {format_spec(x.spec)}" for x in p.inputs]
    if specs:
        lines.append("inputs: " + "; ".join(specs[:top]) + (" ..." if len(specs) > top else ""))
    for w in p.warnings[:top]:
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def _zero_lines(p: ShardingPlan, top: int) -> list[str]:
    """The ZeRO stages of the state inputs and the memory they save (the ``top`` largest
    savings), when any is sharded."""
    staged = [x for x in p.inputs if x.zero]
    if not staged:
        return []
    counts: dict[int, int] = {}
    for x in staged:
        counts[x.zero] = counts.get(x.zero, 0) + 1
    saved = sum(x.zero_saved_bytes for x in staged)
    lines = [
        "ZeRO: "
        + ", ".join(f"stage {k}: {n} state input(s)" for k, n in sorted(counts.items()))
        + f"; saves {fmt_bytes(saved)} per device (state, and gradients read as shards)"
    ]
    for x in sorted(staged, key=lambda x: -x.zero_saved_bytes)[:top]:
        lines.append(f"  {x.name:<28} stage {x.zero}  {format_spec(x.spec):<12} saves {fmt_bytes(x.zero_saved_bytes)}")
    return lines


def _recompute_lines(p: ShardingPlan, top: int) -> list[str]:
    again = sorted((n for n in p.nodes if n.recompute), key=lambda n: -n.recompute_saved_bytes)
    if not again:
        return []
    lines = [
        f"recomputed before the backward pass: {len(again)} nodes, saving {fmt_bytes(p.memory.recompute_saved_bytes)} "
        f"at the peak per device, for {fmt_time(sum(n.compute_s for n in again) / 2)} of compute"
    ]
    for n in again[:top]:
        lines.append(
            f"  recompute {n.name:<8}{n.op:<12}{', '.join(n.types):<22} frees {fmt_bytes(n.recompute_saved_bytes):>11} "
            f"from forward to backward, costs {fmt_time(n.compute_s / 2)}  {n.loc or ''}"
        )
    if len(again) > top:
        lines.append(f'  ... and {len(again) - top} more ("recompute": true in the plan JSON)')
    return lines


def _mfu_lines(p: ShardingPlan) -> list[str]:
    c = p.cost
    if c.mfu is None or c.model_flops is None or c.peak_flops is None:
        return []
    return [
        f"MFU {c.mfu:.1%}: model flops {c.model_flops:.4g} per step over {p.mesh.size} devices x "
        f"{fmt_rate(c.peak_flops)} ({c.peak_dtype} matmul peak of profile {p.mesh.profile.name})"
    ]


def _collective_lines(collectives: tuple[Collective, ...], top: int) -> list[str]:
    coll = sorted(collectives, key=lambda x: -x.time_s)
    if not coll:
        return []
    by_kind: dict[str, list[Collective]] = {}
    for x in coll:
        by_kind.setdefault(x.kind, []).append(x)
    lines = [
        "collectives: "
        + ", ".join(f"{k} x{len(v)} ({fmt_time(sum(x.time_s for x in v))})" for k, v in sorted(by_kind.items()))
    ]
    lines.append(f"  {'kind':<15}{'axes':<8}{'tensor':>12}  {'bytes':>11}  {'time':>10}  {'part':<9} where")
    for x in coll[:top]:
        lines.append(
            f"  {x.kind:<15}{','.join(x.axes):<8}{x.tensor:>12}  {fmt_bytes(x.bytes):>11}  "
            f"{fmt_time(x.time_s):>10}  {x.part or '-':<9} {x.op} {x.loc or ''} "
            f"{format_spec(x.src)} -> {format_spec(x.dst)}"
        )
    return lines


def _explain(p: ShardingPlan, name: str) -> str:
    key = name if name.startswith("%") else f"%{name}"
    for x in p.inputs:
        if x.name == key:
            return _explain_input(p, x)
    for n in p.nodes:
        if n.name == key:
            return _explain_node(n)
    raise PlanError(f"plan has no tensor or node named {key}")


def _explain_input(p: ShardingPlan, x: TensorChoice) -> str:
    tied = any(t[0] == x.index for t in p.ties)
    lines = [
        f"input {x.name} {x.type}: spec {format_spec(x.spec)}"
        + (" (pinned)" if x.pinned else "")
        + (f", ZeRO stage {x.zero} (saves {fmt_bytes(x.zero_saved_bytes)} per device)" if x.zero else "")
        + "; against the best other specs, every other choice held fixed"
        + (" (a tied state input: its output keeps this spec too)" if tied else "")
        + ":"
    ]
    for a in x.alternatives:
        mem = a.memory_delta_bytes or 0
        lines.append(
            f"  instead {', '.join(_specs(a.out_specs)):<22} redistribution to its consumers would cost "
            f"{'+' if a.delta_s >= 0 else ''}{fmt_time(a.delta_s)}, memory per device "
            f"{'+' if mem >= 0 else '-'}{fmt_bytes(abs(mem))}"
        )
    if len(lines) == 1:
        lines.append("  no alternative spec on this mesh")
    return "\n".join(lines)


def _explain_node(n: NodeChoice) -> str:
    lines = [
        f"{n.name} = {n.op} at {n.loc or '?'} ({n.part or 'untagged'}): strategy {n.strategy}, "
        f"out {', '.join(_specs(n.out_specs))}, in {', '.join(_specs(n.in_specs))}, compute {fmt_time(n.compute_s)}"
        + (" (pinned)" if n.pinned else "")
    ]
    if n.recompute:
        lines.append(
            f"  recomputed before the backward pass (compute counted twice): each device frees "
            f"{fmt_bytes(n.recompute_saved_bytes)} of its results from the forward to the backward pass"
        )
    if n.warning:
        lines.append(f"  warning: {n.warning}")
    if not n.alternatives:
        lines.append("  no alternative strategy (only one is valid on this mesh)")
    for a in n.alternatives:
        lines.append(
            f"  instead {a.strategy:<22} out {', '.join(_specs(a.out_specs)):<18} would cost "
            f"{'+' if a.delta_s >= 0 else ''}{fmt_time(a.delta_s)} "
            f"(compute {fmt_time(a.compute_s)}, redistribution {fmt_time(a.comm_s)})"
        )
    return "\n".join(lines)


# --- building a plan from a solved problem ----------------------------------------------------------


def plan_from_solution(problem, sol, memory_limit: int | None, build_s: float, options: Mapping) -> ShardingPlan:
    """The ShardingPlan of ``sol`` (a strategy per item of ``problem``, passes/sharding/problem.py)."""
    graph = problem.graph
    names = graph.value_names()
    choice = sol.choice
    alternatives = _alternatives(problem, choice)
    zero = zero_report(problem, choice)
    recomputed = set(problem.recomputed(choice))
    inputs, outputs, nodes = [], [], []
    for i, it in enumerate(problem.items):
        st = it.strategies[choice[i]]
        alts = tuple(alternatives.get(i, ()))
        if it.kind == "input":
            inputs.append(
                TensorChoice(
                    it.index,
                    f"%{names[it.value]}",
                    str(it.value.type),
                    st.out_specs[0],
                    bool(it.pinned),
                    alts,
                    *zero.get(it.index, (0, 0)),
                )
            )
        elif it.kind == "output":
            outputs.append(
                TensorChoice(it.index, f"%{names[it.value]}", str(it.value.type), st.in_specs[0], bool(it.pinned), alts)
            )
        elif it.kind == "node":
            n = it.node
            nodes.append(
                NodeChoice(
                    it.index,
                    f"%{names[n.outputs[0]]}" if n.outputs else f"node{it.index}",
                    n.op.name,
                    str(n.loc) if n.loc else None,
                    n.part,
                    tuple(str(o.type) for o in n.outputs),
                    st.name,
                    tuple(st.in_specs),
                    tuple(st.out_specs),
                    st.compute_s,
                    bool(it.pinned),
                    it.warning,
                    alts,
                    i in recomputed,
                    sum(problem.value_bytes(o, i, choice[i]) for o in n.outputs) if i in recomputed else 0,
                )
            )
    ev = problem.evaluate(choice)
    collectives = collectives_of(problem, choice)
    comm = sum(c.time_s for c in collectives)
    peak, at = problem.peak_memory(choice)
    at_item = problem.items[problem.order[at]] if problem.order else None
    solver = SolverStats(
        options.get("solver", "highs"),
        sol.status,
        sol.objective,
        sol.bound,
        sol.gap,
        sol.seconds,
        build_s,
        dict(sol.stats),
    )
    return ShardingPlan(
        graph_name=graph.name,
        graph_hash=graph_hash(graph),
        n_nodes=len(graph.nodes),
        mesh=problem.mesh,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        nodes=tuple(nodes),
        collectives=tuple(collectives),
        cost=_cost(graph, problem.mesh, ev["compute_s"], comm),
        memory=Memory(
            memory_limit,
            (peak,) * problem.mesh.size,
            _item_name(at_item, names) if at_item else None,
            (problem.held_peak(choice),) * problem.mesh.size,
            int(problem.memory_profile(choice, recompute=False).max()) - peak if recomputed else 0,
        ),
        solver=solver,
        options=dict(options),
        ties=tuple((problem.items[a].index, problem.items[b].index) for a, b in problem.ties),
        warnings=tuple(_dedupe(problem.warnings)),
    )


def _cost(graph: Graph, mesh: Mesh, compute_s: float, comm_s: float) -> Cost:
    """The Cost of a step, with its MFU (the definition is ``Cost``'s)."""
    total_s = compute_s + comm_s
    flops, contraction = step_flops(graph)
    by_dtype = contraction or flops
    if not by_dtype or total_s <= 0:
        return Cost(compute_s, comm_s, total_s)
    dtype = max(by_dtype, key=lambda k: by_dtype[k])
    model_flops = sum(flops.values())
    peak = mesh.profile.matmul_rate(dtype)
    return Cost(compute_s, comm_s, total_s, model_flops, dtype, peak, model_flops / (total_s * mesh.size * peak))


def step_flops(graph: Graph) -> tuple[dict[str, float], dict[str, float]]:
    """(flops of all nodes, flops of the contractions) of one step of ``graph``, by the dtype of
    each node's first operand (result when it has none), every node counted once."""
    flops: dict[str, float] = {}
    contraction: dict[str, float] = {}
    for node in graph.nodes:
        in_types = tuple(v.type for v in node.inputs)
        out_types = tuple(o.type for o in node.outputs)
        attrs = {**node.attrs, "regions": node.regions} if node.regions else dict(node.attrs)
        f = (node.op.cost or default_cost)(in_types, out_types, **attrs)[0]
        if not (in_types or out_types) or not f:
            continue
        dtype = (in_types or out_types)[0].dtype.name
        flops[dtype] = flops.get(dtype, 0.0) + f
        if node.op.has(Contraction):
            contraction[dtype] = contraction.get(dtype, 0.0) + f
    return flops, contraction


def collectives_of(problem, choice: list[int]) -> list[Collective]:
    """The redistributions the plan needs, in program order. A tensor that several consumers need
    in the same spec is redistributed once, and once more for the later parts' readers of a
    forward value (``read_phase``), and a ZeRO-3 parameter once per reader (``regathered``; the
    ILP's objective counts every edge, so it is an upper bound of the plan's communication
    time)."""
    names = problem.graph.value_names()
    out = []
    done: set = set()
    reader: dict[int, int] = {}
    for e in problem.edges:
        if problem.items[e.src].kind == "fanout":
            reader.setdefault(e.src, e.dst)
    regathered = set(problem.gathers)  # a ZeRO-3 parameter is gathered for each reader (zero.py)
    for e in problem.edges:
        src = problem.items[e.src].strategies[choice[e.src]].out_specs[e.src_out]
        dst = problem.items[e.dst].strategies[choice[e.dst]].in_specs[e.dst_in]
        again = (e.src, e.dst) in regathered and any(src[a].is_split for a in problem.zero_axes)
        if src == dst or ((id(e.value), dst, e.phase) in done and not again):
            continue
        done.add((id(e.value), dst, e.phase))
        t = e.value.type
        consumer = problem.items[reader.get(e.dst, e.dst)]  # a fan-out reports its first reader
        is_node = consumer.kind == "node"
        node_name = (
            f"%{names[consumer.node.outputs[0]]}" if is_node and consumer.node.outputs else f"output {consumer.index}"
        )
        part = consumer.node.part if is_node else None
        producer = problem.items[e.src]
        if producer.kind == "fanout":
            producer = problem.items[producer.index]
        if part is None and producer.kind == "node":
            part = producer.node.part
        for st in plan_steps(t.shape, t.dtype.itemsize, src, dst, problem.mesh):
            out.append(
                Collective(
                    st.kind,
                    (problem.mesh.axis_names[st.axis],),
                    t.nbytes,
                    st.local_bytes,
                    f"%{names[e.value]}",
                    node_name,
                    consumer.index if is_node else None,
                    consumer.node.op.name if is_node else "output",
                    str(consumer.node.loc) if is_node and consumer.node.loc else None,
                    part,
                    st.src,
                    st.dst,
                    bucketed_step_time(st, problem.mesh, problem.bucket_share_bytes) if e.deferred else st.time_s,
                )
            )
    return out


def _dedupe(warnings: list[str]) -> list[str]:
    counts: dict[str, int] = {}
    for w in warnings:
        counts[w] = counts.get(w, 0) + 1
    return [w if n == 1 else f"{w} (x{n})" for w, n in counts.items()]


def _item_name(item, names) -> str:
    if item.kind == "node":
        node = item.node
        return f"%{names[node.outputs[0]]} ({node.op.name} at {node.loc or '?'})" if node.outputs else node.op.name
    return f"{item.kind} %{names[item.value]}"


def _alternatives(problem, choice, top: int = 3) -> dict[int, list[Alternative]]:
    """For every item (input, node, output): its best alternatives with everything else fixed:
    its compute, the redistributions on its edges and, for inputs, the bytes each device holds."""
    incident: dict[int, list] = {}
    for e in problem.edges:
        incident.setdefault(e.src, []).append(e)
        incident.setdefault(e.dst, []).append(e)
    out = {}
    for i, it in enumerate(problem.items):
        if len(it.strategies) < 2:
            continue
        comm = np.zeros(len(it.strategies))  # every strategy of item i, the others as chosen
        for e in incident.get(i, []):
            comm += problem.edge_times_at(e, i, choice)
        compute = problem.compute_times(i)
        delta = (compute + comm) - (compute[choice[i]] + comm[choice[i]])
        delta[choice[i]] = np.inf
        chosen = it.strategies[choice[i]]
        if i in problem.remat:  # the other specs; keeping or recomputing is reported apart
            delta[[st.recompute != chosen.recompute for st in it.strategies]] = np.inf
        best = [s for s in np.argsort(delta, kind="stable")[:top] if np.isfinite(delta[s])]
        alts = []
        for s in best:
            st = it.strategies[s]
            mem = None
            if it.kind == "input":
                mesh_shape = tuple(problem.mesh.shape)
                mem = local_nbytes(it.value.type, st.out_specs[0], mesh_shape) - local_nbytes(
                    it.value.type, chosen.out_specs[0], mesh_shape
                )
            alts.append(Alternative(tuple(st.out_specs), float(delta[s]), st.name, st.compute_s, float(comm[s]), mem))
        out[i] = alts
    return out


__all__ = [
    "PLAN_VERSION",
    "Alternative",
    "Collective",
    "Cost",
    "Memory",
    "NodeChoice",
    "ShardingPlan",
    "SolverStats",
    "TensorChoice",
    "collectives_of",
    "graph_hash",
    "plan_from_solution",
    "step_flops",
]
