"""16-bit floats (bfloat16, float16): every op computes in float32 and rounds each result.

These are graphc's semantics for a value typed ``bf16`` or ``f16``, as XLA's CPU backend runs
them: an op up-converts its 16-bit float operands to float32 (exact), runs its float32
implementation (numpy's float32 loops, float32 BLAS for a matmul, a float32 accumulator for a
reduction) and rounds each result the graph types as 16-bit to that type, to nearest with ties
to even (``astype``, ml_dtypes' rounding for bfloat16). A graph on 16-bit floats therefore gives
what the same graph on float32 gives when every 16-bit typed value is rounded where it is made:
bit for bit for elementwise ops, within a 16-bit ulp for sums (BLAS and numpy add in orders of
their own). numpy's own bfloat16 loops (ml_dtypes) would round inside a sum at every addition,
and its bfloat16 matmul returns float32.

The reference interpreter and constant folding (``evaluate``) and the executor (``in_float32``
around its step) all run an op this way, so they agree bit for bit. Views (reshape,
transpose, slices) move no arithmetic and run on the 16-bit arrays themselves; collectives sum
in float32 too (runtime/pieces.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.core.dtypes import BFLOAT16, LOW_FLOATS
from graphc.core.ir import Node
from graphc.core.traits import Collective, Selects, ViewOf

COMPUTE = np.dtype(np.float32)


def computes_in_float32(node: Node) -> bool:
    """Whether ``node`` reads or makes a 16-bit float and does arithmetic on it (not a view, a
    collective, a selection (maximum, minimum: the result is an operand, bit for bit), or a
    control-flow node, whose regions' nodes are run one by one)."""
    if node.regions or node.op.has(ViewOf) or node.op.has(Collective) or node.op.has(Selects):
        return False
    return any(v.type.dtype in LOW_FLOATS for v in (*node.inputs, *node.outputs))


def result_dtypes(node: Node) -> tuple[np.dtype, ...]:
    return tuple(o.type.dtype for o in node.outputs)


def up(x: Any) -> Any:
    """``x`` in float32 when it is a 16-bit float array (exact), else ``x`` itself."""
    return x.astype(COMPUTE) if isinstance(x, np.ndarray) and x.dtype in LOW_FLOATS else x


def in_float32(fn: Callable[..., Any], out_dtypes: tuple[np.dtype, ...]) -> Callable[..., Any]:
    """``fn`` run on float32 copies of its 16-bit float operands, each result rounded to its
    declared dtype (``out_dtypes``). ``fn`` returns one array or a tuple/list of them; the
    wrapper returns the same form."""

    def run(*xs: Any) -> Any:
        result = fn(*(up(x) for x in xs))
        if isinstance(result, (tuple, list)):
            return type(result)(_round(r, dt) for r, dt in zip(result, out_dtypes))
        return _round(result, out_dtypes[0])

    return run


def evaluate(node: Node, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """``node.op.evaluate`` on ``arrays`` with the node's attributes, in float32 where
    ``computes_in_float32(node)``: the reference result of a node without regions."""
    if not computes_in_float32(node):
        return node.op.evaluate(*arrays, **node.attrs)
    return in_float32(lambda *xs: node.op.evaluate(*xs, **node.attrs), result_dtypes(node))(*arrays)


def _round(result: Any, dtype: np.dtype) -> np.ndarray:
    result = np.asarray(result)
    return result if result.dtype == dtype else result.astype(dtype)


# Ops a fused kernel may run on bfloat16 values (runtime/lowkernel.py) with the bits of the op-by-op
# path above: each computes an exactly rounded float32 result (IEEE +, -, *, /, sqrt; sign, abs, neg,
# where, compare and the float32 <-> bfloat16 conversion are exact), so computing it in float32 and
# rounding to bfloat16 gives the same bits whatever routine computes it. Not here: exp, tanh, log
# (the kernels' own approximations differ from numpy's float32 in the last bit, which can move a
# bfloat16 rounding), reductions (another order of addition), maximum / minimum (Selects: numpy's
# bfloat16 loop picks between equal zeros its own way), float16 (Numba has no float16 arithmetic).
BF16_KERNEL_OPS = frozenset({"add", "sub", "mul", "div", "neg", "abs", "sign", "sqrt", "where", "compare", "convert"})
_BF16_KERNEL_DTYPES = frozenset({BFLOAT16, COMPUTE, np.dtype(np.bool_)})


def fuses_in_bfloat16(node: Node) -> bool:
    """Whether ``node``, which reads or makes a bfloat16 value, can run in a fused kernel with the
    bits of ``in_float32`` (see BF16_KERNEL_OPS). Its operands and results are bfloat16, float32 or
    bool (a where's condition, a comparison's result)."""
    if node.op.name not in BF16_KERNEL_OPS or node.regions:
        return False
    return all(v.type.dtype in _BF16_KERNEL_DTYPES for v in (*node.inputs, *node.outputs))
