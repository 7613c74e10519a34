"""The pipeline runtime: a training step in M micro-batches on S stages, one thread per stage.

``PipelineExecutable(graph, stages=S, microbatches=M, schedule="1f1b")`` micro-batches the step
(passes/microbatch.py), cuts it into stages (passes/pipeline.py) and builds, for every stage, one
task per phase and micro-batch: its forward ``F(k)`` and backward ``B(k)`` nodes of micro-batch
k's program, and the step-phase nodes ``U`` it runs once after the micro-batches meet. Tasks are
graphs run by the single-device executor; values crossing stages go through the communicator's
send/recv (tagged by value and micro-batch), values staying on a stage (residuals kept from F(k)
for B(k)) are kept until their last use. Meeting points accumulate the micro-batches' partial
sums in micro-batch order on the stage that produces them.

Each stage runs its tasks in the schedule's order (GPipe or 1F1B). The step phase is split
where it needs another stage's result, and everything is sent as soon as it is produced, so the
stages follow one global order and cannot deadlock; every wait is bounded by the timeout.

``run_flat(arrays, profile=True)`` also records every task's start and end (for the Chrome trace
and the measured bubble fraction), each stage's peak bytes (values held between tasks plus the
running task's own live values) and ``held_bytes``, the most it holds between forward and
backward tasks (the activations of the micro-batches in flight and the running gradient sums).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphc.errors import GraphcError, PlanError
from graphc.ir import Graph, Value
from graphc.mesh import one_blas_thread
from graphc.pytree import LEAF, TreeDef


@dataclass
class Task:
    stage: int
    phase: str  # "F", "B" or "U"
    k: int  # micro-batch (-1 for the step phase)
    graph: Graph
    in_ids: list[int]  # value id of every task input
    out_ids: list[int]  # value id of every task output
    executable: Any = None
    sends: dict[int, list[int]] = field(default_factory=dict)  # value id -> stages that need it


class PipelineExecutable:
    def __init__(self, graph: Graph, stages: int, microbatches: int, schedule: str = "1f1b", profile=None,
                 memory_limit: int | None = None, timeout_s: float = 60.0):
        from graphc.mesh import MachineProfile, load_profile
        from passes.microbatch import microbatch
        from passes.pipeline import assign_stages, predicted_step

        if not isinstance(stages, int) or stages < 1:
            raise PlanError(f"the number of pipeline stages must be a positive int, got {stages!r}")
        self.graph = graph
        self.n_stages = stages
        self.m = microbatches
        self.schedule = schedule
        self.timeout_s = timeout_s
        if profile is None:
            try:
                profile = load_profile()
            except Exception:
                profile = MachineProfile.default()
        self.mb = microbatch(graph, microbatches)
        g0 = self.mb.programs[0].graph
        self.assignment = assign_stages(g0, self.mb.step_phase, stages, profile, schedule, microbatches, memory_limit)
        self.predicted = predicted_step(self.assignment, microbatches)
        self._build()
        self.last_profile: dict | None = None

    # --- building the tasks ---------------------------------------------------------------------

    def _build(self) -> None:
        from runtime.executor import Executable

        a = self.assignment
        progs = [p.graph for p in self.mb.programs]
        g0 = progs[0]
        n_in = len(g0.inputs)
        # value ids: inputs 0..n_in-1, then node outputs in program order (the same in every program)
        vid_of: list[dict[Value, int]] = []
        for g in progs:
            ids = {v: i for i, v in enumerate(g.inputs)}
            for n in g.nodes:
                for o in n.outputs:
                    ids[o] = len(ids)
            vid_of.append(ids)
        self.n_values = len(vid_of[0])
        prod_node: dict[int, int] = {}
        for k, n in enumerate(g0.nodes):
            for o in n.outputs:
                prod_node[vid_of[0][o]] = k
        self.prod_node = prod_node
        self.n_inputs = n_in
        ids0 = vid_of[0]
        # meeting points: output id -> (input id, stage)
        self.meetings: dict[int, tuple[int, int]] = {}
        for k, n in enumerate(g0.nodes):
            if a.phase[k] == "M":
                if n.op.name != "all_reduce":
                    raise PlanError(f"{n.op.name} at {n.loc or '?'}: micro-batches can only meet by summing "
                                    f"(all_reduce) in a pipeline, got {n.op.name}")
                src = ids0[n.inputs[0]]
                if src not in prod_node or a.phase[prod_node[src]] not in ("F", "B"):
                    raise PlanError(f"all_reduce at {n.loc or '?'} sums a value computed once per step")
                self.meetings[ids0[n.outputs[0]]] = (src, a.stage[k])
        self.meeting_inputs = {src: out for out, (src, _s) in self.meetings.items()}

        def where(vid: int) -> tuple[int, str]:
            """(stage, phase) producing ``vid``; inputs: (-1, "I")."""
            if vid < n_in:
                return -1, "I"
            k = prod_node[vid]
            return a.stage[k], a.phase[k]

        self.where = where
        # consumers of each value: (stage, phase) of every node reading it, and graph outputs
        readers: dict[int, set[tuple[int, str]]] = {}
        for k, n in enumerate(g0.nodes):
            if a.phase[k] in ("C", "M"):
                continue
            for v in n.inputs:
                vid = ids0[v]
                if vid in prod_node and a.phase[prod_node[vid]] == "C":
                    continue
                readers.setdefault(vid, set()).add((a.stage[k], a.phase[k]))
        self.readers = readers
        self.users: dict[int, set[int]] = {}  # value id -> indices of the program nodes reading it
        for k, n in enumerate(g0.nodes):
            for v in n.inputs:
                self.users.setdefault(ids0[v], set()).add(k)
        self.out_ids = [ids0[v] for v in g0.outputs]
        varies = {ids0[v] for v in self.mb.varies}
        for o in self.out_ids:
            s, ph = where(o)
            if ph in ("F", "B") and o in varies and self.m > 1:
                raise PlanError("a result of the step differs per micro-batch and is not combined into one")

        self.tasks: dict[tuple[int, str, int], Task] = {}  # (stage, phase, micro-batch or -1 - segment)
        self.n_segments: dict[int, int] = {}
        for s in range(self.n_stages):
            for ph in ("F", "B"):
                for k in range(self.m):
                    idx = [j for j in range(len(g0.nodes)) if a.stage[j] == s and a.phase[j] == ph]
                    self.tasks[(s, ph, k)] = self._task(progs[k], vid_of[k], idx, s, ph, k)
            # the step phase, cut before every node that needs another stage's step-phase result:
            # what is produced before the cut is sent first, so no two stages wait on each other
            segments: list[list[int]] = [[]]
            for j in range(len(g0.nodes)):
                if a.stage[j] != s or a.phase[j] != "U":
                    continue
                remote = any(self.where(ids0[v])[1] == "U" and self.where(ids0[v])[0] != s
                             for v in g0.nodes[j].inputs if ids0[v] in prod_node)
                if remote and segments[-1]:
                    segments.append([])
                segments[-1].append(j)
            self.n_segments[s] = len(segments)
            for i, seg in enumerate(segments):
                self.tasks[(s, "U", -1 - i)] = self._task(g0, ids0, seg, s, "U", -1)
        for t in self.tasks.values():
            t.executable = Executable(t.graph)

    def _task(self, g: Graph, ids: dict[Value, int], idx: list[int], s: int, ph: str, k: int) -> Task:
        nodes = [g.nodes[j] for j in idx]
        inside = {o for n in nodes for o in n.outputs}
        consts, seen = [], set()
        for n in nodes:
            for v in n.inputs:
                p = v.producer
                if p is not None and v not in inside and p.op.name == "constant" and id(p) not in seen:
                    seen.add(id(p))
                    consts.append(p)
        inside |= {o for c in consts for o in c.outputs}
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
                elsewhere = self.users.get(vid, set()) - mine
                if elsewhere or vid in self.out_ids or vid in self.meeting_inputs:
                    outs.append(o)
                    out_ids.append(vid)
        sends: dict[int, list[int]] = {}
        for vid in out_ids:  # meeting inputs are accumulated here, on the producing stage
            dst = sorted({r[0] for r in self.readers.get(vid, ()) if r[0] != s})
            if dst:
                sends[vid] = dst
        in_tree = TreeDef("tuple", (TreeDef("tuple", (LEAF,) * len(inputs)), TreeDef("dict")))
        out_tree = TreeDef("tuple", (LEAF,) * len(outs))
        graph = Graph(f"{g.name}.stage{s}.{ph}{'' if k < 0 else k}", inputs, consts + nodes, outs, in_tree, out_tree)
        return Task(s, ph, k, graph, in_ids, out_ids, None, sends)

    # --- running --------------------------------------------------------------------------------

    def _tag(self, vid: int, k: int) -> int:
        return vid * 4096 + (k + 1)

    def run_flat(self, arrays: list, profile: bool = False) -> list[np.ndarray]:
        """Run one step on whole inputs; returns the step's outputs (whole arrays)."""
        from runtime.comm import CommAborted, ThreadWorld

        arrays = [np.asarray(x) for x in arrays]
        g0 = self.mb.programs[0].graph
        if len(arrays) != len(g0.inputs):
            raise GraphcError(f"the step takes {len(g0.inputs)} arrays, got {len(arrays)}")
        pieces = self._split_inputs(arrays)
        world = ThreadWorld(self.n_stages, timeout_s=self.timeout_s)
        results: dict[int, dict[int, np.ndarray]] = {}
        errors: dict[int, BaseException] = {}
        prof: dict[int, dict] = {s: {"events": [], "peak_bytes": 0} for s in range(self.n_stages)}
        t0 = time.perf_counter()

        def device(s: int) -> None:
            try:
                results[s] = self._run_stage(s, world.comm(s), pieces, prof[s] if profile else None)
            except BaseException as exc:  # noqa: BLE001 - stops the other stages
                errors[s] = exc
                world.abort(s, exc)

        threads = [threading.Thread(target=device, args=(s,), name=f"graphc-stage-{s}", daemon=True)
                   for s in range(self.n_stages)]
        with one_blas_thread():
            for t in threads:
                t.start()
            deadline = time.monotonic() + self.timeout_s + 5.0
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
        if errors:
            from runtime.parallel import _on_device

            root = {d: e for d, e in errors.items() if not isinstance(e, CommAborted)} or errors
            d = min(root)
            raise _on_device(root[d], d, _StageMesh(self.n_stages))
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            raise GraphcError(f"pipeline stages did not finish within {self.timeout_s + 5:.0f} s: {', '.join(stuck)}")
        if profile:
            for p in prof.values():
                p["t0"] = t0
            self.last_profile = prof
        owned = {vid: arr for r in results.values() for vid, arr in r.items()}
        return [owned[v] if v in owned else arrays[v] for v in self.out_ids]

    def _split_inputs(self, arrays: list[np.ndarray]) -> dict[tuple[int, int], np.ndarray]:
        """(input id, micro-batch) -> its piece; state inputs (not split) under micro-batch -1."""
        out: dict[tuple[int, int], np.ndarray] = {}
        batch = set(self.mb.batch) if self.m > 1 else set()
        for i, x in enumerate(arrays):
            if i in batch:
                for k, piece in enumerate(np.split(x, self.m, axis=0)):
                    out[(i, k)] = piece
            else:
                out[(i, -1)] = x
        return out

    def _run_stage(self, s: int, comm, pieces, prof: dict | None) -> dict[int, np.ndarray]:
        from passes.pipeline import schedule_tasks

        store: dict[tuple[int, int], np.ndarray] = {}
        acc: dict[int, np.ndarray] = {}  # meeting output id -> running sum
        batch = set(self.mb.batch) if self.m > 1 else set()

        def fetch(vid: int, k: int) -> np.ndarray:
            if vid < self.n_inputs:
                return pieces[(vid, k if vid in batch else -1)]
            src, ph = self.where(vid)
            # step-level values live under -1; the step phase reads a per-micro-batch value only when
            # it is the same for every micro-batch (passes/microbatch.py checks), so micro-batch 0's
            kk = -1 if ph in ("U", "M") else max(k, 0)
            hit = store.get((vid, kk))
            if hit is not None:
                return hit
            if ph == "M" and src == s:
                raise GraphcError(f"internal: meeting value {vid} used before all micro-batches met")
            x = comm.recv(src, self._tag(vid, kk))
            store[(vid, kk)] = x
            return x

        def run(task: Task, k: int) -> None:
            args = [fetch(v, k) for v in task.in_ids]
            start = time.perf_counter()
            tprof: dict | None = {} if prof is not None else None
            outs = task.executable.run_flat(args, tprof)
            end = time.perf_counter()
            for vid, y in zip(task.out_ids, outs):
                kk = k if task.phase in ("F", "B") else -1
                if vid in self.meeting_inputs:
                    m_out = self.meeting_inputs[vid]
                    if m_out in acc:
                        acc[m_out] += y
                    else:
                        acc[m_out] = np.array(y, copy=True)
                store[(vid, kk)] = y
                for dst in task.sends.get(vid, ()):
                    comm.send(y, dst, self._tag(vid, kk))
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
                        comm.send(acc[m_out], dst, self._tag(m_out, -1))
                for key in [key for key in store if key[1] >= 0]:
                    if not self._needed_later(key[0], s):
                        del store[key]
                for i in range(self.n_segments[s]):
                    run(self.tasks[(s, "U", -1 - i)], -1)
                continue
            task = self.tasks[(s, ph, k)]
            if task.graph.nodes or task.out_ids:
                run(task, k)
            self._drop_dead(store, s, ph, k)
        owned = {}
        for vid in self.out_ids:
            if vid >= self.n_inputs and self._owner(vid) == s:
                owned[vid] = store[(vid, 0 if self.where(vid)[1] in ("F", "B") else -1)]
        return owned

    def _owner(self, vid: int) -> int:
        if vid < self.n_inputs:
            return -2
        st, ph = self.where(vid)
        if ph == "M":
            return self.meetings[vid][1]
        return st

    def _needed_later(self, vid: int, s: int) -> bool:
        return (s, "U") in self.readers.get(vid, ()) or vid in self.out_ids

    def _drop_dead(self, store: dict, s: int, ph: str, k: int) -> None:
        """After B(k): this micro-batch's values are dead unless the step phase reads them."""
        if ph != "B":
            return
        for key in [key for key in store if key[1] == k]:
            if not self._needed_later(key[0], s):
                del store[key]

    # --- reporting ------------------------------------------------------------------------------

    def measured_bubble(self) -> float:
        """1 - busy / (stages x span) of the last profiled run, F and B tasks only."""
        prof = self.last_profile
        if not prof:
            raise GraphcError("run with profile=True first")
        evs = [(s, e) for s, p in prof.items() for e in p["events"] if e[0] in ("F", "B")]
        if not evs:
            return 0.0
        start = min(e[2] for _, e in evs)
        end = max(e[3] for _, e in evs)
        busy = sum(e[3] - e[2] for _, e in evs)
        return 1.0 - busy / (self.n_stages * (end - start))

    def summary(self) -> str:
        a = self.assignment
        lines = [f"pipeline: {self.n_stages} stages x {self.m} micro-batches, {self.schedule}; predicted step "
                 f"{self.predicted['step_s'] * 1e3:.3f} ms, bubble {self.predicted['bubble']:.1%} "
                 f"(balanced: {(self.n_stages - 1) / (self.m + self.n_stages - 1):.1%})"]
        for s in range(self.n_stages):
            n = sum(1 for x in a.stage if x == s)
            lines.append(f"  stage {s}: {n} nodes, forward {a.forward_s[s] * 1e3:.3f} ms + backward "
                         f"{a.backward_s[s] * 1e3:.3f} ms per micro-batch, update {a.update_s[s] * 1e3:.3f} ms, "
                         f"state {a.state_bytes[s]:,} B, activations {a.activation_bytes[s]:,} B per micro-batch")
        return "\n".join(lines)


class _StageMesh:
    """Names a stage in error messages like a mesh coordinate."""

    def __init__(self, n: int):
        self.axis_names = ("pp",)
        self.n = n

    def coord(self, d: int) -> tuple[int]:
        return (d,)


__all__ = ["PipelineExecutable", "Task"]
