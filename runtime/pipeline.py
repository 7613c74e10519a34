"""The pipeline runtime: a training step in M micro-batches on S stages, each stage on a sub-mesh.

``PipelineExecutable(graph, mesh, microbatches=M, schedule="1f1b")`` runs ``graph`` on a mesh
with a ``pp`` axis of size S (an int S means ``{"pp": S}``); the other axes (dp, tp, ...) form
each stage's sub-mesh. Building it:

1. micro-batches the step (passes/microbatch.py): one program per micro-batch, meeting points
   where the micro-batches' partial sums are accumulated, step-phase nodes after them;
2. cuts micro-batch 0's program into S stages (passes/pipeline.py);
3. plans that program once on the sub-mesh with the sharding ILP (every stage runs its part of
   the same plan, so a value crossing stages has the same spec on both sides and goes from a
   device to the device of the same sub-mesh coordinate) and lowers every micro-batch's program
   with it (passes/lower.py): one program per micro-batch and sub-mesh device;
4. gives every device of stage s, for each micro-batch k, a forward task ``F(k)`` and a
   backward task ``B(k)`` (its nodes of that program), and the step-phase tasks ``U`` it runs
   once after the micro-batches meet. Tasks are graphs run by the single-device executor, whose
   collectives go to the device's communicator with sub-mesh ranks mapped to devices.

Values crossing stages go through send/recv (tagged by value and micro-batch); values staying
on a device (residuals kept from F(k) for B(k)) are held until their last use. Meeting points
add the micro-batches' pieces in micro-batch order on the devices that produce them; the
sub-mesh collectives of the step phase (the data-parallel gradient all-reduce) then run once
per step, not once per micro-batch.

Every device runs its tasks in the schedule's order (GPipe or 1F1B). The step phase is cut
before every node that needs another stage's step-phase result, and everything is sent as soon
as it is produced, so devices cannot wait on each other in a cycle; every wait is bounded.

``run_flat(arrays, profile=True)`` also records every task's start and end (Chrome trace,
measured bubble fraction), each device's peak bytes (values held between tasks plus the running
task's own live values) and ``held_bytes``, the most it holds between forward and backward tasks
(the activations of the micro-batches in flight and the running gradient sums).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphc.core.errors import GraphcError, PlanError
from graphc.core.ir import Graph, Value
from graphc.core.pytree import LEAF, TreeDef
from graphc.passes.pipeline import PP_AXIS
from graphc.runtime.parallel import _CommProxy


@dataclass
class Task:
    device: int
    phase: str  # "F", "B" or "U"
    k: int  # micro-batch (-1 for the step phase)
    graph: Graph
    in_ids: list[int]  # value id of every task input
    out_ids: list[int]  # value id of every task output
    executable: Any = None
    sends: dict[int, list[int]] = field(default_factory=dict)  # value id -> devices that need it


class _SubMeshComm:
    """A device's communicator for programs lowered on its stage's sub-mesh: group members are
    sub-mesh device ids, mapped to the devices of this stage."""

    def __init__(self, comm, devices: list[int]):
        self.comm = comm
        self.devices = devices
        self._groups: dict[tuple, tuple] = {}

    def _g(self, group):
        hit = self._groups.get(group)
        if hit is None:
            hit = self._groups[group] = tuple(self.devices[d] for d in group)
        return hit

    def all_reduce(self, x, group, inplace=False):
        return self.comm.all_reduce(x, self._g(group), inplace)

    def reduce_scatter(self, x, group, dim, blocks=1):
        return self.comm.reduce_scatter(x, self._g(group), dim, blocks)

    def all_gather(self, x, group, dim, blocks=1):
        return self.comm.all_gather(x, self._g(group), dim, blocks)

    def all_to_all(self, x, group, split_dim, concat_dim, split_blocks=1, concat_blocks=1):
        return self.comm.all_to_all(x, self._g(group), split_dim, concat_dim, split_blocks, concat_blocks)


class PipelineExecutable:
    def __init__(self, graph, mesh=None, microbatches: int = 1, schedule: str = "1f1b", profile=None,
                 memory_limit: int | None = None, timeout_s: float = 60.0):
        """``graph`` is a training step's Graph (planned here on ``mesh``: an int S for ``{"pp": S}``,
        or a mesh with a ``pp`` axis) or a ``passes.pipeline.PipelinePlan``."""
        from graphc.core.mesh import Mesh
        from graphc.passes.pipeline import PipelinePlan, plan_pipeline

        if isinstance(graph, PipelinePlan):
            plan = graph
        else:
            if isinstance(mesh, int) and not isinstance(mesh, bool):
                if mesh < 1:
                    raise PlanError(f"the number of pipeline stages must be a positive int, got {mesh!r}")
                mesh = {PP_AXIS: mesh}
            if profile is not None or not isinstance(mesh, Mesh):
                mesh = Mesh(mesh, profile=profile)
            plan = plan_pipeline(graph, mesh, microbatches, schedule, memory_limit)
        self.plan = plan
        self.graph = plan.graph
        self.mesh = plan.mesh
        self.sub = plan.sub
        self.pp = self.mesh.axis_index(PP_AXIS)
        self.n_stages = plan.n_stages
        self.m = plan.m
        self.schedule = plan.schedule
        self.timeout_s = timeout_s
        self.mb = plan.mb
        self.assignment = plan.assignment
        self.predicted = plan.predicted
        self.sub_plan = plan.sub_plan
        self._build()
        self.last_profile: dict | None = None
        self._acc_buffers: dict[int, dict[int, np.ndarray]] = {}

    # --- devices ------------------------------------------------------------------------------

    def device(self, stage: int, c: int) -> int:
        """The mesh device of sub-mesh device ``c`` in stage ``stage``."""
        return self.plan.device(stage, c)

    # --- building the tasks ---------------------------------------------------------------------

    def _programs(self) -> list[list]:
        """[micro-batch][sub-mesh device] -> (graph, origin, in_specs, out_specs)."""
        from graphc.passes.lower import lower

        out = []
        for p in self.mb.programs:
            if self.sub_plan is None:
                g = p.graph
                out.append([(g, list(range(len(g.nodes))), None, None)])
            else:
                out.append([(d.graph, d.origin, d.in_specs, d.out_specs) for d in lower(p.graph, self.sub_plan, self.sub)])
        return out

    def _build(self) -> None:
        from graphc.runtime.executor import Executable

        a = self.assignment
        g0 = self.mb.programs[0].graph
        progs = self._programs()
        self.in_specs = progs[0][0][2]
        self.out_specs = progs[0][0][3]
        ref, origin = progs[0][0][0], progs[0][0][1]  # every (micro-batch, device) program has this structure
        n_in = len(ref.inputs)
        self.n_inputs = n_in
        ids0 = _value_ids(ref)
        producer: dict[int, int] = {}
        for j, n in enumerate(ref.nodes):
            for o in n.outputs:
                producer[ids0[o]] = j
        self.prod_node = producer
        # stage and phase of every program node, from the micro-batch program node it serves
        stage, phase = [0] * len(ref.nodes), [""] * len(ref.nodes)
        for j, n in enumerate(ref.nodes):
            o = origin[j]
            if n.op.name == "constant":
                stage[j], phase[j] = -1, "C"
                continue
            if o < 0:  # redistributing a result at the end: where its value is
                src = producer.get(ids0[n.inputs[0]])
                stage[j], phase[j] = (stage[src], phase[src]) if src is not None else (0, "U")
                if phase[j] in ("M", "C"):
                    phase[j] = "U"
                continue
            stage[j], phase[j] = a.stage[o], a.phase[o]
            if phase[j] == "M" and not (n.op.name == "all_reduce" and n.attrs.get("axis") == "mb"):
                # redistributing the summand before the meeting: part of the micro-batch's work
                src = producer.get(ids0[n.inputs[0]])
                phase[j] = phase[src] if src is not None else "U"
        self.stage, self.phase = stage, phase
        self.meetings: dict[int, tuple[int, int]] = {}  # meeting output id -> (summand id, stage)
        for j, n in enumerate(ref.nodes):
            if phase[j] == "M":
                src = ids0[n.inputs[0]]
                if src not in producer or phase[producer[src]] not in ("F", "B"):
                    raise PlanError(f"all_reduce at {n.loc or '?'} sums a value computed once per step")
                self.meetings[ids0[n.outputs[0]]] = (src, stage[j])
        self.meeting_inputs = {src: out for out, (src, _s) in self.meetings.items()}
        # readers: (stage, phase) of the nodes reading each value; users: their indices
        self.readers: dict[int, set[tuple[int, str]]] = {}
        self.users: dict[int, set[int]] = {}
        for j, n in enumerate(ref.nodes):
            for v in n.inputs:
                vid = ids0[v]
                self.users.setdefault(vid, set()).add(j)
                if phase[j] in ("C", "M") or (vid in producer and phase[producer[vid]] == "C"):
                    continue
                self.readers.setdefault(vid, set()).add((stage[j], phase[j]))
        self.out_ids = [ids0[v] for v in ref.outputs]
        varies = _varies(ref, origin, g0, self.mb.varies)
        for o in self.out_ids:
            if o >= n_in and phase[producer[o]] in ("F", "B") and o in varies and self.m > 1:
                raise PlanError("a result of the step differs per micro-batch and is not combined into one")

        self.stage_devices = {s: self.plan.stage_devices(s) for s in range(self.n_stages)}
        ids = [[_value_ids(prog[0]) for prog in per_k] for per_k in progs]  # [micro-batch][sub-mesh device]
        self.tasks: dict[tuple[int, str, int], Task] = {}  # (device, phase, micro-batch or -1 - segment)
        self.n_segments: dict[int, int] = {}
        self.comms: dict[int, _CommProxy] = {}
        for s in range(self.n_stages):
            segments = self._step_segments(ref, ids0, s)
            work = {ph: [j for j in range(len(ref.nodes)) if stage[j] == s and phase[j] == ph] for ph in ("F", "B")}
            for c, dev in enumerate(self.stage_devices[s]):
                slot = self.comms[dev] = _CommProxy()
                keyed = [((dev, ph, k), (k, idx, ph)) for ph, idx in work.items() for k in range(self.m)]
                keyed += [((dev, "U", -1 - i), (0, seg, "U")) for i, seg in enumerate(segments)]
                for key, (k, idx, ph) in keyed:
                    task = self._task(progs[k][c][0], ids[k][c], idx, s, c, ph, -1 if ph == "U" else k)
                    task.executable = Executable(task.graph, slot)
                    self.tasks[key] = task
                self.n_segments[dev] = len(segments)

    def _where(self, vid: int) -> tuple[int, str]:
        """(stage, phase) producing ``vid``; inputs: (-1, "I")."""
        if vid < self.n_inputs:
            return -1, "I"
        j = self.prod_node[vid]
        return self.stage[j], self.phase[j]

    def _step_segments(self, ref: Graph, ids0: dict[Value, int], s: int) -> list[list[int]]:
        """Stage s's step-phase nodes, cut before every node needing another stage's step-phase
        result: what is produced before the cut is sent first, so no two stages wait on each other."""
        segments: list[list[int]] = [[]]
        for j, n in enumerate(ref.nodes):
            if self.stage[j] != s or self.phase[j] != "U":
                continue
            remote = False
            for v in n.inputs:
                st, ph = self._where(ids0[v])
                remote |= ph in ("U", "M") and st != s
            if remote and segments[-1]:
                segments.append([])
            segments[-1].append(j)
        return segments

    def _task(self, g: Graph, ids: dict[Value, int], idx: list[int], s: int, c: int, ph: str, k: int) -> Task:
        nodes = [g.nodes[j] for j in idx]
        inside = {o for n in nodes for o in n.outputs}
        consts, seen = [], set()
        for n in nodes:
            for v in n.inputs:
                p = v.producer
                if p is not None and v not in inside and p.op.name == "constant" and id(p) not in seen:
                    seen.add(id(p))
                    consts.append(p)
        inside |= {o for q in consts for o in q.outputs}
        inputs, in_ids = [], []
        for n in nodes:
            for v in n.inputs:
                if v not in inside and ids[v] not in in_ids:
                    inputs.append(v)
                    in_ids.append(ids[v])
        outs, out_ids = [], []
        mine = set(idx)
        for n in nodes:
            for o in n.outputs:
                vid = ids[o]
                if self.users.get(vid, set()) - mine or vid in self.out_ids or vid in self.meeting_inputs:
                    outs.append(o)
                    out_ids.append(vid)
        sends: dict[int, list[int]] = {}
        for vid in out_ids:  # meeting summands are accumulated here, on the producing device
            dst = sorted({r[0] for r in self.readers.get(vid, ()) if r[0] != s})
            if dst:
                sends[vid] = [self.device(d, c) for d in dst]
        in_tree = TreeDef("tuple", (TreeDef("tuple", (LEAF,) * len(inputs)), TreeDef("dict")))
        out_tree = TreeDef("tuple", (LEAF,) * len(outs))
        name = f"{g.name}.stage{s}.{ph}{'' if k < 0 else k}"
        return Task(self.device(s, c), ph, k, Graph(name, inputs, consts + nodes, outs, in_tree, out_tree), in_ids,
                    out_ids, None, sends)

    # --- running --------------------------------------------------------------------------------

    def _tag(self, vid: int, k: int) -> int:
        return vid * 4096 + (k + 1)

    def run_flat(self, arrays: list, profile: bool = False) -> list[np.ndarray]:
        """Run one step on whole inputs; returns the step's outputs (whole arrays)."""
        from graphc.core.spec import unshard
        from graphc.runtime.comm import ThreadWorld
        from graphc.runtime.parallel import run_on_devices

        arrays = [np.asarray(x) for x in arrays]
        g0 = self.mb.programs[0].graph
        if len(arrays) != len(g0.inputs):
            raise GraphcError(f"the step takes {len(g0.inputs)} arrays, got {len(arrays)}")
        pieces = self._split_inputs(arrays)
        world = ThreadWorld(self.mesh.size, timeout_s=self.timeout_s)
        for d, slot in self.comms.items():
            slot.current = _SubMeshComm(world.comm(d), self.stage_devices[self._stage_of(d)])
        prof: dict[int, dict] = {d: {"events": [], "peak_bytes": 0} for d in self.comms}
        t0 = time.perf_counter()
        results = run_on_devices(sorted(self.comms), world, self.mesh, self.timeout_s,
                                 lambda d: self._run_device(d, world.comm(d), pieces[d], prof[d] if profile else None))
        if profile:
            for p in prof.values():
                p["t0"] = t0
            self.last_profile = prof
        outs = []
        for k, vid in enumerate(self.out_ids):
            if vid < self.n_inputs:
                outs.append(arrays[vid])
                continue
            owner = self._owner(vid)
            by_c = [results[d][vid] for d in self.stage_devices[owner]]
            if self.sub_plan is None:
                outs.append(by_c[0])
            else:
                v = g0.outputs[k]
                coords = {self.sub.coord(c): x for c, x in enumerate(by_c)}
                outs.append(unshard(coords, self.out_specs[k], tuple(self.sub.shape), v.type.shape)
                            .astype(v.type.dtype, copy=False))
        return outs

    def _stage_of(self, d: int) -> int:
        return self.mesh.coord(d)[self.pp]

    def _split_inputs(self, arrays: list[np.ndarray]) -> dict[int, dict[tuple[int, int], np.ndarray]]:
        """device -> (input id, micro-batch) -> its piece; state (not split) under micro-batch -1."""
        from graphc.core.spec import shard

        batch = set(self.mb.batch) if self.m > 1 else set()
        whole: dict[tuple[int, int], np.ndarray] = {}
        for i, x in enumerate(arrays):
            if i in batch:
                for k, piece in enumerate(np.split(x, self.m, axis=0)):
                    whole[(i, k)] = piece
            else:
                whole[(i, -1)] = x
        out: dict[int, dict] = {}
        for devs in self.stage_devices.values():
            for c, d in enumerate(devs):
                if self.sub_plan is None:
                    out[d] = whole
                else:
                    coord = self.sub.coord(c)
                    out[d] = {key: shard(x, self.in_specs[key[0]], tuple(self.sub.shape), coord)
                              for key, x in whole.items()}
        return out

    def _run_device(self, d: int, comm, pieces, prof: dict | None) -> dict[int, np.ndarray]:
        from graphc.passes.pipeline import schedule_tasks

        s = self._stage_of(d)
        c = self.stage_devices[s].index(d)
        store: dict[tuple[int, int], np.ndarray] = {}
        acc: dict[int, np.ndarray] = {}  # meeting output id -> running sum
        # the sums live in buffers kept from step to step: a fresh one would pay its page faults
        # in the middle of the pipeline every step (tens of ms for the gradients of large layers)
        buffers = self._acc_buffers.setdefault(d, {})
        batch = set(self.mb.batch) if self.m > 1 else set()

        def fetch(vid: int, k: int) -> np.ndarray:
            if vid < self.n_inputs:
                return pieces[(vid, k if vid in batch else -1)]
            src, ph = self._where(vid)
            # step-level values live under -1; the step phase reads a per-micro-batch value only when
            # it is the same for every micro-batch (passes/microbatch.py checks), so micro-batch 0's
            kk = -1 if ph in ("U", "M") else max(k, 0)
            hit = store.get((vid, kk))
            if hit is not None:
                return hit
            if src == s:
                raise GraphcError(f"internal: value {vid} of micro-batch {kk} used before it was computed")
            x = comm.recv(self.device(src, c), self._tag(vid, kk))
            store[(vid, kk)] = x
            return x

        def run(task: Task, k: int) -> None:
            args = [fetch(v, k) for v in task.in_ids]
            start = time.perf_counter()
            tprof: dict | None = {} if prof is not None else None
            outs = task.executable.run_flat(args, tprof)
            kk = k if task.phase in ("F", "B") else -1
            for vid, y in zip(task.out_ids, outs):
                if vid in self.meeting_inputs:
                    m_out = self.meeting_inputs[vid]
                    if m_out in acc:
                        acc[m_out] += y
                    else:
                        y = np.asarray(y)
                        buf = buffers.get(m_out)
                        if buf is None or buf.shape != y.shape or buf.dtype != y.dtype:
                            buf = buffers[m_out] = np.empty_like(y)
                        np.copyto(buf, y)
                        acc[m_out] = buf
                store[(vid, kk)] = y
                for dst in task.sends.get(vid, ()):
                    comm.send(y, dst, self._tag(vid, kk))
            end = time.perf_counter()  # the task's work includes accumulating and sending its results
            if prof is not None:
                live = sum(x.nbytes for x in store.values()) + sum(x.nbytes for x in acc.values())
                if task.phase in ("F", "B"):  # what the micro-batches in flight hold between tasks
                    prof["held_bytes"] = max(prof.get("held_bytes", 0), live)
                prof["events"].append((task.phase, task.k, start, end))
                prof["peak_bytes"] = max(prof["peak_bytes"], live + tprof.get("peak_bytes", 0))

        for ph, k in schedule_tasks(self.schedule, self.n_stages, self.m, s):
            if ph == "U":
                # the micro-batches have met: accumulated sums become step values, sent where needed
                for m_out, (_src, st) in self.meetings.items():
                    if st != s:
                        continue
                    store[(m_out, -1)] = acc[m_out]
                    for dst in sorted({r[0] for r in self.readers.get(m_out, ()) if r[0] != s}):
                        comm.send(acc[m_out], self.device(dst, c), self._tag(m_out, -1))
                for key in [key for key in store if key[1] >= 0]:
                    if not self._needed_later(key[0], s):
                        del store[key]
                for i in range(self.n_segments[d]):
                    run(self.tasks[(d, "U", -1 - i)], -1)
                continue
            task = self.tasks[(d, ph, k)]
            if task.graph.nodes or task.out_ids:
                run(task, k)
            if ph == "B":  # this micro-batch's values are dead unless the step phase reads them
                for key in [key for key in store if key[1] == k]:
                    if not self._needed_later(key[0], s):
                        del store[key]
        owned = {}
        kept = {id(b) for b in buffers.values()}
        for vid in self.out_ids:
            if vid >= self.n_inputs and self._owner(vid) == s:
                x = store[(vid, 0 if self._where(vid)[1] in ("F", "B") else -1)]
                owned[vid] = x.copy() if id(x) in kept else x  # the caller's, not next step's buffer
        return owned

    def _owner(self, vid: int) -> int:
        st, ph = self._where(vid)
        return self.meetings[vid][1] if ph == "M" else st

    def _needed_later(self, vid: int, s: int) -> bool:
        return (s, "U") in self.readers.get(vid, ()) or vid in self.out_ids

    # --- reporting ------------------------------------------------------------------------------

    def measured_bubble(self) -> float:
        """1 - busy / (devices x span) of the last profiled run, forward and backward tasks only."""
        prof = self.last_profile
        if not prof:
            raise GraphcError("run with profile=True first")
        evs = [e for p in prof.values() for e in p["events"] if e[0] in ("F", "B")]
        if not evs:
            return 0.0
        start = min(e[2] for e in evs)
        end = max(e[3] for e in evs)
        busy = sum(e[3] - e[2] for e in evs)
        return 1.0 - busy / (len(prof) * (end - start))

    def summary(self) -> str:
        return self.plan.summary()


def _value_ids(g: Graph) -> dict[Value, int]:
    """Inputs 0..n-1, then node outputs in program order (the same in every program of one plan)."""
    ids = {v: i for i, v in enumerate(g.inputs)}
    for n in g.nodes:
        for o in n.outputs:
            ids[o] = len(ids)
    return ids


def _varies(ref: Graph, origin: list[int], g0: Graph, varies0: set) -> set[int]:
    """Value ids of ``ref`` that differ between micro-batches: those of nodes serving a node of
    micro-batch program ``g0`` whose outputs vary (``varies0``), and batch inputs' pieces."""
    vary_nodes = {k for k, n in enumerate(g0.nodes) if any(o in varies0 for o in n.outputs)}
    vary_inputs = {k for k, v in enumerate(g0.inputs) if v in varies0}
    ids = _value_ids(ref)
    out = {ids[v] for k, v in enumerate(ref.inputs) if k in vary_inputs}
    for j, n in enumerate(ref.nodes):
        if origin[j] in vary_nodes:
            out.update(ids[o] for o in n.outputs)
    return out


__all__ = ["PP_AXIS", "PipelineExecutable", "Task"]
