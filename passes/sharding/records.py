"""The records a ``ShardingPlan`` (passes/sharding/plan.py) is made of, each a frozen value with
its JSON (``to_json()``; ``from_json(doc, n_axes)`` parses the specs on a mesh of ``n_axes`` axes):

    TensorChoice   a graph input's or output's spec, its ZeRO stage, its alternatives
    NodeChoice     a node's strategy, operand and result specs, compute time, recomputation
    Alternative    another choice for one of them, priced (passes/sharding/alternatives.py); a plan
                   just made prices them when first read (passes/sharding/pending.py)
    RuledOut       a spec never considered for an input, and why
    Collective     one redistribution step of the plan
    Cost, Memory, SolverStats   the predicted step, the per-device memory, how the ILP was solved

A record read from a hand-edited file is checked field by field (``check_record``) by the plan
that reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from graphc.core.spec import Spec, format_spec, parse_spec
from graphc.core.units import fmt_rate
from graphc.passes.sharding.pending import LazyAlternatives

# model flops utilization, as every plan's JSON states it (``Cost.mfu``, ``Mfu``)
MFU_FORMULA = "model_flops / (step_s * devices * peak_flops)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Mfu:
    """The model flops utilization of a predicted step, ``MFU_FORMULA``: ``model_flops``, the work
    of one step with every node counted once as on one device (neither replicated work nor
    recomputation counts), over ``step_s`` x ``devices`` x ``peak_flops``, the profile's matmul
    rate of one device for ``peak_dtype``, the dtype carrying most of the step's contraction flops
    (a pipeline's or gradient accumulation's whole step: every micro-batch, the bubble, the update)."""

    value: float
    model_flops: float
    step_s: float
    devices: int
    peak_dtype: str
    peak_flops: float

    def to_json(self) -> dict:
        return {"formula": MFU_FORMULA, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}

    def describe(self, profile: str, what: str = "") -> str:
        """The summary's line (``what``: of which step, after the figure)."""
        return (
            f"MFU {self.value:.1%}{what}: model flops {self.model_flops:.4g} per step over {self.devices} devices x "
            f"{fmt_rate(self.peak_flops)} ({self.peak_dtype} matmul peak of profile {profile})"
        )

    @classmethod
    def from_json(cls, d: Mapping) -> Mfu:
        return cls(**{k: v for k, v in d.items() if k != "formula"})


def _specs(xs) -> list[str]:
    return [format_spec(s) for s in xs]


@dataclass(frozen=True, slots=True, kw_only=True)
class Alternative:
    """Another choice for one input, output or node, every other choice held fixed (the output a
    state input is tied to moves with it), priced in the solver's own model
    (passes/sharding/alternatives.py): what it changes, alternative minus chosen, and why the
    solver did not take it."""

    out_specs: tuple[Spec, ...]
    delta_s: float  # the ILP objective: compute + every redistribution (ZeRO gathers, gradient buckets)
    strategy: str | None = None  # nodes
    compute_delta_s: float = 0.0  # the compute part of delta_s
    comm_delta_s: float = 0.0  # the redistribution part of delta_s
    step_delta_s: float | None = None  # the predicted step (the plan's collectives, once each)
    peak_delta_bytes: int | None = None  # the per-device liveness peak (what a memory limit bounds)
    ruled_out: str | None = None  # the constraint that rules it out; None: allowed, and not cheaper

    def to_json(self) -> dict:
        return {"out_specs": _specs(self.out_specs), **{k: getattr(self, k) for k in _ALTERNATIVE_NUMBERS}}

    @classmethod
    def from_json(cls, d: dict, n_axes: int) -> Alternative:
        """An alternative from its document; a plan written before the totals (with ``compute_s``,
        ``comm_s`` and an input's ``memory_delta_bytes``) keeps only its ``delta_s``."""
        specs = tuple(parse_spec(s, n_axes) for s in d["out_specs"])
        return cls(out_specs=specs, **{k: d[k] for k in _ALTERNATIVE_NUMBERS if k in d})


_ALTERNATIVE_NUMBERS = (
    "delta_s",
    "strategy",
    "compute_delta_s",
    "comm_delta_s",
    "step_delta_s",
    "peak_delta_bytes",
    "ruled_out",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class RuledOut:
    """A spec of an input that was never a candidate (one mesh axis's placement changed from the
    chosen spec), and why the planner did not generate it."""

    spec: Spec
    reason: str

    def to_json(self) -> dict:
        return {"spec": format_spec(self.spec), "reason": self.reason}

    @classmethod
    def from_json(cls, d: dict, n_axes: int) -> RuledOut:
        return cls(spec=parse_spec(d["spec"], n_axes), reason=d["reason"])


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorChoice:
    """The spec chosen for a graph input (what each device is given) or output (what it returns)."""

    index: int
    name: str
    type: str
    spec: Spec
    pinned: bool = False
    alternatives: tuple[Alternative, ...] | LazyAlternatives = ()  # LazyAlternatives of Alternative (a plan just made)
    # inputs: the ZeRO stage of its parameter's group (passes/sharding/zero.py), and the bytes per
    # device its split along the ZeRO axes saves (a parameter's: its gradients' too)
    zero: int = 0
    zero_saved_bytes: int = 0
    ruled_out: tuple[RuledOut, ...] = ()  # inputs: specs never considered, and why

    def to_json(self, alternatives: bool = True) -> dict:
        """Its document; ``pinned`` only when true, ``alternatives`` only if asked (the plan's
        ``to_json`` decides: module docstring)."""
        return {
            "index": self.index,
            "name": self.name,
            "type": self.type,
            "spec": format_spec(self.spec),
            **({"pinned": True} if self.pinned else {}),
            **({"alternatives": [a.to_json() for a in self.alternatives]} if alternatives else {}),
            "zero": self.zero,
            "zero_saved_bytes": self.zero_saved_bytes,
            "ruled_out": [r.to_json() for r in self.ruled_out],
        }

    @classmethod
    def from_json(cls, d: dict, n_axes: int) -> TensorChoice:
        return cls(
            index=d["index"],
            name=d["name"],
            type=d["type"],
            spec=parse_spec(d["spec"], n_axes),
            pinned=bool(d.get("pinned")),
            alternatives=tuple(Alternative.from_json(a, n_axes) for a in d.get("alternatives", ())),
            zero=int(d.get("zero", 0)),
            zero_saved_bytes=int(d.get("zero_saved_bytes", 0)),
            ruled_out=tuple(RuledOut.from_json(r, n_axes) for r in d.get("ruled_out", ())),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeChoice:
    """The strategy chosen for one node: its operand and result specs and the share of its work."""

    index: int
    name: str
    op: str
    loc: str | None
    part: str | None
    types: tuple[str, ...]
    strategy: str
    in_specs: tuple[Spec, ...]
    out_specs: tuple[Spec, ...]
    compute_s: float
    pinned: bool = False
    warning: str | None = None
    alternatives: tuple[Alternative, ...] | LazyAlternatives = ()  # LazyAlternatives of Alternative (a plan just made)
    # recomputed before the backward pass instead of kept (passes/recompute/choices.py); the bytes
    # of its results each device no longer holds from the forward to the backward pass
    recompute: bool = False
    recompute_saved_bytes: int = 0

    def to_json(self, alternatives: bool = True) -> dict:
        """Its document; ``pinned``, ``warning`` and ``recompute`` only when set, ``alternatives``
        only if asked (the plan's ``to_json`` decides: module docstring)."""
        return {
            "index": self.index,
            "name": self.name,
            "op": self.op,
            "loc": self.loc,
            "part": self.part,
            "types": list(self.types),
            "strategy": self.strategy,
            "in_specs": _specs(self.in_specs),
            "out_specs": _specs(self.out_specs),
            "compute_s": self.compute_s,
            **({"pinned": True} if self.pinned else {}),
            **({"warning": self.warning} if self.warning is not None else {}),
            **({"alternatives": [a.to_json() for a in self.alternatives]} if alternatives else {}),
            **({"recompute": True, "recompute_saved_bytes": self.recompute_saved_bytes} if self.recompute else {}),
        }

    @classmethod
    def from_json(cls, d: dict, n_axes: int) -> NodeChoice:
        return cls(
            index=d["index"],
            name=d["name"],
            op=d["op"],
            loc=d.get("loc"),
            part=d.get("part"),
            types=tuple(d.get("types", ())),
            strategy=d["strategy"],
            in_specs=tuple(parse_spec(s, n_axes) for s in d["in_specs"]),
            out_specs=tuple(parse_spec(s, n_axes) for s in d["out_specs"]),
            compute_s=d["compute_s"],
            pinned=bool(d.get("pinned")),
            warning=d.get("warning"),
            alternatives=tuple(Alternative.from_json(a, n_axes) for a in d.get("alternatives", ())),
            recompute=bool(d.get("recompute", False)),
            recompute_saved_bytes=d.get("recompute_saved_bytes", 0),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Collective:
    """One redistribution step: a collective along one mesh axis (or a local slice / zeroing)."""

    kind: str
    axes: tuple[str, ...]
    bytes: int  # of the whole logical tensor (not what moves: see sent_bytes)
    local_bytes: int  # each device's bytes before the step (after, for all_gather)
    tensor: str
    node: str  # the consumer it serves
    node_index: int | None
    op: str
    loc: str | None
    part: str | None
    src: Spec
    dst: Spec
    time_s: float
    # bytes each device sends, by the algorithm the cost model prices (redistribute.collective_cost);
    # None in plans written before it
    sent_bytes: int | None = None

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "axes": list(self.axes),
            "bytes": self.bytes,
            "local_bytes": self.local_bytes,
            "tensor": self.tensor,
            "node": self.node,
            "node_index": self.node_index,
            "op": self.op,
            "loc": self.loc,
            "part": self.part,
            "from": format_spec(self.src),
            "to": format_spec(self.dst),
            "time_s": self.time_s,
            "sent_bytes": self.sent_bytes,
        }

    @classmethod
    def from_json(cls, d: dict, n_axes: int) -> Collective:
        return cls(
            kind=d["kind"],
            axes=tuple(d["axes"]),
            bytes=d["bytes"],
            local_bytes=d["local_bytes"],
            tensor=d["tensor"],
            node=d["node"],
            node_index=d.get("node_index"),
            op=d["op"],
            loc=d.get("loc"),
            part=d.get("part"),
            src=parse_spec(d["from"], n_axes),
            dst=parse_spec(d["to"], n_axes),
            time_s=d["time_s"],
            sent_bytes=d.get("sent_bytes"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Cost:
    """The predicted step, and how much of the devices' peak it uses.

    ``mfu`` (model flops utilization) = ``model_flops / (total_s x devices x peak_flops)``:
    ``model_flops`` is the work of one step, every node of the graph counted once as on one device
    (the unsharded work: neither the work replicated devices repeat nor recomputation counts);
    ``peak_flops`` is the profile's matmul rate of one device for ``peak_dtype``, the dtype that
    carries most of the step's contraction flops. None in plans written before it existed.

    ``comm_s`` is the time of the plan's collectives: each redistribution once, the gradient
    all-reduces sharing buckets of ``bucket_bytes`` (what they fill). The solver's objective
    (``SolverStats.objective_s``) prices the same choices differently: ``edge_comm_s`` is its
    way of counting (every edge of the problem on its own) with the buckets the plan fills, and
    ``SolverStats.bucket_bytes`` the bucket share it estimated before solving. ``offload_s`` is
    the host's part of an offloaded update (passes/offload.py ``OffloadCost.step_s``); the
    device's update it replaces is not in ``compute_s``."""

    compute_s: float
    comm_s: float
    total_s: float
    model_flops: float | None = None
    peak_dtype: str | None = None
    peak_flops: float | None = None
    mfu: float | None = None
    bucket_bytes: int = 0
    edge_comm_s: float | None = None
    offload_s: float = 0.0

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return out if self.mfu is None else {**out, "mfu_formula": MFU_FORMULA}

    def mfu_record(self, devices: int) -> Mfu | None:
        """The MFU as a record (None when the plan has none), the step ``total_s`` on ``devices``."""
        if self.mfu is None or self.model_flops is None or self.peak_dtype is None or self.peak_flops is None:
            return None
        return Mfu(
            value=self.mfu,
            model_flops=self.model_flops,
            step_s=self.total_s,
            devices=devices,
            peak_dtype=self.peak_dtype,
            peak_flops=self.peak_flops,
        )

    @classmethod
    def from_json(cls, d: dict) -> Cost:
        return cls(**{k: v for k, v in d.items() if k != "mfu_formula"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Memory:
    """Per-device memory of a plan. ``peak_bytes`` is the liveness peak of the values under their
    specs (what ``limit_bytes`` bounds: the ILP's memory model); ``held_bytes`` adds the buffers
    the plan's redistributions make (a collective's result, a local slice's copy, a gradient
    bucket), live from the first reader that needs them to the last: what the runtime holds."""

    limit_bytes: int | None
    peak_bytes: tuple[int, ...]  # one per device
    peak_at: str | None
    held_bytes: tuple[int, ...] = ()  # one per device; () in plans written before it: peak_bytes
    recompute_saved_bytes: int = 0  # the peak with every recomputed value kept, minus peak_bytes

    @property
    def held(self) -> tuple[int, ...]:
        return self.held_bytes or self.peak_bytes

    def to_json(self) -> dict:
        return {
            "limit_bytes": self.limit_bytes,
            "peak_bytes": list(self.peak_bytes),
            "peak_at": self.peak_at,
            "held_bytes": list(self.held),
            "recompute_saved_bytes": self.recompute_saved_bytes,
        }

    @classmethod
    def from_json(cls, d: dict) -> Memory:
        return cls(
            limit_bytes=d["limit_bytes"],
            peak_bytes=tuple(d["peak_bytes"]),
            peak_at=d.get("peak_at"),
            held_bytes=tuple(d.get("held_bytes", ())),
            recompute_saved_bytes=d.get("recompute_saved_bytes", 0),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SolverStats:
    """How the ILP was solved. ``objective_s`` is the cost it minimized: the compute of every item
    plus the redistribution of every edge, the deferred gradient all-reduces priced as sharing
    buckets of ``bucket_bytes`` (an estimate made before solving, from every gradient that might
    be all-reduced; 0: no buckets)."""

    name: str
    status: str
    objective_s: float
    bound_s: float
    gap: float
    seconds: float
    build_s: float = 0.0
    sizes: Mapping[str, int] = field(default_factory=dict)  # items, groups, variables, constraints, ...
    bucket_bytes: int = 0

    def to_json(self) -> dict:
        """The named fields, and the sizes beside them."""
        return {**{k: getattr(self, k) for k in _SOLVER_FIELDS}, **dict(self.sizes)}

    @classmethod
    def from_json(cls, d: dict) -> SolverStats:
        named = {k: d[k] for k in _SOLVER_FIELDS if k in d}
        return cls(**named, sizes={k: v for k, v in d.items() if k not in _SOLVER_FIELDS})


_SOLVER_FIELDS = ("name", "status", "objective_s", "bound_s", "gap", "seconds", "build_s", "bucket_bytes")


__all__ = [  # the records (MFU_FORMULA, a string, is imported by name)
    "Alternative",
    "Collective",
    "Cost",
    "Memory",
    "Mfu",
    "NodeChoice",
    "RuledOut",
    "SolverStats",
    "TensorChoice",
]
