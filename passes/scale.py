"""Mesh search at scale: plan one transformer block per tensor-parallel sub-mesh and compose.

A step of L identical layers (passes/blocks.py finds them) is cut into segments: the embedding
(pre), the repeated block, and the head (final norm, output projection, loss). Each segment is
solved once per (tp, b): the sharding ILP (passes/partition.py ``plan_sharding``) on the segment's graph over
a mesh {dp: V, tp: t}, where the virtual data axis of V = batch / b devices gives every device b
sequences, the micro-batch size (micro-batching is data parallelism in time:
passes/microbatch.py). What the block plan predicts on the tp axis (compute, tensor-parallel
collectives, the activations kept for the backward) is a micro-batch's work per device; what it
does on the virtual axis (the gradient reduction) is dropped and priced below for the real one.
Solutions are cached by (tp, b): every candidate with that sub-mesh and micro-batch size reuses
them. Micro-batch 1 is solved for every tp first; larger sizes start as its costs scaled by b
(an estimate, not a bound) and are solved exactly, fastest estimate first, while time remains
and some estimate is faster than the best solved plan by more than the solver's gap.

Each candidate (pp = S, dp = D, tp = t, micro-batch size b, so k = batch / (D b) micro-batches,
a ZeRO stage, recompute off or full) is then composed:

- stages: the L layers cut into S contiguous stages by dynamic programming over the per-layer
  costs (as Alpa), minimising the slowest stage under the memory limit;
- step (1F1B): (k + S - 1) x slowest stage's forward + backward per micro-batch, plus the
  pipeline sends (those of the fill and drain when the profile overlaps them, else every
  micro-batch's), the data-parallel gradient reduction the last backward does not hide, and the
  update; ``ComposedPlan.breakdown`` splits it term by term;
- a segment's time per micro-batch: its matmuls, the fused attention kernel's matmuls at the
  profile's attention rate, its memory-bound ops and its tensor-parallel collectives
  (``TERMS``), less what a GPU GEMM library runs inside the GEMM, its matmuls' last waves of
  output tiles priced whole (passes/gpu_kernels.py);
- memory per device of stage s: its parameters, gradients and optimizer state as the segments'
  plans lay them out on tp (a parameter read whole counts whole: passes/state_layout.py; ZeRO
  splits them over D), plus min(k, S - s) micro-batches' activations (1F1B); with recomputation
  only each layer's input is kept, and one layer's activations at a time; the update's
  redistributions over tp (a parameter read whole from a split gradient is all-gathered) are
  priced after the update;
- MFU = model flops / (step x devices x peak of the dtype carrying the matmul flops), the
  definition of a ShardingPlan's (passes/sharding/records.py ``Cost``).

Candidates are pruned before their blocks are solved: a memory lower bound (the state alone, over
t x S and ZeRO over D) over the limit, or a compute lower bound (the step's flops at the best
matmul rate, with the bubble) over the best solved step so far. The search stops at its deadline
and lists what it did not reach. What the composed model leaves out is in docs/scale.md.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from graphc.core.errors import PlanError
from graphc.core.ir import Graph
from graphc.core.mesh import Mesh
from graphc.core.profiles import (
    ClusterFigures,
    attention_dropout_slowdown,
    cluster_figures,
    hidden_collective_s,
    host_tier,
    launch_gap,
)
from graphc.core.traits import Contraction, Random
from graphc.ops.dims import default_cost
from graphc.passes import offload as offloading
from graphc.passes.blocks import (
    Layers,
    Segments,
    cut_segments,
    find_layers,
    segment_boundary,
    segment_graph,
    update_only,
)
from graphc.passes.composed import ComposedPlan, Layout
from graphc.passes.gpu_kernels import GemmWaves, gemm_absorbed, kernel_launches
from graphc.passes.options import PlanOptions
from graphc.passes.partition import plan_sharding, state_ties, warn_untied
from graphc.passes.pipeline import node_seconds
from graphc.passes.sharding.build import step_flops
from graphc.passes.sharding.milp import HELD_GAP
from graphc.passes.sharding.plan import ShardingPlan
from graphc.passes.sharding.problem import Pins
from graphc.passes.stage_cut import StageMemory, stage_cut
from graphc.passes.state_layout import (
    EndStates,
    SegmentSpecs,
    StateLayout,
    end_groups,
    end_states,
    held_outside,
    kept_bytes,
    split_reads,
    state_layout,
)

VIRTUAL_AXIS = "dp"  # the block's data axis: batch / b devices of b sequences each
MICROBATCH_SIZES = (1, 2, 4, 8, 16)
ACT_FRACTIONS = offloading.ACTIVATION_FRACTIONS  # the shares of a stage's stash offload may move
ZERO_STAGES = (0, 1, 3)
MIN_SOLVE_S = 1.0  # a segment solve begun just before the deadline still gets this long
MAX_GAP = 0.05  # a segment's ILP stopped further than this from its bound is not used
# the loosest relative gap at which the sharding ILP reports "optimal" (a held-buffer round's,
# passes/sharding/milp.py): two predictions closer than this are a tie the solver cannot split
SOLVER_GAP = HELD_GAP
# what a segment's time is made of (SegmentCost.forward_terms / backward_terms): matmuls, the
# fused attention kernel's matmuls, memory-bound ops (norms, elementwise chains, reductions) and
# the tensor-parallel collectives (exposed: Megatron-LM's all-reduces block the compute stream)
TERMS = ("gemm", "attention", "non_gemm", "tp_comm", "launch")  # launch: the GPU waiting for the host


@dataclass(frozen=True, slots=True)
class SegmentCost:
    """One segment solved on a tp sub-mesh at micro-batch size b, per device and micro-batch."""

    forward_s: float  # compute and tensor-parallel collectives
    backward_s: float
    activation_bytes: int  # forward values the backward reads
    input_bytes: int  # the segment's activation input (what recomputation keeps)
    flops: float
    plan: ShardingPlan
    forward_terms: dict[str, float] = field(default_factory=dict)  # forward_s by ``TERMS``
    backward_terms: dict[str, float] = field(default_factory=dict)  # backward_s by ``TERMS``


@dataclass
class _Model:
    """What the search knows about the step once: its layers, segments and per-layer state."""

    graph: Graph
    layers: Layers
    segments: Segments
    batch: int
    param_bytes: float  # one layer's parameters (the inputs its forward reads)
    state_bytes: float  # one layer's optimizer state (its inputs only the update reads)
    other_state: float  # every input outside the layers but the data (embedding, head, final norm; frozen or not)
    update_s: float  # the whole update on one device
    model_flops: float
    peak_dtype: str
    graphs: dict[str, Graph] = field(default_factory=dict)
    matmul_flops: float = 0.0  # the contractions' share of model_flops (what the compute bound counts)
    state_names: tuple[str, ...] = ()  # the optimizer state: tied inputs only the update reads
    layer_params: tuple[int, ...] = ()  # the stamped block's parameters (graph input positions)
    other_params: tuple[int, ...] = ()  # the inputs outside the layers the forward reads (but the data)
    boundaries: dict[str, tuple[list, list]] = field(default_factory=dict)  # per segment graph
    layer_state_inputs: tuple[int, ...] = ()  # the stamped block's optimizer state (graph input positions)
    other_state_inputs: tuple[int, ...] = ()  # the optimizer state outside the layers
    end_groups: dict[int, str] = field(default_factory=dict)  # other_params by the stages holding them

    @property
    def state_share(self) -> float:
        """The optimizer state's share of the state outside the layers (as in the layers)."""
        return self.state_bytes / max(self.param_bytes + self.state_bytes, 1)


def layered_model(graph: Graph, batch: int | None, profile) -> _Model | None:
    """The step's layers and segments, or None when it has no repeated block."""
    layers = find_layers(graph)
    if layers is None or batch is None:
        return None
    seg = cut_segments(graph, layers)
    if seg is None:
        return None
    upd = update_only(graph)
    read_fwd = {v for k, n in enumerate(graph.nodes) if n.part == "forward" and k not in upd for v in n.inputs}
    first = [graph.inputs[k] for k in layers.inputs[0]]
    param = sum(v.type.nbytes for v in first if v in read_fwd)
    state = sum(v.type.nbytes for v in first if v not in read_fwd)
    layer_inputs = {k for ks in layers.inputs for k in ks}
    tied = {i for i, _o in state_ties(graph)}
    warn_untied(graph, [k for k in layers.inputs[0] if graph.inputs[k] in read_fwd], tied)
    held = held_outside(graph, layer_inputs, tied, batch)
    other = sum(graph.inputs[k].type.nbytes for k in held)
    secs = node_seconds(graph, profile)
    flops, contraction = step_flops(graph)
    by = contraction or flops
    dtype = max(by, key=lambda d: by[d]) if by else "float32"
    L = layers.count
    ks = {"pre": seg.nodes(0), "block": seg.nodes(seg.block), "head": seg.nodes(L + 1)}
    graphs = {name: segment_graph(graph, nodes, f"{graph.name}.{name}") for name, nodes in ks.items()}
    update_s = sum(secs[k] for k in seg.update_nodes)
    return _Model(
        graph,
        layers,
        seg,
        batch,
        param,
        state,
        other,
        update_s,
        sum(flops.values()),
        dtype,
        graphs,
        sum(contraction.values()),
        tuple(v.name or f"input{k}" for k, v in enumerate(graph.inputs) if k in tied and v not in read_fwd),
        tuple(k for k in layers.inputs[seg.block - 1] if graph.inputs[k] in read_fwd),
        tuple(k for k in held if graph.inputs[k] in read_fwd),
        {name: segment_boundary(graph, nodes) for name, nodes in ks.items()},
        tuple(k for k in layers.inputs[seg.block - 1] if graph.inputs[k] not in read_fwd),
        tuple(k for k in held if graph.inputs[k] not in read_fwd),
        end_groups(graph, seg.segment, L, [k for k in held if graph.inputs[k] in read_fwd]),
    )


def _score_values(g: Graph) -> set:
    """Attention scores: the [.., T, T] values between two batched contractions (QK^T, then the
    product with V) and their gradients (every value of that shape)."""
    shapes = set()
    for n in g.nodes:
        if n.op.has(Contraction) and n.outputs and n.outputs[0].type.ndim >= 4:
            sh = n.outputs[0].type.shape
            if sh[-1] == sh[-2] and sh[-1] > 1 and n.part == "forward":
                shapes.add(sh)
    return {o for n in g.nodes for o in n.outputs if o.type.shape in shapes}


def solve_segment(
    g: Graph, tp: int, b: int, batch: int, profile, figures: ClusterFigures, deadline: float, pins: Pins = Pins()
) -> SegmentCost:
    """``g`` (a segment at the step's batch) planned on {dp: batch / b, tp} (module doc), its
    inputs' ``pins`` applied."""
    virtual = batch // b
    axes = {VIRTUAL_AXIS: virtual} if virtual > 1 else {}
    if tp > 1:
        axes["tp"] = tp
    mesh = Mesh(axes or {VIRTUAL_AXIS: 1}, profile=profile)
    deadline = max(deadline, time.perf_counter() + MIN_SOLVE_S)
    opts = PlanOptions(zero=0, recompute="off", time_limit=deadline - time.perf_counter())
    plan = plan_sharding(g, mesh, pins, ties=[], options=opts, deadline=deadline)
    if plan.solver.status != "optimal" and plan.solver.gap > MAX_GAP:
        raise PlanError(
            f"the ILP of {g.name} on tp={tp} stopped at the time limit {plan.solver.gap:.0%} from its bound"
        )
    scores = _score_values(g) if figures.fused_attention else set()
    fused = {  # softmax, masking and their reductions: inside the fused kernel, on chip
        k
        for k, n in enumerate(g.nodes)
        if not n.op.has(Contraction) and any(v in scores for v in (*n.inputs, *n.outputs))
    }
    # scores with dropout drawn inside the fused kernel: their attention runs slower (``attention_dropout``)
    dropped = {o.type.shape for k in fused for o in g.nodes[k].outputs if g.nodes[k].op.has(Random)}
    absorbed = gemm_absorbed(g) if figures.gemm_absorbs_layouts else set()
    waves = GemmWaves(g, absorbed, mesh.shape, figures)  # the last wave of a matmul's tiles
    fwd: dict[str, float] = dict.fromkeys(TERMS, 0.0)  # seconds per term (``TERMS``)
    bwd: dict[str, float] = dict.fromkeys(TERMS, 0.0)
    for nc in plan.nodes:
        n = g.nodes[nc.index]
        if nc.index in fused:
            continue  # inside the fused attention kernel: no round trip through memory
        side = fwd if n.part == "forward" else bwd
        if nc.index in absorbed:
            continue  # an operand layout or batch sum the GEMM library takes in the GEMM itself
        if not n.op.has(Contraction):
            side["non_gemm"] += nc.compute_s
        elif scores and any(v in scores for v in (*n.inputs, *n.outputs)):
            t = _attention_s(n, nc, mesh.shape, profile, figures)
            shape = next(v.type.shape for v in (*n.inputs, *n.outputs) if v in scores)
            fwd_x, bwd_x = (
                attention_dropout_slowdown(figures.attention_dropout, shape[-1]) if shape in dropped else (1, 1)
            )
            side["attention"] += t * (fwd_x if side is fwd else bwd_x)
            if n.part == "forward" and any(o in scores for o in n.outputs):
                bwd["attention"] += t * bwd_x  # FlashAttention recomputes the scores in the backward
        else:
            side["gemm"] += waves.seconds(nc)
    for c in plan.collectives:
        if VIRTUAL_AXIS in c.axes:
            continue  # the gradient reduction over the virtual batch axis: priced for the real dp
        (fwd if c.part == "forward" else bwd)["tp_comm"] += c.time_s
    kernels = kernel_launches(g, plan, fused | absorbed, scores, VIRTUAL_AXIS)
    for part, side in (("forward", fwd), ("backward", bwd)):  # the host launching kernels slower than they run
        side["launch"] = launch_gap(sum(side.values()), kernels[part], figures.launch_s)
    act = kept_bytes(g, plan, mesh.shape, scores)
    fwd_reads = {v for n in g.nodes if n.part == "forward" for v in n.inputs}
    inp = max((v.type.nbytes for v in g.inputs if v in fwd_reads and v.type.shape[:1] == (batch,)), default=0)
    flops = sum(step_flops(g)[0].values())
    return SegmentCost(sum(fwd.values()), sum(bwd.values()), act, inp // max(virtual, 1) // tp, flops, plan, fwd, bwd)


def _attention_s(node, nc, shape: tuple[int, ...], profile, figures: ClusterFigures) -> float:
    """The seconds of an attention contraction inside the fused kernel on one device: its flops
    (the mesh axes splitting any operand or result divide them) at ``figures.attention_efficiency``
    of the peak; the scores stay on chip, so no memory term (None: the per-op time as is)."""
    if figures.attention_efficiency is None:
        return nc.compute_s
    in_types, out_types, attrs = [v.type for v in node.inputs], [o.type for o in node.outputs], dict(node.attrs)
    flops = (node.op.cost or default_cost)(in_types, out_types, **attrs)[0]
    specs = (*nc.in_specs, *nc.out_specs)
    divided = math.prod(n for a, n in enumerate(shape) if any(sp[a].is_split for sp in specs))
    return flops / divided / (figures.attention_efficiency * profile.matmul_rate(in_types[0].dtype))


def _ring_s(nbytes: float, n: int, link) -> float:
    """A ring all-reduce of ``nbytes`` per device over ``n`` devices."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * nbytes / link.bandwidth + 2 * (n - 1) * link.latency_s


@dataclass
class _Segments:
    pre: SegmentCost
    block: SegmentCost
    head: SegmentCost
    exact: bool = True  # solved at this micro-batch size, not scaled from micro-batch 1
    layer_state: StateLayout | None = None  # one layer's state as the block plan lays it out
    other_state: StateLayout | None = None  # the state outside the layers, as pre and head lay it out
    split: _Segments | None = None  # the block re-solved reading no parameter less split than its update
    end_states: EndStates | None = None  # other_state by the stages that hold it

    def states(self, model: _Model, tp: int) -> tuple[StateLayout, EndStates]:
        """(one layer's state layout, the rest's by stage); split evenly over tp when not read
        from plans, the rest then held by the first and last stage."""
        share = model.state_share
        layer = self.layer_state or StateLayout.even(model.param_bytes, model.state_bytes, tp)
        if self.end_states is not None:
            return layer, self.end_states
        other = self.other_state or StateLayout.even(model.other_state * (1 - share), model.other_state * share, tp)
        return layer, EndStates(both=other)


def compose(model: _Model, segs: _Segments, lo: Layout, profile, figures: ClusterFigures, limit, fraction=None):
    """The ComposedPlan of layout ``lo`` from its solved segments, or the reason it cannot run; a
    layout offloading activations keeps ``fraction`` of each stage's stash in host memory, the
    fastest of ``ACT_FRACTIONS`` when None (passes/offload.py ``stage_activations``)."""
    if fraction is None and offloading.offloads_activations(lo.offload):
        return offloading.fastest(compose(model, segs, lo, profile, figures, limit, f) for f in ACT_FRACTIONS)
    L, S, D, t, k, act_f = model.layers.count, lo.pp, lo.dp, lo.tp, lo.microbatches, fraction or 0.0
    full = lo.recompute == "full"
    blk, pre, head = segs.block, segs.pre, segs.head
    unit_f = np.full(L, blk.forward_s)
    unit_b = np.full(L, blk.backward_s)
    unit_a = np.full(L, float(blk.input_bytes if full else blk.activation_bytes))
    for i, end in ((0, pre), (L - 1, head)):  # the embedding with the first layer, the head with the last
        unit_f[i] += end.forward_s
        unit_b[i] += end.backward_s
        unit_a[i] += end.input_bytes if full else end.activation_bytes
    unit_s = unit_f * (2 if full else 1) + unit_b
    offloaded = offloading.offloads_state(lo.offload)
    host = host_tier(profile)
    if lo.offload != "off" and host is None:
        return None, f"profile {profile.name} has no host memory tier to offload to"
    layer_st, ends_st = segs.states(model, t)  # as the segments' plans lay them out on tp
    summed = k > 1  # the gradients held as running sums over the micro-batches
    per_layer_state = layer_st.held(D, lo.zero, offloaded, summed)
    ends = {g: getattr(ends_st, g).held(D, lo.zero, offloaded, summed) for g in ("first", "last", "both", "every")}
    work = max(blk.activation_bytes, head.activation_bytes) if full else 0.0

    stage_mem = StageMemory(
        S, k, per_layer_state, ends["both"], act_f, unit_a.max(), work, ends["first"], ends["last"], ends["every"]
    )
    counts = stage_cut(unit_s, unit_a, stage_mem, S, limit)
    if counts is None:
        return None, f"no cut into {S} stages fits {limit / 2**30:.1f} GiB per device" if limit else "no cut"
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    f_s = [float(unit_f[bounds[s] : bounds[s + 1]].sum()) for s in range(S)]
    b_s = [float(unit_b[bounds[s] : bounds[s + 1]].sum()) for s in range(S)]
    per_mb = [(2 * f if full else f) + b for f, b in zip(f_s, b_s)]
    acts = offloading.stage_activations(host, act_f, unit_a, bounds, f_s, per_mb)
    per_mb = [m + (acts[s].exposed_s if acts else 0.0) for s, m in enumerate(per_mb)]
    slowest = max(per_mb)
    terms = _stage_terms(segs, counts, int(np.argmax(per_mb)), k, full)
    terms["act_offload_s"] = k * acts[int(np.argmax(per_mb))].exposed_s if acts else 0.0
    pipeline_s = (k + S - 1) * slowest
    bubble = 1.0 - k * sum(per_mb) / S / pipeline_s if pipeline_s else 0.0
    pp_link = profile.link_for("pp")
    send = pp_link.latency_s + blk.input_bytes / pp_link.bandwidth
    p2p = 0.0 if S == 1 else 2 * send * ((S - 1) if figures.p2p_overlap else (k + S - 1))
    n_max = max(counts)

    def most(attr: str) -> float:  # the most of a state figure a stage holds: its layers' and its ends'
        return ends_st.most(layer_st, counts, attr)

    grad_bytes = most("grad_bytes")
    dp_link = profile.link_for("dp")
    # ZeRO 0: an all-reduce during the backward; ZeRO 1-2: its reduce-scatter half during the
    # backward, then an all-gather of the updated parameters after the update (not hidden), in
    # their own dtype (a bfloat16 parameter's gradient summed in float32 moves twice its bytes:
    # Megatron-LM's distributed optimizer reduce-scatters float32 gradients and all-gathers
    # bfloat16 parameters); ZeRO 3: the reduce-scatter, and an all-gather of the parameters before
    # every forward and backward
    ring_s = _ring_s(grad_bytes, D, dp_link)
    param_bytes = most("param_bytes")
    after_s = _ring_s(param_bytes, D, dp_link) / 2 if 1 <= lo.zero < 3 else 0.0
    hidden_s = ring_s if lo.zero == 0 else ring_s / 2
    gather_s = 2 * k * _ring_s(layer_st.param_bytes * n_max, D, dp_link) / 2 if lo.zero >= 3 else 0.0
    last_backward = max(b_s)
    # what the reduction beside the last backward adds to it: its excess, or the backward slowed
    # beside it (``hidden_collective_s``)
    hidden = hidden_collective_s(hidden_s, figures.dp_overlap * last_backward, figures.overlap_slowdown)
    dp_s = hidden + after_s + gather_s
    # the update of the stage's layers and ends: the whole update's time by the share of its bytes
    # this device updates (a stage's ends, as its layers, in the layout their plans update them in)
    whole = L * layer_st.work_bytes + sum(x.work_bytes for x in ends_st.at(0, 1))
    update_s = model.update_s * most("update_bytes") / max(whole, 1.0) / (D if lo.zero >= 1 else 1)
    # the update's redistributions over tp (a parameter read whole, its gradient split: the
    # updated parameter all-gathered), after the update: the slowest stage's
    relayout_s = most("relayout_s")
    off = None
    if offloaded:  # the update runs on the host instead (passes/offload.py)
        assert host is not None
        owned = 1 / (D if lo.zero >= 1 else 1)  # the share of the tp piece's state this device updates
        state = most("state_bytes") * owned
        if state <= 0:  # nothing moves: the device keeps its update (no saving to buy with the host's)
            return None, "no optimizer state of this layout to offload (its update reads no state input)"
        updated = most("updated_bytes")
        off = offloading.offload_costs(
            host, state, updated * owned, last_backward, figures.dp_overlap, grad_bytes=grad_bytes * owned
        )
        update_s = off.step_s
    if (short := offloading.host_shortfall(host, off, acts, k)) is not None:
        return None, short
    step = pipeline_s + p2p + dp_s + update_s + relayout_s
    mem = [int(stage_mem(s, float(unit_a[bounds[s] : bounds[s + 1]].sum()), counts[s])) for s in range(S)]
    peak = profile.matmul_rate(model.peak_dtype)
    predicted = {
        "step_s": step,
        "pipeline_s": pipeline_s,
        "per_microbatch_s": slowest,
        "bubble": bubble,
        "p2p_s": p2p,
        "dp_s": dp_s,
        "update_s": update_s,
        "relayout_s": relayout_s,
        "comm_s": p2p + dp_s + relayout_s,
        **terms,  # what the pipeline is made of (``_stage_terms``)
        "bubble_s": (S - 1) * slowest,
    }
    predicted.update({} if off is None else {"offload_s": off.step_s})
    plan = ComposedPlan(
        graph_name=model.graph.name,
        layout=lo,
        devices=S * D * t,
        stage_layers=tuple(int(c) for c in counts),
        predicted=predicted,
        memory_bytes=tuple(mem),
        model_flops=model.model_flops,
        peak_dtype=model.peak_dtype,
        peak_flops=peak,
        figures=figures,
        block_plan=blk.plan,
        profile=profile,
        offload=off,
        offloaded=model.state_names if off is not None else (),
        activations=acts[int(np.argmax(per_mb))] if acts else None,
    )
    return plan, None


def _stage_terms(segs: _Segments, counts, s: int, k: int, full: bool) -> dict[str, float]:
    """The k micro-batches of stage ``s`` (the slowest) by ``TERMS`` (``{term}_s``), forward and
    backward together, and the forward run again (``recompute_s``) when ``full``: with the fill
    and drain, (S - 1) x one micro-batch (``bubble_s``), they add up to the pipeline's time."""
    S = len(counts)
    parts = [(segs.block, int(counts[s]))] + [(e, 1) for e, at in ((segs.pre, 0), (segs.head, S - 1)) if at == s]
    out = {}
    for term in TERMS:
        fb = [(c.forward_terms.get(term, 0.0), c.backward_terms.get(term, 0.0), n) for c, n in parts]
        out[f"{term}_s"] = k * sum((f + b) * n for f, b, n in fb)
    forward = sum(c.forward_s * n for c, n in parts)
    out["recompute_s"] = k * forward if full else 0.0
    return out


def flat_accumulated(model: _Model, segs: _Segments, lo: Layout, profile, figures, limit, fraction=None):
    """A layout without pipeline stages: k micro-batches accumulate gradients on a dp x tp mesh,
    priced by the same composed model as a pipeline of one stage, so that every layout is compared
    by one model. The search's choice is then planned whole when the step is small enough
    (passes/search.py ``_plan_whole``: passes/accumulate.py's planner for such a layout)."""
    return compose(model, segs, lo, profile, figures, limit, fraction)


@dataclass
class Outcome:
    """One layout the search considered: its plan, or why not (``error``), or why it was not
    composed at all (``skipped``)."""

    layout: Layout
    plan: ComposedPlan | None = None
    error: str | None = None
    skipped: str | None = None
    seconds: float = 0.0
    exact: bool = True  # composed from segments solved at its micro-batch size (not scaled)
    unsolved: str | None = None  # why a scaled estimate was left unsolved when the search ended (``_refine``)


def layouts(
    model: _Model, n: int, node_size: int | None, options: PlanOptions, offloads: tuple[str, ...] = ("off",)
) -> list[Layout]:
    """Every layout of ``n`` devices (tp dividing a node, so every group stays inside one; pp at most the layers, micro-batch sizes
    ``microbatch_sizes``), largest tp and smallest micro-batch first; each with every offload
    choice of ``offloads``."""
    L, B = model.layers.count, model.batch
    out = []
    # a group of t devices stays inside a node only if t divides the node (6 of 8: ranks 6-11 span two)
    tps = [t for t in range(n, 0, -1) if n % t == 0 and (node_size is None or node_size % t == 0)]
    zeros = ZERO_STAGES if options.zero == "auto" else (int(options.zero),)
    recs = {"auto": ("off", "full"), "off": ("off",), "on": ("full",)}[options.recompute]
    for t in tps:
        stages = [s for s in range(1, min(L, n // t) + 1) if (n // t) % s == 0]
        meshes = [(b, S) for S in stages if B % (n // (t * S)) == 0 for b in microbatch_sizes(B // (n // (t * S)))]
        for b, S in sorted(meshes):
            D = n // (t * S)
            for z in zeros if D > 1 else (0,):
                for r in recs:
                    out += [Layout(S, D, t, b, B // (D * b), z, r, f) for f in offloads]
    return out


def microbatch_sizes(per_replica: int) -> list[int]:
    """The micro-batch sizes tried for ``per_replica`` sequences per data-parallel replica: those
    of ``MICROBATCH_SIZES`` that divide it, and it split into that many micro-batches, so the
    whole replica's batch at once (one micro-batch) is always a choice: 12 per replica tries
    1, 2, 3, 4, 6 and 12, not only 1, 2 and 4."""
    sizes = {b for b in MICROBATCH_SIZES if per_replica % b == 0}
    return sorted(sizes | {per_replica // m for m in MICROBATCH_SIZES if per_replica % m == 0})


def offload_choices(model: _Model, profile) -> tuple[str, ...]:
    """What a layout of ``model`` may offload on ``profile``: a step without optimizer state (plain
    SGD) has none to offload, so only its activations."""
    choices = offloading.offload_choices(profile)
    if model.state_names:
        return choices
    return tuple(f for f in choices if not offloading.offloads_state(f))


def memory_bound(model: _Model, lo: Layout) -> float:
    """Bytes per device no cut can go below: the state spread evenly over tp x pp (ZeRO over dp)."""
    L, D = model.layers.count, lo.dp
    per_layer = (
        model.param_bytes / (D if lo.zero >= 3 else 1)
        + model.param_bytes / (D if lo.zero >= 2 else 1)
        + (0.0 if offloading.offloads_state(lo.offload) else model.state_bytes / (D if lo.zero >= 1 else 1))
    )
    return per_layer * L / (lo.tp * lo.pp)


def compute_bound(model: _Model, lo: Layout, profile) -> float:
    """Seconds no plan of ``lo`` goes below: the step's matmul flops at the best matmul rate over
    all devices (recomputation adds a forward, a third), stretched by the 1F1B bubble. (Only the
    matmuls: fused attention prices its elementwise work at nothing.)"""
    rates = [profile.matmul_rate(model.peak_dtype), *profile.matmul_table.get(model.peak_dtype, {}).values()]
    work = model.matmul_flops * (4 / 3 if lo.recompute == "full" else 1.0)
    ideal = work / (lo.pp * lo.dp * lo.tp * max(rates))
    return ideal * (lo.microbatches + lo.pp - 1) / lo.microbatches


def search_layered(
    model: _Model,
    n: int,
    options: PlanOptions,
    profile,
    deadline: float,
    progress: Callable[[Outcome], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[Outcome]:
    """Every layout of ``n`` devices (``layouts``), pruned by bounds, composed from segments solved
    once per (tp, micro-batch size), until ``deadline`` (``time.perf_counter()`` seconds)."""
    figures = cluster_figures(profile)
    limit = options.memory_limit
    cands = layouts(model, n, figures.node_size, options, offload_choices(model, profile))
    solved: dict[tuple[int, int], _Segments | str] = {}
    solve_s: list[float] = []  # how long each solve took: the next is not begun unless one fits

    def time_left() -> bool:  # for one more solve: as long as the longest so far, and at least MIN_SOLVE_S
        return clock() + max([MIN_SOLVE_S, *solve_s]) < deadline

    def segments(t: int, b: int, exact: bool) -> _Segments | str:
        """Cached: exact per (t, b), else micro-batch 1's scaled by b."""
        if (t, b) in solved and (not exact or _is_exact(solved[(t, b)])):
            return solved[(t, b)]
        if exact or b == 1:
            begun = time.perf_counter()
            solved[(t, b)] = _solve_all(model, t, b, profile, figures, deadline)
            solve_s.append(time.perf_counter() - begun)
        else:
            one = segments(t, 1, True)
            solved[(t, b)] = one if isinstance(one, str) else _scaled_segments(one, b)
        return solved[(t, b)]

    best = math.inf
    out: list[Outcome] = []
    for lo in cands:
        start = time.perf_counter()
        o = Outcome(lo)
        out.append(o)
        if limit is not None and memory_bound(model, lo) > limit:
            o.skipped = f"memory bound: its state alone needs {memory_bound(model, lo) / 2**30:.1f} GiB per device"
            continue
        if compute_bound(model, lo, profile) >= best:
            o.skipped = "compute bound: slower than the best plan so far at any cut"
            continue
        if (lo.tp, 1) not in solved and not time_left():
            o.skipped = "time limit: the search stopped before its block was solved"
            continue
        _compose_into(o, model, segments(lo.tp, lo.micro_batch, False), profile, figures, limit)
        if o.plan is not None and o.exact:  # only a solved plan bounds the others
            best = min(best, o.plan.predicted["step_s"])
        o.seconds = time.perf_counter() - start
        if progress is not None:
            progress(o)
    _refine(out, segments, model, profile, figures, limit, time_left)
    return out


def plan_layout(model: _Model, layout: Layout, options: PlanOptions, profile, deadline: float) -> ComposedPlan:
    """The composed plan of one given layout (a mesh such as Megatron-LM's pp=16, dp=8, tp=8 with
    its micro-batch size), its segments solved at that micro-batch size: what the search would
    predict for it. PlanError when it cannot run."""
    figures = cluster_figures(profile)
    segs = _solve_all(model, layout.tp, layout.micro_batch, profile, figures, deadline)
    return _layout_plan(model, layout, segs, options, profile, figures)


def _layout_plan(model: _Model, layout: Layout, segs, options: PlanOptions, profile, figures) -> ComposedPlan:
    o = Outcome(layout)
    _compose_into(o, model, segs, profile, figures, options.memory_limit)
    if o.plan is None:
        raise PlanError(f"layout {layout}: {o.error}")
    return o.plan


def plan_mesh(model: _Model, axes: dict[str, int], options: PlanOptions, profile, deadline: float) -> ComposedPlan:
    """The composed plan of a given mesh {pp, dp, tp} with ``options.microbatches`` micro-batches
    (so micro-batch size batch / (dp x microbatches)): its ZeRO stage and recomputation as
    ``options`` force them, else the fastest of the choices. PlanError for a mesh the step
    cannot take."""
    unknown = set(axes) - {"pp", "dp", "tp"}
    if unknown:
        raise PlanError(f"the block search prices meshes of pp, dp and tp axes, not {', '.join(sorted(unknown))}")
    S, D, t, k = axes.get("pp", 1), axes.get("dp", 1), axes.get("tp", 1), options.microbatches
    if model.batch % (D * k):
        raise PlanError(f"the batch of {model.batch} does not split into dp={D} x {k} micro-batches")
    b = model.batch // (D * k)
    zeros = ZERO_STAGES if options.zero == "auto" else (int(options.zero),)
    recs = {"auto": ("off", "full"), "off": ("off",), "on": ("full",)}[options.recompute]
    plans, errors = [], []
    figures = cluster_figures(profile)
    segs = _solve_all(model, t, b, profile, figures, deadline)  # once: every choice below composes them
    for z in zeros if D > 1 else (0,):
        for r in recs:
            for f in offload_choices(model, profile):
                try:
                    plans.append(_layout_plan(model, Layout(S, D, t, b, k, z, r, f), segs, options, profile, figures))
                except PlanError as exc:
                    errors.append(str(exc))
    if not plans:
        raise PlanError(errors[0])
    return min(plans, key=lambda p: p.predicted["step_s"])


def _is_exact(s: _Segments | str) -> bool:
    return isinstance(s, str) or s.exact


def _compose_into(o: Outcome, model: _Model, segs: _Segments | str, profile, figures, limit) -> None:
    if isinstance(segs, str):
        o.plan, o.error = None, segs  # an estimate's segments that cannot be solved leave no plan
        return
    compose_fn = compose if o.layout.pp > 1 else flat_accumulated
    o.plan, o.error = compose_fn(model, segs, o.layout, profile, figures, limit)
    if segs.split is not None:  # the block reading its parameters split: kept when it fits or is faster
        alt, _why = compose_fn(model, segs.split, o.layout, profile, figures, limit)
        if alt is not None and (o.plan is None or alt.predicted["step_s"] < o.plan.predicted["step_s"]):
            o.plan, o.error = alt, None
    o.exact = segs.exact


def _refine(out: list[Outcome], segments, model, profile, figures, limit, time_left) -> None:
    """While time remains: solve exactly the (tp, micro-batch size) of the fastest layout whose
    costs were scaled from micro-batch 1, and compose its layouts again; until no estimate is
    left that could still beat the best solved plan. A scaled estimate is no bound (solved, a
    larger micro-batch is usually faster still: fuller GEMM waves, fewer latencies, and more so
    the larger it is), so an estimate of micro-batch size b is left unsolved only once some
    estimate of size b or larger was solved, and it is not faster than the best solved plan by
    more than the solver's gap (``SOLVER_GAP``) even shrunk by the most those beat their own
    estimates by. The layouts left so are marked (``Outcome.unsolved``), as are those the time
    limit leaves; the choice says how many."""
    why = "the time limit ran out before it was solved"
    ratios: dict[int, float] = {}  # micro-batch size -> the least (solved step / its estimate) seen

    def could_win(o: Outcome, best: float) -> bool:
        seen = [r for b, r in ratios.items() if b >= o.layout.micro_batch]
        return not seen or o.plan.predicted["step_s"] * min(seen) < best * (1 - SOLVER_GAP)  # type: ignore[union-attr]

    while time_left():
        pending = [o for o in out if o.plan is not None and not o.exact]
        if not pending:
            return
        best = min((o.plan.predicted["step_s"] for o in out if o.plan is not None and o.exact), default=math.inf)
        live = [o for o in pending if could_win(o, best)]
        if not live:
            why = (
                "no estimate was faster than the best solved plan by more than the solver's gap, even shrunk by "
                "the most a solved estimate of its micro-batch size or larger was overstated"
            )
            break
        top = min(live, key=lambda o: o.plan.predicted["step_s"])  # type: ignore[union-attr]
        key = (top.layout.tp, top.layout.micro_batch)
        segs = segments(*key, True)
        for o in out:
            if (o.layout.tp, o.layout.micro_batch) == key and o.skipped is None:
                estimate = o.plan.predicted["step_s"] if o.plan is not None and not o.exact else None
                _compose_into(o, model, segs, profile, figures, limit)
                if estimate and o.plan is not None and o.exact:
                    b = o.layout.micro_batch
                    ratios[b] = min(ratios.get(b, 1.0), o.plan.predicted["step_s"] / estimate)
    for o in out:
        if o.plan is not None and not o.exact:
            o.unsolved = why


def _solve_all(model: _Model, tp: int, b: int, profile, figures, deadline: float) -> _Segments | str:
    """The segments solved on tp at micro-batch size ``b``, or why they cannot be."""
    begun = time.perf_counter()
    try:
        parts = {
            name: solve_segment(g, tp, b, model.batch, profile, figures, deadline) for name, g in model.graphs.items()
        }
    except PlanError as exc:
        return f"block on tp={tp}, micro-batch {b}: {str(exc).splitlines()[0]}"
    specs = {name: SegmentSpecs(*model.boundaries[name], c.plan) for name, c in parts.items()}
    held = model.layers.count * (model.param_bytes + model.state_bytes) + model.other_state  # what the update reads
    g, rate = model.graph, model.update_s / max(held, 1.0)  # its seconds a byte on one device
    layer = state_layout(g, model.layer_params, [specs["block"]], profile, model.layer_state_inputs, update_rate=rate)
    ends = [specs["pre"], specs["head"], specs["block"]]
    by_stage, other = end_states(g, model.end_groups, ends, profile, model.other_state_inputs, rate)
    segs = _Segments(parts["pre"], parts["block"], parts["head"], True, layer, other, end_states=by_stage)
    # A block that reads a parameter whole (less split than its gradient) is solved again with
    # it read split: every layout is composed from both and keeps the faster that fits, so the
    # choice sees the bytes held and the gather after the update, not only the per-micro-batch time.
    pins = split_reads(specs["block"], layer)
    if pins is None or time.perf_counter() + (time.perf_counter() - begun) / len(parts) >= deadline:
        return segs
    try:
        blk = solve_segment(model.graphs["block"], tp, b, model.batch, profile, figures, deadline, pins)
    except PlanError:
        return segs
    blk_specs = [SegmentSpecs(*model.boundaries["block"], blk.plan)]
    split = state_layout(g, model.layer_params, blk_specs, profile, model.layer_state_inputs, update_rate=rate)
    segs.split = dataclasses.replace(segs, block=blk, layer_state=split)
    return segs


def _scaled_segments(one: _Segments, b: int) -> _Segments:
    split = None if one.split is None else _scaled_segments(one.split, b)
    pre, block, head = scaled(one.pre, b), scaled(one.block, b), scaled(one.head, b)
    return dataclasses.replace(one, pre=pre, block=block, head=head, exact=False, split=split)


def scaled(c: SegmentCost, b: int) -> SegmentCost:
    """A segment's micro-batch-1 costs for a micro-batch of ``b`` sequences: b times the compute,
    the tensor-parallel traffic and the activations (the per-collective latencies are scaled too,
    which overstates them by at most (b - 1) latencies per collective). The kernel launches are
    not: a micro-batch launches the same kernels whatever its size, so the host's excess over the
    GPU's work (``launch_gap``) is taken again against b times the work (at micro-batch 1 the
    launches last the work plus that excess, when there is one)."""
    fwd, bwd = _scaled_terms(c.forward_terms, b), _scaled_terms(c.backward_terms, b)
    return dataclasses.replace(
        c,
        forward_s=sum(fwd.values()) if fwd else c.forward_s * b,
        backward_s=sum(bwd.values()) if bwd else c.backward_s * b,
        forward_terms=fwd,
        backward_terms=bwd,
        activation_bytes=c.activation_bytes * b,
        input_bytes=c.input_bytes * b,
    )


def _scaled_terms(terms: dict[str, float], b: int) -> dict[str, float]:
    """``terms`` (``TERMS``) of one micro-batch scaled to ``b`` sequences (``scaled``)."""
    work = sum(x for t, x in terms.items() if t != "launch")
    out = {t: x * b for t, x in terms.items() if t != "launch"}
    if "launch" in terms:
        launches = work + terms["launch"] if terms["launch"] > 0 else 0.0  # the launches' own time
        out["launch"] = max(0.0, launches - b * work)
    return out


__all__ = [
    "ComposedPlan",
    "Layout",
    "Outcome",
    "SegmentCost",
    "compose",
    "compute_bound",
    "layered_model",
    "layouts",
    "memory_bound",
    "microbatch_sizes",
    "plan_layout",
    "plan_mesh",
    "search_layered",
    "solve_segment",
    "stage_cut",
]
