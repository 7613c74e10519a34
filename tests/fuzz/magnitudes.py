"""The magnitudes of a program's chain rule: the rounding bound of the jvp/vjp identity
(tests/fuzz/test_numpy_grad.py ``test_jvp_and_vjp_agree``).

Forward and reverse mode both compute ``u^T J v``, where J = J_m ... J_1 is the product of the
Jacobians of the primitives the program traces to, taken at the primal values (which both modes
compute with the same primitives in the same order, so alike). Forward mode multiplies from the
right, reverse mode from the left. Each primitive's rule computes a tangent (or a cotangent) as a
sum of products: in floating point, within gamma_k = k eps / (1 - k eps) of the sum of its terms'
magnitudes, where k counts the roundings on the way to one result (the terms it sums, the
roundings per term, the coefficient's own). That error then goes through the later Jacobians,
whose entries it meets in magnitude at most. So each mode's result is within gamma_K of

    A = |u|^T |J_m| ... |J_1| |v|

with K the roundings along the longest chain of primitives, which their sum over all primitives
bounds. The bound must come from these terms: the results themselves can cancel (``np.stack([x,
x]) - x`` is 0, its jvp ``v - v`` exactly 0, while the vjp adds ``u0 + u1`` and subtracts it
again, in another order: 5e-18, the class 27 of docs/fuzzing_numpy.md).

``absolute_jvp`` computes ``|J_m| ... |J_1| |v|`` and K: a forward walk over the traced graph (the
reference implementations compute the primal values) carrying beside each float value the
magnitude of its tangent, a nonnegative array, through rules written here from numpy's
definitions and the calculus, not from graphc's rules (an oracle must not share the mistakes it
looks for). The rules, by the shape of each primitive's Jacobian:

- linear with nonnegative entries (selections, sums, scatters, reshapes, where): the op itself
  applied to the magnitudes (``pad`` padding with 0);
- add and sub: |t_x| + |t_y|; neg, abs, float-to-float convert: |t|;
- multilinear (mul, matmul, einsum): the sum over operands of the op with that operand's
  magnitude and the other operands' absolute values;
- div, pow and the unary functions: |partial derivative| times |t|, for tanh 1 + tanh^2 (the
  magnitudes of 1 - tanh^2, whose computation cancels where tanh is near 1);
- maximum and minimum: the chosen operand's, both at ties; reduce_max and reduce_min: the sum
  over the elements that attain the extremum;
- comparisons, logical ops, sign, argmax and constants have no tangent; ``cond`` walks the region
  its predicate takes.

A primitive without a rule here fails the check (add its rule), rather than being guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import graphc
from graphc.core import dtypes
from graphc.core.ir import Node, Region, Value

Tangent = np.ndarray | None  # a tangent's magnitude; None: no tangent (a symbolic zero)


@dataclass(frozen=True)
class Magnitudes:
    """``outputs``: |J| |v| per output of the traced function, float64; ``roundings``: K, a bound
    on the roundings along any chain of the rules (module docstring); ``eps``: the unit roundoff
    of the least precise float dtype among the graph's values."""

    outputs: list[np.ndarray]
    roundings: int
    eps: float


def absolute_jvp(fn: Callable, primals: Sequence[np.ndarray], magnitudes: Sequence[np.ndarray]) -> Magnitudes:
    """|J| |v| for ``fn`` at ``primals`` (module docstring): ``magnitudes`` are |v|, one per
    primal (ignored for primals that are not floats)."""
    graph = graphc.trace(fn, *primals)
    walk = _Walk()
    env: dict[Value, tuple[np.ndarray, Tangent]] = {}
    for value, x, t in zip(graph.inputs, primals, magnitudes):
        x = np.asarray(x)
        float_input = dtypes.is_float(x.dtype)
        if float_input:
            walk.eps = max(walk.eps, float(np.finfo(x.dtype).eps))
        env[value] = (x, _as_float64(t) if float_input else None)
    with np.errstate(all="ignore"):
        walk.block(graph, env)
    outputs = []
    for value in graph.outputs:
        x, t = env[value]
        outputs.append(np.zeros(np.shape(x)) if t is None else t)
    return Magnitudes(outputs, walk.roundings, walk.eps)


def _as_float64(t: Any) -> np.ndarray:
    return np.asarray(t, np.float64)


class _Walk:
    def __init__(self) -> None:
        self.roundings = 0
        self.eps = float(np.finfo(np.float64).eps)

    def block(self, block: Any, env: dict[Value, tuple[np.ndarray, Tangent]]) -> None:
        for node in block.nodes:
            xs = [env[v][0] for v in node.inputs]
            ts = [env[v][1] for v in node.inputs]
            if node.op.name == "cond":
                ys, outs = self.cond(node, xs, ts)
            else:
                ys = node.op.evaluate(*xs, **node.attrs)
                outs = self.rule(node, xs, ts, ys)
            for value, y, t in zip(node.outputs, ys, outs):
                if t is not None and dtypes.is_float(value.type.dtype):
                    self.eps = max(self.eps, float(np.finfo(value.type.dtype).eps))
                    env[value] = (y, np.broadcast_to(_as_float64(t), y.shape))
                else:
                    env[value] = (y, None)

    def cond(self, node: Node, xs: list, ts: list) -> tuple[list[np.ndarray], list[Tangent]]:
        region: Region = node.regions[0] if bool(xs[0]) else node.regions[1]
        inner = dict(zip(region.inputs, zip(xs[1:], ts[1:])))
        self.block(region, inner)
        return [inner[v][0] for v in region.outputs], [inner[v][1] for v in region.outputs]

    def rule(self, node: Node, xs: list, ts: list, ys: tuple) -> list[Tangent]:
        name = node.op.name
        if all(t is None for t in ts) or name in _NO_TANGENT:
            return [None] * len(ys)
        # (the roundings of one result: the terms it sums, at most the largest operand's or
        # result's size, one per operand adding its term, and 8 for a term and its coefficient)
        sizes = [np.size(a) for a in (*xs, *ys)]
        self.roundings += 8 + len(xs) + max(sizes)
        if name in _LINEAR:
            return list(_apply(node, _linear_operands(xs, ts), pad_with_zero=name == "pad"))
        if name in _MULTILINEAR:
            return [_multilinear(node, xs, ts)]
        if name in _RULES:
            return [_RULES[name](xs, ts, ys[0], node.attrs)]
        raise AssertionError(
            f"tests/fuzz/magnitudes.py has no magnitude rule for the primitive {name!r}: add one "
            "(the bound of the jvp/vjp check needs the magnitude of its Jacobian)"
        )


_NO_TANGENT = frozenset({"compare", "logical_and", "logical_or", "logical_not", "sign", "argmax", "constant"})

# Linear in their float operands, with Jacobian entries 0 or 1 (or sums of such): the op itself
# maps magnitudes to magnitudes.
_LINEAR = frozenset(
    {
        "broadcast_to",
        "reshape",
        "transpose",
        "slice",
        "pad",
        "gather",
        "concatenate",
        "split",
        "dynamic_slice",
        "dynamic_update_slice",
        "scatter",
        "scatter_add",
        "reduce_sum",
        "where",
    }
)
_MULTILINEAR = frozenset({"mul", "matmul", "einsum"})


def _zeros(x: np.ndarray) -> np.ndarray:
    return np.zeros(np.shape(x))


def _linear_operands(xs: list, ts: list) -> list:
    """The float operands replaced by their tangents' magnitudes (zeros without one); indices and
    conditions as they are."""
    return [(_zeros(x) if t is None else t) if dtypes.is_float(np.asarray(x).dtype) else x for x, t in zip(xs, ts)]


def _apply(node: Node, operands: list, pad_with_zero: bool = False) -> tuple[np.ndarray, ...]:
    attrs = dict(node.attrs)
    if pad_with_zero:
        attrs["value"] = 0.0
    return node.op.evaluate(*operands, **attrs)


def _multilinear(node: Node, xs: list, ts: list) -> np.ndarray:
    """sum_i op(|x_1|, ..., |t_i|, ..., |x_n|) (the product rule, in magnitudes)."""
    total: Any = 0.0
    for i, t in enumerate(ts):
        if t is None:
            continue
        operands = [np.abs(np.asarray(x, np.float64)) for x in xs]
        operands[i] = t
        total = total + _apply(node, operands)[0]
    return total


def _times(t: Tangent, factor: Any) -> Any:
    """|t| * factor, 0 where there is no tangent (also where the factor is infinite)."""
    if t is None:
        return 0.0
    return np.where(t == 0, 0.0, t * np.abs(factor))


def _unary(derivative: Callable[[np.ndarray, np.ndarray], Any]) -> Callable:
    def rule(xs, ts, y, attrs):
        return _times(ts[0], derivative(np.asarray(xs[0], np.float64), np.asarray(y, np.float64)))

    return rule


def _sum_of_both(xs, ts, y, attrs):  # add, sub: |t_x| + |t_y|
    return _times(ts[0], 1.0) + _times(ts[1], 1.0)


def _div(xs, ts, z, attrs):  # d (x / y) = t_x / y - z t_y / y
    x, y = xs
    return _times(ts[0], 1.0 / y) + _times(ts[1], z / y)


def _pow(xs, ts, z, attrs):  # d x**y = y x**(y-1) t_x + x**y log(x) t_y (0 where y == 0, x == 0)
    x, y = (np.asarray(a, np.float64) for a in xs)
    dx = y * np.power(x, np.where(y == 0, 1, y - 1))
    dy = z * np.log(np.abs(np.where(x == 0, 1, x)))
    return _times(ts[0], dx) + _times(ts[1], dy)


def _extreme_of_two(first_wins: Callable) -> Callable:
    """maximum, minimum: the chosen operand's tangent; at a tie (or a nan) both."""

    def rule(xs, ts, z, attrs):
        x, y = xs
        tx, ty = (_times(t, 1.0) for t in ts)
        return np.where(first_wins(x, y), tx, 0.0) + np.where(first_wins(y, x), ty, 0.0)

    return rule


def _extreme_of_axes(xs, ts, z, attrs):
    """reduce_max, reduce_min: the sum over the elements that attain the result."""
    (x,), (t,) = xs, ts
    axes = tuple(attrs["axes"])
    hit = x == np.expand_dims(z, axes) if not attrs["keepdims"] else x == z
    return np.sum(np.where(hit, t, 0.0), axis=axes, keepdims=attrs["keepdims"])


def _convert(xs, ts, y, attrs):
    return ts[0] if dtypes.is_float(np.asarray(xs[0]).dtype) and dtypes.is_float(np.dtype(attrs["dtype"])) else None


_RULES: dict[str, Callable] = {
    "add": _sum_of_both,
    "sub": _sum_of_both,
    "neg": _unary(lambda x, y: 1.0),
    "abs": _unary(lambda x, y: 1.0),
    "convert": _convert,
    "div": _div,
    "pow": _pow,
    "exp": _unary(lambda x, y: y),
    "expm1": _unary(lambda x, y: y + 1),
    "log": _unary(lambda x, y: 1 / x),
    "log1p": _unary(lambda x, y: 1 / (1 + x)),
    "tanh": _unary(lambda x, y: 1 + y * y),
    "sqrt": _unary(lambda x, y: 0.5 / y),
    "sin": _unary(lambda x, y: np.cos(x)),
    "cos": _unary(lambda x, y: np.sin(x)),
    "maximum": _extreme_of_two(lambda a, b: ~(a < b)),
    "minimum": _extreme_of_two(lambda a, b: ~(a > b)),
    "reduce_max": _extreme_of_axes,
    "reduce_min": _extreme_of_axes,
}
