"""Pipelines: a micro-batched training step cut into S stages along the ``pp`` mesh axis.

The stages (passes/pipeline_stages.py ``assign_stages``): the forward nodes of one micro-batch's
program (passes/microbatch.py) cut into S contiguous segments by dynamic programming, every other
node placed on the line F0 .. F(S-1) B(S-1) .. B0 so that data only flows forward along it. Values
crossing stages become send/recv pairs in the tasks (passes/pipeline_lower.py) the runtime runs
(runtime/pipeline.py). ``plan_pipeline`` plans the whole: the stages, the plan every stage
follows on its sub-mesh, the predicted step and memory.

Schedules (``schedule_tasks``): GPipe (all forwards, then all backwards) and 1F1B (S-s-1 warm-up
forwards on stage s, then one forward and one backward in turn), which keeps at most S - s
micro-batches' activations alive on stage s instead of M. The predicted bubble fraction of a
balanced pipeline is (S - 1) / (M + S - 1) for both.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from graphc.core.errors import MemoryLimitError, PlanError
from graphc.core.files import atomic_write, check_record, read_document, read_text
from graphc.core.ir import Graph, Value
from graphc.core.mesh import Mesh, as_mesh
from graphc.passes.microbatch import Microbatched, batch_inputs, microbatch, plan_microbatch_program
from graphc.passes.options import SCHEDULES, PlanOptions
from graphc.passes.partition import state_ties
from graphc.passes.pipeline_stages import StageAssignment, assign_stages, in_flight, node_seconds
from graphc.passes.sharding.build import step_mfu
from graphc.passes.sharding.memory import local_nbytes, view_roots
from graphc.passes.sharding.plan import ShardingPlan, check_made_for, graph_hash
from graphc.passes.sharding.records import MFU_FORMULA, Mfu

PIPELINE_PLAN_VERSION = 1


def schedule_tasks(schedule: str, n_stages: int, m: int, stage: int) -> list[tuple[str, int]]:
    """Stage ``stage``'s task order: ("F", k) / ("B", k) per micro-batch k, then ("U", -1)."""
    if schedule == "gpipe":
        tasks = [("F", k) for k in range(m)] + [("B", k) for k in range(m)]
    elif schedule == "1f1b":
        warm = min(n_stages - stage - 1, m)
        tasks = [("F", k) for k in range(warm)]
        for i in range(m - warm):
            tasks += [("F", warm + i), ("B", i)]
        tasks += [("B", k) for k in range(m - warm, m)]
    else:
        raise PlanError(f"unknown pipeline schedule {schedule!r}: expected one of {', '.join(SCHEDULES)}")
    return tasks + [("U", -1)]


# --- a whole pipeline plan: stages, their sub-mesh plan, the schedule, the predicted step ---------


def pipe_axis(mesh: Mesh) -> str | None:
    """The mesh's pipeline axis: the first with the role "pipe" (named pp or pipe), or None."""
    return mesh.axis_with_role("pipe")


def sub_mesh(mesh: Mesh) -> Mesh:
    """The mesh every stage runs on: ``mesh`` without its pp axis (a 1-device mesh if nothing is
    left; ``mesh`` itself, as one stage, if it has no pp axis: gradient accumulation)."""
    rest = {n: k for n, k in zip(mesh.axis_names, mesh.shape) if n != pipe_axis(mesh)}
    links = {n: link for n, link in mesh.links.items() if n in rest}
    return Mesh(rest or {"stage": 1}, links=links or None, profile=mesh.profile)


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelinePlan:
    """What ``plan_pipeline`` decides, as a frozen value: the micro-batch count and schedule, every
    micro-batch-program node's stage and phase, the sharding plan every stage follows on its
    sub-mesh, and the predicted step time, bubble and memory. JSON is a view of it
    (``to_json() -> str``, ``PipelinePlan.from_json``); passes/pipeline_lower.py turns it into
    every device's tasks for the graph it was made for.

    A mesh without a pp axis is one stage on the whole mesh: gradient accumulation, the
    micro-batches run one after the other and the update once (passes/accumulate.py ``plan_accumulated``)."""

    graph_name: str
    graph_hash: str
    mesh: Mesh  # with a pp axis, or without one for gradient accumulation (one stage)
    options: PlanOptions  # how it was planned: its micro-batch count and schedule among them
    assignment: StageAssignment
    sub_plan: ShardingPlan | None  # on sub_mesh(mesh); None on one device per stage
    stage_s: tuple[tuple[float, float, float], ...]  # per stage: forward, backward per micro-batch; update
    transfer_s: float  # sending one micro-batch's activations and gradients across all stage boundaries
    predicted: Mapping[str, float]
    memory_bytes: tuple[int, ...]  # per device of each stage
    microbatch_size: int | None = None  # samples per micro-batch (None: not recorded, or no batch input)
    timing: Mapping[str, Any] = field(default_factory=dict)
    mfu: Mfu | None = None  # the whole step's (None: no flops, or a plan written before it was recorded)
    # what the user should know of the micro-batched step (a 16-bit sum of micro-batches: passes/microbatch.py);
    # the sub-plan's own warnings are its ``warnings``
    warnings: tuple[str, ...] = ()

    @property
    def n_stages(self) -> int:
        return self.assignment.n_stages

    @property
    def m(self) -> int:
        """The number of micro-batches (``options.microbatches``)."""
        return self.options.microbatches

    @property
    def schedule(self) -> str:
        """The schedule (``options.schedule``)."""
        return self.options.schedule

    @property
    def accumulates(self) -> bool:
        """One stage on a mesh without a pp axis: gradient accumulation."""
        return pipe_axis(self.mesh) is None

    @property
    def stage_mesh(self) -> Mesh:
        """The mesh the tasks run on: ``mesh``, or for gradient accumulation ``mesh`` with a
        leading ``pp`` axis of one stage (the same devices)."""
        if not self.accumulates:
            return self.mesh
        axes = {"pp": 1, **dict(zip(self.mesh.axis_names, self.mesh.shape))}
        return Mesh(axes, links=dict(self.mesh.links) or None, profile=self.mesh.profile)

    @property
    def pp_axis(self) -> int:
        """The position of the pipeline axis in ``stage_mesh``."""
        name = pipe_axis(self.mesh)
        return 0 if name is None else self.mesh.axis_index(name)

    @property
    def step_s(self) -> float:
        """The predicted step: every micro-batch, the bubble and the update."""
        return float(self.predicted["step_s"])

    @property
    def peak_bytes(self) -> int:
        """The predicted peak of the fullest device."""
        return max(self.memory_bytes)

    @property
    def sub(self) -> Mesh:
        return sub_mesh(self.mesh)

    def device(self, s: int, c: int) -> int:
        """The mesh device of sub-mesh device ``c`` in stage ``s``."""
        mesh = self.stage_mesh
        coord = list(self.sub.coord(c)) if mesh.ndim > 1 else []
        pp = self.pp_axis
        return mesh.device_id(coord[:pp] + [s] + coord[pp:])

    def stage_devices(self, s: int) -> list[int]:
        return [self.device(s, c) for c in range(self.sub.size)]

    def with_timing(self, **seconds: Any) -> PipelinePlan:
        return dataclasses.replace(self, timing={**self.timing, **seconds})

    def check(self, graph: Graph) -> None:
        """Refuse a plan made for a different graph, or whose micro-batches do not make its batch
        (a plan file whose count was edited: its stages and tasks are of the count it was made for)."""
        check_made_for(graph, self.graph_name, self.graph_hash, "pipeline plan")
        batch = batch_inputs(graph)
        if self.microbatch_size is None or not batch:
            return
        n = graph.inputs[batch[0]].type.shape[0]
        if self.microbatch_size * self.m != n:
            raise PlanError(
                f"pipeline plan for @{self.graph_name}: {self.m} micro-batches of {self.microbatch_size} samples do not "
                f"make its batch of {n} (was the plan's micro-batch count edited?); recompile the plan"
            )

    def to_json(self, indent: int | None = 1) -> str:
        a = self.assignment
        stages = []
        for s in range(self.n_stages):
            f, b, u = self.stage_s[s]
            stages.append(
                {
                    "stage": s,
                    "devices": self.stage_devices(s),
                    "nodes": sum(1 for x in a.stage if x == s),
                    "forward_s": f,
                    "backward_s": b,
                    "update_s": u,
                    "memory_bytes": self.memory_bytes[s],
                }
            )
        doc = {
            "version": PIPELINE_PLAN_VERSION,
            "kind": "pipeline",
            "graph": {"name": self.graph_name, "hash": self.graph_hash},
            "mesh": self.mesh.to_json(),
            "options": self.options.to_json(),
            "microbatch_size": self.microbatch_size,
            "stages": stages,
            "cuts": list(a.cuts),
            "transfer_s": self.transfer_s,
            "tasks": {
                str(s): [
                    f"{ph}{k}" if k >= 0 else ph for ph, k in schedule_tasks(self.schedule, self.n_stages, self.m, s)
                ]
                for s in range(self.n_stages)
            },
            "assignment": {
                "stage": list(a.stage),
                "phase": "".join(a.phase),
                "forward_s": list(a.forward_s),
                "backward_s": list(a.backward_s),
                "update_s": list(a.update_s),
                "state_bytes": list(a.state_bytes),
                "activation_bytes": list(a.activation_bytes),
            },
            "predicted": dict(self.predicted),
            "timing": dict(self.timing),
            "mfu": None if self.mfu is None else self.mfu.to_json(),
            "warnings": list(self.warnings),
            "sub_plan": json.loads(self.sub_plan.to_json()) if self.sub_plan is not None else None,
        }
        return json.dumps(doc, indent=indent)

    @classmethod
    def from_json(cls, text: str, source: str = "<pipeline plan>") -> PipelinePlan:
        doc = read_document(text, source, "pipeline plan", PIPELINE_PLAN_VERSION, "pipeline", PlanError)
        try:
            a = doc["assignment"]
            assignment = StageAssignment(
                n_stages=len(doc["stages"]),
                stage=list(a["stage"]),
                phase=list(a["phase"]),
                cuts=list(doc["cuts"]),
                forward_s=list(a["forward_s"]),
                backward_s=list(a["backward_s"]),
                update_s=list(a["update_s"]),
                state_bytes=list(a["state_bytes"]),
                activation_bytes=list(a["activation_bytes"]),
            )
            sub = doc["sub_plan"]
            # a plan written before its options were recorded has its micro-batches and schedule
            options = doc["options"] if "options" in doc else {k: doc[k] for k in ("microbatches", "schedule")}
            plan = cls(
                graph_name=doc["graph"]["name"],
                graph_hash=doc["graph"]["hash"],
                mesh=Mesh.from_json(doc["mesh"]),
                options=PlanOptions.from_json(options, source),
                assignment=assignment,
                sub_plan=ShardingPlan.from_json(json.dumps(sub), source) if sub else None,
                stage_s=tuple((x["forward_s"], x["backward_s"], x["update_s"]) for x in doc["stages"]),
                transfer_s=doc["transfer_s"],
                predicted=doc["predicted"],
                memory_bytes=tuple(x["memory_bytes"] for x in doc["stages"]),
                microbatch_size=doc.get("microbatch_size"),
                timing=doc.get("timing", {}),
                mfu=Mfu.from_json(doc["mfu"]) if doc.get("mfu") is not None else None,
                warnings=tuple(doc.get("warnings", ())),
            )
        except (KeyError, TypeError, ValueError, OverflowError, AttributeError) as exc:
            raise PlanError(f"{source}: not a complete pipeline plan ({type(exc).__name__}: {exc})") from None
        check_record(plan, source, PlanError)  # a hand-edited value of the wrong type is named here
        _check_pipeline_plan(plan, source)
        return plan

    def save(self, path: str, make_dirs: bool = False) -> None:
        atomic_write(path, self.to_json(), make_dirs=make_dirs)

    @classmethod
    def load(cls, path: str) -> PipelinePlan:
        """The pipeline (or gradient accumulation) plan in the file ``path``, as ``save`` wrote it."""
        return cls.from_json(read_text(path, "pipeline plan", PlanError), path)

    def summary(self) -> str:
        S, m = self.n_stages, self.m
        p = self.predicted
        size = f" of {self.microbatch_size} samples" if self.microbatch_size is not None else ""
        if self.accumulates:
            where = f"mesh {self.sub}" if self.sub_plan is not None else "one device"
            f, b, u = self.stage_s[0]
            return "\n".join(
                [
                    f"gradient accumulation on mesh {self.mesh}: {m} micro-batches{size}, one after the other on "
                    f"{where}, gradients summed in micro-batch order, then one update",
                    f"predicted step {p['step_s'] * 1e3:.3f} ms = {m} x (forward {f * 1e3:.3f} ms + backward "
                    f"{b * 1e3:.3f} ms) + update and gradient sync {u * 1e3:.3f} ms; memory "
                    f"{self.memory_bytes[0]:,} B per device (one micro-batch's activations, the running sums)",
                    *self._mfu_lines(),
                ]
            )
        lines = [
            f"pipeline on mesh {self.mesh}: {S} stages x {m} micro-batches{size} ({self.schedule}), each stage on "
            f"{'sub-mesh ' + str(self.sub) if self.sub_plan is not None else 'one device'}",
            f"predicted step {p['step_s'] * 1e3:.3f} ms, bubble {p['bubble']:.1%} (a balanced pipeline: "
            f"{(S - 1) / (m + S - 1):.1%}), stage transfers {self.transfer_s * 1e6:.1f} us per micro-batch",
        ]
        for s in range(S):
            f, b, u = self.stage_s[s]
            lines.append(
                f"  stage {s} on devices {self.stage_devices(s)}: "
                f"{sum(1 for x in self.assignment.stage if x == s)} nodes, forward {f * 1e3:.3f} ms + "
                f"backward {b * 1e3:.3f} ms per micro-batch, update {u * 1e3:.3f} ms, "
                f"memory {self.memory_bytes[s]:,} B per device"
            )
        return "\n".join([*lines, *self._mfu_lines()])

    def _mfu_lines(self) -> list[str]:
        m = self.mfu
        return [] if m is None else [m.describe(self.mesh.profile.name, f" of the whole step ({MFU_FORMULA})")]


def _check_pipeline_plan(p: PipelinePlan, source: str) -> None:
    """PlanError unless the parts of a pipeline plan read from a file fit together: a pipe axis of
    as many stages as the plan has, per-node and per-stage lists of one length (its options checked
    themselves)."""
    pp = pipe_axis(p.mesh)
    a = p.assignment
    problems = []
    if pp is None and a.n_stages != 1:
        problems.append(f"its mesh {p.mesh} has no pipeline axis (pp), and the plan has {a.n_stages} stages")
    elif pp is not None and p.mesh.shape[p.mesh.axis_index(pp)] != a.n_stages:
        problems.append(f"its mesh has {p.mesh.shape[p.mesh.axis_index(pp)]} stages on {pp}, the plan {a.n_stages}")
    if not (len(p.stage_s) == len(p.memory_bytes) == a.n_stages):
        problems.append(f"'stages' needs one entry per stage ({a.n_stages})")
    if len(a.stage) != len(a.phase) or any(not -1 <= s < a.n_stages for s in a.stage):
        problems.append("assignment.stage and .phase need one entry per node, stages in -1 .. S-1")
    if set(a.phase) - {"F", "B", "M", "U", "C"}:  # C: a constant (stage -1)
        problems.append("assignment.phase entries must be F, B, M, U or C")
    missing = {"step_s", "per_microbatch_s", "bubble"} - set(p.predicted)
    if missing:
        problems.append(f"'predicted' lacks {', '.join(sorted(missing))}")
    if problems:
        raise PlanError(f"{source}: not a consistent pipeline plan: {'; '.join(problems)}")


def check_pipeline_options(options: PlanOptions, mesh: Mesh) -> None:
    """PlanError for what a pipeline (or micro-batched step: a pipeline of one stage) cannot do: a
    stage's tasks are cut from its lowered program by part, so there are no recomputed copies
    there (``recompute="on"``), and its state is not sharded with ZeRO (a forced stage)."""
    if pipe_axis(mesh) is not None:
        what, runs, stages = f"mesh {mesh} has a pp axis", "pipelines", "pipeline stages"
    else:
        what = f"microbatches={options.microbatches} on mesh {mesh}"
        runs = stages = "micro-batched steps"
    if options.recompute == "on":
        raise PlanError(f"recompute='on': {runs} do not recompute ({what})")
    if options.forced_zero is not None:
        raise PlanError(f"zero={options.zero}: {stages} do not shard their state with ZeRO ({what})")


def plan_pipeline(
    graph: Graph,
    mesh,
    options: PlanOptions = PlanOptions(),
    ties: list | None = None,
    mb: Microbatched | None = None,
) -> PipelinePlan:
    """Micro-batch ``graph`` into ``options.microbatches``, cut it into the ``pp`` axis's stages
    for ``options.schedule``, and plan it on the sub-mesh of the other axes (the same plan in
    every stage; passes/microbatch.py ``plan_microbatch_program``: the micro-batch phase priced
    ``m`` times, the update once) within ``options.memory_limit`` per device; the sub-mesh's plan
    neither recomputes nor shards state with ZeRO (``check_pipeline_options``). A mesh without a
    pp axis is one stage: gradient accumulation (passes/accumulate.py ``plan_accumulated``). ``mb``: the micro-batched
    step, if the caller has it already."""
    mesh = as_mesh(mesh)
    pp = pipe_axis(mesh)
    check_pipeline_options(options, mesh)
    m, schedule, memory_limit = options.microbatches, options.schedule, options.memory_limit
    S = 1 if pp is None else mesh.shape[mesh.axis_index(pp)]
    sub = sub_mesh(mesh)
    mb = mb if mb is not None else microbatch(graph, m)
    g0 = mb.program.devices[0].graph
    limit = None if memory_limit is None else memory_limit * sub.size  # a stage's memory, shared evenly
    a = assign_stages(g0, mb.step_phase, S, mesh.profile, schedule, m, limit, sub.size)
    sub_plan = None
    if sub.size > 1:
        sub_ties = state_ties(graph) if ties is None else ties
        sub_plan = plan_microbatch_program(mb, sub, sub_ties, options)
    stage_s = _stage_times(a, sub_plan)
    transfer = 0.0 if pp is None else _transfer_time(g0, a, mesh.links[pp], sub.size)
    per_mb = max(f + b for f, b, _u in stage_s) + (transfer / (S - 1) if S > 1 else 0.0)
    step = (m + S - 1) * per_mb + max(u for _f, _b, u in stage_s)
    busy = sum(m * (f + b) for f, b, _u in stage_s) / S
    predicted = {
        "step_s": step,
        "per_microbatch_s": per_mb,
        "bubble": 1.0 - busy / ((m + S - 1) * per_mb) if per_mb else 0.0,
    }
    if pp is None:  # one stage: the liveness model of the micro-batch program, with the running sums
        own = sub_plan or plan_microbatch_program(mb, sub, state_ties(graph) if ties is None else ties, options)
        mem = [max(own.memory.peak_bytes)]
    else:
        mem = _stage_memory(g0, a, schedule, m, _local_bytes(g0, sub_plan))
        over = [s for s in range(S) if memory_limit is not None and mem[s] > memory_limit]
        if over:  # the cut counted each stage's state and activations; its tasks need more
            raise MemoryLimitError(
                f"pipeline stage {over[0]} needs {mem[over[0]]:,} bytes per device at its peak ({schedule}, "
                f"{m} micro-batches: its state, running sums, activations in flight and the tasks' own values), "
                f"over the memory limit of {memory_limit:,} bytes: more stages or micro-batches, or 1f1b, need less"
            )
    return PipelinePlan(
        graph_name=graph.name,
        graph_hash=graph_hash(graph),
        mesh=mesh,
        options=options,
        assignment=a,
        sub_plan=sub_plan,
        stage_s=tuple(stage_s),
        transfer_s=transfer,
        predicted=predicted,
        memory_bytes=tuple(mem),
        microbatch_size=mb.size,
        mfu=step_mfu(graph, step, mesh),
        warnings=mb.warnings,
    )


def _local_bytes(g: Graph, sub_plan: ShardingPlan | None) -> dict[Value, int]:
    """Bytes per device of every value of ``g`` (one micro-batch's program) under the sub-mesh
    plan: its piece in the spec the plan gives it (all of it, replicated or a partial sum)."""
    if sub_plan is None:
        return {v: v.type.nbytes for v in g.inputs} | {o: o.type.nbytes for n in g.nodes for o in n.outputs}
    shape = tuple(sub_plan.mesh.shape)
    out = {v: local_nbytes(v.type, spec, shape) for v, spec in zip(g.inputs, sub_plan.input_specs())}
    for choice in sub_plan.nodes:
        for o, spec in zip(g.nodes[choice.index].outputs, choice.out_specs):
            out[o] = local_nbytes(o.type, spec, shape)
    return out


def _stage_memory(g: Graph, a: StageAssignment, schedule: str, m: int, size: dict[Value, int]) -> list[int]:
    """Predicted peak bytes per device of each stage, by walking its tasks in the schedule's order
    as runtime/pipeline.py runs them (``_TaskBytes``). Held all step: the inputs the stage reads
    (parameters, optimizer state, one micro-batch's pieces), its running gradient sums and the
    constants its tasks read (one copy each, shared by the tasks: runtime/pipeline.py). Held
    from a micro-batch's forward task to the end of its backward task: what the forward made for
    other tasks or received. While a task runs: what it receives anew, and what it makes, each
    until its last reader in the task unless another task reads it (a backward task frees its
    own stage's forward values at their last use). Each value counts its ``size`` on a
    device (``_local_bytes``); not counted: the buffers of the sub-mesh's collectives."""
    producer = {o: k for k, n in enumerate(g.nodes) for o in n.outputs}
    readers: dict[Value, set[tuple[int, str]]] = {}
    for k, n in enumerate(g.nodes):
        for v in n.inputs:
            readers.setdefault(v, set()).add((a.stage[k], a.phase[k]))
    roots = view_roots(g)  # views hold no bytes: their root lives as long as they do
    size_of = {v: 0 if v in roots else nb for v, nb in size.items()}
    out = []
    for s in range(a.n_stages):
        inputs = {v for k, n in enumerate(g.nodes) if a.stage[k] == s for v in n.inputs if v.producer is None}
        sums = {n.outputs[0] for k, n in enumerate(g.nodes) if a.stage[k] == s and a.phase[k] == "M"}
        held = sum(size_of[v] for v in inputs | sums)
        forward = _TaskBytes(g, a, s, "F", producer, readers, roots, size_of, set())
        tasks = {
            "F": forward,
            "B": _TaskBytes(g, a, s, "B", producer, readers, roots, size_of, forward.stored),
            "U": _TaskBytes(g, a, s, "U", producer, readers, roots, size_of, sums),
        }
        held += sum(size_of[v] for v in set().union(*(t.consts for t in tasks.values())))
        kept = sum(size_of[v] for v in forward.stored)
        peak, flight = 0, 0
        for ph, _k in schedule_tasks(schedule, a.n_stages, m, s):
            peak = max(peak, held + flight + tasks[ph].adds)
            flight += kept if ph == "F" else -kept if ph == "B" else 0
        out.append(int(peak))
    return out


class _TaskBytes:
    """What one task (stage ``s``, phase ``ph``) of a micro-batch program ``g`` adds to what its
    stage holds while it runs (``adds``): the values it receives that the stage does not hold
    yet (``held``: a backward task's micro-batch's forward values, stored since its forward task;
    the update's running sums), and the peak of what it makes, each made value live until its
    last reader in the task unless another task reads it or the step returns it.
    ``stored``: the values a forward task leaves stored for its micro-batch (what it received,
    what it made for other tasks). ``consts``: the constants it reads (the stage holds them)."""

    def __init__(
        self, g: Graph, a: StageAssignment, s: int, ph: str, producer, readers, roots, size, held: set
    ) -> None:
        idx = [k for k in range(len(g.nodes)) if a.stage[k] == s and a.phase[k] == ph]
        mine = set(idx)
        made = {o for k in idx for o in g.nodes[k].outputs}
        returned = set(g.outputs)
        last: dict[Value, int] = {}
        consts: set[Value] = set()
        received: set[Value] = set()
        for i, k in enumerate(idx):
            for v in g.nodes[k].inputs:
                j = producer.get(v)
                if j is None:
                    continue  # a step input: held all step
                if a.phase[j] == "C":
                    consts.add(v)
                elif j not in mine:
                    received.add(v)
                last[v] = i
                last[roots.get(v, v)] = i
        leaves = {v for v in made if v in returned or readers.get(v, set()) - {(s, ph)}}
        # what a backward task frees at its last use: its stage's forward values that nothing
        # later reads (runtime/pipeline.py ``_dying``)
        dying = {
            v
            for v in received & held
            if a.stage[producer[v]] == s and (s, "U") not in readers.get(v, set()) and v not in returned
        }
        self.stored = received | leaves if ph == "F" else set()

        def nbytes(vs) -> int:
            return sum(size[v] for v in vs)

        live = top = nbytes(received - held)
        for i, k in enumerate(idx):
            live += nbytes(g.nodes[k].outputs)
            top = max(top, live)
            for v in {roots.get(x, x) for x in g.nodes[k].inputs}:
                if last.get(v) == i and (v in dying or (v in made and v not in leaves)):
                    live -= nbytes([v])
        self.consts = consts
        self.adds = top


def _stage_times(a: StageAssignment, sub_plan) -> list[tuple[float, float, float]]:
    """Per stage (forward, backward per micro-batch, update): the sub-mesh plan's compute and
    communication of each node when there is one, else the single-device estimate. Adding a
    micro-batch's gradients to the running sums counts with its backward."""
    S = a.n_stages
    if sub_plan is None:
        return [(a.forward_s[s], a.backward_s[s], a.update_s[s]) for s in range(S)]
    per_node = {n.index: n.compute_s for n in sub_plan.nodes}
    for c in sub_plan.collectives:
        if c.node_index is not None:
            per_node[c.node_index] = per_node.get(c.node_index, 0.0) + c.time_s
    out = [[0.0, 0.0, 0.0] for _ in range(S)]
    for k, t in per_node.items():
        s, ph = a.stage[k], a.phase[k]
        if s >= 0:
            out[s][{"F": 0, "B": 1, "M": 1}.get(ph, 2)] += t  # M: a micro-batch's sum added to the running one
    return [(f, b, u) for f, b, u in out]


def _transfer_time(g: Graph, a: StageAssignment, link, n_sub: int) -> float:
    """Seconds to send one micro-batch's values across stage boundaries (each device its piece)."""
    producer = {o: k for k, n in enumerate(g.nodes) for o in n.outputs}
    total = 0.0
    seen = set()
    for k, n in enumerate(g.nodes):
        if a.phase[k] not in ("F", "B"):
            continue
        for v in n.inputs:
            j = producer.get(v)
            if j is None or a.stage[j] < 0 or a.stage[j] == a.stage[k] or (v, a.stage[k]) in seen:
                continue
            seen.add((v, a.stage[k]))
            total += link.latency_s + v.type.nbytes / n_sub / link.bandwidth
    return total


__all__ = [
    "pipe_axis",
    "PipelinePlan",
    "StageAssignment",
    "assign_stages",
    "check_pipeline_options",
    "in_flight",
    "node_seconds",
    "plan_pipeline",
    "schedule_tasks",
]
