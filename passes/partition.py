"""The partition pipeline: a traced graph on a device mesh -> a ShardingPlan -> device programs.

    graph
      -> optimize_for_planning   fold, simplify, CSE, DCE (fusion waits: it runs per device)
      -> build_problem           items, strategies, edges and costs on the mesh, pins and ties applied
      -> shrink                  repeated layers tied, elementwise followers merged
      -> solve                   the ILP, memory limit included (shrink + solve: solve_problem)
      -> make_plan               the frozen ShardingPlan
      -> lower                   one program per device, collectives in place (passes/lower.py)
      -> compile_devices         CSE, DCE and fusion of every device program; ZeRO-3's gathers per use

Each step is a plain function of named inputs. ``plan_sharding`` runs the planning steps and
``partition`` all of them; ``graphc.parallelize``, ``graphc compile``, micro-batching and the
pipeline planner call these functions and nothing else of the sharding machinery.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphc.core.cache import private_dir, read_entry, warn_cache, write_entry
from graphc.core.collector import collector_paused
from graphc.core.errors import PlanError, PlanWarning, user_stacklevel
from graphc.core.ir import Graph
from graphc.core.mesh import Mesh
from graphc.core.pytree import StateUpdate, TreeDef, call_arguments, top_level
from graphc.passes.bucket import bucket_all_reduces
from graphc.passes.lower import lower_graph, regather
from graphc.passes.manager import optimize
from graphc.passes.options import PlanOptions
from graphc.passes.recompute.choices import add_recompute, recompute_mode
from graphc.passes.sharding.build import plan_from_solution
from graphc.passes.sharding.groups import Group, shrink_groups
from graphc.passes.sharding.ilp import Solution, solve
from graphc.passes.sharding.offload_terms import solve_offloading
from graphc.passes.sharding.plan import ShardingPlan
from graphc.passes.sharding.problem import Pins, Problem, apply_ties, items_and_edges, pin_nodes
from graphc.passes.sharding.zero import restrict_zero
from graphc.programs import ParallelProgram

PLAN_PASSES = ("fold_constants", "simplify", "cse", "dce", "recompute_cheap")  # fusion runs per device, after lowering
DEVICE_PASSES = ("cse", "batch_projections", "batch_products", "batch_windows", "cse", "dce", "recompute_cheap", "fuse")
PLANNER_VERSION = 27  # part of the plan cache key: bump when rules or costs change what a plan says


# --- the steps ----------------------------------------------------------------------------------------


# Making the plan and writing its file take about as long as building the problem did: 1.15x on
# LLaMA-3-8B (1.0 + 0.5 s against 1.3 s), 0.8-0.9x on the 1,000-layer GPT (7.6-10 s and 2.6-4.9
# s against 11-14 s, loaded: docs/solver.md); the solver gets the rest of the time limit.
PLAN_RESERVE = 1.2


def optimize_for_planning(graph: Graph) -> Graph:
    return optimize(graph, PLAN_PASSES)


@collector_paused()
def build_problem(
    graph: Graph,
    mesh: Mesh,
    options: PlanOptions = PlanOptions(),
    pins: Pins = Pins(),
    ties: list[tuple[int, int]] | None = None,
) -> Problem:
    """The sharding problem of ``graph`` on ``mesh`` planned with ``options``: its items and edges
    (passes/sharding/problem.py), a forced ZeRO stage, the state ties and the node pins applied,
    and recompute strategies for its candidates (``recompute_mode``)."""
    ties = list(ties or [])
    problem = items_and_edges(graph, mesh, options, pins, ties)
    restrict_zero(problem)
    apply_ties(problem, ties)
    if pins.nodes:
        pin_nodes(problem, dict(pins.nodes))
    add_recompute(problem, recompute_mode(options))
    return problem


def shrink(problem: Problem, enabled: bool = True) -> tuple[list[Group], list[int]]:
    """Groups of items that share a strategy variable, and each item's group."""
    return shrink_groups(problem, tie=enabled, follow=None if enabled else False)


def solve_problem(
    problem: Problem,
    options: PlanOptions = PlanOptions(),
    progress: Callable[[str], None] | None = None,
    time_limit_s: float | None = None,
) -> Solution:
    """shrink -> solve, both within ``time_limit_s`` seconds (default ``options.time_limit``); when
    no plan fits the memory limit, solve again letting the solver offload optimizer state to host
    memory (or stashed activations), on a profile with a host tier (passes/sharding/offload_terms.py)."""
    start = time.perf_counter()
    groups, of = shrink(problem, options.shrink)
    limit = (options.time_limit if time_limit_s is None else time_limit_s) - (time.perf_counter() - start)
    try:
        return solve(problem, groups, of, options.memory_limit, limit, options.solver, progress)
    except PlanError as exc:  # nothing fits keeping everything on the device: may some live in host memory?

        def again(offload: bool | str) -> Solution:
            limit = (options.time_limit if time_limit_s is None else time_limit_s) - (time.perf_counter() - start)
            return solve(problem, groups, of, options.memory_limit, limit, options.solver, progress, offload=offload)

        return solve_offloading(problem, exc, again, progress)


def make_plan(
    problem: Problem, solution: Solution, options: PlanOptions, build_s: float, hashed: str | None = None
) -> ShardingPlan:
    """The plan of ``solution``; leaves ``problem`` re-bucketed to the buckets the plan fills.
    ``hashed``: ``graph_hash(problem.graph)``, if the caller has it."""
    return plan_from_solution(problem, solution, options, build_s, hashed=hashed)


def plan_sharding(
    graph: Graph,
    mesh: Mesh,
    pins: Pins = Pins(),
    ties: list[tuple[int, int]] | None = None,
    options: PlanOptions = PlanOptions(),
    progress: Callable[[str], None] | None = None,
    deadline: float | None = None,
) -> ShardingPlan:
    """build_problem -> shrink -> solve -> make_plan, done by ``deadline`` (``time.perf_counter()``
    seconds; default: ``options.time_limit`` from now). The solver gets what the other steps
    leave: ``PLAN_RESERVE`` times the problem's build time, and 0.2 s to write and exit, are kept
    back for making the plan and writing it."""
    start = time.perf_counter()
    if deadline is None:
        deadline = start + options.time_limit
    problem = build_problem(graph, mesh, options, pins, ties)
    build_s = time.perf_counter() - start
    budget = deadline - time.perf_counter() - PLAN_RESERVE * build_s - 0.2
    solution = solve_problem(problem, options, progress, budget)
    _say_stopped(progress, solution, budget, options)
    return make_plan(problem, solution, options, build_s)


def _say_stopped(
    progress: Callable[[str], None] | None, solution: Solution, budget: float, options: PlanOptions
) -> None:
    """Say that the solver stopped short of optimality, and the share of the time limit it had:
    what tracing and building the problem left, less what making and writing the plan keep back
    (on a loaded machine a deep model's tracing can spend all of it)."""
    if progress and solution.status != "optimal":
        progress(
            f"ILP: stopped at the time limit ({solution.status}) with gap {solution.gap:.2%}: it had "
            f"{max(budget, 0.0):.1f} s of the {options.time_limit:g} s limit (tracing and building the problem "
            "took the rest, less what making and writing the plan keep back; a larger --time-limit solves further)"
        )


@dataclass(frozen=True)
class Choices:
    """What a solved problem chose, by what each strategy is (its name and specs), not by its
    position in the item's list: a graph equal to the solved one up to dim sizes (a generation
    loop whose cache slice grows by one token a call) takes these over without the solver.
    ``context``: the mesh, pins and options they were solved under."""

    context: str
    labels: tuple[tuple[str, str], ...]  # per item: its kind and its node's op
    strategies: tuple[tuple, ...]  # per item: the chosen strategy's name, specs and recompute
    # the figures of the solve that made them (status, gap, problem sizes): a plan that reuses
    # them reports that solve's, since it has none of its own (plan.py ``_solver_line``)
    solved: tuple[tuple[str, Any], ...] = ()


def _labels(problem: Problem) -> tuple[tuple[str, str], ...]:
    return tuple((it.kind, it.node.op.name if it.node is not None else "") for it in problem.items)


def _strategy_key(st) -> tuple:
    return (st.name, st.in_specs, st.out_specs, st.recompute)


def _context(mesh: Mesh, pins: Pins, options: PlanOptions) -> str:
    return json.dumps([mesh.to_json(), pins.to_json(), options.to_json()], sort_keys=True, default=str)


def choices_of(problem: Problem, solution: Solution, pins: Pins, options: PlanOptions, previous=None) -> Choices:
    """The choices ``solution`` made, with the figures of the solve that made them (``previous``'s
    when ``solution`` reused them)."""
    keys = tuple(_strategy_key(it.strategies[c]) for it, c in zip(problem.items, solution.choice))
    if solution.status == "reused" and previous is not None:
        solved = previous.solved
    else:
        sizes = {k: v for k, v in solution.stats.items() if k in _SOLVE_SIZES}
        solved = tuple({"status": solution.status, "gap": solution.gap, **sizes}.items())
    return Choices(_context(problem.mesh, pins, options), _labels(problem), keys, solved)


_SOLVE_SIZES = ("variables", "constraints", "vars_unshrunk", "groups")  # a solve's sizes a reuse reports


def reuse_choices(problem: Problem, previous: Choices, pins: Pins, options: PlanOptions) -> Solution | None:
    """A solution of ``problem`` that makes ``previous``'s choices, or None when it cannot: another
    mesh, pins or options; items of other kinds or ops; a chosen strategy this problem does not
    offer (its dims no longer divide by the mesh axes: the strategies were made for the new
    sizes); a recomputation the problem rules out; or a peak over the memory limit (the memory
    model evaluated at the new sizes). The solver is not called."""
    start = time.perf_counter()
    if previous.context != _context(problem.mesh, pins, options) or previous.labels != _labels(problem):
        return None
    choice = []
    for it, key in zip(problem.items, previous.strategies):
        found = [k for k, st in enumerate(it.strategies) if _strategy_key(st) == key]
        if not found:
            return None
        choice.append(found[0])
    if any(choice[i] != choice[o] for i, o in problem.ties) or not problem.recompute_allowed(choice):
        return None
    if options.memory_limit is not None and problem.memory.peak(choice)[0] > options.memory_limit:
        return None
    total = problem.costs.evaluate(choice)["total_s"]
    # the solve that made the choices, as ``reused_...`` sizes: this problem was not solved
    stats = {"items": len(problem.items), "edges": len(problem.edges)}
    stats.update({f"reused_{k}": v for k, v in previous.solved})
    # nothing is proven about a reused choice: the bound is 0 and the gap 100%
    return Solution(choice, total, "reused", 0.0, 1.0, time.perf_counter() - start, stats, [1] * len(choice))


def plan_sharding_reusing(
    graph: Graph,
    mesh: Mesh,
    previous: Choices | None,
    pins: Pins = Pins(),
    ties: list[tuple[int, int]] | None = None,
    options: PlanOptions = PlanOptions(),
    progress: Callable[[str], None] | None = None,
    deadline: float | None = None,
    hashed: str | None = None,
) -> tuple[ShardingPlan, Choices | None]:
    """``plan_sharding``, taking over ``previous``'s choices when they fit this graph (plan
    status "reused", ``reuse_choices``), else solved; and the choices of the plan made (None
    for a plan the solver cut short: it is not passed on). ``hashed``: ``graph_hash(graph)``, if
    the caller has it (the graph's text is printed once)."""
    start = time.perf_counter()
    if deadline is None:
        deadline = start + options.time_limit
    problem = build_problem(graph, mesh, options, pins, ties)
    build_s = time.perf_counter() - start
    solution = reuse_choices(problem, previous, pins, options) if previous is not None else None
    if solution is None:
        budget = deadline - time.perf_counter() - PLAN_RESERVE * build_s - 0.2
        solution = solve_problem(problem, options, progress, budget)
        _say_stopped(progress, solution, budget, options)
    made = (
        choices_of(problem, solution, pins, options, previous) if solution.status in ("optimal", "reused") else previous
    )
    return make_plan(problem, solution, options, build_s, hashed), made


def lower(graph: Graph, plan: ShardingPlan) -> ParallelProgram:
    """One program per device of the plan's mesh (passes/lower.py), its deferred all-reduces
    in gradient buckets of the plan's size (passes/bucket.py), verified."""
    program = lower_graph(graph, plan)
    bucket_bytes = plan.options.bucket_bytes
    if bucket_bytes:
        devices = tuple(p.with_graph(bucket_all_reduces(p.graph, bucket_bytes)) for p in program.devices)
        program = ParallelProgram(program.mesh, devices, program.in_types, program.out_types)
    return program.verify()


def compile_devices(
    program: ParallelProgram, passes: tuple[str, ...] = DEVICE_PASSES, regather_inputs: frozenset[int] = frozenset()
) -> ParallelProgram:
    """The device passes (CSE, DCE, fusion: the same kernels as on one device, local shapes) on
    every device program, then ``regather`` of the ZeRO-3 parameters at ``regather_inputs``
    (``zero3_inputs(plan)``), verified again."""
    devices = tuple(p.with_graph(regather(optimize(p.graph, passes), regather_inputs)) for p in program.devices)
    return ParallelProgram(program.mesh, devices, program.in_types, program.out_types).verify()


@dataclass(frozen=True)
class Partitioned:
    """Everything ``partition`` made: the graph it planned, the plan, the lowered device programs
    and the compiled ones the runtime runs."""

    graph: Graph
    plan: ShardingPlan
    lowered: ParallelProgram
    program: ParallelProgram


def partition(
    graph: Graph,
    mesh: Mesh,
    pins: Pins = Pins(),
    ties: list[tuple[int, int]] | None = None,
    options: PlanOptions = PlanOptions(),
    plan: ShardingPlan | None = None,
    progress: Callable[[str], None] | None = None,
) -> Partitioned:
    """The whole pipeline on a traced ``graph`` (or, with ``plan``, everything after planning:
    the plan is checked against the optimized graph and followed exactly)."""
    optimized = optimize_for_planning(graph)
    if plan is None:
        plan = plan_sharding(optimized, mesh, pins, ties, options, progress)
    else:
        plan.check(optimized)
    lowered = lower(optimized, plan)
    return Partitioned(optimized, plan, lowered, compile_devices(lowered, regather_inputs=zero3_inputs(plan)))


def zero3_inputs(plan: ShardingPlan) -> frozenset[int]:
    """Positions of the inputs a plan keeps at ZeRO stage 3 (passes/sharding/zero.py): their
    gathers are made again for every reader (``compile_devices``)."""
    return frozenset(x.index for x in plan.inputs if x.zero == 3)


# --- what a training step's signature says ---------------------------------------------------------


def state_ties(graph: Graph) -> list[tuple[int, int]]:
    """(input leaf, output leaf) pairs of outputs that replace an argument of the same structure,
    shapes and dtypes (new parameters for old, new optimizer state): tied to one spec, so a loop
    of steps never reshards its state. A dict is the same structure in any key order (a step that
    rebuilds its parameters' dict in another order still returns them): leaves pair by key.
    Every array the function wrote into an argument object (a KV cache on ``self``, a model's
    weights assigned on the object it returns: a ``StateUpdate``) is tied to the input it
    replaces first, so the planner, micro-batching and pipelines all see it as state."""
    node = graph.out_tree.node
    if node is None or node.cls is not StateUpdate:
        return _returned_ties(graph)
    ties, first = [], graph.out_tree.children[0].num_leaves
    for place, tree in zip(node.aux, graph.out_tree.children[1:]):
        if place.input_leaf is not None and tree.kind == "leaf":
            if graph.inputs[place.input_leaf].type == graph.outputs[first].type:
                ties.append((place.input_leaf, first))
        first += tree.num_leaves
    tied_in, tied_out = {i for i, _o in ties}, {o for _i, o in ties}
    return ties + [(i, o) for i, o in _returned_ties(graph) if i not in tied_in and o not in tied_out]


def _returned_ties(graph: Graph) -> list[tuple[int, int]]:
    """``state_ties`` of the arguments the step returns replaced."""
    in_types = [v.type for v in graph.inputs]
    out_types = [v.type for v in graph.outputs]
    used: set[int] = set()
    ties = []

    def signature(tree: TreeDef, first: int, types: list) -> tuple[tuple, list[int]]:
        order: list[int] = []
        text = _keyed_structure(tree, first, order)
        return (text, tuple(types[i] for i in order)), order

    # each argument's signature once (a model's parameters: thousands of leaves)
    in_sigs = [signature(it, ifirst, in_types) for it, ifirst in call_arguments(graph.in_tree)]
    for pos, (ot, ofirst) in enumerate(top_level(graph.out_tree)):
        if ot.num_leaves == 0:
            continue
        sig, out_order = signature(ot, ofirst, out_types)
        candidates = [j for j, (in_sig, _o) in enumerate(in_sigs) if j not in used and in_sig == sig]
        if not candidates:
            continue
        j = pos if pos in candidates else candidates[0]
        used.add(j)
        ties += sorted(zip(in_sigs[j][1], out_order))
    return ties


def warn_untied(graph: Graph, inputs: list[int], tied: set[int]) -> None:
    """A ``PlanWarning`` when a step returns updated values of the types of its inputs at
    positions ``inputs`` (its layers' parameters) yet ties none of them to an output (``tied``, from
    ``state_ties``): new parameters returned in another structure, which the planner would see as
    constants, with no gradient reduction, optimizer state or update priced for them. (Frozen
    layers, whose new values the step does not return, are not warned about.)"""
    if not inputs or any(k in tied for k in inputs):
        return
    params = [graph.inputs[k] for k in inputs]
    need = Counter(v.type for v in params)
    made = Counter(o.type for o in graph.outputs if o.producer is not None and o.producer.part == "update")
    if any(made[t] < c for t, c in need.items()):  # not one updated value per parameter of a layer
        return
    names = ", ".join(v.name or "?" for v in params[:3]) + (", ..." if len(params) > 3 else "")
    where = next((f"{n.loc}: " for n in graph.nodes if n.part == "update" and n.loc is not None), "")
    warnings.warn(
        f"{where}{graph.name}: the step has an update but returns no new value for its layers' parameters "
        f"({names}) in the structure they were passed in (the same nesting, keys, shapes and dtypes), "
        "so they are planned as constants: no gradient reduction, optimizer state or update is priced "
        "for them; return the new parameters in the argument's structure",
        PlanWarning,
        stacklevel=user_stacklevel(),
    )


def _keyed_structure(t: TreeDef, first: int, order: list[int]) -> str:
    """The tree's structure with every dict's keys in sorted order (static leaves as their repr),
    appending its dynamic leaves' positions (from ``first``) to ``order`` in that order."""
    if t.kind == "leaf":
        order.append(first)
        return "*"
    if t.kind == "static":
        return repr(t.value)
    items, start = [], first
    for k, c in zip(t.keys if t.kind == "dict" else range(len(t.children)), t.children):
        items.append((repr(k), c, start))
        start += c.num_leaves
    if t.kind == "dict":
        items.sort(key=lambda x: x[0])
    inner = ", ".join(f"{k}: {_keyed_structure(c, s, order)}" for k, c, s in items)
    return f"{t.node.name if t.node is not None else ''}{t.kind}({inner})"


# --- the plan cache ----------------------------------------------------------------------------------


class PlanCache:
    """Solved plans on disk, keyed by the graph's hash, the mesh and the planning inputs: re-planning
    an unchanged model only re-traces it. Entries are sealed with their key and their own hash
    (graphc/core/cache.py): a tampered, corrupt or stale entry is discarded with a warning and the
    plan solved again; a folder that is not the user's alone is not used."""

    def __init__(self, folder: str):
        self.folder = folder

    def key(self, graph_hash: str, mesh: Mesh, pins: Pins, ties, options: PlanOptions) -> str:
        # axis order matters (specs are per axis position): the mesh's JSON keeps it
        parts = [
            PLANNER_VERSION,
            graph_hash,
            mesh.to_json(),
            pins.to_json(),
            [list(t) for t in ties or []],
            options.to_json(),
        ]
        return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]

    def _path(self, key: str) -> str | None:
        folder = private_dir(self.folder)
        return None if folder is None else os.path.join(folder, f"{key}.plan")

    def get(self, key: str) -> ShardingPlan | None:
        path = self._path(key)
        payload = read_entry(path, key) if path else None
        if path is None or payload is None:
            return None
        try:
            return ShardingPlan.from_json(payload.decode(), path)
        except (PlanError, UnicodeDecodeError) as exc:  # sealed, yet not a plan this graphc reads
            warn_cache(path, f"cached plan is not readable ({exc})", "discarded; the plan is solved again")
            os.unlink(path)
            return None

    def put(self, key: str, plan: ShardingPlan) -> None:
        path = self._path(key)
        if path is not None:
            write_entry(path, key, plan.to_json().encode())


__all__ = [
    "Choices",
    "DEVICE_PASSES",
    "PLAN_PASSES",
    "Partitioned",
    "PlanCache",
    "Pins",
    "build_problem",
    "choices_of",
    "compile_devices",
    "lower",
    "make_plan",
    "optimize_for_planning",
    "partition",
    "plan_sharding",
    "plan_sharding_reusing",
    "reuse_choices",
    "shrink",
    "solve_problem",
    "state_ties",
    "zero3_inputs",
]
