"""Pipeline stages: a micro-batched training step cut into S stages along the ``pp`` mesh axis.

Input: the program of one micro-batch (passes/microbatch.py), whose nodes are forward, backward,
meeting points (gradient accumulation) and step-phase (the update). Stage partitioning cuts the
forward nodes, in program order, into S contiguous segments by dynamic programming (as Alpa's
inter-op pass and PipeDream do), minimising the slowest stage's predicted time (its forward and
the backward that belongs to it) under each stage's memory limit (parameters, optimizer state
and the activations the schedule keeps in flight).

Every other node follows by position on a line of 2S virtual stages, F0 F1 ... F(S-1) B(S-1) ...
B0, where Fs and Bs run on stage s's devices: a backward node goes to the backward of the stage
whose forward values it reads (the home of the residuals and parameters it uses), but never
before a node it depends on, so data only flows forward along the line: forward activations to
later stages, gradients to earlier ones. Meeting points stay with the value they accumulate;
step-phase nodes go to the stage of the parameters they update. Values crossing stages become
send/recv pairs in the runtime (runtime/pipeline.py).

Schedules (``schedule_tasks``): GPipe (all forwards, then all backwards) and 1F1B (S-s-1 warm-up
forwards on stage s, then one forward and one backward in turn), which keeps at most S - s
micro-batches' activations alive on stage s instead of M. The predicted bubble fraction of a
balanced pipeline is (S - 1) / (M + S - 1) for both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphc.errors import PlanError
from graphc.ir import Graph, Value

SCHEDULES = ("gpipe", "1f1b")


@dataclass
class StageAssignment:
    n_stages: int
    stage: list[int]  # per program node: its stage (-1: a constant, copied to every stage using it)
    phase: list[str]  # per program node: "F", "B", "M" (meeting point) or "U" (step phase)
    cuts: list[int]  # forward positions where stages 1..S-1 start
    forward_s: list[float] = field(default_factory=list)  # predicted seconds per stage and micro-batch
    backward_s: list[float] = field(default_factory=list)
    update_s: list[float] = field(default_factory=list)
    state_bytes: list[int] = field(default_factory=list)  # inputs each stage holds for the whole step
    activation_bytes: list[int] = field(default_factory=list)  # kept per micro-batch in flight


def node_seconds(g: Graph, profile) -> list[float]:
    """Roofline seconds of every node on one device (the cost model of the sharding planner)."""
    from passes.sharding.strategies import _full_time

    out = []
    for n in g.nodes:
        try:
            out.append(0.0 if n.op.name == "constant" else float(_full_time(n, profile)))
        except Exception:  # an op without a cost: count its bytes at memory speed
            out.append(sum(v.type.nbytes for v in n.inputs + n.outputs) / profile.mem_bandwidth)
    return out


def in_flight(schedule: str, n_stages: int, m: int, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at once under ``schedule``."""
    return m if schedule == "gpipe" else min(m, n_stages - stage)


def assign_stages(g: Graph, step_phase: list[bool], n_stages: int, profile, schedule: str = "1f1b", m: int = 1,
                  memory_limit: int | None = None) -> StageAssignment:
    """Cut ``g`` (one micro-batch's program) into ``n_stages`` stages; see the module doc."""
    from passes.lower import COLLECTIVE_OPS

    if schedule not in SCHEDULES:
        raise PlanError(f"unknown pipeline schedule {schedule!r}: expected one of {', '.join(SCHEDULES)}")
    S = n_stages
    nodes = g.nodes
    secs = node_seconds(g, profile)
    producer: dict[Value, int] = {o: k for k, n in enumerate(nodes) for o in n.outputs}
    is_const = [n.op.name == "constant" for n in nodes]
    meets = [n.op.name in COLLECTIVE_OPS for n in nodes]
    fwd = [k for k, n in enumerate(nodes) if n.part == "forward" and not step_phase[k] and not meets[k]
           and not is_const[k]]
    if not fwd:
        raise PlanError("the step has no forward nodes to cut into pipeline stages")
    if len(fwd) < S:
        raise PlanError(f"the step's forward pass has {len(fwd)} nodes: too few for {S} pipeline stages")
    fpos = {k: i for i, k in enumerate(fwd)}
    # forward position that "owns" a value: where it is consumed last in the forward (inputs,
    # parameters, stage-boundary activations) or produced
    users: dict[Value, list[int]] = {}
    for k in fwd:
        for v in nodes[k].inputs:
            users.setdefault(v, []).append(fpos[k])

    def home(v: Value) -> int | None:
        pos = users.get(v, [])
        k = producer.get(v)
        if k is not None and k in fpos:
            pos = pos + [fpos[k]]
        return max(pos) if pos else None

    # backward and step-phase nodes: the forward position they belong to
    other_home: dict[int, int | None] = {}
    for k, n in enumerate(nodes):
        if k in fpos or is_const[k]:
            continue
        hs = [h for v in n.inputs if (h := home(v)) is not None]
        other_home[k] = max(hs) if hs else None

    # --- dynamic programming over the forward order ---------------------------------------------
    nf = len(fwd)
    f_cost = np.zeros(nf + 1)
    np.cumsum([secs[k] for k in fwd], out=f_cost[1:])
    b_at = np.zeros(nf)  # backward seconds homed at each forward position
    for k, h in other_home.items():
        if h is not None and not meets[k] and not step_phase[k]:
            b_at[h] += secs[k]
    b_cost = np.concatenate([[0.0], np.cumsum(b_at)])
    # memory: state (inputs) owned at their first forward use; activations kept for the backward
    act_at = np.zeros(nf)
    backward_reads = {v for k, n in enumerate(nodes) if k not in fpos for v in n.inputs}
    for k in fwd:
        for o in nodes[k].outputs:
            if o in backward_reads:
                act_at[fpos[k]] += o.type.nbytes
    state_at = np.zeros(nf)
    for v in g.inputs:
        if v in users:
            state_at[min(users[v])] += v.type.nbytes
    act_cost = np.concatenate([[0.0], np.cumsum(act_at)])
    state_cost = np.concatenate([[0.0], np.cumsum(state_at)])

    def seg_time(i, j):  # arrays ok
        return (f_cost[j] - f_cost[i]) + (b_cost[j] - b_cost[i])

    def seg_mem(i, j, s):
        return (state_cost[j] - state_cost[i]) + in_flight(schedule, S, m, s) * (act_cost[j] - act_cost[i])

    INF = float("inf")
    best = np.full((S + 1, nf + 1), INF)
    arg = np.zeros((S + 1, nf + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for s in range(1, S + 1):
        for j in range(s, nf - (S - s) + 1):
            i = np.arange(s - 1, j)
            t = np.maximum(best[s - 1, i], seg_time(i, j))
            if memory_limit is not None:
                t = np.where(seg_mem(i, j, s - 1) <= memory_limit, t, INF)
            a = int(np.argmin(t))
            best[s, j], arg[s, j] = t[a], i[a]
    if not np.isfinite(best[S, nf]):
        need = min(max(seg_mem(0, nf, 0), 0.0), INF)
        raise PlanError(f"no cut of the step into {S} pipeline stages fits the memory limit of {memory_limit:,} bytes "
                        f"per device (the whole step needs {int(need):,} bytes on one device)")
    bounds = [nf]
    for s in range(S, 0, -1):
        bounds.append(int(arg[s, bounds[-1]]))
    bounds = bounds[::-1]  # bounds[s] .. bounds[s+1] is stage s
    stage_of_pos = np.zeros(nf, dtype=np.int64)
    for s in range(S):
        stage_of_pos[bounds[s]:bounds[s + 1]] = s

    # --- every node's place on the line F0 .. F(S-1) B(S-1) .. B0 ------------------------------
    p = [0] * len(nodes)
    stage = [0] * len(nodes)
    phase = [""] * len(nodes)
    for k, n in enumerate(nodes):
        if is_const[k]:
            stage[k], phase[k], p[k] = -1, "C", -1
            continue
        before = max((p[producer[v]] for v in n.inputs if v in producer), default=0)
        if k in fpos:
            p[k] = max(before, int(stage_of_pos[fpos[k]]))
            if p[k] >= S:
                raise PlanError(f"{n.op.name} at {n.loc or '?'} is a forward node that depends on the backward pass")
        elif step_phase[k] or meets[k]:
            p[k] = before
        else:
            h = other_home[k]
            p[k] = max(before, S if h is None else 2 * S - 1 - int(stage_of_pos[h]))
        stage[k] = p[k] if p[k] < S else 2 * S - 1 - p[k]
        if step_phase[k]:
            h = other_home[k]
            stage[k] = int(stage_of_pos[h]) if h is not None else stage[k]
            phase[k] = "U"
        elif meets[k]:
            phase[k] = "M"
        else:
            phase[k] = "F" if p[k] < S else "B"
    fs = [0.0] * S
    bs = [0.0] * S
    us = [0.0] * S
    for k in range(len(nodes)):
        if stage[k] >= 0:
            {"F": fs, "B": bs, "U": us, "M": us}[phase[k]][stage[k]] += secs[k]
    st = [int(state_cost[bounds[s + 1]] - state_cost[bounds[s]]) for s in range(S)]
    ab = [int(act_cost[bounds[s + 1]] - act_cost[bounds[s]]) for s in range(S)]
    return StageAssignment(S, stage, phase, bounds[1:-1], fs, bs, us, st, ab)


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


def predicted_step(a: StageAssignment, m: int) -> dict:
    """Predicted step time of a pipeline: the slowest stage's forward + backward, M + S - 1 times
    (fill and drain), then the update; and the bubble fraction (S-1)/(M+S-1) scaled by balance."""
    S = a.n_stages
    per_mb = max(f + b for f, b in zip(a.forward_s, a.backward_s))
    total = (m + S - 1) * per_mb + max(a.update_s)
    busy = sum(m * (f + b) for f, b in zip(a.forward_s, a.backward_s)) / S
    return {"step_s": total, "bubble": 1.0 - busy / ((m + S - 1) * per_mb) if per_mb else 0.0}


__all__ = ["SCHEDULES", "StageAssignment", "assign_stages", "in_flight", "node_seconds", "predicted_step",
           "schedule_tasks"]
