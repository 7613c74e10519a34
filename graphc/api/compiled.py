"""How a parallelized function is planned, built and run: one small class per path.

``graphc.parallelize`` (api/parallel.py) traces the function and keeps its specializations; what
happens to a traced graph depends on the mesh and the backend, and each case is a class here:

    ShardedPath     a mesh without a pp axis: the sharding ILP (passes/partition.py; plans kept on
                    disk and in memory by their cache key), one device program per device
    PipelinePath    a mesh with a pp axis: micro-batches, stages, schedule and each stage's
                    sharding (passes/pipeline.py), every device's tasks (passes/pipeline_lower.py)
    Threads         every device a thread of this process (runtime/devices.py, runtime/pipeline.py);
                    results are numpy arrays
    Mpi             every device an MPI rank (runtime/ranks.py); results are this rank's pieces, and
                    a failure while compiling is reported to the other ranks, which stop

A path builds a ``ParallelCompiled`` or ``PipelineCompiled`` (one specialization: its plan, its
programs and the executable the backend makes of them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from graphc.api.reshard import Resharder
from graphc.core.errors import GraphcError
from graphc.core.ir import Graph
from graphc.core.mesh import Mesh
from graphc.core.pytree import StateUpdate, unflatten
from graphc.interpreter import as_numpy_result, bind_arguments
from graphc.passes.microbatch import Microbatched, microbatch
from graphc.passes.options import PlanOptions
from graphc.passes.partition import (
    Choices,
    Partitioned,
    Pins,
    PlanCache,
    compile_devices,
    lower,
    plan_sharding_reusing,
    state_ties,
    zero3_inputs,
)
from graphc.passes.pipeline import PipelinePlan, plan_pipeline
from graphc.passes.pipeline_lower import lower_pipeline
from graphc.passes.sharding.plan import ShardingPlan, graph_hash
from graphc.programs import ParallelProgram, PipelineProgram
from graphc.runtime.devices import ParallelExecutable, ShardedArray, ShardedInput
from graphc.runtime.mpi_world import MpiWorld
from graphc.runtime.pipeline import PipelineExecutable
from graphc.runtime.ranks import RankExecutable, RankPipelineExecutable

SplitStatic = Callable[[tuple, dict], tuple[tuple, dict, dict]]  # a call's (dynamic args, kwargs, static values)


# --- backends: where the devices run ----------------------------------------------------------------


class Threads:
    """Every device a thread of this process. ``sharded_state``: a training step's new state stays
    on the devices as ShardedArrays between calls (fed back without gathering)."""

    world = None

    def __init__(self, timeout_s: float, sharded_state: bool = False) -> None:
        self.timeout_s = timeout_s
        self.sharded_state = sharded_state

    def sharded(self, program: ParallelProgram) -> ParallelExecutable:
        return ParallelExecutable(program, timeout_s=self.timeout_s)

    def pipeline(self, program: PipelineProgram) -> PipelineExecutable:
        return PipelineExecutable(program, timeout_s=self.timeout_s)

    def compiling(self, build: Callable[[], Any]) -> Any:
        return build()


class Mpi:
    """Every device an MPI rank of ``world`` (one process per device, runtime/mpi_world.py)."""

    def __init__(self, world: MpiWorld, timeout_s: float) -> None:
        self.world = world
        self.timeout_s = timeout_s

    def sharded(self, program: ParallelProgram) -> RankExecutable:
        return RankExecutable(program, self.world, self.timeout_s)

    def pipeline(self, program: PipelineProgram) -> RankPipelineExecutable:
        return RankPipelineExecutable(program, self.world, self.timeout_s)

    def compiling(self, build: Callable[[], Any]) -> Any:
        """``build()``; if it raises, the other ranks (which wait for this one) are told first."""
        try:
            return build()
        except BaseException as exc:
            self.world.fail(exc)
            raise


Backend = Threads | Mpi


# --- one specialization ------------------------------------------------------------------------------


class ParallelCompiled:
    """One specialization of a parallelized function: its plan, device programs and executable."""

    def __init__(self, graph: Graph, plan: ShardingPlan, backend: Backend, split_static: SplitStatic):
        self._split_static = split_static
        self._sharded_state = isinstance(backend, Threads) and backend.sharded_state
        self.plan = plan
        self.graph = graph
        start = time.perf_counter()
        lowered = lower(graph, plan)
        self.partitioned = Partitioned(
            graph, plan, lowered, compile_devices(lowered, regather_inputs=zero3_inputs(plan))
        )
        # threads: every device in this process; MPI: this rank's device only
        self._threads: ParallelExecutable | None = None
        self.rank_executable: RankExecutable | None = None
        if isinstance(backend, Mpi):
            self.rank_executable = backend.sharded(self.partitioned.program)
            self._resharder = Resharder(backend.world, backend.timeout_s)  # inputs wanted in another spec
        else:
            self._threads = backend.sharded(self.partitioned.program)
        self.seconds = {**plan.timing, "build_s": time.perf_counter() - start}
        self.state_outputs = frozenset(o for _i, o in state_ties(graph))

    @property
    def program(self):
        """The device programs the runtime runs (graphc.programs.ParallelProgram, after fusion)."""
        return self.partitioned.program

    @property
    def executable(self) -> ParallelExecutable:
        """The threaded runtime of every device (``rank_executable`` under MPI)."""
        if self._threads is None:
            raise GraphcError("this specialization runs one device per MPI rank: use .rank_executable")
        return self._threads

    def ir(self, stage: str = "optimized") -> str:
        """Text IR: "optimized" (the graph the plan partitions), "lowered" / "device" (every
        device program after lowering / after fusion, concatenated)."""
        if stage == "optimized":
            return str(self.graph)
        if stage == "lowered":
            return "\n".join(str(p.graph) for p in self.partitioned.lowered.devices)
        if stage == "device":
            return "\n".join(str(p.graph) for p in self.partitioned.program.devices)
        raise GraphcError(f"unknown stage {stage!r}: optimized, lowered or device")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs, _ = self._split_static(args, kwargs)
        # shards stay on the devices; sharded inputs are built there
        arrays = bind_arguments(self.graph, args, kwargs, keep=(ShardedArray, ShardedInput))
        if self.rank_executable is not None:  # MPI: every result is this rank's piece
            arrays = self._resharder.arrange(arrays, self.program.in_specs, self.program.mesh)
            return _stored(unflatten(self.graph.out_tree, self.rank_executable.run_flat(arrays)), args, kwargs)
        keep = self.state_outputs if self._sharded_state else frozenset()
        outs = self.executable.run_flat(arrays, keep_sharded=keep)
        out = unflatten(self.graph.out_tree, [o if k in keep else as_numpy_result(o) for k, o in enumerate(outs)])
        return _stored(out, args, kwargs)


class PipelineCompiled:
    """One specialization of a function parallelized on a mesh with a ``pp`` axis: its pipeline
    plan (passes/pipeline.py), every device's tasks (passes/pipeline_lower.py) and the pipeline
    runtime (runtime/pipeline.py)."""

    def __init__(
        self,
        graph: Graph,
        plan: PipelinePlan,
        backend: Backend,
        split_static: SplitStatic,
        mb: Microbatched | None = None,
    ):
        self._split_static = split_static
        self.plan = plan
        self.graph = graph
        start = time.perf_counter()
        self.mb = mb if mb is not None else microbatch(graph, plan.m)  # ``mb``: planning's, of this graph
        self.program = lower_pipeline(graph, plan, self.mb)
        # threads: every device in this process; MPI: this rank's device only
        self._threads: PipelineExecutable | None = None
        self.rank_executable: RankPipelineExecutable | None = None
        if isinstance(backend, Mpi):
            self.rank_executable = backend.pipeline(self.program)
        else:
            self._threads = backend.pipeline(self.program)
        self.seconds = {**plan.timing, "build_s": time.perf_counter() - start}

    @property
    def executable(self) -> PipelineExecutable:
        """The threaded pipeline runtime of every device (``rank_executable`` under MPI)."""
        if self._threads is None:
            raise GraphcError("this specialization runs one device per MPI rank: use .rank_executable")
        return self._threads

    def ir(self, stage: str = "optimized") -> str:
        """Text IR: "optimized" (the step), "microbatch" (micro-batch 0's program), "tasks" (every
        device's forward, backward and update tasks of micro-batch 0)."""
        if stage == "optimized":
            return str(self.graph)
        if stage == "microbatch":
            return str(self.mb.program.devices[0].graph)
        if stage == "tasks":
            return "\n".join(str(t.graph) for (_d, _ph, k), t in sorted(self.program.tasks.items()) if k <= 0)
        raise GraphcError(f"unknown stage {stage!r}: optimized, microbatch or tasks")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs, _ = self._split_static(args, kwargs)
        # under MPI, a result of the last step (state fed back) stays with the stage that holds it
        arrays = bind_arguments(self.graph, args, kwargs, keep=(ShardedArray, ShardedInput))
        if self.rank_executable is not None:  # MPI: the pieces of the stage holding each result
            return _stored(unflatten(self.graph.out_tree, self.rank_executable.run_flat(arrays)), args, kwargs)
        outs = self.executable.run_flat(arrays)
        return _stored(unflatten(self.graph.out_tree, [as_numpy_result(o) for o in outs]), args, kwargs)


def _stored(out: Any, args: tuple, kwargs: dict) -> Any:
    """The call's result, after storing what the function wrote into its argument objects."""
    return out.apply_to(args, kwargs) if type(out) is StateUpdate else out


# --- paths: how a graph is planned and built --------------------------------------------------------


class ShardedPath:
    """A mesh without a pp axis: the sharding ILP on the whole mesh. Solved plans are kept on disk
    (``cache``, a PlanCache; only those solved to optimality) and in memory (by their cache key)
    by the graph's hash, the mesh, the pins, the ties and the options. A new graph equal to the
    last one planned up to dim sizes (a KV cache's slice growing a token a call) reuses that
    plan's choices where they still divide and fit (passes/partition.py ``reuse_choices``)."""

    def __init__(self, mesh: Mesh, cache: PlanCache | None, remembered) -> None:
        self.mesh = mesh
        self.cache = cache
        self.remembered = remembered  # Specializations: plans by cache key
        self.choices: Choices | None = None  # the last plan's choices, for the next graph like it

    def plan(
        self,
        graph: Graph,
        pins: Pins,
        options: PlanOptions,
        traced: dict[str, Any],
        progress=None,
        deadline: float | None = None,
    ) -> ShardingPlan:
        """The plan of ``graph``: remembered, cached, or solved by ``deadline``. ``traced``: the
        trace's timings and node count, recorded with the plan (a cached plan keeps its own count)."""
        start = time.perf_counter()
        ties = state_ties(graph)
        hashed = graph_hash(graph) if self.cache else None  # printed once: for the key and the plan
        key = self.cache.key(hashed, self.mesh, pins, ties, options) if self.cache and hashed else None
        remembered = self.remembered.get(key) if key else None
        if remembered is not None:
            return remembered
        cached = self.cache.get(key) if self.cache and key else None
        seconds = {k: v for k, v in traced.items() if k != "nodes_traced"}
        if cached is not None:
            plan = cached.with_timing(**seconds, cached=True)
        else:
            # a graph equal to the last one solved up to dim sizes takes its choices over (issue 32)
            plan, self.choices = plan_sharding_reusing(
                graph, self.mesh, self.choices, pins, ties, options, progress, deadline, hashed
            )
            plan = plan.with_timing(**traced, plan_s=time.perf_counter() - start, cached=False)
            if self.cache and key and plan.solver.status == "optimal":  # a plan cut short is not kept
                self.cache.put(key, plan)
        if key:
            self.remembered.put(key, plan, {})
        return plan

    @staticmethod
    def build(graph: Graph, plan: ShardingPlan, backend: Backend, split_static: SplitStatic) -> ParallelCompiled:
        return ParallelCompiled(graph, plan, backend, split_static)


class PipelinePath:
    """A mesh with a pp axis: the pipeline planner (passes/pipeline.py) on every call to plan."""

    def __init__(self, mesh: Mesh) -> None:
        self.mesh = mesh
        # the graph last planned and its micro-batched step, for ``build`` to take (a step is
        # micro-batched once: 0.5 s of a 2.5 s compile of a 4-layer GPT on pp=2,dp=2)
        self._made: tuple[Graph, Microbatched] | None = None

    def plan(
        self,
        graph: Graph,
        pins: Pins,
        options: PlanOptions,
        traced: dict[str, Any],
        progress=None,
        deadline: float | None = None,
    ) -> PipelinePlan:
        """The pipeline plan of ``graph`` (pins are not followed on pipelines; ``traced``: the
        trace's timings, recorded with the plan)."""
        start = time.perf_counter()
        self._made = None
        mb = microbatch(graph, options.microbatches)
        plan = plan_pipeline(graph, self.mesh, options, mb=mb)
        self._made = (graph, mb)
        seconds = {k: v for k, v in traced.items() if k != "nodes_traced"}
        return plan.with_timing(**seconds, plan_s=time.perf_counter() - start)

    def build(self, graph: Graph, plan: PipelinePlan, backend: Backend, split_static: SplitStatic) -> PipelineCompiled:
        """The compiled step of ``plan``, with the micro-batched step its planning made when it
        was planned here for ``graph`` (not for a plan given or read from a file)."""
        made, self._made = self._made, None
        mb = made[1] if made is not None and made[0] is graph and made[1].m == plan.m else None
        return PipelineCompiled(graph, plan, backend, split_static, mb)


__all__ = [
    "Mpi",
    "ParallelCompiled",
    "PipelineCompiled",
    "PipelinePath",
    "ShardedPath",
    "Threads",
]
