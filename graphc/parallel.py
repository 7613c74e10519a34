"""``graphc.parallelize`` and ``graphc.shard``: the user's entry points to auto-sharding.

    pf = graphc.parallelize(train_step, mesh={"dp": 2, "tp": 4}, memory_limit="2GiB",
                            static_argnames=("n_head",))
    plan = pf.plan(params, opt_state, tokens, targets, n_head=4)   # trace, optimize, solve; no run
    print(plan.summary()); plan.save("plan.json")
    new_params, new_state, loss = pf(params, opt_state, tokens, targets, n_head=4)   # runs on 8 devices

Calling the object lowers the plan to one program per device (passes/lower.py) and runs them on
one thread per device (runtime/parallel.py); results are numpy arrays equal to the function's.
``pf.compile(*args)`` returns the compiled specialization (its ``.plan``, ``.ir(stage)`` and
device ``.programs``).

Inside a model, ``graphc.shard(x, "S(0)", "R")`` pins the spec of ``x`` (one placement per mesh
axis); ``in_specs=`` / ``out_specs=`` pin the function's arguments and results (one entry per
positional argument / per result element: a spec for all its leaves, a pytree of specs, or None).
An output that has the same pytree structure, shapes and dtypes as an argument it replaces (new
parameters, new optimizer state) is tied to that argument's spec, so a loop of steps never
reshards its state.

Solved plans are cached on disk (``$GRAPHC_CACHE_DIR``/plans or ~/.cache/graphc/plans) by the
graph's hash, the mesh and the options: re-planning an unchanged model only re-traces it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

from graphc.core.errors import GraphcError, PlanError
from graphc.core.files import cache_dir
from graphc.core.pytree import TreeDef, flatten
from graphc.core.spec import Placement, SpecError, format_spec, parse_spec
from graphc.core.units import parse_bytes
from graphc.jit import Jitted

PLAN_PASSES = ("fold_constants", "simplify", "cse", "dce")  # fusion runs per device, after lowering
PLANNER_VERSION = 3  # part of the plan cache key: bump when rules or costs change what a plan says

def shard(x, *placements):
    """Pin the sharding spec of ``x``: ``graphc.shard(h, "S(0)", "R")`` (one placement per mesh
    axis, or one spec string ``"[S(0), R]"``). The identity outside a trace."""
    from graphc.frontend.tracer import Tracer, bind

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
    return isinstance(x, str) or (isinstance(x, tuple) and x and all(isinstance(p, Placement) for p in x))


def _subtrees(t: TreeDef) -> list[tuple[TreeDef, int]]:
    """Top-level elements of a tuple/list tree with their first leaf index (else the whole)."""
    if t.kind in ("tuple", "list"):
        out, k = [], 0
        for c in t.children:
            out.append((c, k))
            k += c.num_leaves
        return out
    return [(t, 0)]


def _expand_specs(specs, tree: TreeDef, first: int, what: str) -> dict[int, tuple]:
    """Specs given for one argument/result (a spec, a pytree of specs, or None) -> {leaf: spec}."""
    out: dict[int, tuple] = {}
    if specs is None:
        return out
    if _is_spec(specs):
        spec = parse_spec(specs)
        for k in range(tree.num_leaves):
            out[first + k] = spec
        return out
    leaves, st = flatten(specs, is_leaf=lambda v: v is None or _is_spec(v))
    if len(leaves) != tree.num_leaves:
        raise GraphcError(f"{what}: specs have {len(leaves)} leaves, the value has {tree.num_leaves} arrays")
    for k, s in enumerate(leaves):
        if s is not None:
            out[first + k] = parse_spec(s)
    return out


def state_ties(graph) -> list[tuple[int, int]]:
    """(input leaf, output leaf) pairs of outputs that replace an argument of the same structure."""
    in_types = [v.type for v in graph.inputs]
    out_types = [v.type for v in graph.outputs]
    args_tree = graph.in_tree.children[0] if graph.in_tree.kind == "tuple" and graph.in_tree.children else graph.in_tree
    args = _subtrees(args_tree)
    kw_first = args_tree.num_leaves
    if graph.in_tree.kind == "tuple" and len(graph.in_tree.children) > 1:
        args += [(c, kw_first + sum(x.num_leaves for x in graph.in_tree.children[1].children[:j]))
                 for j, c in enumerate(graph.in_tree.children[1].children)]
    outs = _subtrees(graph.out_tree)
    used: set[int] = set()
    ties = []
    for pos, (ot, ofirst) in enumerate(outs):
        if ot.num_leaves == 0:
            continue
        sig = (repr(ot), [out_types[ofirst + k] for k in range(ot.num_leaves)])
        candidates = [j for j, (it, ifirst) in enumerate(args)
                      if j not in used and (repr(it), [in_types[ifirst + k] for k in range(it.num_leaves)]) == sig]
        if not candidates:
            continue
        j = pos if pos in candidates else candidates[0]
        used.add(j)
        ifirst = args[j][1]
        ties += [(ifirst + k, ofirst + k) for k in range(ot.num_leaves)]
    return ties


def plan_cache_dir() -> str:
    return cache_dir("plans")


class Parallelized(Jitted):
    """The object ``graphc.parallelize`` returns."""

    def __init__(self, fn: Callable, mesh, memory_limit=None, static_argnames=(), in_specs=None, out_specs=None,
                 shrink: bool = True, time_limit_s: float = 60.0, cache: bool = True, timeout_s: float = 60.0,
                 sharded_state: bool = False, microbatches: int = 1, schedule: str = "1f1b"):
        from graphc.core.mesh import as_mesh

        super().__init__(fn, tuple(static_argnames))  # a 1-device mesh runs like graphc.jit (fusion included)
        self.mesh = as_mesh(mesh)
        self.memory_limit = parse_bytes(memory_limit)
        self.in_specs = in_specs
        self.out_specs = out_specs
        self.shrink = shrink
        self.time_limit_s = time_limit_s
        self.cache = cache
        self.timeout_s = timeout_s
        self.sharded_state = sharded_state
        self.microbatches = microbatches  # a mesh with a "pp" axis runs a pipeline of this many micro-batches
        self.schedule = schedule
        self.node_pins: dict | None = None  # {node index: strategy} of a plan file being followed
        self._plans: dict[Any, Any] = {}
        self._compiled: dict[Any, ParallelCompiled] = {}

    def trace_optimized(self, *args, **kwargs):
        """(traced graph, optimized graph, seconds) for these arguments."""
        from graphc.frontend import trace
        from graphc.passes import optimize

        args, kwargs, static = self._split_static(args, kwargs)
        fn = functools.partial(self.fn, **static) if static else self.fn
        if static:
            functools.update_wrapper(fn, self.fn)
        t0 = time.perf_counter()
        traced = trace(fn, *args, **kwargs)
        t1 = time.perf_counter()
        optimized = optimize(traced, PLAN_PASSES)
        t2 = time.perf_counter()
        return traced, optimized, {"trace_s": t1 - t0, "optimize_s": t2 - t1}

    def follow(self, plan_file, *args, **kwargs) -> int:
        """Take the pins of a (hand-edited) plan file: its pinned inputs, outputs and nodes, for
        every later .plan() and .compile(). Refused if the file was made for another graph.
        Returns the number of pins."""
        _traced, graph, _s = self.trace_optimized(*args, **kwargs)
        plan_file.check(graph)
        in_pins, out_pins, self.node_pins = plan_file.pins()
        self.pins = lambda graph, i=in_pins, o=out_pins: (dict(i), dict(o))
        return len(in_pins) + len(out_pins) + len(self.node_pins)

    def pins(self, graph) -> tuple[dict, dict]:
        in_pins: dict[int, tuple] = {}
        out_pins: dict[int, tuple] = {}
        try:
            if self.in_specs is not None:
                args_tree = graph.in_tree.children[0]
                specs = self.in_specs if isinstance(self.in_specs, (tuple, list)) else (self.in_specs,)
                subs = _subtrees(args_tree)
                if len(specs) > len(subs):
                    raise GraphcError(f"in_specs has {len(specs)} entries, the function takes {len(subs)} array arguments")
                for (t, first), s in zip(subs, specs):
                    in_pins.update(_expand_specs(s, t, first, "in_specs"))
            if self.out_specs is not None:
                subs = _subtrees(graph.out_tree)
                specs = self.out_specs if isinstance(self.out_specs, (tuple, list)) and len(subs) > 1 else (self.out_specs,)
                for (t, first), s in zip(subs, specs):
                    out_pins.update(_expand_specs(s, t, first, "out_specs"))
        except SpecError as exc:
            raise PlanError(f"{exc}") from None
        return in_pins, out_pins

    def plan(self, *args: Any, progress=None, node_pins: dict | None = None, **kwargs: Any):
        """Trace, optimize and solve for these arguments (nothing runs). Returns a Plan."""
        from graphc.passes.sharding import plan_graph
        from graphc.plan import Plan, graph_hash

        traced, graph, seconds = self.trace_optimized(*args, **kwargs)
        if self.pipelined:
            from graphc.passes.pipeline import plan_pipeline

            t0 = time.perf_counter()
            pplan = plan_pipeline(graph, self.mesh, self.microbatches, self.schedule, self.memory_limit,
                                  time_limit_s=self.time_limit_s)
            pplan.seconds = {**seconds, "plan_s": time.perf_counter() - t0}
            return pplan
        in_pins, out_pins = self.pins(graph)
        node_pins = self.node_pins if node_pins is None else node_pins
        ties = state_ties(graph)
        options = {"memory_limit": self.memory_limit, "shrink": self.shrink, "in_pins": _jsonable(in_pins),
                   "out_pins": _jsonable(out_pins), "node_pins": _jsonable(node_pins or {}), "ties": ties,
                   "time_limit_s": self.time_limit_s}
        ghash = graph_hash(graph)
        # axis order matters (specs are per axis position), so it goes into the key unsorted
        axes = list(self.mesh.to_json()["axes"].items())
        key = hashlib.sha256(json.dumps([PLANNER_VERSION, ghash, axes, self.mesh.to_json(), options], sort_keys=True,
                                        default=str).encode()).hexdigest()[:32]
        path = os.path.join(plan_cache_dir(), f"{key}.json")
        if key in self._plans:
            return self._plans[key]
        if self.cache and os.path.exists(path):
            try:
                plan = Plan.load(path)
                plan.doc.setdefault("timing", {}).update(seconds, cached=True)
                plan.graph = graph
                self._plans[key] = plan
                return plan
            except PlanError:
                pass  # a corrupt cache entry: solve again
        t0 = time.perf_counter()
        plan = plan_graph(graph, self.mesh, self.memory_limit, in_pins, out_pins, ties, node_pins,
                          shrink=self.shrink, time_limit_s=self.time_limit_s, progress=progress)
        seconds["plan_s"] = time.perf_counter() - t0
        plan.doc["timing"] = {**seconds, "cached": False}
        plan.doc["graph"]["nodes_traced"] = len(traced.nodes)
        plan.graph = graph
        if self.cache:
            try:
                plan.save(path, make_dirs=True)
            except OSError:
                pass  # a read-only cache is not an error
        self._plans[key] = plan
        return plan

    def compile(self, *args: Any, **kwargs: Any) -> ParallelCompiled:
        """Trace, optimize, plan, lower and build for these arguments (cached by shapes, dtypes
        and static values, like graphc.jit). The result runs on the mesh when called."""
        dyn_args, dyn_kwargs, static = self._split_static(args, kwargs)
        key = self._key(dyn_args, dyn_kwargs, static)
        hit = self._compiled.get(key)
        if hit is not None:
            return hit
        with self._lock:
            hit = self._compiled.get(key)
            if hit is None:
                if self.pipelined:
                    hit = PipelineCompiled(self, self.plan(*args, **kwargs))
                else:
                    hit = ParallelCompiled(self, self.plan(*args, **kwargs))
                self._compiled[key] = hit
        return hit

    @property
    def pipelined(self) -> bool:
        """A mesh with a ``pp`` axis: the step runs as a pipeline of micro-batches."""
        from graphc.passes.pipeline import PP_AXIS

        return PP_AXIS in self.mesh.axis_names

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from graphc.frontend.tracer import current_context

        if current_context() is not None:  # inside a trace (grad of a parallelized function): inline
            return self.fn(*args, **kwargs)
        if self.mesh.size == 1:
            return super().__call__(*args, **kwargs)
        return self.compile(*args, **kwargs)(*args, **kwargs)


class ParallelCompiled:
    """One specialization of a parallelized function: its plan, device programs and executable."""

    def __init__(self, owner: Parallelized, plan):
        from graphc.runtime.parallel import ParallelExecutable

        self._owner = owner
        self.plan = plan
        self.graph = plan.graph
        start = time.perf_counter()
        self.executable = ParallelExecutable(plan.graph, plan, owner.mesh, timeout_s=owner.timeout_s)
        self.seconds = {**plan.doc.get("timing", {}), "build_s": time.perf_counter() - start}
        self.state_outputs = frozenset(o for _i, o in state_ties(self.graph))

    @property
    def programs(self):
        """The device programs (passes.lower.DeviceProgram), after fusion."""
        return self.executable.programs

    def ir(self, stage: str = "optimized") -> str:
        """Text IR: "optimized" (the graph the plan partitions), "lowered" / "device" (every
        device program after lowering / after fusion, concatenated)."""
        if stage == "optimized":
            return str(self.graph)
        if stage == "lowered":
            return "\n".join(str(p.graph) for p in self.executable.lowered)
        if stage == "device":
            return "\n".join(str(p.graph) for p in self.executable.programs)
        raise GraphcError(f"unknown stage {stage!r}: optimized, lowered or device")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from graphc.core.pytree import unflatten
        from graphc.interpreter import as_numpy_result, bind_arguments
        from graphc.runtime.parallel import ShardedArray

        args, kwargs, _ = self._owner._split_static(args, kwargs)
        arrays = bind_arguments(self.graph, args, kwargs, keep=ShardedArray)  # shards stay on the devices
        keep = self.state_outputs if self._owner.sharded_state else frozenset()
        outs = self.executable.run_flat(arrays, keep_sharded=keep)
        return unflatten(self.graph.out_tree, [o if k in keep else as_numpy_result(o) for k, o in enumerate(outs)])


class PipelineCompiled:
    """One specialization of a function parallelized on a mesh with a ``pp`` axis: its pipeline
    plan (passes/pipeline.py) and the pipeline runtime (runtime/pipeline.py)."""

    def __init__(self, owner: Parallelized, plan):
        from graphc.runtime.pipeline import PipelineExecutable

        self._owner = owner
        self.plan = plan
        self.graph = plan.graph
        start = time.perf_counter()
        self.executable = PipelineExecutable(plan, timeout_s=owner.timeout_s)
        self.seconds = {**getattr(plan, "seconds", {}), "build_s": time.perf_counter() - start}

    def ir(self, stage: str = "optimized") -> str:
        """Text IR: "optimized" (the step), "microbatch" (micro-batch 0's program), "tasks" (every
        device's forward, backward and update tasks of micro-batch 0)."""
        if stage == "optimized":
            return str(self.graph)
        if stage == "microbatch":
            return str(self.plan.mb.programs[0].graph)
        if stage == "tasks":
            return "\n".join(str(t.graph) for (_d, _ph, k), t in sorted(self.executable.tasks.items()) if k <= 0)
        raise GraphcError(f"unknown stage {stage!r}: optimized, microbatch or tasks")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from graphc.core.pytree import unflatten
        from graphc.interpreter import as_numpy_result, bind_arguments

        args, kwargs, _ = self._owner._split_static(args, kwargs)
        outs = self.executable.run_flat(bind_arguments(self.graph, args, kwargs))
        return unflatten(self.graph.out_tree, [as_numpy_result(o) for o in outs])


def _jsonable(pins: dict) -> dict:
    return {str(k): format_spec(v) if isinstance(v, tuple) else v for k, v in pins.items()}


def parallelize(fn: Callable | None = None, *, mesh, memory_limit=None, static_argnames=(), in_specs=None,
                out_specs=None, shrink: bool = True, time_limit_s: float = 60.0, cache: bool = True,
                timeout_s: float = 60.0, sharded_state: bool = False, microbatches: int = 1,
                schedule: str = "1f1b"):
    """Decorator or function: ``graphc.parallelize(fn, mesh={"dp": 2, "tp": 4})``. A mesh with a
    ``pp`` axis (``{"pp": 2, "dp": 2, "tp": 2}``) runs the step as a pipeline of ``microbatches``
    micro-batches on ``pp`` stages ("gpipe" or "1f1b" ``schedule``), each stage sharded on the
    other axes."""
    if isinstance(static_argnames, str):
        static_argnames = (static_argnames,)

    def wrap(f):
        return Parallelized(f, mesh, memory_limit, static_argnames, in_specs, out_specs, shrink, time_limit_s, cache,
                            timeout_s, sharded_state, microbatches, schedule)

    return wrap if fn is None else wrap(fn)


__all__ = ["PLAN_PASSES", "Parallelized", "parallelize", "parse_bytes", "shard", "state_ties"]
