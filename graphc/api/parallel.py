"""``graphc.parallelize`` and ``graphc.shard``: the user's entry points to auto-sharding.

    pf = graphc.parallelize(train_step, mesh={"dp": 2, "tp": 4}, memory_limit="2GiB",
                            static_argnames=("n_head",))
    plan = pf.plan(params, opt_state, tokens, targets, n_head=4)   # trace, optimize, solve; no run
    print(plan.summary()); plan.save("plan.json")
    new_params, new_state, loss = pf(params, opt_state, tokens, targets, n_head=4)   # runs on 8 devices

Calling the object runs the partition pipeline (graphc/passes/partition.py: plan, lower, compile
every device program) and the device programs on one thread per device (graphc/runtime/
devices.py); results are numpy arrays equal to the function's. ``pf.compile(*args)`` returns the
compiled specialization (its ``.plan``, ``.ir(stage)`` and device ``.program``). How a traced
graph is planned, built and run (a sharded mesh or a pipeline, threads or MPI ranks) is one small
class per path in graphc/api/compiled.py. The options are two frozen values: ``PlanOptions``
(passes/options.py) and ``RunOptions`` (below).

Inside a model, ``graphc.shard(x, "S(0)", "R")`` pins the spec of ``x`` (one placement per mesh
axis); ``in_specs=`` / ``out_specs=`` pin the function's arguments and results (one entry per
positional argument / per result element: a spec for all its leaves, a pytree of specs, or None).
An output that has the same pytree structure, shapes and dtypes as an argument it replaces (new
parameters, new optimizer state) is tied to that argument's spec, so a loop of steps never
reshards its state.

Solved plans are cached on disk (``$GRAPHC_CACHE_DIR``/plans or ~/.cache/graphc/plans) by the
graph's hash, the mesh and the options: re-planning an unchanged model only re-traces it.

``backend="mpi"`` (launched as ``mpiexec -n <devices> python train.py``) runs one device per
process instead (graphc/runtime/ranks.py): every rank compiles the same plan and runs its own
device program; results are ``ShardedArray``s of each rank's pieces. Under MPI an exception on a
rank, in compiling or running, is reported to the other ranks, which stop (runtime/mpi_world.py).
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphc.api.compiled import (
    Mpi,
    ParallelCompiled,
    PipelineCompiled,
    PipelinePath,
    ShardedPath,
    Threads,
)
from graphc.api.jit import Jitted, Specializations, StaticArgs, trace_hint
from graphc.core.collector import collector_paused
from graphc.core.errors import GraphcError, PlanError, PlanWarning, TraceError, user_stacklevel
from graphc.core.files import cache_dir
from graphc.core.ir import Graph
from graphc.core.mesh import Mesh, as_mesh
from graphc.core.profiles import get_profile
from graphc.core.pytree import StateUpdate, TreeDef, flatten, top_level
from graphc.core.roles import warn_near_role_names
from graphc.core.spec import Placement, Spec, SpecError, format_spec, parse_spec
from graphc.core.units import parse_bytes
from graphc.frontend import random as traced_random
from graphc.frontend.entry import on_a_copy, trace
from graphc.frontend.tracer import Tracer, bind, current_context
from graphc.passes.manager import release_unshared
from graphc.passes.options import DEFAULT_BUCKET_BYTES, PlanOptions, Recompute, Solver, Zero
from graphc.passes.partition import Pins, PlanCache, optimize_for_planning
from graphc.passes.pipeline import PipelinePlan, check_pipeline_options, pipe_axis
from graphc.passes.sharding.plan import ShardingPlan
from graphc.runtime.mpi_world import DEFAULT_TIMEOUT_S, join_world

BACKENDS = ("threads", "mpi")
THREADS_TIMEOUT_S = 60.0
PLAN_WARNINGS = "the plan of "  # how the PlanWarning of a plan's own warnings begins (the CLI prints them itself)


def shard(x, *placements):
    """Pin the sharding spec of ``x``: ``graphc.shard(h, "S(0)", "R")`` (one placement per mesh
    axis, or one spec string ``"[S(0), R]"``). The identity outside a trace."""
    if len(placements) == 1 and isinstance(placements[0], str) and "," in placements[0]:
        spec = parse_spec(placements[0])
    elif len(placements) == 1 and isinstance(placements[0], (tuple, list)):
        spec = parse_spec(placements[0])
    else:
        spec = parse_spec(placements)
    if isinstance(x, Tracer):
        return bind("sharding", x, spec=format_spec(spec))
    return x


def _is_spec(x) -> bool:
    return isinstance(x, str) or (isinstance(x, tuple) and bool(x) and all(isinstance(p, Placement) for p in x))


def _expand_specs(specs, tree: TreeDef, first: int, what: str) -> dict[int, Spec]:
    """Specs given for one argument/result (a spec, a pytree of specs, or None) -> {leaf: spec}."""
    out: dict[int, Spec] = {}
    if specs is None:
        return out
    if _is_spec(specs):
        spec = parse_spec(specs)
        for k in range(tree.num_leaves):
            out[first + k] = spec
        return out
    leaves, _st = flatten(specs, is_leaf=lambda v: v is None or _is_spec(v))
    if len(leaves) != tree.num_leaves:
        raise GraphcError(f"{what}: specs have {len(leaves)} leaves, the value has {tree.num_leaves} arrays")
    for k, s in enumerate(leaves):
        if s is not None:
            out[first + k] = parse_spec(s)
    return out


def check_plan_mesh(plan: ShardingPlan | PipelinePlan, mesh: Mesh) -> None:
    """PlanError unless ``plan`` was made for a mesh of ``mesh``'s axes (names, sizes, order): a
    plan is run only on the mesh it was made for. Links and profiles may differ: they price a plan,
    they do not change what it runs."""
    if (plan.mesh.axis_names, plan.mesh.shape) != (mesh.axis_names, mesh.shape):
        raise PlanError(
            f"the plan was made for mesh {plan.mesh} (graph @{plan.graph_name}), but the mesh is {mesh}: "
            "run it on its mesh, or compile a plan for this one"
        )
    if isinstance(plan, ShardingPlan) and pipe_axis(mesh) is not None:
        raise PlanError(f"mesh {mesh} has a pipeline axis: it runs a pipeline plan, and this is a sharding plan")


def planned_pipeline(plan: ShardingPlan | PipelinePlan | None, microbatches: int | None, schedule: str | None):
    """(micro-batches, schedule) to plan or run with: those asked for (None: 1 and "1f1b"), or a
    given pipeline plan's own, which any that were asked for must equal (PlanError otherwise)."""
    if isinstance(plan, ShardingPlan) and microbatches not in (None, 1):
        raise PlanError(
            f"microbatches={microbatches!r} was asked for, but the plan given is a sharding plan of one pass "
            "(no micro-batches): compile a plan with the micro-batches, or leave them out"
        )
    if not isinstance(plan, PipelinePlan):
        return (1 if microbatches is None else microbatches), ("1f1b" if schedule is None else schedule)
    for what, asked, planned in (("microbatches", microbatches, plan.m), ("schedule", schedule, plan.schedule)):
        if asked is not None and asked != planned:
            raise PlanError(f"the pipeline plan runs {what}={planned!r}, but {what}={asked!r} was asked for")
    return plan.m, plan.schedule


@dataclass(frozen=True, slots=True)
class RunOptions:
    """How to run what was planned: ``cache`` solved plans on disk (PlanCache), ``timeout_s`` a
    collective may wait for its peers (None: THREADS_TIMEOUT_S on threads, mpi_world's
    DEFAULT_TIMEOUT_S under MPI), keep a training step's state ``sharded_state`` on the devices
    between calls (threads), and the ``backend`` (BACKENDS: "threads" or "mpi")."""

    cache: bool = True
    timeout_s: float | None = None
    sharded_state: bool = False
    backend: str = "threads"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise GraphcError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {self.backend!r}")
        if self.timeout_s is not None and not (
            isinstance(self.timeout_s, (int, float)) and not isinstance(self.timeout_s, bool) and self.timeout_s > 0
        ):
            raise GraphcError(f"timeout_s must be a positive number of seconds or None, got {self.timeout_s!r}")

    @property
    def collective_timeout_s(self) -> float:
        """``timeout_s``, or the backend's default."""
        if self.timeout_s is not None:
            return float(self.timeout_s)
        return DEFAULT_TIMEOUT_S if self.backend == "mpi" else THREADS_TIMEOUT_S


def _check_given_plan(plan: ShardingPlan | PipelinePlan, mesh: Mesh, options: PlanOptions) -> None:
    """PlanError unless ``plan`` was made for ``mesh`` and, a pipeline plan, runs the options'
    micro-batches and schedule (``planned_pipeline`` takes them from it)."""
    check_plan_mesh(plan, mesh)
    if isinstance(plan, PipelinePlan) and (options.microbatches, options.schedule) != (plan.m, plan.schedule):
        raise PlanError(
            f"the pipeline plan runs microbatches={plan.m}, schedule={plan.schedule!r}, but the options say "
            f"microbatches={options.microbatches}, schedule={options.schedule!r}"
        )


class Parallelized:
    """The object ``graphc.parallelize`` returns. It traces the function, takes the user's pins,
    and keeps one compiled specialization per shapes, dtypes and static values; what a traced
    graph becomes is its path's (``.path``: ShardedPath or PipelinePath, by the mesh) and how it
    runs its backend's (``.backend``: Threads or Mpi), both in api/compiled.py. A given plan is
    followed as written; a 1-device mesh runs like ``graphc.jit``."""

    def __init__(
        self,
        fn: Callable,
        mesh=None,
        options: PlanOptions = PlanOptions(),
        run: RunOptions = RunOptions(),
        static_argnames=(),
        in_specs=None,
        out_specs=None,
        profile=None,
        plan: ShardingPlan | PipelinePlan | None = None,
    ):
        if plan is not None and not isinstance(plan, (ShardingPlan, PipelinePlan)):
            raise GraphcError(f"plan must be a ShardingPlan or PipelinePlan (graphc.Plan.load(path)), got {plan!r}")
        if mesh is None:
            if plan is None:
                raise GraphcError("parallelize needs a mesh (mesh={'dp': 2}) or a plan, whose mesh is used")
            mesh = plan.mesh
        self.fn = fn
        self.static = StaticArgs(fn, tuple(static_argnames))
        self._one_device = Jitted(fn, tuple(static_argnames))  # a 1-device mesh runs like graphc.jit
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)
        self.mesh = as_mesh(mesh) if profile is None else Mesh(as_mesh(mesh), profile=get_profile(profile))
        warn_near_role_names(self.mesh.axis_names)  # dq=2 is a free axis, not a data axis
        # a plan given is run exactly as written: made for this mesh (and, checked on the first
        # call, for the traced graph); nothing is solved
        self.given_plan = plan
        if plan is not None:
            _check_given_plan(plan, self.mesh, options)
        if pipe_axis(self.mesh) is not None or options.microbatches > 1:
            check_pipeline_options(options, self.mesh)
        if options.microbatches > 1 and pipe_axis(self.mesh) is None and (in_specs, out_specs) != (None, None):
            raise PlanError(
                f"in_specs / out_specs with microbatches={options.microbatches}: a micro-batched step's specs are "
                "the planner's (pins are not followed on micro-batched steps)"
            )
        self.in_specs = in_specs
        self.out_specs = out_specs
        self.options = options
        self.run_options = run
        self.followed: tuple[dict, dict, dict] | None = None  # the pins of a plan file being followed
        name = getattr(fn, "__name__", "the function")
        self._compiled = Specializations(name)
        # under MPI each process is one device: the job must have one rank per device (checked
        # here, before anything is traced, so every rank stops at once with the same message)
        self.backend: Threads | Mpi = (
            Mpi(join_world(self.mesh.size), run.collective_timeout_s)
            if run.backend == "mpi" and self.mesh.size > 1
            else Threads(run.collective_timeout_s, run.sharded_state)
        )
        self.path: ShardedPath | PipelinePath
        if self.pipelined:
            self.path = PipelinePath(self.mesh)
        else:
            cache = PlanCache(cache_dir("plans")) if run.cache else None
            self.path = ShardedPath(self.mesh, cache, Specializations(name, warn_after=1 << 62))  # the compiles warn

    @property
    def world(self):
        """The MPI world of the ranks (the ``"mpi"`` backend on more than one device), else None."""
        return self.backend.world

    def split_static(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, dict]:
        """(dynamic args, dynamic kwargs, static values) of a call."""
        return self.static.split(args, kwargs)

    @property
    def pipelined(self) -> bool:
        """A mesh with a ``pp`` axis, or more than one micro-batch (gradient accumulation: a
        pipeline of one stage, passes/accumulate.py): the step runs as micro-batches."""
        return (
            pipe_axis(self.mesh) is not None
            or self.options.microbatches > 1
            or isinstance(self.given_plan, PipelinePlan)
        )

    # --- the steps ---------------------------------------------------------------------------
    def trace_optimized(self, *args, **kwargs) -> tuple[Graph, Graph, dict[str, float]]:
        """(traced graph, the graph the planner partitions, seconds) for these arguments."""
        args, kwargs, static = self.static.split(args, kwargs)
        fn = self.static.bind(static)
        t0 = time.perf_counter()
        targs, tkwargs = self.static.for_trace(args, kwargs)
        try:
            traced = trace(fn, *targs, **tkwargs)
        except TraceError as exc:
            raise trace_hint(exc, self.static.number_arguments(args, kwargs)) from None
        self.static.check_traced_ints(traced, targs, tkwargs)
        t1 = time.perf_counter()
        optimized = optimize_for_planning(traced)
        t2 = time.perf_counter()
        return traced, optimized, {"trace_s": t1 - t0, "optimize_s": t2 - t1}

    def follow(self, plan_file: ShardingPlan, *args, **kwargs) -> int:
        """Take the pins of a (hand-edited) plan file: its pinned inputs, outputs and nodes, for
        every later .plan() and .compile(). Refused if the file was made for another mesh (its
        pins are specs of that mesh's axes) or another graph. Returns the number of pins."""
        check_plan_mesh(plan_file, self.mesh)
        _traced, graph, _s = self.trace_optimized(*args, **kwargs)
        plan_file.check(graph)
        self.followed = plan_file.pins()
        return sum(len(p) for p in self.followed)

    def pins(self, graph: Graph) -> Pins:
        """The user's pins on ``graph``: in_specs / out_specs, or those of a followed plan file."""
        if self.followed is not None:
            ins, outs, nodes = self.followed
            return Pins(ins, outs, nodes)
        try:
            return Pins(self._in_pins(graph), self._out_pins(graph))
        except SpecError as exc:
            raise PlanError(f"{exc}") from None

    def _in_pins(self, graph: Graph) -> dict[int, Spec]:
        pins: dict[int, Spec] = {}
        if self.in_specs is None:
            return pins
        specs = self.in_specs if isinstance(self.in_specs, (tuple, list)) else (self.in_specs,)
        subs = top_level(graph.in_tree.children[0])
        if self.static.receiver is not None:  # in_specs are for the arguments after the method's object
            subs = subs[1:]
        if len(specs) > len(subs):
            raise GraphcError(f"in_specs has {len(specs)} entries, the function takes {len(subs)} array arguments")
        for (t, first), s in zip(subs, specs):
            pins.update(_expand_specs(s, t, first, "in_specs"))
        return pins

    def _out_pins(self, graph: Graph) -> dict[int, Spec]:
        pins: dict[int, Spec] = {}
        if self.out_specs is None:
            return pins
        result = graph.out_tree
        if result.node is not None and result.node.cls is StateUpdate:  # out_specs are for the result only
            result = result.children[0]
        subs = top_level(result)
        specs = self.out_specs if isinstance(self.out_specs, (tuple, list)) and len(subs) > 1 else (self.out_specs,)
        for (t, first), s in zip(subs, specs):
            pins.update(_expand_specs(s, t, first, "out_specs"))
        return pins

    def plan(self, *args: Any, progress=None, **kwargs: Any) -> ShardingPlan | PipelinePlan:
        """Trace, optimize and solve for these arguments (nothing runs)."""
        args, kwargs, _ = traced_random.bind_generators(args, kwargs)  # a Generator stands for its state
        return self.plan_and_graph(*args, progress=progress, **kwargs)[0]

    def plan_and_graph(
        self, *args: Any, progress=None, start: float | None = None, **kwargs: Any
    ) -> tuple[ShardingPlan | PipelinePlan, Graph]:
        """The plan for these arguments and the (optimized) graph it partitions, within the time
        limit counted from ``start`` (``time.perf_counter()``; default now): a given plan as
        written (checked against the graph), else what the path plans (api/compiled.py). The
        cycle collector is paused throughout (graphc/core/collector.py): once, not per stage."""
        deadline = (time.perf_counter() if start is None else start) + self.options.time_limit
        with collector_paused():  # a with, not a decorator: a warning's stack level names the user's line
            traced, graph, seconds = self.trace_optimized(*args, **kwargs)
            n_traced = len(traced.nodes)
            release_unshared([traced], [graph])  # read no more: its own nodes freed without the collector
            del traced
            if self.given_plan is not None:  # run as written: only checked against the graph
                self.given_plan.check(graph)
                self._warn(self.given_plan)
                return self.given_plan.with_timing(**seconds, given=True), graph
            pins = Pins() if self.pipelined else self.pins(graph)
            timing = {**seconds, "nodes_traced": n_traced}
            plan = self.path.plan(graph, pins, self.options, timing, progress, deadline)
            self._warn(plan)
            return plan, graph

    def _warn(self, plan: ShardingPlan | PipelinePlan) -> None:
        """A PlanWarning with the plan's warnings (replicated work, ops without a sharding rule),
        and one per warning of a pipeline plan's own (a 16-bit sum of micro-batches), each where the
        user called: for a plan made, read from the cache, or given."""
        if isinstance(plan, PipelinePlan):
            for w in plan.warnings:  # not the summary's: graphc compile shows these (PLAN_WARNINGS)
                warnings.warn(PlanWarning(w), stacklevel=user_stacklevel())
            found = plan.sub_plan.warnings if plan.sub_plan is not None else ()
        else:
            found = plan.warnings
        if not found:
            return
        shown = "; ".join(found[:5]) + (f"; and {len(found) - 5} more (plan.warnings)" if len(found) > 5 else "")
        name = getattr(self.fn, "__name__", "the function")
        warnings.warn(PlanWarning(f"{PLAN_WARNINGS}{name} on mesh {self.mesh}: {shown}"), stacklevel=user_stacklevel())

    def compile(self, *args: Any, **kwargs: Any) -> ParallelCompiled | PipelineCompiled:
        """Trace, optimize, plan, lower and build for these arguments (cached by shapes, dtypes
        and static values, like graphc.jit). The result runs on the mesh when called."""
        args, kwargs, _ = traced_random.bind_generators(args, kwargs)  # a Generator stands for its state
        return self.backend.compiling(lambda: self._compile(*args, **kwargs))

    def _compile(self, *args: Any, **kwargs: Any) -> ParallelCompiled | PipelineCompiled:
        dyn_args, dyn_kwargs, _ = self.static.split(args, kwargs)  # an int that changed: traced if it can be
        return self.static.trying_traced_ints(dyn_args, dyn_kwargs, lambda: self._compile_now(*args, **kwargs))

    def _compile_now(self, *args: Any, **kwargs: Any) -> ParallelCompiled | PipelineCompiled:
        dyn_args, dyn_kwargs, static = self.static.split(args, kwargs)
        targs, tkwargs = self.static.for_trace(dyn_args, dyn_kwargs)
        key = self.static.key(targs, tkwargs, static)
        hit = self._compiled.get(key)
        if hit is not None:
            return hit
        with self._lock:
            hit = self._compiled.get(key)
            if hit is None:
                plan, graph = self.plan_and_graph(*args, **kwargs)
                if isinstance(plan, PipelinePlan):
                    path = self.path if isinstance(self.path, PipelinePath) else PipelinePath(self.mesh)
                    hit = path.build(graph, plan, self.backend, self.split_static)
                else:
                    hit = ParallelCompiled(graph, plan, self.backend, self.split_static)
                self._compiled.put(key, hit, self.static.describe(targs, tkwargs, static))
        return hit

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current_context() is not None:  # inside a trace (grad of a parallelized function): inline
            return on_a_copy(self.fn)(*args, **kwargs)  # (a method's writes to self stay off the object)
        if self.mesh.size == 1 and not self.pipelined:
            return self._one_device(*args, **kwargs)
        args, kwargs, generators = traced_random.bind_generators(args, kwargs)  # Generator -> its state
        compiled = self.compile(*args, **kwargs)
        result = compiled(*args, **kwargs)
        if generators:  # each Generator moves past the words the call drew, as numpy's would
            dyn_args, dyn_kwargs, _ = self.static.split(args, kwargs)
            traced_random.advance_generators(compiled.graph, *self.static.for_trace(dyn_args, dyn_kwargs), generators)
        return result


def parallelize(
    fn: Callable | None = None,
    *,
    mesh=None,
    memory_limit=None,
    static_argnames=(),
    in_specs=None,
    out_specs=None,
    shrink: bool = True,
    time_limit: float = 60.0,
    cache: bool = True,
    timeout_s: float | None = None,
    sharded_state: bool = False,
    microbatches: int | None = None,
    schedule: str | None = None,
    free_axes: bool = False,
    profile=None,
    backend: str = "threads",
    plan: ShardingPlan | PipelinePlan | None = None,
    zero: Zero = "auto",
    recompute: Recompute = "auto",
    solver: Solver = "highs",
    bucket_bytes: int | str = DEFAULT_BUCKET_BYTES,
    linear_partials: bool = True,
):
    """Decorator or function: ``graphc.parallelize(fn, mesh={"dp": 2, "tp": 4})``. A mesh with a
    ``pp`` axis (``{"pp": 2, "dp": 2, "tp": 2}``) runs the step as a pipeline of ``microbatches``
    micro-batches on ``pp`` stages ("gpipe" or "1f1b" ``schedule``), each stage sharded on the
    other axes. On any other mesh (one device included), ``microbatches=k`` is gradient
    accumulation (passes/accumulate.py): the step, written for the whole batch B, runs as k
    micro-batches of B/k samples one after the other, each sharded on the mesh, their gradients
    summed in a fixed order, then one update. A count the step cannot take (not dividing the
    batch, no batch input, an update reading the whole batch) is a ``PlanError``.

    Axis names give roles (docs/guide/sharding.md, "Mesh axes"): ``dp``/``data``/``batch`` split only batch dims,
    ``sp``/``seq`` only sequence dims, ``tp``/``model``/``mp`` and other names anything;
    ``free_axes=True`` lets every axis split anything.

    ``profile`` is the hardware to plan for: a preset name (``"h100-sxm"``, ``"a100-sxm"``,
    ``"cpu-here"``; graphc/core/profiles.py), a JSON profile file, or a ``MachineProfile``. It
    replaces the mesh's profile; links the mesh was given for some axes stay. Default: the mesh's
    (this machine's stored calibration for a mesh given as a dict or string).

    ``time_limit`` (seconds) bounds the wall time of planning, tracing included: when it runs out
    the best plan found so far is used (its gap is in ``plan.solver``); ``PlanError`` only if
    there is none.

    ``backend``: ``"threads"`` (one thread per device in this process; results are numpy arrays)
    or ``"mpi"`` (one process per device, launched with ``mpiexec -n <devices> python
    train.py``: each rank compiles the same plan, checks with the others that it did, runs its
    own device, and gets every result as a ``ShardedArray`` of its piece; ``.gather(root=0)``
    for the whole value). ``timeout_s``: how long a collective may wait for its peers (default
    60 s on threads, 30 s under MPI, where a failed or stuck rank ends the whole job).

    ``zero``: ZeRO along the data axes (passes/sharding/zero.py): ``"auto"`` (default) lets the
    solver pick each parameter's stage, 1 shards the optimizer state, 2 the gradients too, 3 the
    parameters too (gathered before each use); 0 keeps the state replicated. A forced stage that
    does not fit the memory limit is a ``PlanError`` naming the smallest memory it needs.
    (``zero=None`` is the deprecated spelling of ``"auto"``.)

    ``plan``: a plan to run exactly as written (``graphc.Plan.load(path)``, a ShardingPlan or a
    PipelinePlan): nothing is solved. It must have been made for this mesh's axes (``mesh`` may be
    left out: the plan's is used) and, checked on the first call, for the traced graph; either
    mismatch is a ``PlanError`` naming both. A pipeline plan brings its micro-batch count and
    schedule. (Re-solving around a hand-edited plan's pins is ``graphc compile --resolve-pins``.)

    ``recompute``: activation recomputation (passes/recompute/choices.py). ``"auto"``: under a
    ``memory_limit`` the solver recomputes forward values in the backward pass where that is the
    cheapest way to fit (without a limit it only costs time, so nothing is); ``"on"``: every
    value that can be recomputed is (``remat.forced``); ``"off"``: none. The plan marks each
    recomputed node (``"recompute": true``). Pipelines (a ``pp`` axis) do not recompute.
    (``True`` / ``False`` are the deprecated spellings of ``"on"`` / ``"off"``.)

    The planning options (``memory_limit`` as bytes or a string such as ``"2GiB"``,
    ``time_limit``, ``zero``, ``recompute``, ``microbatches``, ``schedule``, ``shrink``,
    ``free_axes``, ``solver``: "highs", "CBC" or "SCIP"; ``bucket_bytes``: the gradient buckets'
    size, 0 for none; ``linear_partials``: carry partial sums through linear ops) become one ``PlanOptions`` (passes/options.py: every option's type and values),
    the running ones (``cache``, ``timeout_s``, ``sharded_state``, ``backend``) one
    ``RunOptions``; the returned object keeps them as ``.options`` and ``.run_options``.

    Python ``float`` arguments not in ``static_argnames`` are traced as weakly typed values, as in
    ``graphc.jit``: a new learning rate runs the same compiled step and plan."""
    if isinstance(static_argnames, str):
        static_argnames = (static_argnames,)
    microbatches, schedule = planned_pipeline(plan, microbatches, schedule)
    options = PlanOptions.of(
        memory_limit=parse_bytes(memory_limit, what="memory_limit"),
        time_limit=time_limit,
        zero=zero,
        recompute=recompute,
        microbatches=microbatches,
        schedule=schedule,
        shrink=shrink,
        free_axes=free_axes,
        solver=solver,
        bucket_bytes=parse_bytes(bucket_bytes, allow_zero=True, what="bucket_bytes"),
        linear_partials=linear_partials,
    )
    run = RunOptions(cache=cache, timeout_s=timeout_s, sharded_state=sharded_state, backend=backend)

    def wrap(f):
        return Parallelized(f, mesh, options, run, static_argnames, in_specs, out_specs, profile, plan)

    return wrap if fn is None else wrap(fn)


__all__ = [
    "BACKENDS",
    "PLAN_WARNINGS",
    "ParallelCompiled",
    "Parallelized",
    "PipelineCompiled",
    "RunOptions",
    "check_plan_mesh",
    "parallelize",
    "planned_pipeline",
    "shard",
]
