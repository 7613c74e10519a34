"""Gradient accumulation on any mesh: a training step run as k micro-batches, one after the other.

``plan_accumulated(graph, mesh, options)`` is the planning entry point (the mesh search calls it
for meshes without a pp axis): ``graph`` is a training step written for the whole batch B, and
``options.microbatches`` = k splits it into micro-batches of B/k samples (passes/microbatch.py).
The program of one micro-batch is planned on the real mesh by the sharding ILP, priced as a step
runs it (``plan_microbatch_program``: forward and backward k times, the update once), and run as
a pipeline of one stage (passes/pipeline_lower.py, runtime/pipeline.py): k forward-backward tasks,
the gradients summed in micro-batch order at the meeting points (an all-reduce over the mesh's
data axes carries the partial sums through, so it runs once per step, after the sum), then one
update task.

    plan = plan_accumulated(graph, Mesh({"dp": 2}), PlanOptions(microbatches=4))
    plan.step_s       # predicted seconds per step: k passes, one update, one gradient sync
    plan.peak_bytes   # predicted peak bytes of the fullest device: one micro-batch's activations,
                      # the parameters and optimizer state, the running gradient sums
    plan.microbatch_size, plan.m, plan.sub_plan (the ShardingPlan of one micro-batch's program)
"""

from __future__ import annotations

from graphc.core.errors import PlanError
from graphc.core.ir import Graph
from graphc.core.mesh import as_mesh
from graphc.passes.options import PlanOptions
from graphc.passes.pipeline import PipelinePlan, pipe_axis, plan_pipeline


def plan_accumulated(
    graph: Graph, mesh, options: PlanOptions = PlanOptions(), ties: list | None = None
) -> PipelinePlan:
    """The plan of ``graph`` (optimized for planning: passes/partition.py) on ``mesh`` (no pp
    axis) as ``options.microbatches`` micro-batches with gradient accumulation (module doc).
    ``ties``: the state ties (default ``state_ties(graph)``). PlanError for a count the step
    cannot take (``microbatch``: not dividing the batch, no batch input, a step reading the whole
    batch in its update), a mesh with a pp axis (``plan_pipeline`` plans those), or a plan that
    does not fit ``options.memory_limit``."""
    mesh = as_mesh(mesh)
    if pipe_axis(mesh) is not None:
        raise PlanError(f"plan_accumulated plans meshes without a pp axis, got {mesh}: use plan_pipeline")
    return plan_pipeline(graph, mesh, options, ties)


__all__ = ["plan_accumulated"]
