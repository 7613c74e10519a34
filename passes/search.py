"""Automatic mesh choice: factor a device count into pipeline, data and tensor axes.

``search_meshes(graph, 8)`` tries every factorization 8 = pp x dp x tp (axes of size 1 left out),
with, for pipelines, micro-batch counts 1, S, 2S and 4S that divide the batch (without pipeline
stages, gradient accumulation over 2, 4, 8, ... micro-batches while the step does not fit at
once: passes/accumulate.py), plans each (the
sharding ILP on {dp, tp}; stages, schedule and the ILP on each stage's sub-mesh for pp > 1) and
ranks them by predicted step time. A candidate that cannot meet the memory limit, or cannot be
planned, stays in the list with the reason; so does one that is skipped without planning, with
why (a micro-batch count the batch does not divide; a mesh that is the same planning problem as
one already planned: axes of equal roles, sizes and links). Axis names carry roles (dp splits
only batch dims, tp anything: graphc/core/roles.py), so dp=8 and tp=8 are different problems.
Links per axis (``links={"dp": Link(...)}``) model a slow network between data-parallel groups;
``pp`` and ``tp`` keep the machine's link unless given one.

A step of repeated layers on the default axes is searched by blocks instead (passes/scale.py,
docs/scale.md): one ILP per tensor-parallel sub-mesh and micro-batch size, stamped over the layers
and composed into layouts with micro-batch sizes, ZeRO and recomputation. Either way the whole
search ends by its deadline (``options.time_limit``); what it did not reach is listed as skipped.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

from graphc.core.errors import GraphcError, MemoryLimitError, PlanError, TimeLimitError
from graphc.core.ir import Graph
from graphc.core.mesh import Mesh
from graphc.core.profile import INTER_NODE_ROLES
from graphc.core.profiles import cluster_figures, load_profile
from graphc.core.roles import axis_role
from graphc.passes.microbatch import batch_inputs
from graphc.passes.offload import not_runnable, offloads_state
from graphc.passes.options import PlanOptions
from graphc.passes.partition import plan_sharding, state_ties
from graphc.passes.pipeline import PipelinePlan, plan_pipeline
from graphc.passes.scale import SOLVER_GAP, ComposedPlan, Layout, layered_model, search_layered
from graphc.passes.sharding.plan import ShardingPlan, graph_hash

AXES = ("pp", "dp", "tp")
TIME_UP = "time limit: the search stopped before reaching it"


@dataclass(slots=True, kw_only=True)
class Candidate:
    axes: dict[str, int]
    microbatches: int
    predicted_s: float | None = None
    comm_s: float | None = None
    bubble: float | None = None
    memory_bytes: int | None = None  # the largest device's predicted peak
    error: str | None = None
    seconds: float = 0.0  # planning time
    plan: ShardingPlan | PipelinePlan | ComposedPlan | None = field(default=None, repr=False)
    skipped: str | None = None  # why it was not planned at all
    layout: Layout | None = None  # the block search's layout (micro-batch size, ZeRO, recompute)
    whole_error: str | None = None  # why the block search's choice kept its composed plan (_plan_whole)
    composed: ComposedPlan | None = field(default=None, repr=False)  # the block search's prediction, when planned whole
    estimate: str | None = None  # a block-search prediction scaled from micro-batch 1, not solved: why
    tie: str | None = None  # why a runnable plan was chosen over a faster prediction within the solver's gap
    over_memory: bool = False  # the error is that no plan fits the memory limit (MemoryLimitError)
    timed_out: bool = False  # the error is that its share of the time ran out before a plan (TimeLimitError)

    @property
    def ok(self) -> bool:
        return self.error is None and self.skipped is None

    @property
    def unreached(self) -> bool:
        """Skipped because the time limit ran out before it (``TIME_UP``, or the block search's)."""
        return (self.skipped or "").startswith("time limit")

    @property
    def mesh_text(self) -> str:
        return _mesh_text(self.axes)

    @property
    def step_s(self) -> float:
        """The predicted step of a feasible candidate."""
        assert self.predicted_s is not None, "no plan"
        return self.predicted_s

    def describe(self) -> str:
        mesh = self.mesh_text
        mb = f", {self.microbatches} micro-batches" if "pp" in self.axes or self.microbatches > 1 else ""
        if self.layout is not None:
            lo = self.layout
            mb = f", micro-batch {lo.micro_batch} x {lo.microbatches}, ZeRO {lo.zero}, recompute {lo.recompute}"
            mb += f", offload {lo.offload}" if lo.offload != "off" else ""
        mb += " (an estimate, not solved)" if self.estimate is not None and self.ok else ""
        if self.skipped is not None:
            return f"{mesh}{mb}: skipped ({self.skipped})"
        if not self.ok:
            return f"{mesh}{mb}: no plan ({self.error})"
        extra = f", bubble {self.bubble:.0%}" if self.bubble is not None else ""
        comm = f", communication {self.comm_s * 1e3:.3f} ms" if self.comm_s is not None else ""
        return (
            f"{mesh}{mb}: predicted step {self.step_s * 1e3:.3f} ms{comm}{extra}, "
            f"peak memory {(self.memory_bytes or 0) / 2**20:.2f} MiB per device"
        )

    def to_json(self) -> dict:
        return {
            "mesh": self.axes,
            "microbatches": self.microbatches,
            "predicted_s": self.predicted_s,
            "comm_s": self.comm_s,
            "bubble": self.bubble,
            "memory_bytes": self.memory_bytes,
            "error": self.error,
            "skipped": self.skipped,
            "seconds": self.seconds,
            "layout": None if self.layout is None else dataclasses.asdict(self.layout),
            "estimate": self.estimate,
        }


def _mesh_text(axes: dict[str, int]) -> str:
    return ",".join(f"{a}={n}" for a, n in axes.items()) or "1 device"


def factorizations(n: int, axes: tuple[str, ...] = AXES) -> list[dict[str, int]]:
    """Every way to write ``n`` as a product over ``axes`` (size-1 axes left out), in a fixed order:
    the first axis ascending, the others descending."""
    if n < 1:
        raise GraphcError(f"the number of devices must be at least 1, got {n}")

    def rec(rest: int, i: int) -> list[list[int]]:  # later axes get the larger sizes first (dp before tp)
        if i == len(axes) - 1:
            return [[rest]]
        sizes = [d for d in range(1, rest + 1) if rest % d == 0]
        return [[d] + tail for d in (sizes if i == 0 else sizes[::-1]) for tail in rec(rest // d, i + 1)]

    out = []
    for sizes in rec(n, 0):
        out.append({a: s for a, s in zip(axes, sizes) if s > 1})
    return out


def _beyond_a_node(shape: dict[str, int], links: dict, profile) -> str | None:
    """Why ``shape`` cannot keep its axes that stay inside a node (tp, sp: not ``INTER_NODE_ROLES``,
    and not given a link of their own) inside one node of the profile's cluster, or None: their
    group of devices must divide the node (6 of 8: ranks 6-11 span two nodes), as the block search
    keeps tp (passes/scale.py ``layouts``)."""
    node = cluster_figures(profile).node_size
    inner = {a: n for a, n in shape.items() if a not in links and axis_role(a) not in INTER_NODE_ROLES}
    size = math.prod(inner.values())
    if node is None or node % size == 0:
        return None
    return (
        f"beyond a node: {_mesh_text(inner)} does not divide a node of {node} devices ({profile.name}), "
        "so a group would span two"
    )


def step_batch(graph: Graph) -> int | None:
    sizes = {graph.inputs[k].type.shape[0] for k in batch_inputs(graph)}
    return min(sizes) if sizes else None


def search_meshes(
    graph: Graph,
    n_devices: int,
    options: PlanOptions = PlanOptions(),
    links: dict | None = None,
    profile=None,
    axes: tuple[str, ...] = AXES,
    microbatches: tuple[int, ...] | None = None,
    progress=None,
    deadline: float | None = None,
) -> list[Candidate]:
    """Plan ``graph`` on every factorization of ``n_devices`` with ``options``, the whole search
    by ``deadline`` (``time.perf_counter()`` seconds; default ``options.time_limit`` from now):
    what it does not reach is listed as skipped. A step of repeated layers on the default axes is
    searched by blocks (passes/scale.py: pp x dp x tp, micro-batch sizes, ZeRO, recomputation);
    any other plans each candidate whole (a pipeline candidate with its own micro-batch count,
    from ``microbatches`` or 1, S, 2S and 4S; a mesh without pipeline stages that does not fit
    the memory limit at once again with more micro-batches, ``accumulation_counts``, until one
    fits), each solve with an even share of the time left for the solves expected from it on.
    Candidates best first (feasible ones by predicted step time, then the infeasible ones, then
    the skipped)."""
    if options.microbatches != 1:  # each candidate takes its own count: a fixed one would be silently dropped
        raise PlanError(
            f"microbatches={options.microbatches} with a search of {n_devices} devices: the search chooses each "
            "mesh's micro-batch count itself; fix the count on one mesh instead (--mesh ... --microbatches k)"
        )
    if deadline is None:
        deadline = time.perf_counter() + options.time_limit
    if time.perf_counter() >= deadline:  # tracing took the whole limit: no candidate is priced, nor blocks found
        return [Candidate(axes=shape, microbatches=1, skipped=TIME_UP) for shape in factorizations(n_devices, axes)]
    profile = profile or load_profile()
    links = links or {}
    batch = step_batch(graph)
    model = layered_model(graph, batch, profile) if axes == AXES and not links and microbatches is None else None
    if model is not None:
        found = _by_blocks(model, n_devices, options, profile, deadline, progress)
        if found and found[0].ok and len(graph.nodes) <= WHOLE_PLAN_NODES:
            _plan_whole(found[0], graph, options, profile, deadline)
        return found
    shapes = factorizations(n_devices, axes)
    return _search_whole(graph, shapes, batch, options, links, profile, microbatches, deadline, progress)


def _search_whole(
    graph: Graph,
    shapes: list[dict[str, int]],
    batch: int | None,
    options: PlanOptions,
    links: dict,
    profile,
    microbatches: tuple[int, ...] | None,
    deadline: float,
    progress,
) -> list[Candidate]:
    """``search_meshes`` of a step not searched by blocks: each mesh shape planned whole."""
    ties = state_ties(graph)
    out: list[Candidate] = []
    seen: dict[tuple, str] = {}  # planning problem -> the mesh that stands for it
    # each solve gets an even share of the time left, so one hard ILP cannot spend every later mesh's
    solves = [len(_counts(s["pp"], batch, microbatches)) if "pp" in s else 1 for s in shapes]  # expected per shape
    again: list[tuple[Candidate, Mesh, PlanOptions]] = []  # cut short by their share: they get the time left
    for i, shape in enumerate(shapes):
        if time.perf_counter() >= deadline:
            out.append(Candidate(axes=dict(shape), microbatches=1, skipped=TIME_UP))
            continue
        mesh_links = {a: link for a, link in links.items() if a in shape}
        beyond = _beyond_a_node(shape, links, profile)
        if beyond is not None:
            out.append(Candidate(axes=dict(shape), microbatches=1, skipped=beyond))
            continue
        key = _problem_key(shape, links, profile)
        if key in seen:
            out.append(Candidate(axes=dict(shape), microbatches=1, skipped=f"the same planning problem as {seen[key]}"))
            continue
        seen[key] = _mesh_text(shape)
        S = shape.get("pp", 1)
        ms = _counts(S, batch, microbatches)
        floors: list[int] = []  # the least memory each count tried on a flat mesh needs
        for j, m in enumerate(ms):
            if S == 1 and m > 1 and not _worth_more(out[-1], floors, options.memory_limit):
                break  # accumulation on a flat mesh: only while the step does not fit with fewer
            if batch is not None and batch % m:
                why = f"indivisible: the batch of {batch} does not split into {m} micro-batches"
                out.append(Candidate(axes=dict(shape), microbatches=m, skipped=why))
                continue
            cand = Candidate(axes=dict(shape), microbatches=m)
            start = time.perf_counter()
            if start >= deadline:
                cand.skipped = TIME_UP
                out.append(cand)
                continue
            left = (len(ms) - j if S > 1 else 1) + sum(solves[i + 1 :])  # this solve and those expected after it
            options = dataclasses.replace(options, time_limit=max((deadline - start) / left, 0.1))
            mesh = Mesh(shape or {"dp": 1}, links=mesh_links or None, profile=profile)
            floor = _plan_one(cand, graph, mesh, ties, options)
            if cand.timed_out:
                again.append((cand, mesh, options))
            if S == 1 and m > 1 and floor is not None:
                floors.append(floor)
            cand.seconds = time.perf_counter() - start
            out.append(cand)
            if progress is not None:
                progress(cand)
    _plan_again(again, graph, ties, deadline, progress)
    # feasible by predicted step, then the infeasible, then the skipped
    out.sort(key=lambda c: (c.skipped is not None, not c.ok, c.step_s if c.ok else 0.0))
    return out


def _problem_key(shape: dict[str, int], links: dict, profile) -> tuple:
    """Axes of one role, size and link are one problem whatever their names ({model: 4} and
    {tp: 4}); the roles differ between dp and tp, so {dp: 4} and {tp: 4} are two."""
    flat = ((axis_role(a), n, str(links.get(a, profile.link_for(a)))) for a, n in shape.items() if a != "pp")
    return (shape.get("pp", 1), tuple(sorted(flat)))


def _plan_again(
    again: list[tuple[Candidate, Mesh, PlanOptions]], graph: Graph, ties, deadline: float, progress
) -> None:
    """Plan again the candidates whose share of the time ran out before the solver found a plan
    (``TimeLimitError``), in search order, each with an even share of what the search has left."""
    for k, (cand, mesh, options) in enumerate(again):
        start = time.perf_counter()
        if start >= deadline:
            return
        cand.error, cand.timed_out = None, False
        _plan_one(
            cand, graph, mesh, ties, dataclasses.replace(options, time_limit=(deadline - start) / (len(again) - k))
        )
        cand.seconds += time.perf_counter() - start
        if progress is not None:
            progress(cand)


def _counts(S: int, batch: int | None, microbatches: tuple[int, ...] | None) -> list[int]:
    """The micro-batch counts a mesh of ``S`` pipeline stages tries (``search_meshes``)."""
    if S > 1:
        return list(microbatches or sorted({1, S, 2 * S, 4 * S}))
    if batch is not None and microbatches is None:
        return [1, *accumulation_counts(batch)]  # tried only while the fewer do not fit
    return [1]


def _plan_one(cand: Candidate, graph: Graph, mesh: Mesh, ties, options: PlanOptions) -> int | None:
    """Plan ``cand`` on ``mesh`` (its error when it cannot be); the least memory a plan needs when
    that is why not and the solver said how much (else None)."""
    try:
        if "pp" not in cand.axes and cand.microbatches == 1:  # no pipeline (an empty shape: one device)
            _plan_flat(cand, graph, mesh, ties, options)
        else:  # plan_pipeline also plans gradient accumulation on a mesh without pp
            _plan_pipelined(cand, graph, mesh, dataclasses.replace(options, microbatches=cand.microbatches), ties)
    except PlanError as exc:
        cand.error = str(exc).splitlines()[0]
        cand.over_memory = isinstance(exc, MemoryLimitError)
        cand.timed_out = isinstance(exc, TimeLimitError)
        return getattr(exc, "min_memory_bytes", None) or cand.memory_bytes  # the ILP's least, else the plan's peak
    return None


def accumulation_counts(batch: int) -> list[int]:
    """The micro-batch counts a mesh without pipeline stages tries when the whole batch does not
    fit at once: divisors of ``batch``, each at least twice the last (2, 4, 8, ... for a power of
    two), so that a handful of solves halves the activations each time. The search stops at the
    first count that fits: more passes of smaller micro-batches pay their ops' fixed costs again
    and run no op faster, so a larger count would mostly cost search time (on the MLP of
    tests/passes/test_search.py, tp=2 at 2 micro-batches is predicted 1.8% slower than at 1)."""
    out: list[int] = []
    for d in range(2, batch + 1):
        if batch % d == 0 and d >= 2 * (out[-1] if out else 1):
            out.append(d)
    return out


def _worth_more(last: Candidate, floors: list[int], limit: int | None) -> bool:
    """Whether a flat mesh should try the next micro-batch count after ``last``: only when
    ``last`` did not fit the memory limit (and failed for nothing else), and more micro-batches
    can still reach the limit. A count's activations halve with each doubling, so when the last
    doubling lowered the least memory needed by d, every later one together lowers it by less
    than d: once the excess over the limit is larger, no count fits (``floors``: the least
    memory each count over 1 needed, in order)."""
    if last.ok or last.skipped is not None or limit is None:
        return False
    if not last.over_memory:
        return False  # the step cannot be planned on this mesh at all
    if len(floors) >= 2:
        drop, excess = floors[-2] - floors[-1], floors[-1] - limit
        return excess < drop
    return True


def _by_blocks(model, n_devices: int, options: PlanOptions, profile, deadline: float, progress) -> list[Candidate]:
    """The block search (passes/scale.py), its layouts as candidates."""
    begun = time.perf_counter()
    hashed = graph_hash(model.graph)  # the chosen plan names its graph: hashed before the deadline, not after
    deadline -= time.perf_counter() - begun  # as long again for writing the plan after the search
    out = []
    for o in search_layered(model, n_devices, options, profile, deadline):
        lo = o.layout
        cand = Candidate(axes=lo.axes, microbatches=lo.microbatches, layout=lo, seconds=o.seconds)
        cand.skipped, cand.error, cand.estimate = o.skipped, o.error, o.unsolved
        if o.plan is not None:
            cand.plan = o.plan
            cand.predicted_s = o.plan.predicted["step_s"]
            cand.comm_s = o.plan.predicted["comm_s"]
            cand.bubble = o.plan.predicted["bubble"] if lo.pp > 1 else None
            cand.memory_bytes = max(o.plan.memory_bytes)
        out.append(cand)
        if progress is not None and cand.skipped is None:
            progress(cand)
    out.sort(key=lambda c: (c.skipped is not None, not c.ok, c.step_s if c.ok else 0.0))
    _prefer_runnable(out)
    if out and isinstance(out[0].plan, ComposedPlan):  # the chosen plan names the graph it was made for
        out[0].plan = dataclasses.replace(out[0].plan, graph_hash=hashed)
    return out


def _prefer_runnable(out: list[Candidate]) -> None:
    """Put first the best plan graphc can run (one that offloads nothing: the runtime has no host
    tier) when it is within the solver's relative gap (``SOLVER_GAP``) of the best plan, which
    offloads: a difference that small is a tie the ILP does not split. ``out`` best first."""
    if not out or not out[0].ok or out[0].layout is None or out[0].layout.offload == "off":
        return
    best = out[0]
    at = next((i for i, c in enumerate(out) if c.ok and c.layout is not None and c.layout.offload == "off"), None)
    if at is None or out[at].step_s > best.step_s * (1 + SOLVER_GAP):
        return
    runnable = out.pop(at)
    runnable.tie = (
        f"chosen over {best.describe().split(':')[0]} (only {(runnable.step_s / best.step_s - 1):.3%} slower, within the "
        f"solver's relative gap of {SOLVER_GAP:.1%}), which offloads and so cannot run here"
    )
    out.insert(0, runnable)


# a step up to this many nodes (a few dozen layers of a small model) has the block search's choice
# planned whole, so the plan it returns runs; larger steps keep the composed plan (a prediction)
WHOLE_PLAN_NODES = 6000


# why a layout that offloads stays a prediction (docs/remat.md, "Offload")
OFFLOAD_WHY = "it offloads the optimizer state or activations, which only the block search's prediction models (no host tier here)"


def _plan_whole(cand: Candidate, graph: Graph, options: PlanOptions, profile, deadline: float) -> None:
    """Replace the block search's composed plan for ``cand`` by the whole-graph plan of its layout
    (its mesh and micro-batch count; ZeRO and recomputation as ``options`` say), which
    ``graphc run`` and ``parallelize`` can run; keep the composed plan when the time is up or the
    whole plan cannot be made (the reason in ``cand.whole_error``)."""
    assert cand.layout is not None
    start = time.perf_counter()
    if start >= deadline:
        cand.whole_error = "the time limit ran out before the chosen layout could be planned whole"
        return
    lo = cand.layout
    if lo.offload != "off":  # the runtime has no host tier: a whole plan would silently keep the state
        cand.whole_error = OFFLOAD_WHY
        return
    opts = dataclasses.replace(options, microbatches=lo.microbatches, time_limit=max(deadline - start, 0.1))
    fake = Candidate(axes=lo.axes, microbatches=lo.microbatches)
    try:
        mesh = Mesh(lo.axes or {"dp": 1}, profile=profile)
        if lo.pp > 1 or lo.microbatches > 1:  # plan_pipeline also plans accumulation on a mesh without pp
            _plan_pipelined(fake, graph, mesh, opts, state_ties(graph))
        else:
            _plan_flat(fake, graph, mesh, state_ties(graph), opts)
    except PlanError as exc:
        cand.whole_error = str(exc).splitlines()[0]
        return
    assert isinstance(cand.plan, ComposedPlan)
    cand.composed, cand.plan = cand.plan, fake.plan
    cand.seconds += time.perf_counter() - start


def _plan_flat(cand: Candidate, graph: Graph, mesh: Mesh, ties, options: PlanOptions) -> None:
    plan = plan_sharding(graph, mesh, ties=ties, options=options)
    if plan.offload is not None:  # fits only offloading: a plan the runtime here cannot run
        raise not_runnable(plan.offload, mesh.profile.name)
    cand.predicted_s, cand.comm_s = plan.cost.total_s, plan.cost.comm_s
    cand.memory_bytes = max(plan.memory.peak_bytes)
    cand.plan = plan


def _plan_pipelined(cand: Candidate, graph: Graph, mesh: Mesh, options: PlanOptions, ties) -> None:
    plan = plan_pipeline(graph, mesh, options, ties=ties)
    if plan.sub_plan is not None and plan.sub_plan.offload is not None:  # as in _plan_flat
        raise not_runnable(plan.sub_plan.offload, mesh.profile.name)
    memory_limit = options.memory_limit
    cand.predicted_s = plan.predicted["step_s"]
    cand.bubble = plan.predicted["bubble"] if "pp" in cand.axes else None  # accumulation alone has none
    cand.memory_bytes = max(plan.memory_bytes)
    if plan.sub_plan is not None:
        cand.comm_s = plan.sub_plan.cost.comm_s
    if memory_limit is not None and cand.memory_bytes > memory_limit:
        raise MemoryLimitError(f"stage memory {cand.memory_bytes:,} B over the limit")
    cand.plan = plan


def explain(cands: list[Candidate], shown: int = 6, verbose: bool = False) -> str:
    """The choice and the runners-up, with why the winner wins; a line on what was considered
    and skipped, and with ``verbose`` every candidate."""
    planned = [c for c in cands if c.skipped is None]
    ok = [c for c in planned if c.ok]
    lines = [_considered(cands) + ("" if verbose else " (--verbose lists each)")]
    if verbose:
        lines += [f"  {c.describe()}" for c in cands]
    if not ok:
        late = any(c.unreached for c in cands)
        lines.append("no plan was made before the time limit ran out:" if late else "no mesh can run this step:")
        lines += [f"  {c.describe()}" for c in planned[:shown]]
        return "\n".join(lines)
    best = ok[0]
    lines.append(f"chose {best.describe()}")
    if isinstance(best.plan, ComposedPlan):
        offloads = best.layout is not None and best.layout.offload != "off"
        why = best.whole_error or (
            OFFLOAD_WHY if offloads else f"a step of over {WHOLE_PLAN_NODES:,} nodes is not planned whole"
        )
        lines.append(
            f"the plan written is the block search's prediction, not a plan to run ({why}): compile the chosen mesh with --mesh to run it"
        )
    elif best.layout is not None:
        lines.append("the chosen layout was then planned whole: the plan written runs (graphc run --plan)")
    lines.append("why: " + _why(best, ok))
    if verbose:
        return "\n".join(lines)
    for c in ok[1:shown]:
        lines.append(f"  runner-up {c.describe()} ({c.step_s / best.step_s:.2f}x the chosen step)")
    bad = [c for c in planned if not c.ok]
    for c in bad[:shown]:
        lines.append(f"  rejected {c.describe()}")
    if len(bad) > shown:
        lines.append(f"  ... and {len(bad) - shown} more rejected")
    return "\n".join(lines)


def _considered(cands: list[Candidate]) -> str:
    """One line: the mesh shapes considered, how many candidates were planned, feasible,
    infeasible and skipped (and why)."""
    shapes = sorted({c.mesh_text for c in cands})
    planned = [c for c in cands if c.skipped is None]
    skipped = [c for c in cands if c.skipped is not None]
    reasons: dict[str, int] = {}
    for c in cands:
        if c.skipped is None:
            continue
        why = c.skipped.split(":")[0] if c.skipped.split(":")[0] in _KINDS else c.skipped
        why = "indivisible micro-batch counts" if why == "indivisible" else why
        reasons[why] = reasons.get(why, 0) + 1
    text = (
        f"considered {len(shapes)} mesh shapes ({'; '.join(shapes)}): planned {len(planned)} candidates "
        f"({sum(c.ok for c in planned)} feasible)"
    )
    if skipped:
        text += f", skipped {len(skipped)} (" + "; ".join(f"{n} {why}" for why, n in reasons.items()) + ")"
    return text


_KINDS = ("indivisible", "time limit", "memory bound", "compute bound", "beyond a node")


def _why(best: Candidate, ok: list[Candidate]) -> str:
    piped = "pp" in best.axes
    other = next((c for c in ok[1:] if ("pp" in c.axes) != piped), None)
    parts = [best.tie] if best.tie is not None else [f"the lowest predicted step of {len(ok)} feasible plans"]
    estimates = [c for c in ok if c.estimate is not None]
    if estimates:
        parts[0] += (
            f" ({len(estimates)} of them estimates scaled from micro-batch 1, not solved: "
            f"{estimates[0].estimate}; --verbose marks them)"
        )
    if other is not None:
        if piped:
            parts.append(
                f"the best plan without a pipeline ({other.describe().split(':')[0]}) is "
                f"{other.step_s / best.step_s:.2f}x slower"
                + (f", {other.comm_s * 1e3:.3f} ms of it communication" if other.comm_s else "")
            )
        else:
            parts.append(
                f"the best pipeline ({other.describe().split(':')[0]}) is {other.step_s / best.step_s:.2f}x "
                f"slower, {other.bubble or 0.0:.0%} of it bubble"
            )
    if best.layout is not None and best.layout.offload != "off":  # offload is chosen only to fit or to be faster
        kept = next((c for c in ok if c.layout is not None and c.layout.offload == "off"), None)
        what = "the optimizer state" if offloads_state(best.layout.offload) else "the activations"
        parts.append(
            f"no plan that keeps {what} on the device fits"
            if kept is None
            else f"the best plan keeping {what} on the device ({kept.describe().split(':')[0]}) is "
            f"{kept.step_s / best.step_s:.2f}x slower"
        )
    return "; ".join(parts)


__all__ = ["AXES", "WHOLE_PLAN_NODES", "Candidate", "explain", "factorizations", "search_meshes", "step_batch"]
