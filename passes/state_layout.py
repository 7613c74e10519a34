"""Where a step's parameters, gradients and optimizer state live on a tensor-parallel sub-mesh,
read from the segment plans the block search (passes/scale.py) solved.

A segment's sharding ILP chooses the spec each parameter is read in and the spec each gradient is
made in, freely: a parameter may be read whole on every tp rank (a sequence-split matmul with a
replicated weight) while its gradient comes out split over tp. Counting every parameter as split
over tp then undercounts the memory of such a plan, and forgets the redistribution the update
needs. Per parameter this module reads:

    read      tp pieces of the parameter as its segment reads it (1: replicated)
    grad      tp pieces of its gradient as the segment's backward makes it (a partial sum: 1)
    update    the layout the update runs in: the finer of the two (its optimizer state, the
              inputs only its update reads, is held there); the gradient is redistributed to it
              (free from a replicated gradient, an all-reduce from a partial one), and the updated
              parameter from it to the read layout (an all-gather over tp when the parameter is
              read replicated and its gradient is split), once a step after the update; when
              both are whole, split over tp instead if that is faster (``_update_layout``)

The state outside the repeated layers is held by the pipeline stages whose segments read it
(``EndStates``: the embedding's by the first, the head's by the last).

A parameter's gradient is the value its update reads nearest to it (through update nodes) that
has its shape and is made before the update; its optimizer state the step's inputs of its shape
that only the update reads. The bytes here are per device of the tp sub-mesh: ZeRO's split over
the data axis applies on top (passes/scale.py ``compose``). ``kept_bytes`` counts the other thing
a device holds of a segment, the forward values its backward reads, under the plan's specs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from graphc.core.dtypes import LOW_FLOATS
from graphc.core.ir import Graph, Value
from graphc.core.mesh import Mesh
from graphc.core.spec import Placement, R, S, split_factor
from graphc.passes.blocks import update_only
from graphc.passes.microbatch import summed_widened
from graphc.passes.partition import state_ties
from graphc.passes.sharding.plan import ShardingPlan
from graphc.passes.sharding.problem import Pins
from graphc.passes.sharding.redistribute import redistribution_time
from graphc.passes.sharding.zero import param_groups

TP_AXIS = "tp"


@dataclass(frozen=True, slots=True)
class ParamLayout:
    """One parameter on the tp sub-mesh (module doc)."""

    name: str
    nbytes: int  # the whole parameter
    grad_nbytes: int  # its whole gradient (0 for an input the step reads but does not train)
    state_nbytes: int  # its whole optimizer state
    read: int  # tp pieces as read
    grad: int  # tp pieces of the gradient
    relayout_s: float  # per step: the gradient to the update's layout, the new parameter back
    read_at: Placement = R  # its placement on tp as read
    grad_at: Placement = R  # its gradient's
    # its whole gradient's running sum over micro-batches (None: ``grad_nbytes``): float32 for a
    # 16-bit float gradient (passes/microbatch.py ``widen_sums``)
    sum_nbytes: int | None = None
    update_at: Placement | None = None  # the layout its update runs in (None: the finer of read and grad)
    update_pieces: int = 0  # its tp pieces (0: None above)

    @property
    def update(self) -> int:
        return self.update_pieces or max(self.read, self.grad)

    @property
    def update_place(self) -> Placement:
        if self.update_at is not None:
            return self.update_at
        return self.grad_at if self.grad > self.read else self.read_at


@dataclass(frozen=True, slots=True)
class StateLayout:
    """Per device of the tp sub-mesh: the bytes of a set of parameters, their gradients and their
    optimizer state, and the update's redistributions over tp a step."""

    param_bytes: float
    grad_bytes: float
    state_bytes: float
    relayout_s: float
    update_share: float  # the share of their update one device runs (1/tp when all is split)
    params: tuple[ParamLayout, ...] = ()
    sum_bytes: float | None = None  # the gradients' running sums over micro-batches (None: grad_bytes)
    work_bytes: float = 0.0  # the parameters' and their state's whole bytes (what their update reads)

    @property
    def update_bytes(self) -> float:
        """The bytes of their update one device runs: its share of ``work_bytes``."""
        return self.work_bytes * self.update_share

    @property
    def updated_bytes(self) -> float:
        """The parameters' bytes per device in the update's layout (what an update writes)."""
        return sum(p.nbytes / p.update for p in self.params) if self.params else self.param_bytes

    def held(self, dp: int, zero: int, offloaded: bool, microbatched: bool = False) -> float:
        """Bytes per device with ZeRO stage ``zero`` over ``dp`` devices (1: the optimizer state
        split, 2: and the gradients, 3: and the parameters); the optimizer state in host memory
        when ``offloaded``; the gradients as their running sums when ``microbatched``."""
        grads = self.sum_bytes if microbatched and self.sum_bytes is not None else self.grad_bytes
        return (
            self.param_bytes / (dp if zero >= 3 else 1)
            + grads / (dp if zero >= 2 else 1)
            + (0.0 if offloaded else self.state_bytes / (dp if zero >= 1 else 1))
        )

    @classmethod
    def of(cls, params: Sequence[ParamLayout]) -> StateLayout:
        work = sum(p.nbytes + p.state_nbytes for p in params)
        return cls(
            param_bytes=sum(p.nbytes / p.read for p in params),
            grad_bytes=sum(p.grad_nbytes / p.grad for p in params),
            state_bytes=sum(p.state_nbytes / p.update for p in params),
            relayout_s=sum(p.relayout_s for p in params),
            update_share=sum((p.nbytes + p.state_nbytes) / p.update for p in params) / work if work else 1.0,
            params=tuple(params),
            sum_bytes=sum((p.grad_nbytes if p.sum_nbytes is None else p.sum_nbytes) / p.grad for p in params),
            work_bytes=work,
        )

    @classmethod
    def even(cls, param_bytes: float, state_bytes: float, tp: int) -> StateLayout:
        """Everything split over tp, the gradients in the parameters' dtype: what a plan of
        unknown specs is taken to do."""
        return cls(
            param_bytes / tp, param_bytes / tp, state_bytes / tp, 0.0, 1 / tp, work_bytes=param_bytes + state_bytes
        )


NO_STATE = StateLayout.of([])


@dataclass(frozen=True, slots=True)
class EndStates:
    """The state outside the repeated layers by the pipeline stages that hold it (``end_groups``):
    ``first`` is read only by the embedding (pre), so held by the first stage; ``last`` only by the
    head, so by the last stage; ``both`` by both ends (a tied embedding), and the optimizer state
    no parameter's update claims; ``every`` by the layers' blocks without being one of the layer
    structure's parameters (a weight the layers share, a per-layer array outside the structure):
    every stage holds it, whole when the stamped block does not read it."""

    first: StateLayout = NO_STATE
    last: StateLayout = NO_STATE
    both: StateLayout = NO_STATE
    every: StateLayout = NO_STATE

    def at(self, s: int, stages: int) -> list[StateLayout]:
        """What stage ``s`` of ``stages`` holds (one stage: all of it, each once)."""
        out = [self.every]
        out += [self.first] if s == 0 else []
        out += [self.last] if s == stages - 1 else []
        out += [self.both] if s in (0, stages - 1) else []
        return out

    def most(self, layer: StateLayout, counts: Sequence[int], attr: str) -> float:
        """The most of ``attr`` (a ``StateLayout`` figure) a stage holds, its layers' (``layer``
        each, ``counts`` per stage) and its ends': the first, the last and the middle stage of
        most layers are the ones to look at."""
        S = len(counts)
        looked = {0, S - 1} | ({max(range(1, S - 1), key=counts.__getitem__)} if S > 2 else set())
        per = getattr(layer, attr)
        return max(per * counts[s] + sum(getattr(x, attr) for x in self.at(s, S)) for s in looked)


def held_outside(graph: Graph, layer_inputs: set[int], tied: set[int], batch: int) -> list[int]:
    """The positions of the inputs outside the layers (``layer_inputs``) that a device holds as
    state: every one, trained (``tied``) or not (a frozen embedding), but the data (an untied input
    whose leading dimension is the batch's)."""
    return [
        k
        for k, v in enumerate(graph.inputs)
        if k not in layer_inputs and (k in tied or v.type.ndim == 0 or v.type.shape[0] != batch)
    ]


def end_groups(graph: Graph, segment: Sequence[int], n_layers: int, params: Iterable[int]) -> dict[int, str]:
    """Which ``EndStates`` group each input at ``params`` belongs to, from the segments of the
    nodes that read it (``segment``: per node, 0 pre, 1 .. ``n_layers`` the layers' blocks,
    ``n_layers`` + 1 the head, -1 none: passes/blocks.py ``Segments``)."""
    wanted = {graph.inputs[k]: k for k in params}
    seen: dict[int, set[int]] = {k: set() for k in wanted.values()}
    for j, n in enumerate(graph.nodes):
        if segment[j] < 0:
            continue
        for v in n.inputs:
            if v in wanted:
                seen[wanted[v]].add(segment[j])
    head = n_layers + 1
    out = {}
    for k, segs in seen.items():
        if any(1 <= s <= n_layers for s in segs):
            out[k] = "every"
        elif segs == {0}:
            out[k] = "first"
        elif segs == {head}:
            out[k] = "last"
        else:
            out[k] = "both"  # both ends, or read by no segment
    return out


def end_states(
    graph: Graph,
    groups: dict[int, str],
    segments: Sequence[SegmentSpecs],
    profile,
    state: Iterable[int] = (),
    update_rate: float = 0.0,
) -> tuple[EndStates, StateLayout]:
    """The state outside the layers by ``EndStates`` group (``groups``: ``end_groups``), as the
    ``segments`` (pre, head, the stamped block) lay it out, and all of it together. A parameter
    none of them reads is counted whole; the state no parameter claims goes with ``both``."""
    whole = state_layout(graph, groups, segments, profile, state, unread_whole=True, update_rate=update_rate)
    group_of = {graph.inputs[k].name or f"input{k}": g for k, g in groups.items()}
    by: dict[str, list[ParamLayout]] = {g: [] for g in ("first", "last", "both", "every")}
    for p in whole.params:
        by[group_of.get(p.name, "both")].append(p)
    return EndStates(**{g: StateLayout.of(ps) for g, ps in by.items()}), whole


@dataclass(frozen=True, slots=True)
class SegmentSpecs:
    """A solved segment: the step's values its graph's inputs and outputs stand for
    (passes/blocks.py ``segment_boundary``), and its plan."""

    inputs: list[Value]
    outputs: list[Value]
    plan: ShardingPlan


def tp_placement(spec, plan: ShardingPlan) -> Placement:
    """The placement of ``spec`` on the plan's tp axis (R on a mesh without one)."""
    names = plan.mesh.axis_names
    return spec[names.index(TP_AXIS)] if TP_AXIS in names else R


def state_layout(
    graph: Graph,
    params: Iterable[int],
    segments: Sequence[SegmentSpecs],
    profile,
    state: Iterable[int] = (),
    unread_whole: bool = False,
    update_rate: float = 0.0,
) -> StateLayout:
    """The layout of the step's inputs ``params`` (positions in ``graph.inputs``) as the
    ``segments`` that read them and make their gradients planned them (module doc). A parameter
    read by several segments counts in its least split read; one none of them reads is left out,
    or with ``unread_whole`` counted whole (replicated on tp). ``update_rate``: the update's
    seconds a byte of parameter and state on one device; with it, a parameter whose update would
    run whole on every tp rank runs it split over tp instead when that is faster, the gathers
    after it counted (``_update_layout``). ``state``: the optimizer state of
    these parameters (inputs only the update reads); what no parameter's update claims (a
    parameter whose new value the step returns in another dtype or structure, so that no tie leads
    from it to its update) still counts, with the gradients the segments make that its update
    reads (``_unclaimed``)."""
    nodes = graph.nodes
    producer = {o: k for k, n in enumerate(nodes) for o in n.outputs}
    upd = update_only(graph)
    read_fwd = {v for k, n in enumerate(nodes) if n.part == "forward" and k not in upd for v in n.inputs}
    new_of = {graph.inputs[i]: graph.outputs[o] for i, o in state_ties(graph)}
    read_in: dict[Value, list[Placement]] = {}
    made_in: dict[Value, Placement] = {}
    tp = 1
    for seg in segments:
        tp = max(tp, seg.plan.mesh.shape[seg.plan.mesh.axis_names.index(TP_AXIS)] if _has_tp(seg.plan) else 1)
        for v, spec in zip(seg.inputs, seg.plan.input_specs()):
            read_in.setdefault(v, []).append(tp_placement(spec, seg.plan))
        for v, spec in zip(seg.outputs, seg.plan.output_specs()):
            made_in[v] = tp_placement(spec, seg.plan)
    mesh = Mesh({TP_AXIS: tp}, profile=profile) if tp > 1 else None
    out = []
    claimed: set[Value] = set()
    for i in params:
        p = graph.inputs[i]
        reads = read_in.get(p) or ([R] if unread_whole else None)
        if not reads:
            continue  # no segment reads it: nothing of it is on the sub-mesh's plans
        read = min(reads, key=lambda x: _pieces(x, tp))
        grad_v, operands = _update_operands(graph, producer, upd, read_fwd, p, new_of.get(p))
        claimed.update([grad_v, *operands])
        grad = made_in.get(grad_v, read) if grad_v is not None else read
        update = read if _pieces(read, tp) >= _pieces(grad, tp) else grad
        summed = _summed_nbytes(graph, grad_v, upd) if grad_v is not None else 0  # none: not trained
        relayout, chosen = 0.0, None
        if mesh is not None:
            g_type = grad_v.type if grad_v is not None else p.type
            work = update_rate * (p.type.nbytes + sum(s.type.nbytes for s in operands)) if grad_v is not None else 0.0
            update, relayout = _update_layout(p.type, g_type, read, grad, update, work, mesh)
            chosen = update if update not in (read, grad) else None
        out.append(
            ParamLayout(
                name=p.name or f"input{i}",
                nbytes=p.type.nbytes,
                grad_nbytes=summed,
                sum_nbytes=_running_sum_nbytes(grad_v, summed) if grad_v is not None else 0,
                state_nbytes=sum(s.type.nbytes for s in operands),
                read=_pieces(read, tp),
                grad=_pieces(grad, tp),
                relayout_s=relayout,
                read_at=read,
                grad_at=grad,
                update_at=chosen,
                update_pieces=_pieces(update, tp) if chosen is not None else 0,
            )
        )
    out += _unclaimed(graph, upd, [k for k in state if graph.inputs[k] not in claimed], made_in, claimed, tp)
    return StateLayout.of(out)


def _update_layout(p_type, g_type, read: Placement, grad: Placement, update: Placement, work: float, mesh: Mesh):
    """(the layout a parameter's update runs in, the update's redistributions over tp): the
    finer of its read and gradient layouts (``update``), or, when that is whole and its update
    takes ``work`` seconds on one device, split over tp along its first dimension tp divides if
    that is faster: the gradient sliced or reduce-scattered into it, the new parameter gathered
    back to its read layout (as the sharding ILP may lay a step's update out)."""

    def relayout(at: Placement) -> float:
        there = redistribution_time(g_type.shape, g_type.dtype.itemsize, (grad,), (at,), mesh)
        return there + redistribution_time(p_type.shape, p_type.dtype.itemsize, (at,), (read,), mesh)

    kept = relayout(update)
    tp = mesh.shape[0]
    dims = [d for d, n in enumerate(p_type.shape) if n % tp == 0 and n >= tp]
    if update.is_split or not dims or work <= 0:
        return update, kept
    split = S(dims[0])
    moved = relayout(split)
    return (split, moved) if work / tp + moved < work + kept else (update, kept)


def _unclaimed(graph: Graph, upd: set[int], state: list[int], made_in: dict, claimed: set, tp: int) -> list:
    """ParamLayouts (of no parameter bytes) of the optimizer state at positions ``state`` that no
    parameter's update claimed, with the gradients the update joins to it (passes/sharding/zero.py
    ``param_groups``, which follows the update's nodes, not ties): held in the layout the
    segments made their gradient in (``made_in``), split over tp when they made none of it."""
    if not state:
        return []
    update = frozenset(graph.nodes[k] for k in upd)
    out = []
    for group in param_groups(graph, set(state), update):
        grads = [v for v in group.gradients if v not in claimed]
        made = [made_in[v] for v in grads if v in made_in]
        pieces = max((_pieces(x, tp) for x in made), default=tp)
        at = next((x for x in made if _pieces(x, tp) == pieces), R)
        summed = [_summed_nbytes(graph, v, upd) for v in grads]
        ks = group.states if group.param is None else (*group.states, group.param)
        out.append(
            ParamLayout(
                name=graph.inputs[ks[0]].name or f"input{ks[0]}",
                nbytes=0,
                grad_nbytes=sum(summed),
                sum_nbytes=sum(_running_sum_nbytes(v, n) for v, n in zip(grads, summed)),
                state_nbytes=sum(graph.inputs[k].type.nbytes for k in ks),
                read=pieces,
                grad=pieces,
                relayout_s=0.0,
                read_at=at,
                grad_at=at,
            )
        )
    return out


def split_reads(seg: SegmentSpecs, layout: StateLayout) -> Pins | None:
    """Pins that read every parameter the segment's plan reads less split than its update runs
    in the update's layout on tp (the other axes as the plan has them): the segment's
    alternative that holds no parameter whole and gathers nothing after the update. None when
    the plan reads every parameter in its update's layout."""
    finer = {p.name: p.update_place for p in layout.params if p.read < p.update}
    if not finer or not _has_tp(seg.plan):
        return None
    at = seg.plan.mesh.axis_names.index(TP_AXIS)
    pins = {
        j: (*spec[:at], finer[v.name], *spec[at + 1 :])
        for j, (v, spec) in enumerate(zip(seg.inputs, seg.plan.input_specs()))
        if v.name in finer
    }
    return Pins(inputs=pins)


def kept_bytes(g: Graph, plan: ShardingPlan, shape: tuple[int, ...], scores: set) -> int:
    """Bytes per device of the forward values the backward reads, under the plan's specs (fused
    attention scores are not kept)."""
    spec_of = {}
    for nc in plan.nodes:
        for o, sp in zip(g.nodes[nc.index].outputs, nc.out_specs):
            spec_of[o] = sp
    read_back = {v for n in g.nodes if n.part != "forward" for v in n.inputs}
    kept = [o for n in g.nodes if n.part == "forward" for o in n.outputs]
    return sum(
        o.type.nbytes // split_factor(spec_of[o], shape)
        for o in kept
        if o in read_back and o not in scores and o in spec_of
    )


def _has_tp(plan: ShardingPlan) -> bool:
    return TP_AXIS in plan.mesh.axis_names


def _pieces(x: Placement, tp: int) -> int:
    return tp if x.is_split else 1


def _summed_nbytes(graph: Graph, grad: Value, upd: set[int]) -> int:
    """The bytes of ``grad`` as micro-batches and data-parallel ranks sum it: a 16-bit gradient
    that the update only widens (``g.astype(np.float32)``) is summed after the widening, in the
    wider dtype (passes/microbatch.py ``summed_widened``)."""
    readers = [graph.nodes[k] for k in upd if grad in graph.nodes[k].inputs]
    if not readers or any(n.op.name != "convert" for n in readers):
        return grad.type.nbytes
    wide = [n.outputs[0].type.dtype for n in readers if summed_widened(grad.type.dtype, n.outputs[0].type.dtype)]
    return grad.type.size * max(wide, key=lambda d: d.itemsize).itemsize if wide else grad.type.nbytes


def _running_sum_nbytes(grad: Value, summed: int) -> int:
    """The bytes of ``grad``'s running sum over micro-batches (``summed``: ``_summed_nbytes``):
    float32 for a 16-bit float gradient, widened by the step or not (passes/microbatch.py
    ``widen_sums``)."""
    return max(summed, grad.type.size * 4) if grad.type.dtype in LOW_FLOATS else summed


def _update_operands(graph: Graph, producer, upd: set[int], read_fwd: set, p: Value, new: Value | None):
    """(the gradient of ``p``, its optimizer state) read by the update nodes that make ``new``
    (module doc); (None, []) when the step returns no new value of ``p``."""
    if new is None:
        return None, []
    seen, frontier, reached = {new}, [new], []
    while frontier:  # breadth first: the nearest operands first
        nxt = []
        for v in frontier:
            k = producer.get(v)
            if k is None or k not in upd:
                reached.append(v)
                continue
            for u in graph.nodes[k].inputs:
                if u not in seen:
                    seen.add(u)
                    nxt.append(u)
        frontier = nxt
    shape = p.type.shape
    grad = next(
        (v for v in reached if v.type.shape == shape and v in producer and graph.nodes[producer[v]].part != "forward"),
        None,
    )
    state = [v for v in reached if v not in producer and v is not p and v.type.shape == shape and v not in read_fwd]
    return grad, state


__all__ = [
    "NO_STATE",
    "EndStates",
    "ParamLayout",
    "SegmentSpecs",
    "StateLayout",
    "end_groups",
    "end_states",
    "held_outside",
    "kept_bytes",
    "split_reads",
    "state_layout",
    "tp_placement",
]
