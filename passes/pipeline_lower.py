"""Lowering a pipeline plan to every device's tasks: PipelinePlan -> graphc.programs.PipelineProgram.

1. The micro-batched step (passes/microbatch.py: one program per micro-batch) is lowered on the
   stage's sub-mesh with the plan's sub-mesh ShardingPlan (passes/lower.py): one program per
   micro-batch and sub-mesh device, all with the same structure.
2. Every node of those programs takes the stage and phase of the micro-batch program node it
   serves (``plan.assignment``): forward "F", backward "B", meeting point "M" (the all-reduce over
   the micro-batch axis: gradient accumulation) or update "U".
3. Each device of stage s gets, for each micro-batch k, a forward task F(k) and a backward task
   B(k) (its nodes of that program), and the update's tasks U, cut before every node that needs
   another stage's update result so that no two stages wait on each other.

Values of the step are named by id (inputs first, then node results in program order; the same
in every program of one plan). A task's outputs are the values read by another task, returned by
the step, or summed at a meeting point; ``sends`` says which devices need them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphc.core.errors import PlanError
from graphc.core.ir import Graph, Node, Value
from graphc.core.pytree import LEAF, TreeDef
from graphc.core.traits import Constant
from graphc.ops import OPS
from graphc.passes.lower import lower_graph
from graphc.passes.microbatch import MB_AXIS, Microbatched, microbatch
from graphc.passes.pipeline import PipelinePlan, schedule_tasks
from graphc.programs import PipelineProgram, PipelineTask


def value_ids(g: Graph) -> dict[Value, int]:
    """Inputs 0..n-1, then node outputs in program order (the same in every program of one plan)."""
    ids = {v: i for i, v in enumerate(g.inputs)}
    for n in g.nodes:
        for o in n.outputs:
            ids[o] = len(ids)
    return ids


@dataclass
class _Step:
    """What the builder knows about the step's values, from the reference program (micro-batch 0,
    sub-mesh device 0)."""

    ref: Graph
    ids: dict[Value, int]
    producer: dict[int, int]  # value id -> index of the node producing it
    stage: list[int]  # per node
    phase: list[str]  # per node: F, B, M, U or C (a constant, copied where used)
    meetings: dict[int, tuple[int, int]]  # meeting output id -> (summand id, stage)
    readers: dict[int, set[tuple[int, str]]]  # value id -> (stage, phase) of the nodes reading it
    users: dict[int, set[int]]  # value id -> indices of the nodes reading it
    out_ids: list[int]

    def where(self, vid: int) -> tuple[int, str]:
        if vid < len(self.ref.inputs):
            return -1, "I"
        j = self.producer[vid]
        return self.stage[j], self.phase[j]


def lower_pipeline(graph: Graph, plan: PipelinePlan, mb: Microbatched | None = None) -> PipelineProgram:
    """Every device's tasks for ``graph`` (the training step ``plan`` was made for)."""
    mb = mb if mb is not None else microbatch(graph, plan.m)
    progs = _device_programs(mb, plan)
    ref, origin = progs[0][0][0], progs[0][0][1]
    step = _analyse(ref, origin, plan)
    _check_outputs_combined(step, origin, mb, plan.m)
    stage_devices = tuple(tuple(plan.stage_devices(s)) for s in range(plan.n_stages))
    tasks: dict[tuple[int, str, int], PipelineTask] = {}
    n_segments: dict[int, int] = {}
    for s in range(plan.n_stages):
        segments = _update_segments(step, s)
        work = {
            ph: [j for j in range(len(ref.nodes)) if step.stage[j] == s and step.phase[j] == ph] for ph in ("F", "B")
        }
        for c, dev in enumerate(stage_devices[s]):
            keyed = [((dev, ph, k), (k, idx)) for ph, idx in work.items() for k in range(plan.m)]
            keyed += [((dev, "U", -1 - i), (0, seg)) for i, seg in enumerate(segments)]  # micro-batch 0's program
            for key, (k, idx) in keyed:
                g = progs[k][c][0]
                tasks[key] = _task(g, value_ids(g), idx, s, c, key[1], key[2], step, stage_devices)
            n_segments[dev] = len(segments)
    g0 = mb.program.devices[0].graph
    in_specs, out_specs = progs[0][0][2], progs[0][0][3]
    return PipelineProgram(
        mesh=plan.stage_mesh,  # gradient accumulation: the mesh with a pp axis of one stage
        pp_axis=plan.pp_axis,
        n_stages=plan.n_stages,
        m=plan.m,
        schedule=plan.schedule,
        stage_devices=stage_devices,
        sub_shape=tuple(plan.sub.shape),
        order=tuple(tuple(schedule_tasks(plan.schedule, plan.n_stages, plan.m, s)) for s in range(plan.n_stages)),
        tasks=tasks,
        n_segments=n_segments,
        n_inputs=len(ref.inputs),
        batch=frozenset(mb.batch) if plan.m > 1 else frozenset(),
        where={vid: (step.stage[j], step.phase[j]) for vid, j in step.producer.items()},
        readers={vid: frozenset(r) for vid, r in step.readers.items()},
        meetings=dict(step.meetings),
        out_ids=tuple(step.out_ids),
        in_types=tuple(v.type for v in g0.inputs),
        out_types=tuple(v.type for v in g0.outputs),
        in_specs=in_specs,
        out_specs=out_specs,
    )


def _device_programs(mb: Microbatched, plan: PipelinePlan) -> list[list[tuple[Graph, Any, Any, Any]]]:
    """[micro-batch][sub-mesh device] -> (graph, origin, in_specs, out_specs); the specs are None
    when every stage is one device."""
    out: list[list[tuple[Graph, Any, Any, Any]]] = []
    for p in mb.program.devices:
        if plan.sub_plan is None:
            g = p.graph
            out.append([(g, tuple(range(len(g.nodes))), None, None)])
        else:
            # the micro-batch program's meeting points are all_reduces over the mb axis, which the
            # pipeline runtime performs itself: only the graphs verify, not the collective order
            lowered = lower_graph(p.graph, plan.sub_plan)
            for d in lowered.devices:
                d.graph.verify()
            out.append([(d.graph, d.origin, d.in_specs, d.out_specs) for d in lowered.devices])
    return out


def _analyse(ref: Graph, origin, plan: PipelinePlan) -> _Step:
    ids = value_ids(ref)
    producer = {ids[o]: j for j, n in enumerate(ref.nodes) for o in n.outputs}
    stage, phase = _place(ref, origin, ids, producer, plan)
    meetings: dict[int, tuple[int, int]] = {}
    for j, n in enumerate(ref.nodes):
        if phase[j] == "M":
            src = ids[n.inputs[0]]
            if src not in producer or phase[producer[src]] not in ("F", "B"):
                raise PlanError(f"all_reduce at {n.loc or '?'} sums a value computed once per step")
            meetings[ids[n.outputs[0]]] = (src, stage[j])
    readers: dict[int, set[tuple[int, str]]] = {}
    users: dict[int, set[int]] = {}
    for j, n in enumerate(ref.nodes):
        for v in n.inputs:
            vid = ids[v]
            users.setdefault(vid, set()).add(j)
            if phase[j] in ("C", "M") or (vid in producer and phase[producer[vid]] == "C"):
                continue
            readers.setdefault(vid, set()).add((stage[j], phase[j]))
    return _Step(ref, ids, producer, stage, phase, meetings, readers, users, [ids[v] for v in ref.outputs])


def _place(
    ref: Graph, origin, ids: dict[Value, int], producer: dict[int, int], plan: PipelinePlan
) -> tuple[list[int], list[str]]:
    """Stage and phase of every node, from the micro-batch program node it serves."""
    a = plan.assignment
    stage, phase = [0] * len(ref.nodes), [""] * len(ref.nodes)
    for j, n in enumerate(ref.nodes):
        o = origin[j]
        if n.op.has(Constant):
            stage[j], phase[j] = -1, "C"
        elif o < 0:  # redistributing a result at the end: where its value is
            src = producer.get(ids[n.inputs[0]])
            stage[j], phase[j] = (stage[src], phase[src]) if src is not None else (0, "U")
            if phase[j] in ("M", "C"):
                phase[j] = "U"
        else:
            stage[j], phase[j] = a.stage[o], a.phase[o]
            if phase[j] == "M" and not _meets(n):
                # redistributing the summand before the meeting: part of the micro-batch's work
                src = producer.get(ids[n.inputs[0]])
                phase[j] = phase[src] if src is not None else "U"
    return stage, phase


def _meets(n: Node) -> bool:
    return n.op is OPS.all_reduce and n.attrs.get("axis") == MB_AXIS


def _check_outputs_combined(step: _Step, origin, mb: Microbatched, m: int) -> None:
    """Every result of the step is one value, not one per micro-batch."""
    g0 = mb.program.devices[0].graph
    vary_nodes = {k for k, n in enumerate(g0.nodes) if any(o in mb.varies for o in n.outputs)}
    vary_inputs = {k for k, v in enumerate(g0.inputs) if v in mb.varies}
    varies = {step.ids[v] for k, v in enumerate(step.ref.inputs) if k in vary_inputs}
    for j, n in enumerate(step.ref.nodes):
        if origin[j] in vary_nodes:
            varies.update(step.ids[o] for o in n.outputs)
    n_in = len(step.ref.inputs)
    for o in step.out_ids:
        if o >= n_in and step.phase[step.producer[o]] in ("F", "B") and o in varies and m > 1:
            raise PlanError("a result of the step differs per micro-batch and is not combined into one")


def _update_segments(step: _Step, s: int) -> list[list[int]]:
    """Stage s's update nodes, cut before every node needing another stage's update result: what
    is produced before the cut is sent first, so no two stages wait on each other."""
    segments: list[list[int]] = [[]]
    for j, n in enumerate(step.ref.nodes):
        if step.stage[j] != s or step.phase[j] != "U":
            continue
        remote = False
        for v in n.inputs:
            st, ph = step.where(step.ids[v])
            remote |= ph in ("U", "M") and st != s
        if remote and segments[-1]:
            segments.append([])
        segments[-1].append(j)
    return segments


def _task(
    g: Graph,
    ids: dict[Value, int],
    idx: list[int],
    s: int,
    c: int,
    ph: str,
    k: int,
    step: _Step,
    stage_devices: tuple[tuple[int, ...], ...],
) -> PipelineTask:
    """The task of nodes ``idx`` of program ``g`` (stage s, sub-mesh device c): its constants
    copied in, its inputs and outputs named by value id."""
    nodes = [g.nodes[j] for j in idx]
    inside = {o for n in nodes for o in n.outputs}
    consts, seen = [], set()
    for n in nodes:
        for v in n.inputs:
            p = v.producer
            if p is not None and v not in inside and p.op.has(Constant) and id(p) not in seen:
                seen.add(id(p))
                consts.append(p)
    inside |= {o for q in consts for o in q.outputs}
    inputs, in_ids = [], []
    for n in nodes:
        for v in n.inputs:
            if v not in inside and ids[v] not in in_ids:
                inputs.append(v)
                in_ids.append(ids[v])
    summands = {src for src, _stage in step.meetings.values()}
    outs, out_ids = [], []
    mine = set(idx)
    for n in nodes:
        for o in n.outputs:
            vid = ids[o]
            if step.users.get(vid, set()) - mine or vid in step.out_ids or vid in summands:
                outs.append(o)
                out_ids.append(vid)
    sends: dict[int, tuple[int, ...]] = {}
    for vid in out_ids:  # meeting summands are accumulated here, on the producing device
        dst = sorted({r[0] for r in step.readers.get(vid, ()) if r[0] != s})
        if dst:
            sends[vid] = tuple(stage_devices[d][c] for d in dst)
    in_tree = TreeDef("tuple", (TreeDef("tuple", (LEAF,) * len(inputs)), TreeDef("dict")))
    out_tree = TreeDef("tuple", (LEAF,) * len(outs))
    name = f"{g.name}.stage{s}.{ph}{k if k >= 0 else -1 - k}"
    graph = Graph(name, inputs, consts + nodes, outs, in_tree, out_tree)
    return PipelineTask(stage_devices[s][c], ph, k, graph, tuple(in_ids), tuple(out_ids), sends)


__all__ = ["lower_pipeline", "value_ids"]
