"""Redistribution: turn a tensor placed by one spec into the same tensor placed by another, with
the cheapest sequence of collectives per mesh axis (the spirit of MindSpore's tensor
redistribution), and what that costs under the alpha-beta model of each axis's link.

Per mesh axis the transitions are:

    P -> S(d)   reduce_scatter        P -> R   all_reduce
    S -> S'     all_to_all            S -> R   all_gather
    R -> S(d)   slice (local)         R -> P   zero (local: devices off coordinate 0 hold zeros)

They run in that order (partial sums first, gathers before slices), which keeps every
intermediate spec valid: a dim is never split over two axes at once. A transition that would
split a dim already split over another axis takes the long way (all_reduce / all_gather now,
slice at the end). The same steps tell the lowering which collectives to insert.

When a mesh has more devices than the profile's cores (threads of one machine), the links'
bandwidth, the latencies and the call overhead are scaled by the devices' share of the cores
(``MachineProfile.device_share``), and a local slice copies at ``concurrent_bandwidth``.

Costs over ``n`` devices, link latency ``a`` and bandwidth ``bw``, ``B`` = bytes each device
holds before the step (after, for all_gather), plus a fixed per-call overhead ``c``. Each
collective takes the cheaper of the ring algorithm (bandwidth-optimal) and, for the latency-bound
small messages, recursive doubling / halving with ``L = ceil(log2 n)`` rounds, as MPI libraries
choose between them (the runtime makes the same choice from the same formulas):

    all_reduce      min(2 (n-1) a + 2 (n-1)/n B / bw,  L (a + B / bw))  + c
    reduce_scatter  min(  (n-1) a,  L a) + (n-1)/n B / bw               + c
    all_gather      min(  (n-1) a,  L a) + (n-1)/n B / bw               + c   (B: the gathered size)
    all_to_all        (n-1) a +   (n-1)/n B / bw                        + c
    slice             B_after / memory bandwidth                              (a local copy)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from graphc.core.spec import P, Placement, R, format_spec, local_shape

KINDS = ("reduce_scatter", "all_reduce", "all_to_all", "all_gather", "slice", "zero")


def read_phase(value_part: str | None, reader_part: str | None, redo_later: bool) -> str:
    """Which copy of a redistributed value a reader shares: "" (the copy made for the value's
    first reader), or, when ``redo_later`` (plans under a memory limit), "later" when the
    forward pass made the value and a later part (backward, update) reads it.

    The later reads then redistribute again instead of keeping the forward pass's copy alive
    until then: a sequence-split activation all-gathered for a column-parallel matmul is
    gathered again for its weight gradient, so only the split activation is saved for the
    backward pass (Megatron sequence parallelism, Korthikanti et al. 2022, section 4.2.2). The
    memory limit bounds the values' liveness, which a copy held across the passes would escape;
    without a limit one copy is cheaper. The planner prices the redistributions apart
    (problem.py: ``add_fanouts``), counts their buffers apart (``redistribution_buffers``), and
    the lowering makes both (passes/lower.py, from the plan's ``memory.limit_bytes``)."""
    return "later" if redo_later and value_part == "forward" and reader_part not in (None, "forward") else ""


@dataclass(frozen=True)
class Step:
    kind: str
    axis: int  # mesh axis index
    src: tuple[Placement, ...]  # whole spec before the step
    dst: tuple[Placement, ...]  # whole spec after it
    local_bytes: int  # bytes each device holds before the step (after, for all_gather)
    time_s: float
    sent_bytes: int = 0  # bytes each device sends (collective_cost)

    @property
    def is_collective(self) -> bool:
        return self.kind not in ("slice", "zero")

    def __str__(self) -> str:
        return f"{self.kind}(axis {self.axis}) {format_spec(self.src)} -> {format_spec(self.dst)}"


def collective_cost(
    kind: str, n: int, nbytes: int, latency: float, bandwidth: float, overhead: float, mem_bandwidth: float
) -> tuple[float, int]:
    """(seconds, bytes each device sends) of one step of ``kind`` over ``n`` devices, ``nbytes``
    the bytes each device holds before it (after, for all_gather), by the formulas of the module
    doc: the sent bytes are the bandwidth term of the algorithm the time takes (the ring's
    ``2 (n-1)/n B`` for an all-reduce, or ``L B`` when recursive doubling is cheaper; ``(n-1)/n B``
    for reduce_scatter, all_gather and all_to_all; nothing for the local slice and zeroing). The
    one place both numbers come from: the planner's costs and the plan's per-device traffic."""
    if n <= 1:
        return 0.0, 0
    frac = (n - 1) / n
    rounds = (n - 1).bit_length()  # ceil(log2 n)
    if kind == "all_reduce":
        ring = 2 * (n - 1) * latency + 2 * frac * nbytes / bandwidth
        doubling = rounds * (latency + nbytes / bandwidth)
        if ring <= doubling:
            return ring + overhead, round(2 * frac * nbytes)
        return doubling + overhead, rounds * nbytes
    if kind in ("reduce_scatter", "all_gather"):
        return min(n - 1, rounds) * latency + frac * nbytes / bandwidth + overhead, round(frac * nbytes)
    if kind == "all_to_all":
        return (n - 1) * latency + frac * nbytes / bandwidth + overhead, round(frac * nbytes)
    if kind == "slice":
        return nbytes / mem_bandwidth, 0
    return 0.0, 0


def step_time(
    kind: str, n: int, nbytes: int, latency: float, bandwidth: float, overhead: float, mem_bandwidth: float
) -> float:
    """The seconds of ``collective_cost``."""
    return collective_cost(kind, n, nbytes, latency, bandwidth, overhead, mem_bandwidth)[0]


def _split_elsewhere(spec, dim: int, axis: int) -> bool:
    return any(p.is_split and p.dim == dim for a, p in enumerate(spec) if a != axis)


def plan_steps(shape: tuple[int, ...], itemsize: int, src, dst, mesh) -> list[Step]:
    """The collectives (and local steps) that take a tensor from spec ``src`` to ``dst``."""
    return list(_plan_steps(tuple(shape), int(itemsize), tuple(src), tuple(dst), _mesh_key(mesh)))


def redistribution_time(shape, itemsize, src, dst, mesh) -> float:
    if src == dst:
        return 0.0
    return _time(tuple(shape), int(itemsize), tuple(src), tuple(dst), _mesh_key(mesh))


def bucketed_time(shape, itemsize, src, dst, mesh, share_bytes: int) -> float:
    """``redistribution_time`` of an all-reduce that rides in a gradient bucket of
    ``share_bytes`` (passes/bucket.py): its fixed cost (latency rounds and call overhead, the
    time of an empty message) is paid in proportion to its share of the bucket."""
    if src == dst:
        return 0.0
    return _bucketed(tuple(shape), int(itemsize), tuple(src), tuple(dst), _mesh_key(mesh), int(share_bytes))


@lru_cache(maxsize=1 << 16)
def _bucketed(shape, itemsize, src, dst, mesh_key, share: int) -> float:
    return sum(_bucketed_step(s, mesh_key, share) for s in _plan_steps(shape, itemsize, src, dst, mesh_key))


def bucketed_step_time(step: Step, mesh, share_bytes: int) -> float:
    """One step's time when it rides in a bucket of ``share_bytes`` (all-reduces only)."""
    return _bucketed_step(step, _mesh_key(mesh), int(share_bytes))


def _bucketed_step(s: Step, mesh_key, share: int) -> float:
    if s.kind != "all_reduce" or share <= 0:
        return s.time_s
    mesh_shape, links, overhead, mem_bw = mesh_key[:4]
    lat, bw = links[s.axis]
    fixed = step_time("all_reduce", mesh_shape[s.axis], 0, lat, bw, overhead, mem_bw)
    return s.time_s - fixed * (1.0 - min(1.0, s.local_bytes / share))


@lru_cache(maxsize=1 << 18)
def _time(shape, itemsize, src, dst, mesh_key) -> float:
    return sum(s.time_s for s in _plan_steps(shape, itemsize, src, dst, mesh_key))


def _mesh_key(mesh):
    key = getattr(mesh, "_redistribution_key", None)
    if key is not None:
        return key
    prof = mesh.profile
    # more device threads than cores: a collective's copies and sums, and its waits, get the
    # devices' share of the cores (MachineProfile.device_share)
    devices = math.prod(mesh.shape)
    share = prof.device_share(devices)
    links = tuple((mesh.links[name].latency_s / share, mesh.links[name].bandwidth * share) for name in mesh.axis_names)
    key = (tuple(mesh.shape), links, prof.collective_overhead_s / share, prof.concurrent_bandwidth(devices))
    try:
        object.__setattr__(mesh, "_redistribution_key", key)
    except (AttributeError, TypeError):  # pragma: no cover - a mesh that takes no attributes
        pass
    return key


@lru_cache(maxsize=1 << 16)
def _plan_steps(shape, itemsize, src, dst, mesh_key) -> tuple[Step, ...]:
    """The steps from ``src`` to ``dst``, in the order of the module doc: partial sums, re-splits,
    gathers, then local slices and zeroing."""
    steps = _Steps(shape, itemsize, mesh_key, src)
    steps.reduce_partials(dst)
    steps.resplit(dst)
    steps.gather(dst)
    steps.slice_and_zero(src, dst)
    assert tuple(steps.cur) == dst, (src, dst, steps.cur)
    return tuple(steps.steps)


class _Steps:
    """The steps planned so far and the spec they leave the tensor in (``cur``)."""

    def __init__(self, shape, itemsize: int, mesh_key, src) -> None:
        self.shape = shape
        self.itemsize = itemsize
        self.mesh_shape, self.links, self.overhead, self.mem_bw = mesh_key
        self.axes = range(len(self.mesh_shape))
        self.cur: list[Placement] = list(src)
        self.steps: list[Step] = []

    def nbytes(self, spec) -> int:
        """Bytes each device holds of the tensor placed by ``spec``."""
        n = self.itemsize
        for d in local_shape(self.shape, spec, self.mesh_shape):
            n *= d
        return n

    def emit(self, kind: str, axis: int, new: Placement) -> None:
        """Append the step that places the tensor by ``new`` along ``axis``, with its cost."""
        before = tuple(self.cur)
        self.cur[axis] = new
        after = tuple(self.cur)
        b = self.nbytes(after) if kind in ("all_gather", "slice") else self.nbytes(before)
        lat, bw = self.links[axis]
        t, sent = collective_cost(kind, self.mesh_shape[axis], b, lat, bw, self.overhead, self.mem_bw)
        self.steps.append(Step(kind, axis, before, after, b, t, sent))

    def reduce_partials(self, dst) -> None:
        """1. Partial sums: reduce_scatter straight into the target split when no other axis splits
        that dim, else all_reduce."""
        for a in self.axes:
            if self.cur[a].kind != "P" or dst[a].kind == "P":
                continue
            t = dst[a]
            if t.is_split and not _split_elsewhere(self.cur, t.dim, a):
                self.emit("reduce_scatter", a, t)
            else:
                self.emit("all_reduce", a, R)

    def resplit(self, dst) -> None:
        """2. Re-splits: all_to_all from one split to another, or all_gather (slice later) when the
        new dim is split over another axis or is the same dim in other blocks."""
        for a in self.axes:
            if not (self.cur[a].is_split and dst[a].is_split and self.cur[a] != dst[a]):
                continue
            if self.cur[a].dim != dst[a].dim and not _split_elsewhere(self.cur, dst[a].dim, a):
                self.emit("all_to_all", a, dst[a])
            else:
                self.emit("all_gather", a, R)

    def gather(self, dst) -> None:
        """3. Gathers: an axis split now but not in the target."""
        for a in self.axes:
            if self.cur[a].is_split and not dst[a].is_split:
                self.emit("all_gather", a, R)

    def slice_and_zero(self, src, dst) -> None:
        """4. Local steps on what is left (replicated axes): slice to a split, zero to a partial."""
        for a in self.axes:
            if self.cur[a] == dst[a]:
                continue
            if dst[a].is_split:
                self.emit("slice", a, dst[a])
            elif dst[a].kind == "P":
                self.emit("zero", a, P)
            else:  # pragma: no cover - every transition to R was handled above
                raise AssertionError(f"redistribution {format_spec(src)} -> {format_spec(dst)} stuck at {self.cur}")
