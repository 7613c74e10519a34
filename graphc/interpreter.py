"""The reference interpreter: the oracle every later stage is checked against.

A plain loop over the nodes with an environment of numpy arrays; each op runs its numpy reference
implementation. A value is dropped after its last use. An op on bfloat16 or float16 computes in
float32 and rounds each result (graphc/ops/precision.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from graphc.core.buffers import foreign_semantics, unaliased, written_overlap
from graphc.core.captured import changed_read
from graphc.core.errors import (
    NUMPY_ERRORS,
    EvaluationError,
    GraphcError,
    NumpyError,
    TraceError,
    note_where,
    numpy_error,
)
from graphc.core.ir import Graph, Region, Value
from graphc.core.pytree import ArraySpec, flatten_as, unflatten
from graphc.ops import precision


def bind_arguments(graph: Graph, args: tuple, kwargs: dict, keep: type | tuple[type, ...] = ()) -> list[Any]:
    """Flatten call arguments against the graph's signature, checking structure, shapes and dtypes.
    Leaves of the ``keep`` types (ShardedArrays that stay on their devices) are checked by their
    shape and dtype and passed through without being converted to arrays."""
    try:
        leaves = flatten_as((tuple(args), dict(kwargs)), graph.in_tree, path="arguments")
    except ValueError as exc:
        raise EvaluationError(f"graph @{graph.name}: {exc}") from None
    arrays: list[Any] = []
    for leaf, value in zip(leaves, graph.inputs):
        if isinstance(leaf, ArraySpec) and not hasattr(leaf, "__array__"):  # a ShardedArray has data
            raise EvaluationError(f"graph @{graph.name}: input %{value.name} is an ArraySpec; evaluation needs data")
        foreign = foreign_semantics(leaf)
        if foreign is not None:
            raise EvaluationError(f"graph @{graph.name}: input %{value.name} is {foreign}")
        arr: Any = leaf if keep and isinstance(leaf, keep) else np.asarray(leaf)
        if tuple(arr.shape) != value.type.shape or np.dtype(arr.dtype) != value.type.dtype:
            raise EvaluationError(
                f"graph @{graph.name}: input %{value.name} expects {value.type}, "
                f"got array of shape {arr.shape} and dtype {arr.dtype}"
            )
        arrays.append(arr)
    check_call(graph, arrays)
    return arrays


def check_call(graph: Graph, arrays: Sequence[Any]) -> None:
    """Refuse a call of ``graph`` (``arrays``: its inputs) that it would answer unlike numpy:
    arguments overlapping an array it writes in place, globals it compiled that changed since."""
    if graph.written_inputs:
        check_written_unaliased(graph, arrays)
    if graph.global_reads:
        check_global_reads(graph)


def check_global_reads(graph: Graph) -> None:
    """Refuse a call after an array the traced functions read from their globals or closures
    (``graph.global_reads``, compiled as constants) changed: numpy would read its new values. A
    TraceError at the function that reads it."""
    read = changed_read(graph.global_reads)
    if read is None:
        return
    where = "global" if isinstance(read.holder, dict) else "closure variable"
    raise TraceError(
        f"{read.function} reads the {where} {read.name}, whose value changed since graphc compiled it into this "
        f"function (as jax.jit does: arrays as constants, numbers and functions as traced then); numpy would "
        f"read the new value. Pass {read.name} as an argument (or hold it on an object passed as one) to read it "
        "at every call",
        read.loc,
    )


def check_written_unaliased(graph: Graph, arrays: Sequence[Any]) -> None:
    """Refuse a call whose arguments share memory with an input the function writes into in place
    (``graph.written_inputs``): numpy would see the write through the other name (a tied weight
    held twice, the same array passed twice, a view held beside its array), the graph reads each
    input as it was at the call. A TraceError at the line of the write."""
    if not graph.written_inputs:
        return
    hit = written_overlap(arrays, [i for i, _ in graph.written_inputs])
    if hit is None:
        return
    i, j = hit
    loc = dict(graph.written_inputs)[i]
    a, b = graph.inputs[i].name, graph.inputs[j].name
    same = type(arrays[i]) is np.ndarray and arrays[i] is arrays[j]
    raise TraceError(
        f"{graph.name} writes into {a} in place, and this call passes {b} "
        f"{'as the same array' if same else 'over memory it shares'}: numpy would see "
        f"the write through {b}, graphc reads each argument as it was at the call. Pass separate "
        f"arrays (np.copy), or hold the array under one name",
        loc,
    )


def last_uses(graph: Graph | Region) -> dict[int, list[Value]]:
    """For each node index, the values whose last use is that node (graph outputs are never freed)."""
    last: dict[Value, int] = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last[v] = i
    keep = set(graph.outputs)
    out: dict[int, list[Value]] = {}
    for v, i in last.items():
        if v not in keep:
            out.setdefault(i, []).append(v)
    return out


def run_flat(graph: Graph | Region, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Run a graph body or a region on flat input arrays."""
    env: dict[Value, np.ndarray] = dict(zip(graph.inputs, arrays))
    frees = last_uses(graph)
    for i, node in enumerate(graph.nodes):
        operands = [env[v] for v in node.inputs]
        try:
            if node.regions:
                results = tuple(np.asarray(r) for r in node.op.impl(run_flat, node.regions, *operands, **node.attrs))
            else:  # (bfloat16 and float16 in float32, each result rounded: ops/precision.py)
                results = precision.evaluate(node, *operands)
        except Exception as exc:
            note_where(exc, node.op.name, node.loc)
            if isinstance(exc, NUMPY_ERRORS) and not isinstance(exc, GraphcError):  # numpy raised on these values
                raise numpy_error(exc, NumpyError).with_traceback(exc.__traceback__) from None
            raise
        for value, result in zip(node.outputs, results):
            if result.shape != value.type.shape or result.dtype != value.type.dtype:
                raise AssertionError(
                    f"reference implementation of {node.op.name} at {node.loc} returned "
                    f"{result.dtype}{list(result.shape)}, expected {value.type}"
                )
            env[value] = result
        for v in frees.get(i, ()):
            env.pop(v, None)
    return [env[v] for v in graph.outputs]


def as_numpy_result(x: np.ndarray) -> Any:
    """numpy returns scalars, not 0-d arrays, from most operations; do the same."""
    return x[()] if x.ndim == 0 else x


def evaluate(graph: Graph, *args: Any, **kwargs: Any) -> Any:
    """Run ``graph`` on the same arguments its function was traced with; returns the same pytree."""
    arrays = bind_arguments(graph, args, kwargs)
    outs = run_flat(graph, arrays)
    outs = [o if o.flags.writeable else o.copy() for o in outs]  # constants are read-only: return copies
    outs = unaliased(outs, arrays)  # an input returned, or one value returned twice: a copy
    return unflatten(graph.out_tree, [as_numpy_result(o) for o in outs])
