"""numpy ufuncs on traced arrays.

Type resolution is numpy's own: ``ufunc.resolve_dtypes`` picks the inner loop from the operand
dtypes, with Python scalars weak and numpy scalars strong (NEP 50). Operands are converted to the
loop's input dtypes, then one primitive is emitted.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.errors import TraceError
from graphc.frontend.tracer import Tracer, bind, fresh, lift, user_location

# ufunc -> (primitive, attrs). The primitive sees operands already converted to the loop dtype.
_SIMPLE: dict[np.ufunc, tuple[str, dict[str, Any]]] = {
    np.add: ("add", {}),
    np.subtract: ("sub", {}),
    np.multiply: ("mul", {}),
    np.true_divide: ("div", {}),
    np.power: ("pow", {}),
    np.float_power: ("pow", {}),
    np.maximum: ("maximum", {}),
    np.minimum: ("minimum", {}),
    np.negative: ("neg", {}),
    np.exp: ("exp", {}),
    np.log: ("log", {}),
    np.log1p: ("log1p", {}),
    np.expm1: ("expm1", {}),
    np.tanh: ("tanh", {}),
    np.sqrt: ("sqrt", {}),
    np.sin: ("sin", {}),
    np.cos: ("cos", {}),
    np.absolute: ("abs", {}),
    np.sign: ("sign", {}),
    np.logical_not: ("logical_not", {}),
    np.logical_and: ("logical_and", {}),
    np.logical_or: ("logical_or", {}),
    np.equal: ("compare", {"direction": "eq"}),
    np.not_equal: ("compare", {"direction": "ne"}),
    np.less: ("compare", {"direction": "lt"}),
    np.less_equal: ("compare", {"direction": "le"}),
    np.greater: ("compare", {"direction": "gt"}),
    np.greater_equal: ("compare", {"direction": "ge"}),
}

# bitwise ops on bool arrays are the logical ops (masks combined with & | ~)
_BOOL_ONLY = {np.bitwise_and: "logical_and", np.bitwise_or: "logical_or", np.invert: "logical_not"}

_REDUCE = {np.add: np.sum, np.maximum: np.max, np.minimum: np.min}


def _operand_dtype(x: Any):
    """What resolve_dtypes needs: a dtype for arrays and numpy scalars, the Python type for
    Python int/float (weak scalars, NEP 50)."""
    if isinstance(x, Tracer):
        return x.dtype
    if isinstance(x, (np.ndarray, np.generic)):
        return x.dtype
    if isinstance(x, bool):
        return np.dtype(np.bool_)
    if isinstance(x, (int, float)):
        return type(x)
    if isinstance(x, complex):
        raise TraceError("complex numbers are not supported", user_location())
    if isinstance(x, (list, tuple)):
        return lift(x).dtype
    raise TraceError(f"cannot use {type(x).__name__} as an array operand", user_location())


def resolve_loop(ufunc: np.ufunc, inputs: tuple) -> tuple[np.dtype, ...]:
    """numpy's loop signature (input dtypes..., output dtypes...) for these operands."""
    in_dts = tuple(_operand_dtype(x) for x in inputs)
    try:
        return tuple(np.dtype(d) for d in ufunc.resolve_dtypes(in_dts + (None,) * ufunc.nout))
    except (TypeError, np.exceptions.DTypePromotionError) as exc:
        shown = ", ".join(str(getattr(d, "__name__", d)) for d in in_dts)
        raise TraceError(f"numpy.{ufunc.__name__} has no loop for operand dtypes ({shown}): {exc}", user_location()) from None


def apply_ufunc(ufunc: np.ufunc, *inputs: Any) -> Tracer:
    """Call a supported elementwise ufunc with numpy's exact type resolution."""
    if ufunc is np.matmul:
        from graphc.frontend.functions import matmul

        return matmul(*inputs)
    sig = resolve_loop(ufunc, inputs)
    loop_in = sig[: ufunc.nin]
    operands = [lift(x, dt) for x, dt in zip(inputs, loop_in)]
    if ufunc is np.positive:
        return fresh(operands[0])
    if ufunc is np.square:
        return bind("mul", operands[0], operands[0])
    if ufunc is np.reciprocal:
        if sig[0].kind != "f":
            raise TraceError("np.reciprocal of integers is not supported (it truncates)", user_location())
        return bind("div", lift(np.ones((), sig[0])), operands[0])
    if ufunc in COMPOSITE:
        return _composite(ufunc, sig, operands)
    if ufunc in _BOOL_ONLY:
        if any(dt.kind != "b" for dt in loop_in):
            raise TraceError(
                f"numpy.{ufunc.__name__} is supported on bool arrays only (as logical and/or/not)", user_location()
            )
        return bind(_BOOL_ONLY[ufunc], *operands)
    prim, attrs = _SIMPLE[ufunc]
    out = bind(prim, *operands, **attrs)
    assert out.dtype == sig[-1], (ufunc, sig, out.dtype)
    return out


_LOG_BASE = {np.log2: np.log(2.0), np.log10: np.log(10.0)}


def _composite(ufunc: np.ufunc, sig: tuple, operands: list[Tracer]) -> Tracer:
    """ufuncs that numpy itself defines from the primitives' functions."""
    if ufunc in _LOG_BASE:  # log2(x) = log(x) / log(2)
        return bind("div", bind("log", operands[0]), lift(np.asarray(_LOG_BASE[ufunc], sig[0])))
    if ufunc is np.exp2:  # 2**x
        return bind("pow", lift(np.asarray(2, sig[0])), operands[0])
    if ufunc is np.isnan:  # x != x
        return bind("compare", operands[0], operands[0], direction="ne")
    if ufunc is np.logaddexp:  # max(a, b) + log1p(exp(-|a - b|)), as numpy computes it
        a, b = operands
        big = bind("maximum", a, b)
        diff = bind("abs", bind("sub", a, b))
        return bind("add", big, bind("log1p", bind("exp", bind("neg", diff))))
    raise AssertionError(ufunc)


COMPOSITE = set(_LOG_BASE) | {np.exp2, np.isnan, np.logaddexp}
SUPPORTED = set(_SIMPLE) | set(_BOOL_ONLY) | COMPOSITE | {np.positive, np.square, np.reciprocal, np.matmul}


def handle_ufunc(ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any):
    if kwargs.get("out") is not None:
        raise TraceError(f"numpy.{ufunc.__name__}(..., out=...) writes in place; not supported while tracing", user_location())
    kwargs.pop("out", None)
    if method == "reduce":
        if ufunc not in _REDUCE:
            raise TraceError(f"numpy.{ufunc.__name__}.reduce is not supported", user_location())
        axis = kwargs.pop("axis", 0)
        return _REDUCE[ufunc](inputs[0], axis=axis, **kwargs)
    if method != "__call__":
        raise TraceError(f"numpy.{ufunc.__name__}.{method} is not supported", user_location())
    if ufunc not in SUPPORTED:
        raise TraceError(f"numpy.{ufunc.__name__} is not supported by graphc", user_location())
    dtype = kwargs.pop("dtype", None)
    if kwargs.pop("where", True) is not True:
        raise TraceError(f"numpy.{ufunc.__name__}(..., where=...) is not supported", user_location())
    kwargs.pop("casting", None)
    if kwargs:
        raise TraceError(f"numpy.{ufunc.__name__}: unsupported arguments {sorted(kwargs)}", user_location())
    if dtype is not None:  # numpy then picks the loop for that dtype
        inputs = tuple(lift(x, np.dtype(dtype)) for x in inputs)
    return apply_ufunc(ufunc, *inputs)
