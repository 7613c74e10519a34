"""Elementwise primitives. Operands broadcast like numpy; they must already share one dtype
(the tracer inserts ``convert`` nodes to apply numpy's promotion rules first)."""

from __future__ import annotations

import numpy as np

from graphc.core import dtypes
from graphc.core.errors import ShapeError
from graphc.core.ir import OpDef, TensorType
from graphc.core.traits import CHEAP, LOAD_STORE, MATH, Elementwise, FollowsProducer, FreshResult, LinearIn, Selects
from graphc.ops.dims import elementwise_rule, io_bytes
from graphc.ops.registry import REGISTRY, register, same_dtype


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
        _NUMERIC: dt.kind in "iu" or dtypes.is_float(dt),
        _SIGNED: dt.kind == "i" or dtypes.is_float(dt),
        _FLOAT: dtypes.is_float(dt),
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


def _float_to_float(node) -> tuple[frozenset[int], ...]:
    """A convert is linear in its operand between float dtypes (an int's rounding is not)."""
    src, dst = node.inputs[0].type.dtype, node.outputs[0].type.dtype
    return (frozenset({0}),) if dtypes.is_float(src) and dtypes.is_float(dst) else ()


# --- autodiff rules ---------------------------------------------------------------------------
# vjp(ad, g) -> one cotangent per input (None: zero or not differentiable);
# jvp(ad, *tangents) -> the output tangent (None: zero). ``ad`` gives the node's inputs/outputs as
# traced arrays, so the rules are numpy code; see graphc/autodiff.py.


def _set_rules(op: OpDef, vjp, jvp) -> None:
    op.vjp, op.jvp = vjp, jvp


def _unary_rules(op: OpDef, derivative) -> None:
    """Rules for y = f(x) from f'(x) written with x and y."""

    def vjp(ad, g):
        (x,), (y,) = ad.inputs, ad.outputs
        return [g * derivative(x, y)]

    def jvp(ad, t):
        (x,), (y,) = ad.inputs, ad.outputs
        return None if t is None else t * derivative(x, y)

    _set_rules(op, vjp, jvp)


_unary_rules(exp, lambda x, y: y)  # d exp(x) = exp(x)
_unary_rules(log, lambda x, y: 1 / x)  # d log(x) = 1/x
_unary_rules(log1p, lambda x, y: 1 / (1 + x))  # d log(1+x) = 1/(1+x)
_unary_rules(expm1, lambda x, y: y + 1)  # d (exp(x)-1) = exp(x)
_unary_rules(tanh, lambda x, y: 1 - y * y)  # d tanh = 1 - tanh^2
_unary_rules(sqrt, lambda x, y: 0.5 / y)  # d sqrt(x) = 1/(2 sqrt(x))
_unary_rules(sin, lambda x, y: np.cos(x))  # d sin = cos
_unary_rules(cos, lambda x, y: -np.sin(x))  # d cos = -sin
_unary_rules(abs_, lambda x, y: np.sign(x))  # d |x| = sign(x)
_set_rules(neg, lambda ad, g: [-g], lambda ad, t: None if t is None else -t)
_set_rules(sign, lambda ad, g: [None], lambda ad, t: None)  # piecewise constant
for _op in (logical_not, logical_and, logical_or, compare):
    _set_rules(_op, lambda ad, g: [None] * len(ad.inputs), lambda ad, *t: None)  # bool results


def sum_tangents(*terms):
    """The sum of the non-None terms (None if all are None: a symbolic zero)."""
    present = [t for t in terms if t is not None]
    if not present:
        return None
    total = present[0]
    for t in present[1:]:
        total = total + t
    return total


def _scale(t, factor):
    """t * factor, with the constants 1 and -1 emitting no multiply."""
    if isinstance(factor, int) and factor in (1, -1):
        return t if factor == 1 else -t
    return t * factor


def _binary_rules(op: OpDef, dx, dy) -> None:
    """Rules for z = f(x, y) from the partial derivatives dx(x, y, z) and dy(x, y, z)."""

    def vjp(ad, g):
        (x, y), (z,) = ad.inputs, ad.outputs
        gx = ad.unbroadcast(_scale(g, dx(x, y, z)), x.shape) if ad.needs[0] else None
        gy = ad.unbroadcast(_scale(g, dy(x, y, z)), y.shape) if ad.needs[1] else None
        return [gx, gy]

    def jvp(ad, tx, ty):
        (x, y), (z,) = ad.inputs, ad.outputs
        terms = [
            _scale(tx, dx(x, y, z)) if tx is not None else None,
            _scale(ty, dy(x, y, z)) if ty is not None else None,
        ]
        return ad.broadcast_to_output(sum_tangents(*terms))

    _set_rules(op, vjp, jvp)


def _pow_dx(x, y, z):  # d x**y / dx = y x**(y-1), and 0 where y == 0
    return y * np.power(x, np.where(y == 0, 1, y - 1))


def _pow_dy(x, y, z):  # d x**y / dy = x**y log(x), and 0 where x == 0
    return z * np.log(np.where(x == 0, 1, x))


def _max_dx(x, y, z):  # 1 where x is the max, 0.5 at ties (split evenly), else 0
    one, half, zero = (z.dtype.type(v) for v in (1, 0.5, 0))
    return np.where(x > y, one, np.where(x == y, half, zero))


_binary_rules(add, lambda x, y, z: 1, lambda x, y, z: 1)
_binary_rules(sub, lambda x, y, z: 1, lambda x, y, z: -1)
_binary_rules(mul, lambda x, y, z: y, lambda x, y, z: x)
_binary_rules(div, lambda x, y, z: 1 / y, lambda x, y, z: -z / y)
_binary_rules(pow_, _pow_dx, _pow_dy)
_binary_rules(maximum, _max_dx, lambda x, y, z: _max_dx(y, x, z))
_binary_rules(minimum, lambda x, y, z: _max_dx(y, x, z), _max_dx)


def _where_vjp(ad, g):
    c, x, y = ad.inputs
    gx = ad.unbroadcast(np.where(c, g, 0), x.shape) if ad.needs[1] else None
    gy = ad.unbroadcast(np.where(c, 0, g), y.shape) if ad.needs[2] else None
    return [None, gx, gy]


def _where_jvp(ad, tc, tx, ty):
    if tx is None and ty is None:
        return None
    c, x, y = ad.inputs
    return ad.broadcast_to_output(np.where(c, ad.instantiate(tx, x), ad.instantiate(ty, y)))


_set_rules(where, _where_vjp, _where_jvp)


def _convert_vjp(ad, g):
    (x,) = ad.inputs
    return [g.astype(x.dtype) if dtypes.is_float(x.dtype) and dtypes.is_float(g.dtype) else None]


def _convert_jvp(ad, t):
    (y,) = ad.outputs
    return t.astype(y.dtype) if t is not None and dtypes.is_float(y.dtype) else None


_set_rules(convert, _convert_vjp, _convert_jvp)


# --- sharding rules (see graphc/ops/dims.py) --------------------------------------------------
# Broadcasting aligns dims from the right; a broadcast size-1 operand dim cannot carry a split.
# Transcendental functions cost a few multiply-adds per element in the fused kernels.

_TRANSCENDENTAL = {"exp": 8, "log": 8, "log1p": 8, "expm1": 8, "tanh": 10, "sin": 10, "cos": 10, "pow": 16}


def _elementwise_dim_rule(in_types, out_types, **_attrs):
    return elementwise_rule(in_types, out_types)


def _elementwise_cost(weight: int):
    def cost(in_types, out_types, **_attrs):
        return float(weight * out_types[0].size), io_bytes(in_types, out_types)

    return cost


for _op in REGISTRY.values():
    if _op.kind == "elementwise":
        _op.dim_rule = _elementwise_dim_rule
        _op.cost = _elementwise_cost(_TRANSCENDENTAL.get(_op.name, 1))


# --- traits (graphc/core/traits.py) ------------------------------------------------------------
_COSTS = {
    **dict.fromkeys((add, sub, mul, neg, abs_, maximum, minimum, where, compare, convert), LOAD_STORE),
    **dict.fromkeys((div, sign, logical_and, logical_or, logical_not), CHEAP),
}
_LINEAR = {
    add: LinearIn((frozenset({0, 1}),), on_meshes=True),
    sub: LinearIn((frozenset({0, 1}),), on_meshes=True),
    neg: LinearIn((frozenset({0}),), on_meshes=True),
    mul: LinearIn((frozenset({0}), frozenset({1})), on_meshes=True),
    div: LinearIn((frozenset({0}),), on_meshes=True),
    where: LinearIn((frozenset({1, 2}),)),  # both branches jointly
    convert: LinearIn(of_node=_float_to_float, on_meshes=True),
}
for _op in REGISTRY.values():
    if _op.kind == "elementwise":
        linear = (_LINEAR[_op],) if _op in _LINEAR else ()
        selects = (Selects(),) if _op in (maximum, minimum) else ()
        _op.traits = (Elementwise(_COSTS.get(_op, MATH)), FreshResult(), FollowsProducer(), *linear, *selects)
