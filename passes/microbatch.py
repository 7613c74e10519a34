"""Micro-batching: one training step run as M micro-batches with gradient accumulation.

Splitting the batch into micro-batches is data parallelism in time instead of space, so it
reuses the sharding machinery: the step's graph is partitioned along a virtual mesh axis ``mb``
of size M, with the batch inputs split on their first dim (``S(0)``), the state (parameters,
optimizer state: inputs an output replaces) and every output replicated. Each node takes the
strategy that keeps its operands where they already are (sharding propagation, as GSPMD does; on
one device there is no trade-off for an ILP to weigh), falling back to the cheapest
redistribution. Lowering (passes/lower.py) then gives one program per micro-batch, and every
collective over ``mb`` is a point where the micro-batches meet: an ``all_reduce`` of a partial
sum is gradient accumulation, summed in micro-batch order.

The exactness comes for free: the partial sums carry the whole batch's normalisation (a mean
over the batch is a sum scaled by 1/B, not 1/(B/M)), so a loss that is a mean and a loss that is
a sum both accumulate to the full-batch gradient.

The nodes split into two phases: the **micro-batch phase** (everything upstream of the meeting
points: forward and backward of one micro-batch) and the **step phase** (from the meeting points
on, run once: the optimizer update), which also takes the values of the state alone that only it
reads (Adam's ``b1 * m``: computed once, not once per micro-batch and held to the update). A
step-phase node may read step-phase values, meeting-point results, and values that are the same
for every micro-batch; reading one micro-batch's activations there means the step needs the
whole batch at once (batch statistics, a loss over the batch's maximum), which micro-batching
cannot split: ``PlanError`` names the line.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np

from graphc.core.dtypes import LOW_FLOATS
from graphc.core.errors import PlanError
from graphc.core.ir import Graph, Value
from graphc.core.mesh import Mesh
from graphc.core.profile import Link
from graphc.core.pytree import leaf_paths
from graphc.core.spec import P, R, S
from graphc.core.traits import Collective, Constant, DeviceLocal, Random
from graphc.ops.random import state_inputs
from graphc.passes.options import PlanOptions
from graphc.passes.partition import Pins, build_problem, lower, make_plan, plan_sharding, solve_problem, state_ties
from graphc.passes.pipeline_stages import no_forward_pass
from graphc.passes.rewrite import Rewriter, finish
from graphc.passes.sharding.costs import CostModel
from graphc.passes.sharding.items import Edge
from graphc.passes.sharding.memory import MemoryModel
from graphc.passes.sharding.plan import ShardingPlan
from graphc.passes.sharding.problem import Problem
from graphc.programs import ParallelProgram, simulate

MB_AXIS = "mb"
# ops of a lowered program whose result differs from micro-batch to micro-batch on the same data


def batch_inputs(graph: Graph) -> list[int]:
    """Positions of the inputs split into micro-batches: array inputs that no output replaces
    (the state of a training step, tied by ``passes.partition.state_ties``, is not split; nor is
    a random generator's state, which every micro-batch reads whole: ops/random.py)."""
    state = {i for i, _o in state_ties(graph)} | set(state_inputs(graph))
    return [k for k, v in enumerate(graph.inputs) if k not in state and v.type.ndim >= 1]


def _redistribution_bytes(v: Value, src: tuple, dst: tuple, constant: bool = False) -> float:
    """What taking ``v`` from spec ``src`` to ``dst`` costs the propagation: 0 when equal or a
    local slice; never R -> P but for constants (it would run the step-phase work once per
    micro-batch); a partial
    sum is summed whole (all_reduce) rather than reduce-scattered into an update in slices."""
    if src == dst:
        return 0.0
    (a,), (b,) = src, dst
    if a == R and b.kind == "S":
        return 0.0
    if b == P:  # a constant (the zeros a scatter_add adds into) is its own partial copy
        return 0.0 if constant else float("inf")
    if a == P and b.kind == "S":  # reduce_scatter: the sharded (ZeRO) update, pointless in time
        return 2.0 * v.type.nbytes
    return float(v.type.nbytes)


def propagate(problem) -> dict[int, str]:
    """{node index: strategy name}: every node's strategy, in program order, is the one whose
    operand specs match what its operands already are (no communication), preferring split
    results over partial ones over replicated ones; failing that, the one with the least
    redistribution.

    Then meeting points move up through linear ops: when the partial result of a linear op
    (``(1 - b1) * g``) is only ever summed whole, and its partial operand is no larger, the op
    runs once after the meeting instead, so the operand (``g``) is what meets, once for all its
    consumers (Adam's ``g`` and ``g * g``)."""
    return _propagation(problem)[0]


def _propagation(problem) -> tuple[dict[int, str], dict[int, tuple], dict[Value, tuple]]:
    """``propagate``'s pins, with each node's operand specs and each value's spec."""
    replicate: set[int] = set()
    constants = _constant_values(problem.graph)  # the same in every round
    while True:
        pins, spec_in, spec_out = _propagate_once(problem, replicate, constants)
        hoist = _hoistable(problem, pins, spec_in, spec_out) - replicate
        if not hoist:
            return pins, spec_in, spec_out
        replicate |= hoist


def _propagate_once(problem, replicate: set[int], constants: set[Value]):
    spec: dict[Value, tuple] = {}
    for it in problem.items:
        if it.kind == "input":
            spec[it.value] = it.strategies[0].out_specs[0] if len(it.strategies) == 1 else (R,)
    pins: dict[int, str] = {}
    wants: dict[int, tuple] = {}  # node index -> the chosen strategy's operand specs
    rank = {"S": 0, "P": 1, "R": 2}
    for it in problem.items:
        if it.kind != "node":
            continue
        node = it.node

        def cost(st, node=node):
            moved = sum(
                _redistribution_bytes(v, spec[v], s, v in constants) for v, s in set(zip(node.inputs, st.in_specs))
            )
            # after a meeting point the work runs once per step: an operand still split or partial
            # there would be one micro-batch's piece (x_k * sum_k x_k is right only per micro-batch)
            mixes = moved > 0 and any(s != (R,) for s in st.in_specs)
            # slicing a replicated operand would split per-step values (parameters) across
            # micro-batches: tensor parallelism in time, which only adds meeting points
            sliced = sum(spec[v] != s for v, s in zip(node.inputs, st.in_specs))
            split = sum(rank[s[0].kind] for s in st.out_specs)
            return (mixes, moved, sliced, split, st.compute_s)

        best = min(it.strategies, key=cost)
        whole = not node.inputs or (node.outputs and node.outputs[0] in constants)
        if whole or it.index in replicate or cost(best)[1] == float("inf"):
            # constants stay whole (consumers slice them); hoisted ops run once, after the meeting
            best = next(s for s in it.strategies if all(x == (R,) for x in s.in_specs + s.out_specs))
        pins[it.index] = best.name
        wants[it.index] = best.in_specs
        for o, s in zip(node.outputs, best.out_specs):
            spec[o] = s
    return pins, wants, spec


def _constant_values(graph: Graph) -> set[Value]:
    """The values computed from constants alone, the same in every micro-batch: a ``Constant``'s,
    and the results of ops whose operands are all such values (``broadcast_to`` of a scalar zero:
    constant folding leaves a large array of zeros so, and a scatter_add adds into it). They
    stay whole, and each is its own partial copy (``_redistribution_bytes``)."""
    out: set[Value] = set()
    for n in graph.nodes:
        if n.op.has(Constant) or (
            n.inputs
            and not n.regions
            and not n.op.has(Random)
            and not n.op.has(DeviceLocal)
            and all(v in out for v in n.inputs)
        ):
            out.update(n.outputs)
    return out


def summed_widened(src: np.dtype, dst: np.dtype) -> bool:
    """Whether a partial sum of dtype ``src`` that a linear op widens to ``dst`` is summed (over
    micro-batches, and so over data-parallel ranks) after the widening: a 16-bit float widened
    (``g.astype(np.float32)``) is, since summed in its own dtype the running sum would round at
    every micro-batch, and stop growing once one micro-batch's share is under half its last bit
    (192 micro-batches of bfloat16 gradients)."""
    return src in LOW_FLOATS and dst.itemsize > src.itemsize


def _hoistable(problem, pins: dict[int, str], wants: dict[int, tuple], spec: dict[Value, tuple]) -> set[int]:
    """Linear-partial nodes whose result every consumer takes whole (R) and whose partial
    operands are no larger than the result; and converts that narrow a partial sum to a 16-bit
    float that any consumer takes whole or the step returns (``_narrows_a_sum``: the sum meets
    in the wider dtype, even where another consumer would have kept it partial)."""
    graph = problem.graph
    index = {n: k for k, n in enumerate(graph.nodes)}
    takes: dict[Value, list[tuple]] = {}
    for k, node in enumerate(graph.nodes):
        for v, s in zip(node.inputs, wants[k]):
            takes.setdefault(v, []).append(s)
    outputs = set(graph.outputs)
    out = set()
    for node in graph.nodes:
        k = index[node]
        if not pins[k].startswith("linear") or len(node.outputs) != 1:
            continue
        o = node.outputs[0]
        if spec[o] != (P,):
            continue
        partial = [v for v, s in zip(node.inputs, wants[k]) if s == (P,)]
        whole = [s == (R,) for s in takes.get(o, ())]
        if _narrows_a_sum(node, partial):
            # taken whole by any reader, or returned: meets before it, in the wider dtype; readers
            # that would keep it partial (np.sum(g) beside the update) then take it whole too
            if o in outputs or any(whole):
                out.add(k)
            continue
        if o in outputs or not whole or not all(whole):
            continue
        widens = any(summed_widened(v.type.dtype, o.type.dtype) for v in partial)
        if not widens and all(v.type.nbytes <= o.type.nbytes for v in partial):
            out.add(k)
    return out


def _narrows_a_sum(node, partial: list[Value]) -> bool:
    """A convert of a wider float partial sum to a 16-bit float: the micro-batches meet before
    it, in the wider dtype (``microbatch`` puts one after each 16-bit sum)."""
    o = node.outputs[0]
    return (
        node.op.name == "convert"
        and o.type.dtype in LOW_FLOATS
        and any(summed_widened(o.type.dtype, v.type.dtype) for v in partial)
    )


@dataclass
class Microbatched:
    """A step partitioned into ``m`` micro-batches: the plan on the virtual ``mb`` axis, one
    lowered program per micro-batch, and each program node's phase."""

    graph: Graph
    m: int
    plan: ShardingPlan
    program: ParallelProgram  # one device program per micro-batch
    batch: list[int]  # positions of the inputs split into micro-batches
    step_phase: list[bool] = field(default_factory=list)  # per program node: runs once per step
    varies: set = field(default_factory=set)  # values of programs[0] that differ between micro-batches
    warnings: tuple[str, ...] = ()  # what the user should know of the step micro-batched (``_low_precision_sums``)

    @property
    def size(self) -> int | None:
        """Samples per micro-batch: dim 0 of the batch inputs over ``m`` (None: no batch input)."""
        return self.graph.inputs[self.batch[0]].type.shape[0] // self.m if self.batch else None

    @property
    def meeting_points(self) -> list[str]:
        """The collectives where the micro-batches meet, as ``kind %value at file:line``."""
        g = self.program.devices[0].graph
        names = g.value_names()
        return [f"{n.op.name} %{names[n.inputs[0]]} at {n.loc or '?'}" for n in g.nodes if n.op.has(Collective)]

    def run_reference(self, arrays: list) -> list[np.ndarray]:
        """Run on whole inputs with the reference implementations (every micro-batch in lock
        step, meeting points summed in micro-batch order); the outputs are whole arrays."""
        outs = simulate(self.program, self.program.shard_inputs([np.asarray(a) for a in arrays]))
        return self.program.gather_outputs(outs)


def microbatch(graph: Graph, m: int, batch: list[int] | None = None) -> Microbatched:
    """Partition ``graph`` (a training step, or any function of a batch) into ``m`` micro-batches
    along dim 0 of the ``batch`` inputs (default: ``batch_inputs(graph)``). PlanError, naming the
    function, for a count the step cannot take: not a positive int, more than one micro-batch of
    a step with no batch input (every micro-batch would be the whole step), or a batch dim it
    does not divide."""
    if not isinstance(m, int) or isinstance(m, bool) or m < 1:
        raise PlanError(f"microbatches must be a positive int, got {m!r} (@{graph.name})")
    batch = batch_inputs(graph) if batch is None else list(batch)
    names = graph.value_names()
    if m > 1 and not batch:
        raise PlanError(
            f"microbatches={m}: @{graph.name} has no batch input to split into micro-batches (an array argument "
            f"that no result replaces, split along dim 0); run it with microbatches=1"
        )
    if m > 1 and not any(n.part in ("forward", "backward", "update") for n in graph.nodes):
        raise no_forward_pass(graph.name)  # before its weights, not returned, are split as batch inputs
    for k in batch:
        v = graph.inputs[k]
        if v.type.ndim == 0 or v.type.shape[0] % m:
            at = next((n.loc for n in graph.nodes if n.loc is not None and v in n.inputs), None)
            raise PlanError(
                f"{f'{at}: ' if at else ''}@{graph.name}: input %{names[v]} of shape {list(v.type.shape)} does not split "
                f"into {m} micro-batches along dim 0 (microbatches={m} must divide dim 0 of every batch input: an "
                "array argument the step does not return replaced, split along its dim 0, so a time-major input "
                "[T, B, ...] splits time" + ("; the line named first reads it)" if at else ")")
            )
    # the link is free: micro-batches meet in memory; only the propagation's choices matter
    mesh = Mesh({MB_AXIS: m}, links={MB_AXIS: Link(latency_s=1e-12, bandwidth=1e18)})
    in_pins = {k: (S(0),) if k in batch and m > 1 else (R,) for k in range(len(graph.inputs))}
    out_pins = {k: (R,) for k in range(len(graph.outputs))}
    ties = state_ties(graph)
    # every choice is the propagation's: no ILP heuristics, buckets, ZeRO or recomputation
    options = PlanOptions(shrink=False, linear_partials=True, bucket_bytes=0, zero=0, recompute="off")
    split = graph
    node_pins, wants, spec = _propagation(build_problem(split, mesh, options, Pins(in_pins, out_pins), ties))
    if m > 1 and (low := _low_sums(split, wants, spec)):  # sum them in float32 (``widen_sums``)
        split = widen_sums(split, low)
        ties = state_ties(split)
        node_pins = propagate(build_problem(split, mesh, options, Pins(in_pins, out_pins), ties))
    plan = plan_sharding(split, mesh, Pins(in_pins, out_pins, node_pins), ties, options)
    program = lower(split, plan)
    mb = Microbatched(graph, m, plan, program, batch)
    _check_meetings_are_sums(graph, program.devices[0].graph)
    if m > 1:
        mb.warnings = _low_precision_sums(graph, program.devices[0].graph, m)
    mb.step_phase, mb.varies = _phases(program.devices[0].graph, set(batch), m)
    return mb


def _low_sums(graph: Graph, wants: dict[int, tuple], spec: dict[Value, tuple]) -> list[Value]:
    """The 16-bit float values of ``graph`` the micro-batches meet at under the propagation's
    ``spec`` and operand specs ``wants`` (by node position): partial sums that a reader takes
    whole, or that the step returns. A partial value every reader keeps partial (a bfloat16
    gradient that Adam's ``g.astype(np.float32)`` widens before the meeting) is not one: a
    float32 round trip after it would run in every micro-batch for nothing."""
    whole: set[Value] = set(graph.outputs)
    for k, node in enumerate(graph.nodes):
        whole.update(v for v, s in zip(node.inputs, wants.get(k, ())) if s == (R,))
    return [
        o
        for node in graph.nodes
        for o in node.outputs
        if o.type.dtype in LOW_FLOATS and spec.get(o) == (P,) and o in whole
    ]


def widen_sums(graph: Graph, low: list[Value]) -> Graph:
    """``graph`` with each value of ``low`` widened to float32 and narrowed back where it is
    made (``x.astype(np.float32).astype(x.dtype)``): the micro-batches meet between the two
    converts (``_narrows_a_sum``), so the running sum is float32, rounded once to the 16-bit
    dtype after the last micro-batch, as Megatron-LM accumulates bfloat16 gradients in a float32
    ``main_grad``; summed in the 16-bit dtype it would round at every micro-batch, and stop
    growing once a micro-batch's share is under half its last bit."""
    wanted = set(low)
    rw = Rewriter()
    for node in graph.nodes:
        kept = rw.keep(node)
        for old, new in zip(node.outputs, kept.outputs):
            if old in wanted:
                wide = rw.emit("convert", [new], {"dtype": np.dtype(np.float32)}, kept).outputs[0]
                narrow = rw.emit("convert", [wide], {"dtype": old.type.dtype}, kept).outputs[0]
                rw.subst[old] = narrow
    nodes, outputs = finish(rw, graph.nodes, graph.outputs)
    return Graph(graph.name, graph.inputs, nodes, outputs, graph.in_tree, graph.out_tree)


def _low_precision_sums(graph: Graph, g: Graph, m: int) -> tuple[str, ...]:
    """The warning, if any, that micro-batches still meet in a 16-bit float sum in the lowered
    program ``g``, rounding at every one of the ``m``: ``widen_sums`` moves every 16-bit meeting
    point the propagation finds to float32, so this is a guard against one it missed. The plan
    carries it (``PipelinePlan.warnings``), so a plan read from a file warns as one just made does."""
    low = [n for n in g.nodes if n.op.has(Collective) and n.inputs[0].type.dtype in LOW_FLOATS]
    if not low:
        return ()
    first = low[0]
    where = f"{first.loc}: " if first.loc is not None else ""
    return (
        f"{where}{graph.name}: {len(low)} sum(s) of {m} micro-batches (the first: {first.inputs[0].type}) run in "
        f"{first.inputs[0].type.dtype}, rounding at every micro-batch (graphc sums 16-bit values in float32 where it "
        "finds them; not these)",
    )


def _check_meetings_are_sums(graph: Graph, g: Graph) -> None:
    """PlanError unless the micro-batches meet only in sums (all_reduce over ``mb``): a value
    gathered or re-split across micro-batches is the whole batch at once (a maximum over the
    batch, a result per sample), which running them one after the other cannot give."""
    for node in g.nodes:
        if _joins(node):
            readers = [n for n in g.nodes if node.outputs[0] in n.inputs]
            returned = g.outputs.index(node.outputs[0]) if not readers and node.outputs[0] in g.outputs else None
            if returned is not None and returned not in {o for _i, o in state_ties(graph)}:  # gathered to be returned
                path = leaf_paths(graph.out_tree)[returned]
                where = "".join(f"[{key!r}]" for key in path)  # [2] or [0]['logits']: where it is returned
                raise PlanError(
                    f"@{graph.name}: its result{where} ({node.outputs[0].type}, made at {node.loc or '?'}) is joined "
                    "from every micro-batch's piece (a value per sample, such as predictions), but micro-batches run "
                    "one after the other: a micro-batched step returns only values of the whole batch (a loss, sums, "
                    "the new state); return such values from a step without microbatches"
                )
            at = readers[0] if readers else node
            joined = _joined_inputs(graph, g)
            raise PlanError(
                f"@{graph.name}: {at.op.name} at {at.loc or node.loc or '?'} reads the whole batch at once (its "
                f"operand is joined from every micro-batch by {node.op.name}, not summed): this step needs the "
                f"whole batch at once and cannot be split into micro-batches"
                + (
                    f"; it joins {joined}, split along dim 0 as batch inputs (every array argument the step does not "
                    "return replaced is one, split along its dim 0: a frozen weight is state only if the step returns "
                    "it unchanged, and a time-major input [T, B, ...] splits time)"
                    if joined
                    else ""
                )
            )


def _joins(node) -> bool:
    """A collective over ``mb`` that is not a sum: it joins the micro-batches' pieces whole."""
    return node.op.has(Collective) and node.attrs.get("axis") == MB_AXIS and node.op.name != "all_reduce"


def _joined_inputs(graph: Graph, g: Graph) -> str:
    """The step's inputs that micro-batching split and a collective of the micro-batch program ``g``
    joins whole again (``%W (f32[8,4]), %x (f32[16,8])``), or ""."""
    names = graph.value_names()
    at = {g.inputs.index(n.inputs[0]) for n in g.nodes if _joins(n) and n.inputs and n.inputs[0] in g.inputs}
    return ", ".join(f"%{names[graph.inputs[k]]} ({graph.inputs[k].type})" for k in sorted(at))


# --- planning the micro-batch program on a real mesh: k passes and one update per step -----------


def meeting_nodes(g: Graph) -> list[int]:
    """Positions of the nodes of a micro-batch program where the micro-batches meet: the
    all-reduces over the ``mb`` axis (gradient accumulation)."""
    return [k for k, n in enumerate(g.nodes) if n.op.has(Collective) and n.attrs.get("axis") == MB_AXIS]


class RepeatedCosts(CostModel):
    """The cost model of a micro-batch program that runs ``m`` times per step: the compute of
    every micro-batch-phase node (forward, backward, the accumulation at a meeting point) and
    every redistribution into one counts ``m`` times, the step phase (the update, and the
    redistributions into it) once. So the ILP sees that a data-parallel gradient all-reduce
    before a meeting point runs once per micro-batch and one after it once per step (an
    all-reduce carries a partial sum through: graphc/ops/comm.py). Weighted arrays are made once and kept: the ILP shares terms by their identity."""

    def __init__(self, base: CostModel, item_weight: list[int]) -> None:
        super().__init__(base.mesh, base.items, base.edges, base.bucket_share_bytes, base.bucket_limit)
        self.item_weight = item_weight
        self._weighted: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # id(base), w -> (base, weighted)

    def _times(self, base: np.ndarray, w: int) -> np.ndarray:
        if w == 1:
            return base
        hit = self._weighted.get((id(base), w))
        if hit is None or hit[0] is not base:
            hit = (base, base * w)
            self._weighted[(id(base), w)] = hit
        return hit[1]

    def compute_times(self, item: int) -> np.ndarray:
        return self._times(super().compute_times(item), self.item_weight[item])

    def edge_table(self, e: Edge) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        table, ui, vi = super().edge_table(e)
        return self._times(table, self.item_weight[e.dst]), ui, vi

    def edge_time(self, e: Edge, s_src: int, s_dst: int) -> float:
        return super().edge_time(e, s_src, s_dst) * self.item_weight[e.dst]

    def rebucket(self, choice: list[int], filled: int | None = None) -> None:
        super().rebucket(choice, filled)
        self._weighted.clear()

    def evaluate(self, choice: list[int]) -> dict[str, float]:
        w = self.item_weight
        compute = sum(w[i] * self.items[i].strategies[s].compute_s for i, s in enumerate(choice))
        comm = sum(self.edge_time(e, choice[e.src], choice[e.dst]) for e in self.edges)
        return {"compute_s": compute, "comm_s": comm, "total_s": compute + comm}


def item_weights(problem: Problem, step_phase: list[bool], m: int) -> list[int]:
    """Per item of the micro-batch program's problem: how many times a step runs it (module doc
    of ``RepeatedCosts``). Inputs and outputs once; a fan-out as often as its most frequent reader."""
    weight = [1] * len(problem.items)
    for i, it in enumerate(problem.items):
        if it.kind == "node" and not step_phase[it.index]:
            weight[i] = m
    readers: dict[int, int] = {}
    for e in problem.edges:
        readers[e.src] = max(readers.get(e.src, 1), weight[e.dst])
    for i, it in enumerate(problem.items):
        if it.kind == "fanout":
            weight[i] = readers.get(i, 1)
    return weight


class AccumulatingMemory(MemoryModel):
    """The memory model of a micro-batch program that runs ``m`` times per step: each running sum
    (a meeting point's result) is live all through the program, not from its meeting point to its
    last reader: it is kept while every micro-batch runs, read by the update as an argument (which
    a task does not free) and its buffer kept for the next step (runtime/pipeline.py). Constants
    are live all run, as in the one-pass model: a device holds one copy of each, shared by all its
    task programs (runtime/pipeline.py ``ConstantTable``). The ILP's memory rows and the plan's
    peak read it."""

    def __init__(self, base: MemoryModel, sums: frozenset[int]) -> None:
        super().__init__(
            base.graph, base.mesh, base.items, base.edges, base.order, base.remat, base.gathers, base.zero_axes
        )
        self.sums = sums  # items of the meeting points
        self._kept: list[tuple[Value, int, int, int]] | None = None

    def live_ranges(self) -> list[tuple[Value, int, int, int]]:
        if self._kept is None:
            end = self.size - 1
            self._kept = [(v, i, 0, end) if i in self.sums else (v, i, a, b) for v, i, a, b in super().live_ranges()]
        return self._kept


def plan_microbatch_program(mb: Microbatched, mesh: Mesh, ties, options: PlanOptions) -> ShardingPlan:
    """The sharding plan (passes/partition.py) of one micro-batch's program (``mb``: the step
    split into ``mb.m`` micro-batches) on ``mesh``, priced as a step runs it (``RepeatedCosts``:
    the micro-batch phase ``m`` times, the update once) and its memory with the running sums
    kept all along (``AccumulatingMemory``: what ``options.memory_limit`` bounds and the plan's
    peak counts), without ZeRO or recomputation."""
    g0 = mb.program.devices[0].graph
    options = dataclasses.replace(options, zero=0, recompute="off")
    start = time.perf_counter()
    problem = build_problem(g0, mesh, options, Pins(), ties)
    one_pass = problem.costs
    problem.costs = RepeatedCosts(one_pass, item_weights(problem, mb.step_phase, mb.m))
    meets = set(meeting_nodes(g0))
    sums = frozenset(i for i, it in enumerate(problem.items) if it.kind == "node" and it.index in meets)
    problem.memory = AccumulatingMemory(problem.memory, sums)
    build_s = time.perf_counter() - start
    solution = solve_problem(problem, options, time_limit_s=options.time_limit - build_s)
    # the plan is of the program it lowers: its costs are one pass's (the step is the caller's
    # to add up by phase, as passes/pipeline.py does), and so is the objective it reports, the
    # bound scaled alike (the gap is the solver's)
    weighted = problem.costs.evaluate(solution.choice)["total_s"]
    problem.costs = one_pass
    plan = make_plan(problem, solution, options, build_s)
    objective = one_pass.evaluate(solution.choice)["total_s"]
    scale = objective / weighted if weighted > 0 else 1.0
    solver = dataclasses.replace(plan.solver, objective_s=objective, bound_s=plan.solver.bound_s * scale)
    return dataclasses.replace(plan, solver=solver)


def _phases(g: Graph, batch: set[int], m: int) -> tuple[list[bool], set[Value]]:
    """Each node's phase (True: step phase) and the values that differ between micro-batches;
    raises PlanError where a step-phase node reads one micro-batch's values. With one micro-batch
    (``m`` 1) nothing meets: the update (the nodes graphc.grad's caller runs on the gradients,
    part "update") and what reads it are the step phase all the same, so a pipeline places them
    with their parameters, as it does for more micro-batches, instead of sending the update's
    values across stages."""
    varies: set[Value] = {v for k, v in enumerate(g.inputs) if k in batch}  # differs per micro-batch
    step: set[Value] = set()  # computed once per step
    phases = []
    for node in g.nodes:
        meets = node.op.has(Collective)
        seeds = m == 1 and node.part == "update" and not meets
        is_step = not meets and (seeds or any(v in step for v in node.inputs))
        phases.append(is_step)
        if meets or is_step:
            step.update(node.outputs)
        elif node.op.has(DeviceLocal) or any(v in varies for v in node.inputs):
            varies.update(node.outputs)
        if is_step and m > 1:  # one micro-batch is the whole batch
            bad = [v for v in node.inputs if v in varies]
            if bad:
                raise PlanError(
                    f"@{g.name.split('.')[0]}: {node.op.name} at {node.loc or '?'} combines the whole batch with one micro-batch's values "
                    f"(after the micro-batches meet at a collective, it still reads per-micro-batch data): this "
                    f"step needs the whole batch at once and cannot be split into micro-batches"
                )
    _join_update(g, phases, varies)
    return phases, varies


def _join_update(g: Graph, phases: list[bool], varies: set[Value]) -> None:
    """Move into the step phase (in place) every node that depends on no micro-batch and whose
    results only the step phase reads (or the step returns): Adam's ``b1 * m`` of the old
    moments, its bias corrections. Left in the micro-batch phase, each would run once per
    micro-batch and be held from the first forward to the update, which the memory model (the
    program's order: read by the update, so live there) does not count; in the step phase it
    runs once, after the micro-batches meet, where the model places it. Constants stay where
    they are (in every task that uses them, one array per device: runtime/constants.py), and so
    do meeting points."""
    readers: dict[Value, list[int]] = {}
    for k, node in enumerate(g.nodes):
        for v in node.inputs:
            readers.setdefault(v, []).append(k)
    returned = set(g.outputs)
    for k in range(len(g.nodes) - 1, -1, -1):
        node = g.nodes[k]
        if phases[k] or node.op.has(Collective) or node.op.has(Constant) or not node.outputs:
            continue
        if any(o in varies for o in node.outputs):
            continue
        read = [j for o in node.outputs for j in readers.get(o, ())]
        if all(phases[j] for j in read) and (read or any(o in returned for o in node.outputs)):
            phases[k] = True


__all__ = [
    "MB_AXIS",
    "Microbatched",
    "AccumulatingMemory",
    "RepeatedCosts",
    "batch_inputs",
    "item_weights",
    "meeting_nodes",
    "microbatch",
    "plan_microbatch_program",
    "propagate",
]
