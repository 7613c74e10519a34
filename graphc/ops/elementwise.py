"""Elementwise primitives. Operands broadcast like numpy; they must already share one dtype
(the tracer inserts ``convert`` nodes to apply numpy's promotion rules first)."""

from __future__ import annotations

import numpy as np

from graphc import dtypes
from graphc.errors import ShapeError
from graphc.ir import TensorType
from graphc.ops import OpDef, register, same_dtype


def broadcast_shapes(opname: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(
            f"{opname}: operands could not be broadcast together with shapes {' '.join(map(str, shapes))}"
        ) from None


# which dtypes each family accepts
_ANY = "any"
_NUMERIC = "numeric"  # int, uint or float
_SIGNED = "signed"  # signed int or float (numpy has no negative for bool)
_FLOAT = "float"
_BOOL = "bool"


def _check_dtype(opname: str, dt: np.dtype, allowed: str) -> None:
    ok = {
        _ANY: True,
        _NUMERIC: dt.kind in "iuf",
        _SIGNED: dt.kind in "if",
        _FLOAT: dt.kind == "f",
        _BOOL: dt.kind == "b",
    }[allowed]
    if not ok:
        raise ShapeError(f"{opname} is not defined for dtype {dtypes.short_name(dt)} (needs {allowed})")


def _unary(name: str, fn, allowed: str, doc: str) -> OpDef:
    def infer(in_types):
        (x,) = in_types
        _check_dtype(name, x.dtype, allowed)
        return (x,)

    return register(OpDef(name, "elementwise", infer, fn, doc=doc))


def _binary(name: str, fn, allowed: str, doc: str, result_bool: bool = False) -> OpDef:
    def infer(in_types):
        dt = same_dtype(in_types, name)
        _check_dtype(name, dt, allowed)
        shape = broadcast_shapes(name, *(t.shape for t in in_types))
        return (TensorType(shape, np.dtype(np.bool_) if result_bool else dt),)

    return register(OpDef(name, "elementwise", infer, fn, num_inputs=2, doc=doc))


neg = _unary("neg", np.negative, _SIGNED, "-x")
exp = _unary("exp", np.exp, _FLOAT, "e**x")
log = _unary("log", np.log, _FLOAT, "natural logarithm")
log1p = _unary("log1p", np.log1p, _FLOAT, "log(1 + x), accurate for small x")
expm1 = _unary("expm1", np.expm1, _FLOAT, "exp(x) - 1, accurate for small x")
tanh = _unary("tanh", np.tanh, _FLOAT, "hyperbolic tangent")
sqrt = _unary("sqrt", np.sqrt, _FLOAT, "square root")
sin = _unary("sin", np.sin, _FLOAT, "sine")
cos = _unary("cos", np.cos, _FLOAT, "cosine")
abs_ = _unary("abs", np.abs, _NUMERIC, "absolute value")
sign = _unary("sign", np.sign, _NUMERIC, "-1, 0 or 1")
logical_not = _unary("logical_not", np.logical_not, _BOOL, "not x")

add = _binary("add", np.add, _ANY, "x + y (logical or on bool, as numpy)")
sub = _binary("sub", np.subtract, _NUMERIC, "x - y")
mul = _binary("mul", np.multiply, _ANY, "x * y (logical and on bool, as numpy)")
div = _binary("div", np.true_divide, _FLOAT, "x / y")
pow_ = _binary("pow", np.power, _NUMERIC, "x ** y")
maximum = _binary("maximum", np.maximum, _ANY, "elementwise max (nan-propagating)")
minimum = _binary("minimum", np.minimum, _ANY, "elementwise min (nan-propagating)")
logical_and = _binary("logical_and", np.logical_and, _BOOL, "x and y")
logical_or = _binary("logical_or", np.logical_or, _BOOL, "x or y")

COMPARISONS = {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}


def _compare_infer(in_types, direction):
    if direction not in COMPARISONS:
        raise ShapeError(f"compare: direction must be one of {', '.join(COMPARISONS)}, got {direction!r}")
    same_dtype(in_types, "compare")
    shape = broadcast_shapes("compare", *(t.shape for t in in_types))
    return (TensorType(shape, np.dtype(np.bool_)),)


compare = register(
    OpDef(
        "compare",
        "elementwise",
        _compare_infer,
        lambda x, y, direction: COMPARISONS[direction](x, y),
        attrs=("direction",),
        num_inputs=2,
        doc="x <direction> y with direction in eq ne lt le gt ge; bool result",
    )
)


def _where_infer(in_types):
    c, x, y = in_types
    if c.dtype.kind != "b":
        raise ShapeError(f"where: condition must be bool, got {c}")
    dt = same_dtype((x, y), "where")
    return (TensorType(broadcast_shapes("where", c.shape, x.shape, y.shape), dt),)


where = register(OpDef("where", "elementwise", _where_infer, np.where, num_inputs=3, doc="c ? x : y"))


def _convert_infer(in_types, dtype):
    (x,) = in_types
    return (TensorType(x.shape, dtypes.canonical(dtype)),)


convert = register(
    OpDef(
        "convert",
        "elementwise",
        _convert_infer,
        lambda x, dtype: np.asarray(x).astype(dtype),
        attrs=("dtype",),
        doc="x.astype(dtype) with numpy's casting (unsafe casts allowed, like astype)",
    )
)
