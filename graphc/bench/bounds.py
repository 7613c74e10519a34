"""How far a compiled run of a graph may be from graphc's reference interpreter, derived from the
computation itself: a forward error analysis (Higham, *Accuracy and Stability of Numerical
Algorithms*, ch. 3-4) run beside the reference values, node by node.

A compiled run computes the graph's ops on the same rounding points as the interpreter (an op on
bfloat16 or float16 computes in float32 and rounds each result, graphc/ops/precision.py), but

* adds the K terms of a matmul, einsum, sum or scatter_add in an order of its own (BLAS blocks,
  fused row sums, one device's share then a collective). What counts is the sum of the terms'
  magnitudes S, not the result: a gradient of 6e-4 summed from terms up to 0.07 may move by many
  ulps of itself. Two sums in any orders are within 2 gamma_K S of each other (gamma_K =
  K u / (1 - K u), u the accumulator's unit roundoff: float32's for 16-bit and float32 ops);
  with the rounding errors taken as independent, each order is about sqrt(K) u S off (Higham and
  Mary, "A new approach to probabilistic rounding error analysis", SISC 2019);
* computes exp / tanh / log in its fused kernels with formulas of its own (runtime/fastmath.py:
  within 4 eps of numpy's results, relative: 4e-7 in float32, 4.5e-16 in float64);
* on a mesh or in micro-batches (``Freedom.split_levels``) holds a sum as partial sums, each
  rounded to the value's dtype once more per level it passes (each device's piece, each mesh
  axis's collective, each micro-batch): at most a unit roundoff of the dtype times the sum of the
  pieces' magnitudes per level, which the value's *magnitude twin* M bounds: a sum's sum|terms|,
  carried through the ops a plan carries partial sums through (P + P: M_a + M_b, P - P, P * R:
  M |R|, layout ops), and none after any other op (its result is whole);
* may regroup an op's arithmetic (a pass writing x**3 as x*x*x, numpy's function against
  graphc's decomposition of it): ``Freedom.op_eps`` units of the compute dtype's eps times |y|.

Two walks carry these through the graph, each value's error from its operands':

``reference_with_bounds``, the worst case (the 16-bit tests' oracle, one device): a bound D
before rounding (elementwise ops: the op at the corners of the operands' boxes x +- E, in
float64; a layout op: the op on the bounds; a max or min over axes: its value at x -+ E; a sum of
products: the product rule sum_i op(|x_1|..E_i..|x_n| + E_n)) plus the terms above, then
E = how far the roundings of y -+ D are from the rounding of y: for a 16-bit value 0 where no
rounding boundary lies within D of y (the reference's bits are then the only right answer); for
a float32 or float64 value D plus one ulp. Through a deep network these worst cases multiply:
models/mlp.py's bfloat16 train step on dp=2,tp=2 gets an infinite bound on its loss of 3.09.

``reference_with_spreads``, what ``graphc run`` checks with: the same terms as standard
deviations of independent errors, combined in quadrature (a sum's operands' spreads through the
op on squares, an elementwise op's through its slope at x -+ sigma), a rounding adding the
chance d / ulp of a one-ulp flip; a result may be SIGMAS of its spreads off, then rounded as above.

Comparisons whose operands differ may flip (a max's argmax, a relu at 0, a loop's condition): both
walks assume they do not (both sides then pick values within their bounds of each other). Where a
bound is not finite (an overflow, log of a value its bound reaches 0 with) it allows any value.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from graphc.core.dtypes import LOW_FLOATS, is_float
from graphc.core.ir import Graph, Node, OpDef, Region, Value
from graphc.core.traits import Collective, Constant, ControlFlow, DeviceLocal, Elementwise, Fused, Random
from graphc.interpreter import last_uses
from graphc.ops.linalg import parse_equation

EPS32 = float(np.finfo(np.float32).eps)
EPS64 = float(np.finfo(np.float64).eps)
REORDERED_SUMS = frozenset({"matmul", "einsum", "reduce_sum", "scatter_add"})
# runtime/fastmath.py's FUNCTIONS (not imported here: it loads numba; a test keeps the two equal)
OWN_FORMULAS = frozenset({"exp", "expm1", "tanh", "log", "log1p"})
SELECTIONS = frozenset(
    {"broadcast_to", "reshape", "transpose", "slice", "pad", "gather", "concatenate", "split", "dynamic_slice",
     "dynamic_update_slice", "scatter", "where", "sharding"}
)  # fmt: skip
# ops whose result is a rounded linear function of operands a plan may hold as partial sums
ROUNDED_LINEAR = frozenset({"add", "sub", "mul", "div", "convert"})


@dataclass(frozen=True)
class Freedom:
    """What a compiled run may do that the reference interpreter does not (module docstring).
    ``split_levels``: how many more times a value held as partial sums may be rounded to its dtype
    than on one device (0 on one device: ``jit``). ``op_eps``: how many eps of the compute dtype
    (float32 for 16-bit values) times |y| any op's result may move by regrouping its arithmetic."""

    split_levels: int = 0
    op_eps: float = 0.0


ONE_DEVICE = Freedom()
# how many standard deviations a result may be off in the statistical model (reference_with_spreads):
# a normal variable exceeds 8 sigma with a chance of 1e-15, leaving room for a model of independent
# errors that is only near the truth
SIGMAS = 8.0
# a regrouped op (x**3 as x*x*x: two roundings for pow's one) or numpy's function against graphc's
# decomposition of it: a few roundings of the compute dtype either way
REGROUPED_OP_EPS = 4.0


def freedom_of_run(mesh_sizes: Sequence[int], microbatches: int) -> Freedom:
    """The freedom of a compiled run on a mesh with axes of ``mesh_sizes`` in ``microbatches``
    micro-batches: a value split over the mesh is rounded as each device's piece and once per
    collective of an axis; a micro-batched gradient once per micro-batch's running sum."""
    axes = sum(1 for n in mesh_sizes if n > 1)
    levels = (axes + 1 if axes else 0) + (microbatches if microbatches > 1 else 0)
    return Freedom(split_levels=levels, op_eps=REGROUPED_OP_EPS)


def reference_with_bounds(
    graph: Graph, arrays: Sequence[np.ndarray], freedom: Freedom = ONE_DEVICE
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The reference results of ``graph`` on ``arrays`` (each op in float32 on float32 copies of
    its 16-bit operands, each result rounded to the dtype the graph gives it, as the interpreter
    computes them: graphc/ops/precision.py, here without its code) and for each result the
    elementwise bound (float64) on how far a compiled run with ``freedom`` may be from it."""
    walk = _Walk(freedom)
    values, errors, _ = walk.run(graph, [np.asarray(a) for a in arrays], [None] * len(arrays), [None] * len(arrays))
    return values, [np.zeros(np.shape(v)) if e is None else walk.allowed(e) for v, e in zip(values, errors)]


def has_bound_rule(op: OpDef) -> bool:
    """Whether ``reference_with_bounds`` can walk nodes of ``op`` (every op of a single-device graph)."""
    if op.has(ControlFlow) or op.has(Fused) or op.has(Constant) or op.has(Random) or op.name in SELECTIONS:
        return True
    if op.has(Collective) or op.has(DeviceLocal):
        return False  # a device program's op: never in the graph a run is checked against
    return op.name in REORDERED_SUMS or op.name in ("reduce_max", "reduce_min", "argmax") or op.has(Elementwise)


class _Walk:
    """The reference values, their bounds E (None: 0) and magnitude twins M (None: |value|)."""

    def __init__(self, freedom: Freedom):
        self.freedom = freedom

    def run(self, body: Graph | Region, arrays: list, errors: list, mags: list) -> tuple[list, list, list]:
        env: dict[Value, Any] = dict(zip(body.inputs, arrays))
        err: dict[Value, Any] = {v: e for v, e in zip(body.inputs, errors) if e is not None}
        mag: dict[Value, Any] = {v: m for v, m in zip(body.inputs, mags) if m is not None}
        frees = last_uses(body)
        for i, node in enumerate(body.nodes):
            operands = [env[v] for v in node.inputs]
            operand_errors = [err.get(v) for v in node.inputs]
            operand_mags = [mag.get(v) for v in node.inputs]
            if node.regions:
                results, result_errors, result_mags = self.regions(node, operands, operand_errors, operand_mags)
            else:
                results, result_errors, result_mags = self.node(node, operands, operand_errors, operand_mags)
            for v, y, e, m in zip(node.outputs, results, result_errors, result_mags):
                env[v] = y
                if e is not None:
                    err[v] = e
                if m is not None:
                    mag[v] = m
            for v in frees.get(i, ()):  # as the interpreter: a value is dropped after its last use
                env.pop(v, None)
                err.pop(v, None)
                mag.pop(v, None)
        outs = body.outputs
        return [env[v] for v in outs], [err.get(v) for v in outs], [mag.get(v) for v in outs]

    def regions(self, node: Node, operands: list, errors: list, mags: list) -> tuple[list, list, list]:
        """A control-flow or fused node: its op's implementation, running each region through this
        walk. The bounds travel beside the arrays, found again by the arrays' identity."""
        beside: dict[int, tuple[Any, Any, Any]] = {id(x): (x, e, m) for x, e, m in zip(operands, errors, mags)}

        def found(x) -> tuple[Any, Any]:
            entry = beside.get(id(x))
            return (entry[1], entry[2]) if entry is not None and entry[0] is x else (None, None)

        def run(region: Region, xs: list) -> list:
            pairs = [found(x) for x in xs]
            ys, es, ms = self.run(region, [np.asarray(x) for x in xs], [p[0] for p in pairs], [p[1] for p in pairs])
            beside.update({id(y): (y, e, m) for y, e, m in zip(ys, es, ms)})
            return ys

        results = list(node.op.impl(run, node.regions, *operands, **node.attrs))
        pairs = [found(r) for r in results]
        return [np.asarray(r) for r in results], [p[0] for p in pairs], [p[1] for p in pairs]

    def node(self, node: Node, operands: list, errors: list, mags: list) -> tuple[list, list, list]:
        low = any(v.type.dtype in LOW_FLOATS for v in (*node.inputs, *node.outputs))
        xs = [_up(x) for x in operands] if low else operands
        with np.errstate(all="ignore"):
            if node.op.name == "convert" and _is_float_array(xs[0]) and is_float(node.outputs[0].type.dtype):
                ys = [np.asarray(xs[0])]  # the value before its rounding to the new dtype
            else:
                ys = [np.asarray(y) for y in node.op.evaluate(*xs, **node.attrs)]
            values = [y if y.dtype == out.type.dtype else y.astype(out.type.dtype) for y, out in zip(ys, node.outputs)]
            if not has_bound_rule(node.op):
                raise NotImplementedError(f"reference_with_bounds: no bound rule for {node.op.name!r} (add one)")
            floats = [np.issubdtype(np.asarray(x).dtype, np.inexact) for x in xs]
            errs = [self.carried(e) if f and e is not None else None for e, f in zip(errors, floats)]
            ms = _magnitudes_of(xs, mags, floats) if node.op.name in REORDERED_SUMS else []
            result_mags = self.magnitudes(node, xs, [m if f else None for m, f in zip(mags, floats)], floats, ys)
            before = self.before_rounding(node, xs, errs, ms, floats, ys, result_mags)
            bounds = []
            for out, y, d in zip(node.outputs, ys, before):
                if d is not None and is_float(out.type.dtype) and np.any(d):
                    bounds.append(self.rounded(y, np.asarray(d, np.float64), out.type.dtype))
                else:
                    bounds.append(None)
        return values, bounds, result_mags

    def carried(self, error: Any) -> Any:
        """What the rules below read of an operand's error: its bound E."""
        return error

    def rounded(self, y: np.ndarray, d: np.ndarray, dtype: np.dtype) -> Any:
        """A result's error after its rounding to ``dtype``: the bound E."""
        return rounded_bound(y, d, dtype)

    def allowed(self, error: Any) -> Any:
        """How far a result may be from the reference: E."""
        return error

    def before_rounding(self, node: Node, xs: list, errs: list, ms: list, floats: list, ys: list, twins: list) -> list:
        """D of every result of ``node`` (None: 0), before it is rounded to its dtype; ``twins``:
        the results' magnitude twins."""
        name = node.op.name
        if not any(np.issubdtype(y.dtype, np.inexact) for y in ys):
            return [None] * len(ys)  # comparisons, argmax: assumed not to flip (module docstring)
        if node.op.has(Constant) or node.op.has(Random):
            return [None] * len(ys)
        if name in SELECTIONS:
            if all(e is None for e in errs):
                return [None] * len(ys)
            attrs = {**node.attrs, "value": 0.0} if name == "pad" else node.attrs
            return list(node.op.evaluate(*_linear(xs, errs, floats), **attrs))
        if name in ("reduce_max", "reduce_min"):  # nondecreasing in every element: its value at x +- E
            if errs[0] is None:
                return [None]
            x64, e = np.asarray(xs[0], np.float64), errs[0]
            center = node.op.evaluate(x64, **node.attrs)[0]
            return [np.maximum(*(np.abs(node.op.evaluate(x64 + s * e, **node.attrs)[0] - center) for s in (-1, 1)))]
        (y,) = ys
        eps = EPS64 if y.dtype == np.float64 else EPS32
        abs_y = np.abs(np.asarray(y, np.float64))
        d: Any = self.freedom.op_eps * eps * abs_y if self.freedom.op_eps else 0.0
        if name in REORDERED_SUMS:
            d = d + self.reordered(node, xs, errs, ms, floats, eps)
        elif name == "convert":
            d = d + (errs[0] if errs[0] is not None else 0.0)
        else:
            if any(e is not None for e in errs) or name in OWN_FORMULAS:
                d = d + _corners(node, xs, errs, floats, y)
        if self.freedom.split_levels and twins[0] is not None and name in ROUNDED_LINEAR | REORDERED_SUMS:
            d = d + self.freedom.split_levels * unit_roundoff(node.outputs[0].type.dtype) * twins[0]
        return [d if np.any(d) else None]

    def reordered(self, node: Node, xs: list, errs: list, ms: list, floats: list, eps: float) -> Any:
        """A sum of K products (terms) per result added in another order, of operands off by
        their bounds: 2 gamma_K op(M + E) plus what the operands' bounds make of the op."""
        terms = _terms(node, xs, floats)
        gamma = terms * eps / (1 - terms * eps)
        plus = [m + e if e is not None else m for m, e in zip(ms, errs)]
        d = 2 * gamma * _on_magnitudes(node, plus)
        if node.op.name in ("matmul", "einsum"):  # the product rule: sum_i |x_1|..E_i..(|x_n|+E_n)
            mags = [np.abs(np.asarray(x, np.float64)) if f else x for x, f in zip(xs, floats)]
            near = [m + e if e is not None else m for m, e in zip(mags, errs)]
            for i, e in enumerate(errs):
                if e is not None:
                    d = d + _on_magnitudes(node, [*mags[:i], e, *near[i + 1 :]])
        elif any(e is not None for e in errs):  # linear in its float operands
            d = d + _on_magnitudes(node, _linear(xs, errs, floats))
        return d

    def magnitudes(self, node: Node, xs: list, twins: list, floats: list, ys: list) -> list:
        """The magnitude twins of ``node``'s results, only needed when partial sums are rounded
        (``Freedom.split_levels``). None: the value is never held as partial sums. A sum may be
        (its twin: sum|terms| of its own terms); a plan carries partial sums on only through ops
        linear in them (traits.LinearIn: P + P, P * R, a layout op of P), so their twins follow
        those ops, and every other op's result is whole. A contraction's twin starts again from
        its own terms: a plan reduces a partial sum before the next contraction reads it (carried
        through every contraction, the twin of a backward pass grows as the product of |W| over
        the layers: a float32 GPT gradient's bound exceeded the gradient itself)."""
        name = node.op.name
        if not self.freedom.split_levels or not all(np.issubdtype(y.dtype, np.inexact) for y in ys):
            return [None] * len(ys)
        held = [m for m, f in zip(twins, floats) if f]
        if name in REORDERED_SUMS:  # sum|terms| of its own terms
            return [np.asarray(_on_magnitudes(node, _magnitudes_of(xs, [None] * len(xs), floats)))]
        if name == "mul":  # a product of a partial sum and a whole value
            if all(m is None for m in held):
                return [None]
            return [np.asarray(_on_magnitudes(node, _magnitudes_of(xs, twins, floats)))]
        if name == "div":
            return [None if twins[0] is None else twins[0] / np.abs(np.asarray(xs[1], np.float64))]
        if not held or any(m is None for m in held):  # jointly linear: partial sums only if every operand is
            return [None] * len(ys)
        if name in ("neg", "convert"):
            return [twins[0]]
        if name == "sub":
            return [twins[0] + twins[1]]
        if name not in ROUNDED_LINEAR and name not in SELECTIONS:
            return [None] * len(ys)
        attrs = {**node.attrs, "value": 0.0} if name == "pad" else node.attrs
        ms = [m if f else x for x, m, f in zip(xs, twins, floats)]
        return [np.asarray(m) for m in node.op.evaluate(*ms, **attrs)]


@dataclass(frozen=True)
class Spread:
    """A value's error in the statistical model (``reference_with_spreads``): ``sigma``, the
    standard deviation of its difference from the reference after its rounding to ``dtype``,
    carried on to the ops that read it; ``before``, that of ``y``, its value before the rounding."""

    sigma: np.ndarray
    y: np.ndarray
    before: np.ndarray
    dtype: np.dtype


class _Spreads(_Walk):
    """The walk of ``reference_with_spreads``: each error a Spread, the operands' spreads combined
    in quadrature (independent errors) instead of added with their worst signs."""

    def __init__(self, freedom: Freedom, sigmas: float):
        super().__init__(freedom)
        self.sigmas = sigmas

    def carried(self, error: Any) -> Any:
        return error.sigma

    def rounded(self, y: np.ndarray, d: np.ndarray, dtype: np.dtype) -> Any:
        # a rounding flips where y +- d straddles a boundary: by one ulp, with a chance of about d / ulp
        ulp = ulp_at(np.abs(y), dtype)
        sigma = np.sqrt(d * d + np.minimum(ulp * ulp, d * ulp))
        return Spread(np.where(np.isnan(sigma), np.inf, sigma), y, d, dtype)

    def allowed(self, error: Any) -> Any:
        """The roundings of y -+ SIGMAS sigma-before-rounding (0 for a 16-bit value no rounding
        boundary lies that near): how far the result may be from the reference."""
        return rounded_bound(error.y, self.sigmas * error.before, error.dtype)

    def extremum(self, node: Node, x: Any, sigma: np.ndarray) -> np.ndarray:
        """A max (min) over axes picks an element the compiled run may pick too, or one that is
        SIGMAS spreads near it: the largest spread among those, not among every element (a
        masked score of -1e9 carries a spread far larger than any element the max can pick)."""
        x64 = np.asarray(x, np.float64)
        axes, sign = tuple(node.attrs["axes"]), (1.0 if node.op.name == "reduce_max" else -1.0)
        with np.errstate(invalid="ignore"):
            low = np.max(sign * x64 - self.sigmas * sigma, axis=axes, keepdims=True)
            near = sign * x64 + self.sigmas * sigma >= low
        return np.asarray(np.max(np.where(near, sigma, 0.0), axis=axes, keepdims=node.attrs["keepdims"]))

    def before_rounding(self, node: Node, xs: list, errs: list, ms: list, floats: list, ys: list, twins: list) -> list:
        """The standard deviation of every result of ``node`` (None: 0) before its rounding."""
        name = node.op.name
        if not any(np.issubdtype(y.dtype, np.inexact) for y in ys) or node.op.has(Constant) or node.op.has(Random):
            return [None] * len(ys)
        squares = [e * e if e is not None else None for e in errs]
        if name in SELECTIONS:
            if all(e is None for e in errs):
                return [None] * len(ys)
            attrs = {**node.attrs, "value": 0.0} if name == "pad" else node.attrs
            return [np.sqrt(v) for v in node.op.evaluate(*_linear(xs, squares, floats), **attrs)]
        if name in ("reduce_max", "reduce_min"):
            return [None if errs[0] is None else self.extremum(node, xs[0], errs[0])]
        (y,) = ys
        eps = EPS64 if y.dtype == np.float64 else EPS32
        abs_y = np.abs(np.asarray(y, np.float64))
        var: Any = (self.freedom.op_eps * eps * abs_y) ** 2 if self.freedom.op_eps else 0.0
        if name in REORDERED_SUMS:  # two orders, each within about sqrt(K) eps sum|terms| (Higham & Mary)
            magnitude = twins[0] if twins[0] is not None else _on_magnitudes(node, ms)  # sum|terms|
            var = var + 2 * _terms(node, xs, floats) * (eps * np.asarray(magnitude, np.float64)) ** 2
            if name in ("matmul", "einsum"):  # sum_i op(x_1^2 .. V_i .. x_n^2)
                sq = [np.square(np.asarray(x, np.float64)) if f else x for x, f in zip(xs, floats)]
                for i, v in enumerate(squares):
                    if v is not None:
                        var = var + _on_magnitudes(node, [*sq[:i], v, *sq[i + 1 :]])
            elif any(v is not None for v in squares):
                var = var + _on_magnitudes(node, _linear(xs, squares, floats))
        elif name == "convert":
            var = var + (squares[0] if squares[0] is not None else 0.0)
        else:
            var = var + _sensitivities(node, xs, errs, floats, y)
            if name in OWN_FORMULAS:
                var = var + (4 * eps * abs_y) ** 2
        if self.freedom.split_levels and twins[0] is not None and name in ROUNDED_LINEAR | REORDERED_SUMS:
            u = unit_roundoff(node.outputs[0].type.dtype)
            var = var + self.freedom.split_levels * (u * np.asarray(twins[0], np.float64)) ** 2
        d = np.sqrt(var)
        return [d if np.any(d) else None]


def _sensitivities(node: Node, xs: list, errs: list, floats: list, y: np.ndarray) -> Any:
    """sum_i (how far operand i's spread sigma_i moves the op)^2: for add, sub, neg, mul and div
    the first-order terms (sigma_a^2 b^2 + a^2 sigma_b^2 for a product), for any other
    elementwise op max_+- (op(.. x_i +- sigma_i ..) - y)^2 in float64 (its derivative times
    sigma_i where sigma_i is small)."""
    name = node.op.name
    x64 = [np.asarray(x, np.float64) if f else x for x, f in zip(xs, floats)]
    sq = [e * e if e is not None else None for e in errs]
    if name in ("add", "sub", "neg"):
        return sum((v for v in sq if v is not None), 0.0)
    if name == "mul":
        a, b = x64
        return (sq[0] * b * b if sq[0] is not None else 0.0) + (a * a * sq[1] if sq[1] is not None else 0.0)
    if name == "div":
        a, b = x64
        return (sq[0] / (b * b) if sq[0] is not None else 0.0) + (
            (a / (b * b)) ** 2 * sq[1] if sq[1] is not None else 0.0
        )
    center = np.asarray(y, np.float64)
    var: Any = 0.0
    for i, e in enumerate(errs):
        if e is None:
            continue
        sides = []
        for s in (-1.0, 1.0):
            value = np.asarray(node.op.evaluate(*x64[:i], x64[i] + s * e, *x64[i + 1 :], **node.attrs)[0], np.float64)
            sides.append(np.where(np.isnan(value) & np.isnan(center), 0.0, np.abs(value - center)))
        # a side outside the op's domain (sqrt, log of x - sigma < 0) leaves the other side's slope
        worst = np.where(np.isnan(sides[0]), sides[1], np.where(np.isnan(sides[1]), sides[0], np.maximum(*sides)))
        var = var + worst * worst
    return var


def reference_with_spreads(
    graph: Graph, arrays: Sequence[np.ndarray], freedom: Freedom = ONE_DEVICE, sigmas: float = 0.0
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """As ``reference_with_bounds``, with the rounding errors taken as independent random
    variables (Higham & Mary's probabilistic rounding error analysis): a sum of K terms is off by
    about sqrt(K) eps sum|terms|, and errors carried into an op combine in quadrature. Each result
    may be ``sigmas`` (default SIGMAS) standard deviations off, then rounded. Where the worst case
    grows by a factor of the fan-in per layer (models/mlp.py's bfloat16 train step on dp=2,tp=2:
    an infinite bound on its loss of 3.09), this allows 0.47 there."""
    walk = _Spreads(freedom, sigmas or SIGMAS)
    values, errors, _ = walk.run(graph, [np.asarray(a) for a in arrays], [None] * len(arrays), [None] * len(arrays))
    return values, [np.zeros(np.shape(v)) if e is None else walk.allowed(e) for v, e in zip(values, errors)]


def _magnitudes_of(xs: list, twins: list, floats: list) -> list:
    """Each float operand's magnitude twin, or its magnitude (in its own dtype: a sum of their
    products need not be exact); other operands as they are."""
    return [(m if m is not None else np.abs(x)) if f else x for x, m, f in zip(xs, twins, floats)]


def _terms(node: Node, xs: list, floats: list) -> float:
    """K: the most terms any result element of a sum of products adds (at least 1)."""
    name = node.op.name
    if name == "matmul":
        return float(max(np.shape(xs[0])[-1] if np.ndim(xs[0]) else 1, 1))
    if name == "reduce_sum":
        return float(max(int(np.prod([np.shape(xs[0])[a] for a in node.attrs["axes"]], dtype=np.int64)), 1))
    if name == "einsum":
        ins, out = parse_equation(node.attrs["equation"], len(xs))
        sizes = {c: n for spec, x in zip(ins, xs) for c, n in zip(spec, np.shape(x))}
        return float(max(int(np.prod([n for c, n in sizes.items() if c not in out], dtype=np.int64)), 1))
    ones = [np.ones(np.shape(x), np.float32) if f else x for x, f in zip(xs, floats)]  # scatter_add: its updates
    return float(np.max(node.op.evaluate(*ones, **node.attrs)[0], initial=1.0))


def _on_magnitudes(node: Node, operands: list) -> np.ndarray:
    """A sum of products (or a selection) on non-negative operands (magnitudes, bounds,
    variances): the op itself, an einsum in numpy's optimized order (BLAS where it can: the order
    of a sum of non-negative terms moves only its rounding, which a bound need not carry)."""
    if node.op.name == "einsum":
        return np.asarray(np.einsum(node.attrs["equation"], *operands, optimize=True))
    return np.asarray(node.op.evaluate(*operands, **node.attrs)[0])


def _linear(xs: list, errs: list, floats: list) -> list:
    """Operands for applying a linear op to the bounds: a float operand's bound (0 where it has
    none), other operands (indices, conditions) as they are."""
    return [(e if e is not None else np.zeros(np.shape(x))) if f else x for x, e, f in zip(xs, errs, floats)]


def _is_float_array(x: Any) -> bool:
    return np.issubdtype(np.asarray(x).dtype, np.inexact)


def _up(x: Any) -> Any:
    """A 16-bit float array in float32 (exactly), anything else as it is."""
    return x.astype(np.float32) if isinstance(x, np.ndarray) and x.dtype in LOW_FLOATS else x


def _corners(node: Node, xs: list, errs: list, floats: list, y) -> np.ndarray:
    """max |op(corner) - op(x)| over the corners of the operands' boxes x +- E, in float64, plus
    4 eps |y| (of float32, or float64 for a float64 op) where a kernel may compute the op by its
    own formula."""
    x64 = [np.asarray(x, np.float64) if f else x for x, f in zip(xs, floats)]
    center = np.asarray(node.op.evaluate(*x64, **node.attrs)[0], np.float64)
    d = np.zeros(np.shape(y))
    sides = [(-1.0, 1.0) if e is not None else (0.0,) for e in errs]
    for signs in itertools.product(*sides):
        corner = [x + s * e if e is not None else x for x, s, e in zip(x64, signs, errs)]
        value = np.asarray(node.op.evaluate(*corner, **node.attrs)[0], np.float64)
        d = np.maximum(d, np.where(np.isnan(value) & np.isnan(center), 0.0, np.abs(value - center)))
    if node.op.name in OWN_FORMULAS:
        d = d + 4 * (EPS64 if np.asarray(y).dtype == np.float64 else EPS32) * np.abs(np.asarray(y, np.float64))
    return d


def rounded_bound(y: np.ndarray, d: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """How far ``dtype``'s rounding of a value within ``d`` of ``y`` may be from the rounding of
    ``y``: rounding is monotone, so the compiled value lies between the roundings of y - d and
    y + d (0 where both round to the same float: no rounding boundary between them). For a 32- or
    64-bit result, d and one ulp at |y| + d. Infinite where that is not a number."""
    d = np.broadcast_to(d, np.shape(y))
    y64 = np.asarray(y, np.float64)
    with np.errstate(all="ignore"):
        if dtype not in LOW_FLOATS:
            out = np.where(d > 0, d + ulp_at(np.abs(y64) + d, dtype), 0.0)
        else:
            here = np.asarray(y).astype(np.float32).astype(dtype).astype(np.float64)
            ends = [(y64 + s * d).astype(np.float32).astype(dtype).astype(np.float64) for s in (-1.0, 1.0)]
            out = np.maximum(*(np.abs(e - here) for e in ends))
            out = np.where(d > 0, out, 0.0)
    return np.where(np.isnan(out) | np.isnan(d) | np.isinf(d), np.inf, out)


def _finfo(dtype: np.dtype) -> Any:
    return ml_dtypes.finfo(dtype) if dtype in LOW_FLOATS else np.finfo(dtype)


def ulp_at(magnitude: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The spacing of ``dtype``'s floats at ``magnitude`` (the subnormal spacing below the
    normals): float32's spacing scaled to the 16-bit dtypes' fewer mantissa bits (bfloat16 has
    float32's exponents; float16's subnormals are spaced 2**-24)."""
    if np.dtype(dtype) == np.float64:
        return np.spacing(np.asarray(magnitude, np.float64))
    spacing = np.spacing(np.asarray(magnitude, np.float32)) * np.float32(2.0 ** (23 - int(_finfo(dtype).nmant)))
    return np.maximum(spacing, np.float32(2.0**-24)) if np.dtype(dtype) == np.float16 else spacing


def unit_roundoff(dtype: np.dtype) -> float:
    """Half the spacing of ``dtype``'s floats at 1: the largest relative error of one rounding."""
    return float(_finfo(dtype).eps) / 2


def outside(got: Any, want: Any, bound: np.ndarray) -> np.ndarray:
    """Where ``got`` is farther from ``want`` than ``bound`` (elementwise, in float64): NaN where
    ``want`` is not counts, equal values (infinities) never do."""
    g64, w64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    with np.errstate(invalid="ignore"):
        off = np.where((g64 == w64) | (np.isnan(g64) & np.isnan(w64)), 0.0, np.abs(g64 - w64))
    return (off > bound) | (np.isnan(g64) != np.isnan(w64))


__all__ = [
    "ONE_DEVICE",
    "Freedom",
    "freedom_of_run",
    "has_bound_rule",
    "outside",
    "reference_with_bounds",
    "reference_with_spreads",
    "rounded_bound",
    "ulp_at",
    "unit_roundoff",
]
