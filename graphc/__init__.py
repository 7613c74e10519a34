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
    parse(text) -> Graph                     read the text IR back
    Graph, Node, Value, TensorType           the IR
    ArraySpec(shape, dtype)                  an argument that has a type but no data
    OPS                                      the op registry (name -> OpDef)
    TraceError, ParseError, VerifyError, EvaluationError, GraphcError
"""

from graphc import optim
from graphc.autodiff import grad, jvp, value_and_grad, vjp
from graphc.errors import EvaluationError, GraphcError, ParseError, SourceLoc, TraceError, VerifyError
from graphc.frontend import Tracer, trace
from graphc.frontend.control import cond, fori_loop, while_loop
from graphc.interpreter import evaluate
from graphc.ir import Graph, Node, TensorType, Value
from graphc.jit import jit
from graphc.ops import REGISTRY as OPS
from graphc.pytree import ArraySpec, tree_map
from graphc.textir import parse, print_graph


def optimize(graph: Graph, passes=None, verify=None, dump_dir=None) -> Graph:
    """Run the default optimization pipeline (or the named passes) on ``graph``; see passes/."""
    from passes import optimize as _optimize

    return _optimize(graph, passes, verify, dump_dir)


__version__ = "0.1.0"

__all__ = [
    "ArraySpec",
    "EvaluationError",
    "Graph",
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
    "tree_map",
    "value_and_grad",
    "vjp",
    "parse",
    "print_graph",
    "trace",
]
