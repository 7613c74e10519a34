"""The scalar expression of each elementwise op inside a generated kernel (runtime/kernelsource.py):
numpy's semantics for one element, as Numba-compiled Python text.

Arithmetic is cast to the result dtype after every op, as numpy rounds after every ufunc; exp,
tanh, log, expm1 and log1p call the vectorizable versions of runtime/fastmath.py (Numba's wheels
have no vectorized libm); maximum/minimum propagate NaN; a power by a scalar exponent takes
numpy's fast paths.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphc.core.ir import Node

_FASTMATH = {"exp": "exp", "tanh": "tanh", "log": "log", "log1p": "log1p_", "expm1": "expm1_"}
_FLOAT_FUNCS = {"sqrt": "math.sqrt", "sin": "math.sin", "cos": "math.cos"}  # (kernels are float32/64 only)
_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}
# numpy's integer +, - and * wrap. Numba computes integers of every signed width in int64 with
# LLVM's nsw flag, under which a signed overflow is undefined: LLVM folds ``x + x == 0`` to
# ``x == 0`` and ``x - 1 > x`` to False. Its uint64 arithmetic has no such flag and wraps, and
# the low bits of a sum, difference or product do not depend on the operands' signedness, so
# these ops compute in uint64 and cast to the result dtype.
_WRAPPING = ("add", "sub", "mul")
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def np_type(dt: np.dtype) -> str:
    return "np.bool_" if dt.kind == "b" else f"np.{np.dtype(dt).name}"


def constant_text(value: np.ndarray) -> str:
    """A scalar constant as Python source (``float('inf')`` and ``float('nan')`` for non-finite floats)."""
    val = value.reshape(()).item()
    return f"float({str(val)!r})" if isinstance(val, float) and not math.isfinite(val) else repr(val)


def arithmetic_expr(name: str, args: list[str], dtype: np.dtype) -> str | None:
    """Arithmetic and math functions, cast to the result dtype; None for other ops."""
    cast = np_type(dtype)
    if name in _WRAPPING and dtype.kind in "iu":  # in uint64, which wraps (see _WRAPPING)
        return f"{cast}(np.uint64({args[0]}) {_BINARY[name]} np.uint64({args[1]}))"
    if name in _BINARY:
        return f"{cast}({args[0]} {_BINARY[name]} {args[1]})"
    if name in _FASTMATH:  # vectorizable versions (runtime/fastmath.py)
        return f"fm.{_FASTMATH[name]}{'32' if dtype == np.float32 else '64'}({args[0]})"
    if name in _FLOAT_FUNCS:
        return f"{cast}({_FLOAT_FUNCS[name]}({args[0]}))"
    if name == "neg":
        return f"{cast}(-{args[0]})"
    if name == "abs":
        return f"{cast}(abs({args[0]}))"
    if name == "sign":  # numpy's: sign(-0.0) is +0.0 and sign(nan) nan (Numba's np.sign keeps -0.0)
        a = args[0]
        return f"{cast}(1 if {a} > 0 else -1 if {a} < 0 else ({a} if {a} != {a} else 0))"
    return None


def scalar_exponent(node: Node) -> bool:
    """Whether numpy's float power loop sees this pow's exponent with stride 0, as one scalar for
    the whole loop: a 0-d exponent, or one of size 1 that is broadcast (the operand shapes differ
    from the result's, so numpy iterates them with stride 0); size-1 operands of the result's own
    shape are walked with their strides. It then takes the fast path below."""
    base, exponent = node.inputs
    out = node.outputs[0]
    if out.dtype.kind != "f" or exponent.type.size != 1:
        return False
    if exponent.ndim == 0:
        return True
    return not (exponent.shape == out.shape and (base.ndim == 0 or base.shape == out.shape))


def power_expr(node: Node, args: list[str]) -> str:
    """numpy's float32/float64 power loop with a scalar exponent (see ``scalar_exponent``): -1, 0,
    0.5, 1 and 2 are 1/x, 1, sqrt(x), x and x*x (sqrt(-0.0) is -0.0 and sqrt(-inf) nan, where pow
    gives 0.0 and inf), any other exponent pow."""
    x, e = args
    cast = np_type(node.outputs[0].dtype)
    return (
        f"{cast}(1.0 / {x} if {e} == -1.0 else 1.0 if {e} == 0.0 else math.sqrt({x}) if {e} == 0.5 "
        f"else {x} if {e} == 1.0 else {x} * {x} if {e} == 2.0 else {x} ** {e})"
    )


def select_expr(name: str, args: list[str], dtype: np.dtype) -> str | None:
    """maximum and minimum (NaN-propagating for floats, like numpy) and where; None for other ops."""
    if name == "maximum":
        a, b = args
        return f"({a} if ({a} != {a} or {a} > {b}) else {b})" if dtype.kind == "f" else f"max({a}, {b})"
    if name == "minimum":
        a, b = args
        return f"({a} if ({a} != {a} or {a} < {b}) else {b})" if dtype.kind == "f" else f"min({a}, {b})"
    if name == "where":
        return f"({args[1]} if {args[0]} else {args[2]})"
    return None


def logical_expr(name: str, args: list[str], dtype: np.dtype, attrs: dict[str, Any]) -> str | None:
    """Comparisons and logical ops; None for other ops."""
    if name == "compare":
        return f"({args[0]} {_COMPARE[attrs['direction']]} {args[1]})"
    if name == "logical_and":
        return f"({args[0]} and {args[1]})"
    if name == "logical_or":
        return f"({args[0]} or {args[1]})"
    if name == "logical_not":
        return f"(not {args[0]})"
    return None


def convert_expr(node: Node, args: list[str]) -> str:
    """dtype conversion. A float goes to an integer narrower than 64 bits through int64, which
    then wraps into the narrower type, as numpy's cast does on x86-64 (-1.0 to uint8 is 255, 300.0
    is 44): Numba's direct conversion of a float out of the target's range is undefined (LLVM's
    fptoui), and gave 0 in vectorized loops and the wrapped value in their tails."""
    (x,) = args
    dtype = node.outputs[0].dtype
    if dtype.kind == "b":
        return f"({x} != 0)"
    if node.inputs[0].dtype.kind == "f" and dtype.kind in "iu" and dtype.itemsize < 8:
        return f"{np_type(dtype)}(np.int64({x}))"
    return f"{np_type(dtype)}({x})"
