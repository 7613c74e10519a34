"""Pipeline stages: one micro-batch's program cut into S stages along the ``pp`` mesh axis
(``assign_stages``; passes/pipeline.py plans the whole pipeline around it).

Input: the program of one micro-batch (passes/microbatch.py), whose nodes are forward, backward,
meeting points (gradient accumulation) and step-phase (the update). Stage partitioning cuts the
forward nodes (or, where a loss linear in the weights left fewer than S, the whole micro-batch
phase: ``_cut_order``), in program order, into S contiguous segments by dynamic programming (as
Alpa's inter-op pass and PipeDream do), minimising the slowest stage's predicted time (its forward and
the backward that belongs to it) under each stage's memory limit (parameters, optimizer state
and the activations the schedule keeps in flight).

Every other node follows by position on a line of 2S virtual stages, F0 F1 ... F(S-1) B(S-1) ...
B0, where Fs and Bs run on stage s's devices: a backward node goes to the backward of the stage
whose forward values it reads (the home of the residuals and parameters it uses), but never
before a node it depends on, so data only flows forward along the line: forward activations to
later stages, gradients to earlier ones. Meeting points stay with the value they accumulate;
step-phase nodes go to the stage of the parameters they update (one reading only the step's
inputs and constants, as Adam's ``b1 * m``, to its readers' stage).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graphc.core.errors import MemoryLimitError, PlanError
from graphc.core.ir import Graph, Node, Value
from graphc.core.traits import Collective, Constant
from graphc.passes.options import SCHEDULES
from graphc.passes.sharding.strategies import full_time


@dataclass(slots=True, kw_only=True)
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
    out = []
    for n in g.nodes:
        try:
            out.append(0.0 if n.op.has(Constant) else float(full_time(n, profile)))
        except Exception:  # an op without a cost: count its bytes at memory speed
            out.append(sum(v.type.nbytes for v in n.inputs + n.outputs) / profile.mem_bandwidth)
    return out


def in_flight(schedule: str, n_stages: int, m: int, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at once under ``schedule``."""
    return m if schedule == "gpipe" else min(m, n_stages - stage)


def assign_stages(
    g: Graph,
    step_phase: list[bool],
    n_stages: int,
    profile,
    schedule: str = "1f1b",
    m: int = 1,
    memory_limit: int | None = None,
    devices: int = 1,
) -> StageAssignment:
    """Cut ``g`` (one micro-batch's program) into ``n_stages`` stages; see the module doc. The
    steps: the forward order and the forward position every other node belongs to
    (``_forward_order``), the costs of a stage of forward positions (``_segment_costs``), the
    cuts by dynamic programming (``_cut_forward``), and their refinement against the placement
    of every node on the line F0 .. F(S-1) B(S-1) .. B0 (``_refine_cuts``, ``_place``).
    ``memory_limit`` is a stage's, shared evenly by its ``devices`` (what an error reports per
    device)."""
    if schedule not in SCHEDULES:
        raise PlanError(f"unknown pipeline schedule {schedule!r}: expected one of {', '.join(SCHEDULES)}")
    S = n_stages
    sn = _forward_order(g, step_phase, S, profile)
    costs = _segment_costs(g, sn, schedule, S, m)
    bounds = _cut_forward(costs, len(sn.fwd), memory_limit, devices)
    bounds, placed = _refine_cuts(sn, costs, bounds, memory_limit)
    st = [int(costs.state_bytes[bounds[s + 1]] - costs.state_bytes[bounds[s]]) for s in range(S)]
    ab = [int(costs.activation_bytes[bounds[s + 1]] - costs.activation_bytes[bounds[s]]) for s in range(S)]
    times = placed.times
    return StageAssignment(
        n_stages=S,
        stage=placed.stage,
        phase=placed.phase,
        cuts=bounds[1:-1],
        forward_s=list(times[:, 0]),
        backward_s=list(times[:, 1]),
        update_s=list(times[:, 2]),
        state_bytes=st,
        activation_bytes=ab,
    )


@dataclass
class _StepNodes:
    """What the steps of ``assign_stages`` share about the nodes of one micro-batch's program."""

    nodes: list[Node]
    secs: list[float]  # per node: predicted seconds on one device (node_seconds)
    step_phase: list[bool]  # per node: part of the update
    is_const: list[bool]  # per node: a constant (belongs to no stage: copied to every stage using it)
    meets: list[bool]  # per node: a meeting point (gradient accumulation)
    producer: dict[Value, int]  # value -> the node producing it
    fwd: list[int]  # the forward nodes in program order: what the stages cut
    fpos: dict[int, int]  # forward node -> its position in ``fwd``
    users: dict[Value, list[int]]  # value -> the forward positions reading it
    other_home: dict[int, int | None] = field(default_factory=dict)  # any other node -> its forward position
    anchor: dict[int, int] = field(default_factory=dict)  # node -> the forward position it belongs with (_anchors)
    readers: dict[Value, list[int]] = field(default_factory=dict)  # value -> the nodes reading it

    def home(self, v: Value) -> int | None:
        """The forward position that owns ``v``: where it is consumed last in the forward (inputs,
        parameters, stage-boundary activations) or produced; None for a constant or a value the
        forward neither reads nor produces."""
        k = self.producer.get(v)
        if k is not None and self.is_const[k]:
            return None
        pos = self.users.get(v, [])
        if k is not None and k in self.fpos:
            pos = pos + [self.fpos[k]]
        return max(pos) if pos else None


def no_forward_pass(name: str) -> PlanError:
    """The error for micro-batching or pipelining a step with no forward pass to split (one that
    takes no gradient): ``microbatch`` raises it before anything else is checked, stage assignment
    for one micro-batch on stages."""
    return PlanError(
        f"@{name} has no forward pass (nodes graphc.grad or value_and_grad differentiates): micro-batches and "
        "pipeline stages split a training step's forward and backward passes; run it with microbatches=1 and no "
        "pp axis"
    )


def _forward_order(g: Graph, step_phase: list[bool], S: int, profile) -> _StepNodes:
    """The forward order (the forward nodes that are neither step phase, meeting points nor
    constants, in program order; at least ``S`` of them) and the value homes: the forward
    position every backward and step-phase node belongs to, the latest home of its operands."""
    nodes = g.nodes
    secs = node_seconds(g, profile)
    producer: dict[Value, int] = {o: k for k, n in enumerate(nodes) for o in n.outputs}
    is_const = [n.op.has(Constant) for n in nodes]
    meets = [n.op.has(Collective) for n in nodes]
    fwd = _cut_order(g, step_phase, meets, is_const, S)
    fpos = {k: i for i, k in enumerate(fwd)}
    users: dict[Value, list[int]] = {}
    for k in fwd:
        for v in nodes[k].inputs:
            users.setdefault(v, []).append(fpos[k])
    sn = _StepNodes(nodes, secs, step_phase, is_const, meets, producer, fwd, fpos, users)
    for k, n in enumerate(nodes):
        if k in fpos or is_const[k]:
            continue
        hs = [h for v in n.inputs if (h := sn.home(v)) is not None]
        sn.other_home[k] = max(hs) if hs else None
    for k, n in enumerate(nodes):
        for v in n.inputs:
            sn.readers.setdefault(v, []).append(k)
    sn.anchor = _anchors(sn)
    return sn


def _cut_order(g: Graph, step_phase: list[bool], meets: list[bool], is_const: list[bool], S: int) -> list[int]:
    """The nodes the stages cut, in program order: the forward nodes of the micro-batch phase
    (neither step phase, meeting points nor constants), if there are at least ``S``. A loss
    linear in (some of) the weights needs few or no forward values for its gradient
    (``np.sum(x @ w)``: ``x.T @ 1``), so a step that does not return it may keep fewer forward
    nodes than stages, or none: then the whole micro-batch phase, forward and backward nodes in
    program order (each reads only values made before it, so a cut of them sends data only to
    later stages). A gradient folded to a constant leaves no micro-batch work at all: one stage
    runs an empty micro-batch phase and the update once; more stages are an error naming the
    update's line, as is a micro-batch phase of fewer than ``S`` nodes."""
    nodes = g.nodes
    name = g.name.split(".dev")[0]
    work = [k for k, n in enumerate(nodes) if not (step_phase[k] or meets[k] or is_const[k])]
    fwd = [k for k in work if nodes[k].part == "forward"]
    if len(fwd) < S:
        fwd = [k for k in work if nodes[k].part in ("forward", "backward")]
    update = [n for n in nodes if n.part == "update"]
    if not fwd and not update:  # no gradient taken
        raise no_forward_pass(name)
    if len(fwd) >= S or (S == 1 and not fwd):
        return fwd
    if not fwd:
        at = next((n.loc for n in update if n.loc is not None), "?")
        raise PlanError(
            f"@{name}: the update at {at} reads a gradient folded to a constant (no node of the step depends on "
            f"the batch): there is no micro-batch work to cut into {S} pipeline stages; micro-batch it on a mesh "
            "without a pp axis"
        )
    locs = sorted({str(nodes[k].loc) for k in fwd if nodes[k].loc is not None})
    raise PlanError(
        f"@{name}: one micro-batch's forward and backward passes ({', '.join(locs) or '?'}) are {len(fwd)} node(s) "
        f"once optimized: too few to cut into {S} pipeline stages (each stage takes at least one); "
        + (f"use at most {len(fwd)} stages" if len(fwd) > 1 else "micro-batch it on a mesh without a pp axis")
    )


def _anchors(sn: _StepNodes) -> dict[int, int]:
    """{node: the forward position it belongs with}, for every node but constants that has one
    (where the stage cut counts the memory of the step inputs only it reads): a forward node's
    own; any other's home; failing that, the latest of its operands' producers' (a meeting point,
    an update step after the gradient it reads); failing that (a node reading only the step's
    inputs and constants, as Adam's ``b1 * m``), the earliest of its readers'."""
    anchor: dict[int, int] = {}
    for k, n in enumerate(sn.nodes):
        if sn.is_const[k]:
            continue
        h = sn.fpos.get(k, sn.other_home.get(k))
        if h is None:
            hs = [anchor[j] for v in n.inputs if (j := sn.producer.get(v)) is not None and j in anchor]
            h = max(hs) if hs else None
        if h is not None:
            anchor[k] = h
    for k in range(len(sn.nodes) - 1, -1, -1):
        if k not in anchor and not sn.is_const[k]:
            hs = [anchor[r] for o in sn.nodes[k].outputs for r in sn.readers.get(o, ()) if r in anchor]
            if hs:
                anchor[k] = min(hs)
    return anchor


def _loose(sn: _StepNodes, k: int) -> bool:
    """Node ``k`` reads only the step's inputs and constants: nothing places it but its readers."""
    return all((j := sn.producer.get(v)) is None or sn.is_const[j] for v in sn.nodes[k].inputs)


@dataclass
class _SegmentCosts:
    """Prefix sums over the forward order: a stage of forward positions [i, j) costs
    ``x[j] - x[i]`` of each (``i`` may be an array of starts)."""

    forward_s: np.ndarray  # the forward nodes' seconds
    backward_s: np.ndarray  # the seconds of the backward nodes homed at each position
    activation_bytes: np.ndarray  # forward results the rest of the step reads (kept for the backward)
    state_bytes: np.ndarray  # graph inputs, owned at their first forward use
    schedule: str
    n_stages: int
    m: int

    def time(self, i, j):
        """Seconds of the stage [i, j) per micro-batch: its forward and the backward homed in it."""
        return (self.forward_s[j] - self.forward_s[i]) + (self.backward_s[j] - self.backward_s[i])

    def memory(self, i, j, s: int):
        """Bytes stage ``s`` holds as [i, j): its state, and its activations once per micro-batch
        in flight under the schedule."""
        in_flight_mb = in_flight(self.schedule, self.n_stages, self.m, s)
        return (self.state_bytes[j] - self.state_bytes[i]) + in_flight_mb * (
            self.activation_bytes[j] - self.activation_bytes[i]
        )

    def fits(self, bounds: list[int], memory_limit: int | None) -> bool:
        """Every stage of the cut ``bounds`` within the memory limit."""
        return memory_limit is None or all(
            self.memory(bounds[s], bounds[s + 1], s) <= memory_limit for s in range(self.n_stages)
        )


def _segment_costs(g: Graph, sn: _StepNodes, schedule: str, S: int, m: int) -> _SegmentCosts:
    """The prefix sums of ``_SegmentCosts``: the backward seconds at their home's position, the
    activations at their producer's, the state at its first forward use."""
    nodes, fpos = sn.nodes, sn.fpos
    nf = len(sn.fwd)
    f_cost = np.zeros(nf + 1)
    np.cumsum([sn.secs[k] for k in sn.fwd], out=f_cost[1:])
    b_at = np.zeros(nf)
    for k, h in sn.other_home.items():
        if h is not None and not sn.meets[k] and not sn.step_phase[k]:
            b_at[h] += sn.secs[k]
    act_at = np.zeros(nf)
    backward_reads = {v for k, n in enumerate(nodes) if k not in fpos for v in n.inputs}
    for k in sn.fwd:
        for o in nodes[k].outputs:
            if o in backward_reads:
                act_at[fpos[k]] += o.type.nbytes
    state_at = np.zeros(nf)
    for v in g.inputs:
        if v in sn.users:
            state_at[min(sn.users[v])] += v.type.nbytes
            continue
        at = [sn.anchor[k] for k in sn.readers.get(v, ()) if k in sn.anchor]
        if at:  # read by no forward node (an optimizer state): owned where its readers belong
            state_at[min(at)] += v.type.nbytes
    return _SegmentCosts(
        f_cost,
        np.concatenate([[0.0], np.cumsum(b_at)]),
        np.concatenate([[0.0], np.cumsum(act_at)]),
        np.concatenate([[0.0], np.cumsum(state_at)]),
        schedule,
        S,
        m,
    )


def _cut_forward(costs: _SegmentCosts, nf: int, memory_limit: int | None, devices: int = 1) -> list[int]:
    """The cut of the ``nf`` forward positions into S stages (stage s: ``bounds[s]`` ..
    ``bounds[s + 1]``) whose slowest stage is fastest and whose every stage fits the memory limit,
    by dynamic programming: ``best[s, j]`` is the slowest stage of the best cut of positions
    0 .. j into s stages, ``arg[s, j]`` where its last stage starts."""
    S = costs.n_stages
    if nf == 0 and S == 1:  # a gradient folded to a constant: the micro-batch phase is empty
        return [0, 0]
    INF = float("inf")
    best = np.full((S + 1, nf + 1), INF)
    arg = np.zeros((S + 1, nf + 1), dtype=np.int64)
    best[0, 0] = 0.0
    for s in range(1, S + 1):
        for j in range(s, nf - (S - s) + 1):
            i = np.arange(s - 1, j)
            t = np.maximum(best[s - 1, i], costs.time(i, j))
            if memory_limit is not None:
                t = np.where(costs.memory(i, j, s - 1) <= memory_limit, t, INF)
            a = int(np.argmin(t))
            best[s, j], arg[s, j] = t[a], i[a]
    if not np.isfinite(best[S, nf]):
        need = min(max(costs.memory(0, nf, 0), 0.0), INF)
        per, over = int((memory_limit or 0) // devices), f" over each stage's {devices} devices" if devices > 1 else ""
        raise MemoryLimitError(
            f"no cut of the step into {S} pipeline stages fits the memory limit of {per:,} bytes "
            f"per device (the whole step as one stage needs {int(need // devices):,} bytes per device{over})"
        )
    bounds = [nf]
    for s in range(S, 0, -1):
        bounds.append(int(arg[s, bounds[-1]]))
    return bounds[::-1]


@dataclass
class _Placement:
    """Where a cut puts every node: its stage and phase (as in StageAssignment), and per stage the
    seconds of its forward, backward and update (meeting points count as update)."""

    stage: list[int]
    phase: list[str]
    times: np.ndarray  # (S, 3)

    def slowest_s(self) -> float:
        """The slowest stage's forward + backward seconds per micro-batch."""
        return float(np.max(self.times[:, 0] + self.times[:, 1]))


def _place(sn: _StepNodes, bounds: list[int]) -> _Placement:
    """Every node's place on the line F0 .. F(S-1) B(S-1) .. B0 under the cut ``bounds``, hence
    its stage and phase, and the seconds each stage spends in each phase."""
    S = len(bounds) - 1
    stage_of_pos = np.zeros(len(sn.fwd), dtype=np.int64)
    for s in range(S):
        stage_of_pos[bounds[s] : bounds[s + 1]] = s
    line = _line_positions(sn, stage_of_pos, S)
    stage, phase = _stages_and_phases(sn, line, stage_of_pos, S)
    times = np.zeros((S, 3))
    col = {"F": 0, "B": 1, "U": 2, "M": 2}
    for k in range(len(sn.nodes)):
        if stage[k] >= 0:
            times[stage[k], col[phase[k]]] += sn.secs[k]
    return _Placement(stage, phase, times)


def _line_positions(sn: _StepNodes, stage_of_pos: np.ndarray, S: int) -> list[int]:
    """Every node's position on the line (0 .. 2S-1; -1 for constants), never before a node it
    depends on: a forward node at its stage's F, a backward node at the B of its home's stage (the
    first B if it has no home), a meeting point or step-phase node right after its operands."""
    p = [0] * len(sn.nodes)
    for k, n in enumerate(sn.nodes):
        if sn.is_const[k]:
            p[k] = -1
            continue
        before = max((p[sn.producer[v]] for v in n.inputs if v in sn.producer), default=0)
        before = max(before, 0)  # a constant (-1) is copied where used: it does not place its readers
        if k in sn.fpos:
            p[k] = max(before, int(stage_of_pos[sn.fpos[k]]))
            if p[k] >= S:
                raise PlanError(f"{n.op.name} at {n.loc or '?'} is a forward node that depends on the backward pass")
        elif sn.step_phase[k] or sn.meets[k]:
            p[k] = before
        else:
            h = sn.other_home[k]
            p[k] = max(before, S if h is None else 2 * S - 1 - int(stage_of_pos[h]))
    return p


def _stages_and_phases(
    sn: _StepNodes, line: list[int], stage_of_pos: np.ndarray, S: int
) -> tuple[list[int], list[str]]:
    """Every node's stage (Fs and Bs run on stage s; step-phase nodes on the stage of their home,
    the parameters they update, or if they read only the step's inputs and constants, as Adam's
    ``b1 * m``, on their first reader's; -1 for constants) and phase ("F", "B", "M", "U"; "C"
    constants)."""
    stage = [0] * len(sn.nodes)
    phase = [""] * len(sn.nodes)
    loose = []
    for k, p in enumerate(line):
        if sn.is_const[k]:
            stage[k], phase[k] = -1, "C"
            continue
        stage[k] = p if p < S else 2 * S - 1 - p
        if sn.step_phase[k]:
            h = sn.other_home[k]
            stage[k] = int(stage_of_pos[h]) if h is not None else stage[k]
            phase[k] = "U"
            if h is None and _loose(sn, k):
                loose.append(k)
        elif sn.meets[k]:
            phase[k] = "M"
        else:
            phase[k] = "F" if p < S else "B"
    for k in reversed(loose):  # a chain of them (t + 1, b1 ** t, 1 - b1 ** t) follows its last link
        on = [stage[j] for o in sn.nodes[k].outputs for j in sn.readers.get(o, ()) if stage[j] >= 0]
        stage[k] = min(on) if on else stage[k]
    return stage, phase


def _refine_cuts(
    sn: _StepNodes, costs: _SegmentCosts, bounds: list[int], memory_limit: int | None
) -> tuple[list[int], _Placement]:
    """The DP saw each backward node at its home; the placement can move some later on the line
    (to an earlier stage): refine the cuts against the placement itself by coordinate descent
    (each cut moved by 64, 16, 4 or 1 either way while the slowest stage gets faster and every
    stage fits; at most 8 rounds). Returns the cuts and their placement."""
    S = costs.n_stages
    placed = _place(sn, bounds)
    best_t = placed.slowest_s()
    for _round in range(8):
        improved = False
        for c in range(1, S):
            for step in (64, 16, 4, 1, -1, -4, -16, -64):
                trial = list(bounds)
                trial[c] += step
                if not trial[c - 1] < trial[c] < trial[c + 1] or not costs.fits(trial, memory_limit):
                    continue
                tried = _place(sn, trial)
                t = tried.slowest_s()
                if t < best_t * (1 - 1e-9):
                    bounds, placed, best_t, improved = trial, tried, t, True
        if not improved:
            break
    return bounds, placed


__all__ = ["StageAssignment", "assign_stages", "in_flight", "node_seconds"]
