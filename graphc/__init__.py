"""graphc: numpy model code -> Graph IR -> optimized, partitioned, parallel execution.

Public API (everything else is internal and may change):

    trace(fn, *args, **kwargs) -> Graph      record a numpy function as a graph
    grad, value_and_grad, vjp, jvp           autodiff (eager on numpy arrays, or inside a trace)
    optim.sgd / momentum / adam              optimizers as plain pytree functions
    cond, while_loop, fori_loop              explicit graph control flow (the source transform emits them too)
    tree_map(fn, tree, *rest)                map over array leaves of pytrees
    evaluate(graph, *args, **kwargs)         run a graph with the reference interpreter
    optimize(graph, passes=None)             run the default pass pipeline (or the named passes)
    jit(fn, static_argnames=())              trace + optimize + run on the single-device executor
    Mesh({"dp": 2, "tp": 4})                 a device mesh with named axes and a link model per axis
    parallelize(fn, mesh=..., memory_limit=None, static_argnames=())
                                             auto-sharding: ``.plan(*args) -> Plan`` (ILP over strategies);
                                             calling it runs on the mesh (one thread per device)
    shard(x, "S(0)", "R")                    pin a tensor's sharding spec inside a traced function
    Plan                                     a partition plan (JSON document, summary, explain)
    parse(text) -> Graph                     read the text IR back
    Graph, Node, Value, TensorType           the IR
    ArraySpec(shape, dtype)                  an argument that has a type but no data
    OPS                                      the op registry (name -> OpDef)
    TraceError, ParseError, VerifyError, EvaluationError, PlanError, MeshError, GraphcError
"""

from graphc import optim
from graphc.autodiff import grad, jvp, value_and_grad, vjp
from graphc.core.errors import EvaluationError, GraphcError, ParseError, PlanError, SourceLoc, TraceError, VerifyError
from graphc.core.ir import Graph, Node, TensorType, Value
from graphc.core.mesh import Mesh, MeshError
from graphc.core.pytree import ArraySpec, tree_map
from graphc.frontend import Tracer, cond, fori_loop, trace, while_loop
from graphc.interpreter import evaluate
from graphc.jit import jit
from graphc.ops import REGISTRY as OPS
from graphc.parallel import parallelize, shard
from graphc.plan import Plan
from graphc.textir import parse, print_graph


def optimize(graph: Graph, passes=None, verify=None, dump_dir=None) -> Graph:
    """Run the default optimization pipeline (or the named passes) on ``graph``; see passes/."""
    from graphc.passes import optimize as _optimize

    return _optimize(graph, passes, verify, dump_dir)


__version__ = "0.1.0"

__all__ = [
    "ArraySpec",
    "EvaluationError",
    "Graph",
    "Mesh",
    "MeshError",
    "Plan",
    "PlanError",
    "GraphcError",
    "Node",
    "OPS",
    "ParseError",
    "SourceLoc",
    "TensorType",
    "TraceError",
    "Tracer",
    "Value",
    "VerifyError",
    "cond",
    "evaluate",
    "fori_loop",
    "while_loop",
    "grad",
    "jit",
    "jvp",
    "optimize",
    "optim",
    "parallelize",
    "shard",
    "tree_map",
    "value_and_grad",
    "vjp",
    "parse",
    "print_graph",
    "trace",
]
