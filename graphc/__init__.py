"""graphc: numpy model code -> Graph IR -> optimized, partitioned, parallel execution.

Public API (everything else is internal and may change):

    trace(fn, *args, **kwargs) -> Graph      record a numpy function as a graph
    grad, value_and_grad, vjp, jvp           autodiff (eager on numpy arrays, or inside a trace)
    optim.sgd / momentum / adam              optimizers as plain pytree functions
    ps.train(grad_fn, params, batches, workers=4, servers=2, mode="sync"|"async"|"ssp")
                                             SGD on a parameter server of threads (api/ps.py)
    cond, while_loop, fori_loop              explicit graph control flow (the source transform emits them too)
    rng_seed(seed) / rng_seed(rng=gen)       the stream np.random.rand/randn/... draw from in traced code (docs/random.md)
    tree_map(fn, tree, *rest)                map over array leaves of pytrees
    add_user_code(folder)                    report that folder's lines as the user's (code inside an installed package)
    register_pytree(cls, flatten, unflatten) a class as a pytree node, as JAX's register_pytree_node
                                             (dataclasses, NamedTuples, plain objects need none)
    StateUpdate                              a traced function's result and what it wrote into its
                                             argument objects (.apply(*args) stores it; jit does)
    evaluate(graph, *args, **kwargs)         run a graph with the reference interpreter
    optimize(graph, passes=None)             run the default pass pipeline (or the named passes)
    jit(fn, static_argnames=())              trace + optimize + run on the single-device executor
    Mesh({"dp": 2, "tp": 4})                 a device mesh with named axes and a link model per axis
    MachineProfile, get_profile("h100-sxm")  what the planner assumes of the devices (presets, files)
    parallelize(fn, mesh=..., memory_limit=None, static_argnames=())
                                             auto-sharding: ``.plan(*args) -> ShardingPlan`` (ILP over
                                             strategies); calling it runs on the mesh (one thread per device)
    shard(x, "S(0)", "R")                    pin a tensor's sharding spec inside a traced function
    parallelize(..., backend="mpi")          one process per device under mpiexec; results are ShardedArrays
    sharded_input(shape, dtype, fn)          an input each device builds its own piece of (fn(index))
    ShardedArray, ShardedInput               values split over the devices (.gather(root=0), .local)
    save_checkpoint / load_checkpoint        sharded checkpoints: atomic, checksummed, resharded on load
    ShardingPlan (also Plan), PipelinePlan   partition plans (frozen values; JSON, summary, explain)
    parse(text) -> Graph                     read the text IR back
    Graph, Node, Value, TensorType           the IR
    ArraySpec(shape, dtype)                  an argument that has a type but no data
    bfloat16                                 numpy's bfloat16 dtype (ml_dtypes): computed in float32, each result rounded
    OPS                                      the op registry (name -> OpDef)
    TraceError, ParseError, VerifyError, EvaluationError, PlanError, MeshError, GraphcError
    MemoryLimitError                         a PlanError: no plan fits the memory limit (min_memory_bytes when proven)
    TimeLimitError                           a PlanError: the time limit ran out before any plan was found
    GraphcWarning, CacheWarning              warnings (a cache not used, an entry discarded and rebuilt)
    RecompileWarning                         a jitted/parallelized function compiled again and again (names why)
    PromotionWarning                         numpy's promotion made a jitted function's float32 values float64 (names the line)
    RandomWarning                            an np.random call graphc could not trace (numpy's numbers, frozen; names the line)
    MeshWarning                              a mesh axis named like a role but not one (dq=2): a free axis
    PlanWarning                              a plan replicates work it was asked to split (the plan's warnings)

``import graphc`` is lazy (PEP 562): each name imports its module on first use, so importing the
package costs little and numba (kernels) and HiGHS (the ILP) load only when used.
"""

from __future__ import annotations

import importlib
from typing import Any

from graphc.runtime.guarding import guard_this_rank

__version__ = "0.1.0"

# under hydra (MPICH's mpiexec) this rank goes on in a child process, guarded by this one, so that
# a rank killed by a signal is named by every survivor (runtime/guarding.py; GRAPHC_RANK_GUARD=0: not)
guard_this_rank()

# public name -> (module, attribute in it)
_EXPORTS: dict[str, tuple[str, str]] = {
    "trace": ("graphc.frontend.entry", "trace"),
    "add_user_code": ("graphc.frontend.locations", "add_user_code"),
    "cond": ("graphc.frontend.entry", "cond"),
    "while_loop": ("graphc.frontend.entry", "while_loop"),
    "fori_loop": ("graphc.frontend.entry", "fori_loop"),
    "rng_seed": ("graphc.frontend.random", "rng_seed"),
    "RandomWarning": ("graphc.frontend.random", "RandomWarning"),
    "Tracer": ("graphc.frontend.tracer", "Tracer"),
    "grad": ("graphc.autodiff", "grad"),
    "jvp": ("graphc.autodiff", "jvp"),
    "value_and_grad": ("graphc.autodiff", "value_and_grad"),
    "vjp": ("graphc.autodiff", "vjp"),
    "evaluate": ("graphc.interpreter", "evaluate"),
    "parse": ("graphc.textir", "parse"),
    "print_graph": ("graphc.core.ir", "print_graph"),
    "Graph": ("graphc.core.ir", "Graph"),
    "Node": ("graphc.core.ir", "Node"),
    "TensorType": ("graphc.core.ir", "TensorType"),
    "Value": ("graphc.core.ir", "Value"),
    "ArraySpec": ("graphc.core.pytree", "ArraySpec"),
    "tree_map": ("graphc.core.pytree", "tree_map"),
    "register_pytree": ("graphc.core.pytree", "register_pytree"),
    "StateUpdate": ("graphc.core.pytree", "StateUpdate"),
    "Mesh": ("graphc.core.mesh", "Mesh"),
    "MeshError": ("graphc.core.errors", "MeshError"),
    "MachineProfile": ("graphc.core.profile", "MachineProfile"),
    "get_profile": ("graphc.core.profiles", "get_profile"),
    "bfloat16": ("graphc.core.dtypes", "BFLOAT16"),
    "OPS": ("graphc.ops", "REGISTRY"),
    "optimize": ("graphc.passes.manager", "optimize"),
    "jit": ("graphc.api.jit", "jit"),
    "parallelize": ("graphc.api.parallel", "parallelize"),
    "shard": ("graphc.api.parallel", "shard"),
    "sharded_input": ("graphc.runtime.devices", "sharded_input"),
    "ShardedInput": ("graphc.runtime.devices", "ShardedInput"),
    "ShardedArray": ("graphc.runtime.devices", "ShardedArray"),
    "save_checkpoint": ("graphc.api.checkpoint", "save_checkpoint"),
    "load_checkpoint": ("graphc.api.checkpoint", "load_checkpoint"),
    "CheckpointError": ("graphc.core.checkpoint_format", "CheckpointError"),
    "ShardingPlan": ("graphc.passes.sharding.plan", "ShardingPlan"),
    "Plan": ("graphc.passes.sharding.plan", "ShardingPlan"),
    "PipelinePlan": ("graphc.passes.pipeline", "PipelinePlan"),
    "GraphcError": ("graphc.core.errors", "GraphcError"),
    "GraphcWarning": ("graphc.core.errors", "GraphcWarning"),
    "CacheWarning": ("graphc.core.errors", "CacheWarning"),
    "RecompileWarning": ("graphc.core.errors", "RecompileWarning"),
    "PromotionWarning": ("graphc.core.errors", "PromotionWarning"),
    "MeshWarning": ("graphc.core.errors", "MeshWarning"),
    "PlanWarning": ("graphc.core.errors", "PlanWarning"),
    "TraceError": ("graphc.core.errors", "TraceError"),
    "ParseError": ("graphc.core.errors", "ParseError"),
    "VerifyError": ("graphc.core.errors", "VerifyError"),
    "EvaluationError": ("graphc.core.errors", "EvaluationError"),
    "PlanError": ("graphc.core.errors", "PlanError"),
    "MemoryLimitError": ("graphc.core.errors", "MemoryLimitError"),
    "TimeLimitError": ("graphc.core.errors", "TimeLimitError"),
    "SourceLoc": ("graphc.core.errors", "SourceLoc"),
}
# public submodule -> the module it is
_SUBMODULES = {"optim": "graphc.optim", "ps": "graphc.api.ps"}

__all__ = sorted([*_EXPORTS, *_SUBMODULES])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value  # later lookups skip this function
        return value
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    raise AttributeError(f"module 'graphc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
