"""The model the offload tests share: a 4-layer GPT-3 training step in bfloat16 with float32 Adam
moments (d=64, 4 heads, 16 tokens, vocabulary 128, batch 8), small enough to solve in seconds and
with optimizer state and stashed activations of the sizes offload is for. The block-search tests
(tests/passes/test_offload*.py) take it as a layered model; the fixed-mesh ILP tests
(tests/passes/sharding/test_offload*.py) plan its graph on one device with ``plan_one_device``."""

import graphc
from graphc.api.parallel import Parallelized
from graphc.core.ir import Graph
from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.core.pytree import static_argnames
from graphc.models import gpt3
from graphc.passes import scale
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, make_plan, solve_problem, state_ties
from graphc.passes.search import step_batch

BATCH = 8
# one device, no recomputation: offload is the only way to save memory, so the ILP's choice and its
# price can be checked in closed form
OFFLOAD_ONLY = dict(recompute="off", time_limit=120.0)
# a segment that costs nothing: the pre and head of block-search cost tables built by hand
NO_COST = scale.SegmentCost(0.0, 0.0, 0, 0, 0.0, None)


def gpt3_bf16_step() -> Graph:
    """The traced, optimized training step (one graph per call: tests may mutate what they build on it)."""
    args, kw = gpt3.example_train_specs(
        n_layer=4, d=64, n_head=4, seq=16, n_vocab=128, batch=BATCH, dtype=graphc.bfloat16
    )
    step = Parallelized(gpt3.train_step, {"dp": 1}, static_argnames=static_argnames(kw))
    return step.trace_optimized(*args, **kw)[1]


def gpt3_tied_tp2_step() -> Graph:
    """A 3-layer GPT-3 step in bfloat16 with float32 Adam moments (d=32), traced for tp=2: three
    tied layers, small enough for the fixed-mesh ILP's exactness tests to solve whole."""
    args, kw = gpt3.example_train_specs(n_layer=3, d=32, n_head=4, seq=8, n_vocab=64, batch=4, dtype=graphc.bfloat16)
    step = Parallelized(gpt3.train_step, {"tp": 2}, static_argnames=static_argnames(kw))
    return step.trace_optimized(*args, **kw)[1]


def gpt3_bf16_layered(profile: MachineProfile):
    """The step as the block search sees it: pre, one repeated layer, head."""
    g = gpt3_bf16_step()
    return scale.layered_model(g, step_batch(g), profile)


def plan_one_device(graph: Graph, profile: MachineProfile, limit: int | None):
    """The fixed-mesh ILP's problem, solution and plan of ``graph`` on one device under ``limit``,
    without recomputation (``OFFLOAD_ONLY``)."""
    opts = PlanOptions(memory_limit=limit, **OFFLOAD_ONLY)
    problem = build_problem(graph, Mesh({"dp": 1}, profile=profile), opts, ties=state_ties(graph))
    solution = solve_problem(problem, opts)
    return problem, solution, make_plan(problem, solution, opts, 0.0)
