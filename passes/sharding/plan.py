"""``ShardingPlan``: what the auto-sharding solver chose, what it costs, and why; a frozen value.

Fields, each a small frozen dataclass or tuple of them:

    graph              name, hash (of the text IR it was made for), node count
    mesh               the Mesh (axes, links, machine profile)
    options            how it was planned: the PlanOptions (memory limit, time limit, ZeRO, ...)
    inputs / outputs   per graph input / output: name, type, spec, pinned, best alternatives
    nodes              per node: strategy, operand and result specs, compute time, pins, warning,
                       best alternatives
    collectives        every redistribution in program order: kind, mesh axes, bytes, time, where
    cost               compute_s, comm_s, total_s; model flops and MFU (``Cost``)
    memory             limit_bytes, peak_bytes (one per device), peak_at
    solver             name, status, objective, bound, gap, seconds, problem sizes
    offload            what lives in host memory, or None (passes/offload.py ``OffloadRecord``)
    ties, warnings, timing

JSON is a view of it: ``to_json() -> str`` and ``ShardingPlan.from_json(str)`` (version
``PLAN_VERSION``). The alternatives are in it for a plan of at most ``ALTERNATIVES_IN_FILE``
inputs, nodes and outputs, or when asked (``to_json(alternatives=True)``, ``graphc compile
--alternatives``): pricing them is linear in the items, and they were two thirds of a deep
model's file (docs/plans.md); a file without them says so (``"alternatives_kept": false``), and
``explain`` of a plan read from it says that they were left out. A plan file can be hand-edited
(set a node's ``"pinned": true`` after changing its ``strategy``, or pin an input's ``spec``) and
re-solved around the pins (``graphc compile --resolve-pins FILE``); ``check(graph)`` refuses a
plan made for another graph.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from graphc.core.collector import collector_paused
from graphc.core.errors import MeshError, PlanError
from graphc.core.files import atomic_write, check_record, dump_document, read_document, read_text
from graphc.core.ir import Graph, Value, print_graph
from graphc.core.literals import arrays_as_digests
from graphc.core.mesh import Mesh
from graphc.core.spec import Spec, SpecError, format_spec
from graphc.core.units import fmt_bytes, fmt_time
from graphc.passes.offload import OffloadRecord
from graphc.passes.options import PlanOptions
from graphc.passes.sharding.records import (
    Alternative,
    Collective,
    Cost,
    Memory,
    NodeChoice,
    SolverStats,
    TensorChoice,
)

PLAN_VERSION = 2

# A plan of more inputs, nodes and outputs than this leaves its alternatives out of its JSON unless
# asked: pricing them costs about 0.3 ms an item on dp=8,tp=8 (the GPT-3 175B slice's 7,485 items:
# its file written in 2.7 s with them, loaded, where LLaMA-3-8B's 14,696 without took 0.3 s), and at
# 200 layers of a d=256 GPT (87,000 items; 5,000 is about 11 layers) they were two thirds of an
# 86 MB file and most of the 18 s of writing it (docs/plans.md).
ALTERNATIVES_IN_FILE = 5_000


def graph_hash(graph: Graph, names: dict[Value, str] | None = None) -> str:
    """The hash a plan is made for: of the graph's text IR, large constants by their own hash
    (``names``: ``graph.value_names()``, if the caller has them), source files by their absolute
    paths (the text names a file relative to the working directory: a plan compiled in one folder
    runs from another)."""
    with arrays_as_digests():
        text = print_graph(graph, names)
    return hashlib.sha256(_absolute_locations(text).encode()).hexdigest()[:32]


_LOCATION = re.compile(r' loc\(("(?:[^"\\]|\\.)*"):')  # loc("models/gpt.py":12), the file JSON-quoted


def _absolute_locations(text: str) -> str:
    """``text`` with every location's file absolute (``<stdin>`` and the like stay as they are):
    each distinct file's locations replaced at once (a few files, thousands of locations)."""
    for quoted in dict.fromkeys(_LOCATION.findall(text)):
        file = json.loads(quoted)
        absolute = json.dumps(file if file.startswith("<") else os.path.abspath(file))
        if absolute != quoted:  # absolute paths print as themselves: no replacement makes another match
            text = text.replace(f" loc({quoted}:", f" loc({absolute}:")
    return text


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


@dataclass(frozen=True, slots=True, kw_only=True)
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
    options: PlanOptions = PlanOptions()
    ties: tuple[tuple[int, int], ...] = ()
    warnings: tuple[str, ...] = ()
    timing: Mapping[str, Any] = field(default_factory=dict)
    offload: OffloadRecord | None = None  # optimizer state in host memory (sharding/offload_terms.py)
    alternatives_kept: bool = True  # False: read from a file written without them (to_json)

    def __post_init__(self):
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
    @collector_paused()
    def to_json(self, alternatives: bool | None = None) -> str:
        """The plan's document. ``alternatives``: write every item's alternatives (True), none
        (False), or (None) those of a plan of at most ``ALTERNATIVES_IN_FILE`` items. The cycle
        collector is paused: a deep plan's records are a few hundred thousand new objects."""
        if alternatives is None:
            alternatives = len(self.inputs) + len(self.nodes) + len(self.outputs) <= ALTERNATIVES_IN_FILE
        return dump_document(_plan_doc(self, alternatives and self.alternatives_kept))

    @classmethod
    def from_json(cls, text: str, source: str = "<plan>") -> ShardingPlan:
        doc = read_document(text, source, "plan", PLAN_VERSION, error=PlanError)
        try:
            plan = _plan_from_doc(doc, source)
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError, SpecError, MeshError) as exc:
            raise PlanError(f"{source}: not a complete graphc plan ({type(exc).__name__}: {exc})") from None
        check_record(plan, source, PlanError)  # a hand-edited value of the wrong type is named here
        if plan.offload is not None:  # a record of another package: checked on its own
            check_record(plan.offload, f"{source}.offload", PlanError)
        devices = plan.mesh.size
        if len(plan.memory.peak_bytes) != devices or len(plan.memory.held_bytes) not in (0, devices):
            raise PlanError(f"{source}: memory.peak_bytes and held_bytes need one entry per device ({devices})")
        return plan

    def save(self, path: str, make_dirs: bool = False) -> None:
        atomic_write(path, self.to_json(), make_dirs=make_dirs)

    @classmethod
    def load(cls, path: str) -> ShardingPlan:
        """The plan in the file ``path``; a pipeline (or gradient accumulation) plan is
        ``PipelinePlan.load``'s: refused here, named as one."""
        return cls.from_json(read_text(path, "plan", PlanError), path)

    # --- for people ------------------------------------------------------------------------
    def summary(self, top: int = 12) -> str:
        return _summary(self, top)

    def explain(self, name: str) -> str:
        """Why an input (``%params.w``) or a node (``%12``) got its spec: its best alternatives,
        every other choice held fixed, each with its difference in the solver's objective, the
        predicted step and the per-device peak, and the constraint that rules it out (or by how
        much it is slower); for an input also the specs that were never candidates, and why."""
        return _explain(self, name)

    def __repr__(self) -> str:
        return f"<ShardingPlan @{self.graph_name} total {fmt_time(self.cost.total_s)}, {len(self.collectives)} collectives>"


# --- JSON -------------------------------------------------------------------------------------------


def _specs(xs) -> list[str]:
    return [format_spec(s) for s in xs]


def _plan_doc(p: ShardingPlan, alternatives: bool) -> dict:
    return {
        "version": PLAN_VERSION,
        "graph": {"name": p.graph_name, "hash": p.graph_hash, "nodes": p.n_nodes},
        "mesh": p.mesh.to_json(),
        "options": p.options.to_json(),
        "alternatives_kept": alternatives,
        "inputs": [x.to_json(alternatives) for x in p.inputs],
        "outputs": [x.to_json(alternatives) for x in p.outputs],
        "nodes": [n.to_json(alternatives) for n in p.nodes],
        "collectives": [c.to_json() for c in p.collectives],
        "cost": p.cost.to_json(),
        "memory": p.memory.to_json(),
        "solver": p.solver.to_json(),
        "ties": [list(t) for t in p.ties],
        "warnings": list(p.warnings),
        "timing": dict(p.timing),
        "offload": None if p.offload is None else p.offload.to_json(),
    }


def _plan_from_doc(doc: dict, source: str) -> ShardingPlan:
    mesh = Mesh.from_json(doc["mesh"])
    n = len(mesh.shape)
    return ShardingPlan(
        graph_name=doc["graph"]["name"],
        graph_hash=doc["graph"]["hash"],
        n_nodes=doc["graph"]["nodes"],
        mesh=mesh,
        inputs=tuple(TensorChoice.from_json(d, n) for d in doc["inputs"]),
        outputs=tuple(TensorChoice.from_json(d, n) for d in doc["outputs"]),
        nodes=tuple(NodeChoice.from_json(d, n) for d in doc["nodes"]),
        collectives=tuple(Collective.from_json(d, n) for d in doc["collectives"]),
        cost=Cost.from_json(doc["cost"]),
        memory=Memory.from_json(doc["memory"]),
        solver=SolverStats.from_json(doc["solver"]),
        options=PlanOptions.from_json(doc.get("options", {}), source),
        ties=tuple(tuple(t) for t in doc.get("ties", ())),
        warnings=tuple(doc.get("warnings", ())),
        timing=doc.get("timing", {}),
        offload=None if doc.get("offload") is None else OffloadRecord.from_json(doc["offload"]),
        alternatives_kept=doc.get("alternatives_kept", True),
    )


# --- reports ----------------------------------------------------------------------------------------

INPUTS_SHOWN = 40  # the summary lists this many inputs, and says how many more there are

# Printed once at the end of every summary; docs/plans.md ("Reading a plan") says more.
LEGEND = """\
legend: a spec has one placement per mesh axis: R replicated, S(d) split along dim d (blocks=b: in b
  blocks), P partial sums (each device holds a summand; a reduction makes the whole). A strategy names
  the op's dimension label each axis splits: "m@dp n@tp" splits label m over dp and n over tp (matmul
  [m,k] @ [k,n] -> [m,n]: splitting k leaves P); e<d>, t<d>, r<d>, b<d>: dim d of an elementwise op, a
  transpose, a reduction, a batched matmul; "/3": in 3 blocks; "linear0@tp": operand 0 arrives as a
  partial sum along tp and the op, linear in it, carries it on; replicate: every device does all of it.
  A fan-out is where a value read by several consumers (or a gradient) is redistributed once.
  More in docs/plans.md, "Reading a plan".\
"""


def _solver_line(s) -> str:
    """How the plan was solved; a plan that took over the choices of an earlier solve of a graph
    like it (passes/partition.py ``reuse_choices``) says so, with that solve's figures: it has
    none of its own (nothing was solved, so no bound and no gap)."""
    sizes = s.sizes
    if s.status == "reused":
        solved = {k[len("reused_") :]: v for k, v in sizes.items() if k.startswith("reused_")}
        earlier = (
            f"{solved['status']}, gap {solved['gap']:.2%}, {solved.get('variables', '?')} variables / "
            f"{solved.get('constraints', '?')} constraints"
            if "status" in solved
            else "its figures not kept"
        )
        return (
            f"solver {s.name}: not run: the choices of the last plan solved for a graph like this one were reused "
            f"(that solve: {earlier}); objective {fmt_time(s.objective_s)} at these sizes, in {s.seconds:.2f} s"
        )
    return (
        f"solver {s.name}: {s.status}, objective {fmt_time(s.objective_s)}, gap {s.gap:.2%}, "
        f"{s.seconds:.2f} s, {sizes.get('variables', '?')} variables / {sizes.get('constraints', '?')} constraints "
        f"(unshrunk {sizes.get('vars_unshrunk', '?')}; {sizes.get('items', '?')} items -> {sizes.get('groups', '?')} groups)"
    )


def _summary(p: ShardingPlan, top: int) -> str:
    axes = ", ".join(f"{name}={size}" for name, size in zip(p.mesh.axis_names, p.mesh.shape))
    c, m, s = p.cost, p.memory, p.solver
    lines = [
        f"plan for @{p.graph_name} on mesh ({axes}): {p.n_nodes} nodes, {len(p.collectives)} collectives",
        f"predicted step {fmt_time(c.total_s)} = compute {fmt_time(c.compute_s)} + communication {fmt_time(c.comm_s)} "
        + (f"{'+' if c.offload_s > 0 else '-'} offload {fmt_time(abs(c.offload_s))} " if c.offload_s else "")
        + "(the plan's collectives, each redistribution once"
        + (f"; gradient all-reduces in the buckets they fill, {fmt_bytes(c.bucket_bytes)})" if c.bucket_bytes else ")"),
        *_mfu_lines(p),
        f"memory per device: peak {fmt_bytes(m.peak_bytes[0])}"
        + (f" of {fmt_bytes(m.limit_bytes)}" if m.limit_bytes else " (no limit)")
        + (f", at {m.peak_at}" if m.peak_at else "")
        + f"; with redistribution buffers {fmt_bytes(m.held[0])}",
        *_recompute_lines(p, top),
        *_offload_lines(p, top),
        _solver_line(s),
        *_objective_lines(c, s),
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
    lines += _input_lines(p.inputs)
    for w in p.warnings[:top]:
        lines.append(f"warning: {w}")
    if len(p.warnings) > top:
        lines.append(f'... and {len(p.warnings) - top} more warnings (the plan JSON\'s "warnings")')
    lines.append(LEGEND)
    return "\n".join(lines)


def _objective_lines(c: Cost, s: SolverStats) -> list[str]:
    """What the solver's objective contains, and why the predicted step differs from it."""
    obj_comm = s.objective_s - c.compute_s - c.offload_s
    counted = (
        f"  the objective is what the ILP minimized: compute {fmt_time(c.compute_s)} + redistribution "
        f"{fmt_time(obj_comm)}, every edge of the problem priced on its own"
        + (f", + offload {fmt_time(c.offload_s)}" if c.offload_s else "")
        + (
            f", gradient all-reduces in buckets of {fmt_bytes(s.bucket_bytes)} (its estimate before solving)"
            if s.bucket_bytes
            else ""
        )
    )
    diff = c.total_s - s.objective_s
    tiny = 1e-12 + 1e-9 * abs(c.total_s)
    if abs(diff) <= tiny:
        return [counted + "; the predicted step equals it"]
    if c.edge_comm_s is None:  # a plan written before the split was recorded
        return [counted + f"; the predicted step prices the plan's collectives: {_signed_time(diff)}"]
    why = []
    buckets = c.edge_comm_s - obj_comm
    if abs(buckets) > tiny:
        why.append(
            f"{_signed_time(buckets)} from pricing the gradient all-reduces in the buckets the plan fills "
            f"({fmt_bytes(c.bucket_bytes)})"
        )
    once = c.comm_s - c.edge_comm_s
    if abs(once) > tiny:
        why.append(f"{_signed_time(once)} from counting each redistribution once (edges that share one)")
    return [counted, f"  the predicted step is {_signed_time(diff)} off it: " + "; ".join(why)]


def _input_lines(inputs: tuple[TensorChoice, ...]) -> list[str]:
    """One line per input (the first ``INPUTS_SHOWN``): name, type, spec, ZeRO stage, pin."""
    if not inputs:
        return []
    shown = inputs[:INPUTS_SHOWN]
    width = max(len(x.name) for x in shown)
    lines = [f"inputs ({len(inputs)}), the spec each device is given:"]
    for x in shown:
        lines.append(
            f"  {x.name:<{width}}  {x.type:<20} {format_spec(x.spec):<14}"
            + (f" ZeRO stage {x.zero}" if x.zero else "")
            + (" pinned" if x.pinned else "")
        )
    if len(inputs) > len(shown):
        lines.append(
            f'  ... the first {len(shown)} of {len(inputs)} inputs (all in the plan JSON\'s "inputs"; '
            "--explain NAME / plan.explain(name) for one)"
        )
    return lines


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


def _offload_lines(p: ShardingPlan, top: int) -> list[str]:
    off = p.offload
    if off is None:
        return []
    acts = off.activations
    moved = [f"the optimizer state of {len(off.params)} parameter(s), {len(off.values)} input(s)"] if off.params else []
    moved += [f"{len(acts.values)} stashed activation(s), between the forward and the backward"] if acts else []
    size = off.state_bytes + (acts.nbytes if acts else 0.0)
    lines = [
        f"offloaded to host memory: {'; '.join(moved)}; {fmt_bytes(int(size))} per device; it adds "
        f"{fmt_time(off.step_s)} to the step (the host's part and the copies the compute does not hide, less the "
        "device update it replaces; a prediction: the runtime here has no host tier, the plan is not run)",
        f"  why: {off.why(p.memory.limit_bytes)}",
    ]
    for kind, names in (("", off.values), ("activation ", acts.values if acts else ())):
        lines += [f"  offloaded {kind}{v}" for v in names[:top]]
        if len(names) > top:
            lines.append(f'  ... and {len(names) - top} more (the plan JSON\'s "offload")')
    return lines


def _recompute_lines(p: ShardingPlan, top: int) -> list[str]:
    again = sorted((n for n in p.nodes if n.recompute), key=lambda n: -n.recompute_saved_bytes)
    if not again:
        return []
    lines = [
        f"recomputed before the backward pass: {len(again)} nodes, saving {fmt_bytes(p.memory.recompute_saved_bytes)} "
        f"at the peak per device, for {fmt_time(sum(n.compute_s for n in again) / 2)} of compute"
    ]
    lines.append(f"  why: {_why_recomputed(p)}")
    for n in again[:top]:
        lines.append(
            f"  recompute {n.name:<8}{n.op:<12}{', '.join(n.types):<22} frees {fmt_bytes(n.recompute_saved_bytes):>11} "
            f"from forward to backward, costs {fmt_time(n.compute_s / 2)}  {n.loc or ''}"
        )
    if len(again) > top:
        lines.append(f'  ... and {len(again) - top} more ("recompute": true in the plan JSON)')
    return lines


def _mfu_lines(p: ShardingPlan) -> list[str]:
    m = p.cost.mfu_record(p.mesh.size)
    return [] if m is None else [m.describe(p.mesh.profile.name)]


def _collective_lines(collectives: tuple[Collective, ...], top: int) -> list[str]:
    coll = sorted(collectives, key=lambda x: -x.time_s)
    if not coll:
        return []
    by_kind: dict[str, list[Collective]] = {}
    for x in coll:
        by_kind.setdefault(x.kind, []).append(x)
    lines = [
        "collectives: "
        + ", ".join(f"{k} x{len(v)} ({fmt_time(sum(x.time_s for x in v))})" for k, v in sorted(by_kind.items())),
        "  (tensor size: the whole logical tensor; sent/device: the bytes each device sends, by the algorithm "
        "the cost model prices)",
    ]
    shown = coll[:top]
    width = max(12, *(len(x.tensor) for x in shown))
    lines.append(
        f"  {'kind':<15}{'axes':<8}{'tensor':<{width}}  {'tensor size':>11}  {'sent/device':>11}  {'time':>10}  "
        f"{'part':<9} where"
    )
    for x in shown:
        sent = "?" if x.sent_bytes is None else fmt_bytes(x.sent_bytes)
        lines.append(
            f"  {x.kind:<15}{','.join(x.axes):<8}{x.tensor:<{width}}  {fmt_bytes(x.bytes):>11}  {sent:>11}  "
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
            return _explain_node(p, n)
    raise PlanError(f"plan has no tensor or node named {key}")


def _chosen_line(p: ShardingPlan) -> str:
    m = p.memory
    return (
        f"  chosen: objective {fmt_time(p.solver.objective_s)}, predicted step {fmt_time(p.cost.total_s)}, "
        f"peak {fmt_bytes(m.peak_bytes[0])} per device"
        + (f" (limit {fmt_bytes(m.limit_bytes)})" if m.limit_bytes else " (no limit)")
        + "\n  each alternative changes this one choice, every other held fixed (differences: alternative minus chosen)"
    )


def _explain_input(p: ShardingPlan, x: TensorChoice) -> str:
    tied = any(t[0] == x.index for t in p.ties)
    lines = [
        f"input {x.name} {x.type}: spec {format_spec(x.spec)}"
        + (" (pinned)" if x.pinned else "")
        + (f", ZeRO stage {x.zero} (saves {fmt_bytes(x.zero_saved_bytes)} per device)" if x.zero else "")
        + (
            "; tied to its output (the state returned updated: both take one spec, and change together below)"
            if tied
            else ""
        ),
        _chosen_line(p),
    ]
    if p.offload is not None and x.name.lstrip("%") in p.offload.values:
        lines.insert(1, f"  in host memory (offloaded): {p.offload.why(p.memory.limit_bytes)}")
    for a in x.alternatives:
        lines.append(f"  instead {', '.join(_specs(a.out_specs)):<22} {_describe(a)}")
    if not p.alternatives_kept:
        lines.append(_LEFT_OUT)
    elif not x.alternatives:
        lines.append("  no alternative spec on this mesh" + (" (pinned)" if x.pinned else ""))
    by_reason: dict[str, list[str]] = {}
    for r in x.ruled_out:
        by_reason.setdefault(r.reason, []).append(format_spec(r.spec))
    if by_reason:
        lines.append("  never candidates (the chosen spec with one mesh axis changed):")
        lines += [f"    {', '.join(specs)}: {reason}" for reason, specs in by_reason.items()]
    return "\n".join(lines)


def _why_recomputed(p: ShardingPlan) -> str:
    """Why a plan recomputes (issue 30): the limit it must fit, and the peak it would have
    keeping every recomputed value; or that recomputation was asked for."""
    m = p.memory
    kept = m.peak_bytes[0] + m.recompute_saved_bytes
    if m.limit_bytes is None or p.options.recompute == "on":
        return f"recompute='on' asked for it (keeping them, the peak would be {fmt_bytes(kept)} per device)"
    return (
        f"keeping them, the peak would be {fmt_bytes(kept)} per device, over the limit of "
        f"{fmt_bytes(m.limit_bytes)}; the solver recomputes the values that fit it for the least compute"
    )


def _explain_node(p: ShardingPlan, n: NodeChoice) -> str:
    lines = [
        f"{n.name} = {n.op} at {n.loc or '?'} ({n.part or 'untagged'}): strategy {n.strategy}, "
        f"out {', '.join(_specs(n.out_specs))}, in {', '.join(_specs(n.in_specs))}, compute {fmt_time(n.compute_s)}"
        + (" (pinned)" if n.pinned else ""),
        _chosen_line(p),
    ]
    off = p.offload
    acts = off.activations if off is not None else None
    if off is not None and acts is not None and n.name.lstrip("%") in acts.values:
        why = f"{acts.why()}; {off.because(p.memory.limit_bytes)}"
        lines.insert(1, f"  in host memory between its forward and backward uses (offloaded): {why}")
    if n.recompute:
        lines.append(
            f"  recomputed before the backward pass (compute counted twice): each device frees "
            f"{fmt_bytes(n.recompute_saved_bytes)} of its results from the forward to the backward pass; "
            f"{_why_recomputed(p)}"
        )
    if n.warning:
        lines.append(f"  warning: {n.warning}")
    if not p.alternatives_kept:
        lines.append(_LEFT_OUT)
    elif not n.alternatives:
        lines.append(
            "  no alternative strategy: "
            + ("it is pinned" if n.pinned else "only one is valid on this mesh (the legend of the summary says why)")
        )
    for a in n.alternatives:
        lines.append(f"  instead {a.strategy or '?':<22} out {', '.join(_specs(a.out_specs)):<18} {_describe(a)}")
    return "\n".join(lines)


_LEFT_OUT = (
    f"  alternatives: not in this plan: its file was written without them (more than {ALTERNATIVES_IN_FILE:,} "
    "inputs, nodes and outputs; graphc compile --alternatives writes them, --explain prints them)"
)


def _describe(a: Alternative) -> str:
    """An alternative's differences and verdict, on one line."""
    parts = [
        f"objective {_signed_time(a.delta_s)} (compute {_signed_time(a.compute_delta_s)}, "
        f"redistribution {_signed_time(a.comm_delta_s)})"
    ]
    if a.step_delta_s is not None and abs(a.step_delta_s - a.delta_s) > 1e-12 + 1e-9 * abs(a.delta_s):
        parts.append(f"predicted step {_signed_time(a.step_delta_s)}")
    if a.peak_delta_bytes is not None:
        parts.append(f"peak per device {'+' if a.peak_delta_bytes >= 0 else '-'}{fmt_bytes(abs(a.peak_delta_bytes))}")
    if a.ruled_out is not None:
        verdict = a.ruled_out
    elif a.delta_s > 0:
        verdict = f"allowed, slower by {fmt_time(a.delta_s)}"
    else:
        verdict = "allowed, and as fast: the solver took either"
    return ", ".join(parts) + ": " + verdict


def _signed_time(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + fmt_time(abs(seconds))


__all__ = [
    "ALTERNATIVES_IN_FILE",
    "INPUTS_SHOWN",
    "LEGEND",
    "PLAN_VERSION",
    "ShardingPlan",
    "check_made_for",
    "graph_hash",
]
