"""Control flow: ``cond``, ``while_loop`` and ``fori_loop``, ops with regions.

Regions are isolated (every value they use is an operand), so each later stage sees all of a
control-flow op's data dependencies on the node itself. A stage that cannot look inside a region
treats the whole op as one unit.

  cond(pred, *xs) {true: (*xs) -> ys} {false: (*xs) -> ys}           -> ys
  while_loop(*init) {cond: (*carry) -> bool[]} {body: (*carry) -> carry} -> carry
  fori_loop(lower, upper, *init, step=s) {body: (i, *carry) -> carry}  -> carry
      runs the body for i in range(lower, upper, step)

Their reference implementations receive ``run(region, arrays) -> arrays`` from the interpreter.
Their autodiff rules build new control-flow nodes whose regions differentiate the old ones, through
the rule context (graphc/ops/context.py): ``ad.cond``, ``ad.jvp``, ``ad.inline`` ...
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.core import dtypes
from graphc.core.errors import ShapeError, TraceError
from graphc.core.ir import OpDef, TensorType
from graphc.core.traits import ControlFlow
from graphc.ops.dims import region_cost
from graphc.ops.registry import register

SCALAR_BOOL = TensorType((), np.dtype(np.bool_))
SCALAR_INDEX = TensorType((), np.dtype(np.int64))


def _types(ts) -> str:
    return "(" + ", ".join(map(str, ts)) + ")"


def _check_region(opname: str, which: str, region, inputs: tuple, outputs: tuple | None = None) -> None:
    if region.in_types != tuple(inputs):
        raise ShapeError(f"{opname}: the {which} region takes {_types(region.in_types)}, expected {_types(inputs)}")
    if outputs is not None and region.out_types != tuple(outputs):
        raise ShapeError(f"{opname}: the {which} region returns {_types(region.out_types)}, expected {_types(outputs)}")


def _cond_infer(in_types, regions):
    pred, *xs = in_types
    if pred != SCALAR_BOOL:
        raise ShapeError(f"cond: the predicate must be bool[], got {pred}")
    true_r, false_r = regions
    _check_region("cond", "true", true_r, xs)
    _check_region("cond", "false", false_r, xs, true_r.out_types)
    return true_r.out_types


def _cond_impl(run, regions, pred, *xs):
    return tuple(run(regions[0] if bool(pred) else regions[1], list(xs)))


cond = register(
    OpDef(
        "cond",
        "control",
        _cond_infer,
        _cond_impl,
        num_inputs=None,
        min_inputs=1,
        num_regions=2,
        doc="run the true or the false region on the operands",
    )
)


def _while_infer(in_types, regions):
    cond_r, body_r = regions
    _check_region("while_loop", "cond", cond_r, in_types, (SCALAR_BOOL,))
    _check_region("while_loop", "body", body_r, in_types, in_types)
    return tuple(in_types)


def _while_impl(run, regions, *init):
    cond_r, body_r = regions
    carry = list(init)
    while bool(run(cond_r, carry)[0]):
        carry = run(body_r, carry)
    return tuple(carry)


while_loop = register(
    OpDef(
        "while_loop",
        "control",
        _while_infer,
        _while_impl,
        num_inputs=None,
        min_inputs=0,
        num_regions=2,
        doc="repeat the body region while the cond region returns true",
    )
)


def _fori_infer(in_types, regions, step):
    if not isinstance(step, int) or isinstance(step, bool) or step == 0:
        raise ShapeError(f"fori_loop: step must be a non-zero int, got {step!r}")
    if len(in_types) < 2:
        raise ShapeError("fori_loop takes lower and upper bounds before the carried values")
    lower, upper, *carry = in_types
    if lower != SCALAR_INDEX or upper != SCALAR_INDEX:
        raise ShapeError(f"fori_loop: bounds must be i64[], got {lower} and {upper}")
    (body_r,) = regions
    _check_region("fori_loop", "body", body_r, (SCALAR_INDEX, *carry), carry)
    return tuple(carry)


def _fori_impl(run, regions, lower, upper, *init, step):
    carry = list(init)
    for i in range(int(lower), int(upper), step):
        carry = run(regions[0], [np.asarray(i, np.int64), *carry])
    return tuple(carry)


fori_loop = register(
    OpDef(
        "fori_loop",
        "control",
        _fori_infer,
        _fori_impl,
        attrs=("step",),
        num_inputs=None,
        min_inputs=2,
        num_regions=1,
        doc="run the body region for i in range(lower, upper, step)",
    )
)


# sharding: no finer rule, so the planner runs a control op replicated (one strategy for the whole
# op, with a warning in the plan); its cost is one pass over its regions' nodes (trip counts are
# data-dependent).
def _control_cost(in_types, out_types, regions, **_attrs):
    flops = sum(region_cost(r, in_types, out_types)[0] for r in regions)
    return flops, sum(t.nbytes for t in in_types) + sum(t.nbytes for t in out_types)


for _op in (cond, while_loop, fori_loop):
    _op.cost = _control_cost


# --- autodiff -------------------------------------------------------------------------------------


def _float(v) -> bool:
    return dtypes.is_float(v.dtype)


def _cond_jvp(ad, tpred, *tangents):
    """A cond whose branches compute the tangents of the chosen branch's results."""
    pred, *ops = ad.inputs
    if all(t is None for t in tangents):
        return None
    tans = [ad.instantiate(t, o) for t, o in zip(tangents, ops)]
    float_out = [i for i, o in enumerate(ad.outputs) if _float(o)]

    def branch(region):
        def fn(*args):
            primals, ts = args[: len(ops)], args[len(ops) :]
            _, out_t = ad.jvp(lambda *p: ad.inline(region, p), primals, ts)
            return [out_t[i] for i in float_out]

        return fn

    result = ad.cond(pred, branch(ad.node.regions[0]), branch(ad.node.regions[1]), *ops, *tans)
    it = iter(result)
    return tuple(next(it) if i in float_out else None for i in range(len(ad.outputs)))


def _cond_vjp(ad, *gs):
    """A cond whose branches pull the cotangents back through the chosen branch."""
    pred, *ops = ad.inputs
    wanted = [i for i, (o, need) in enumerate(zip(ops, ad.needs[1:])) if need and _float(o)]
    if not wanted:
        return [None] * len(ad.inputs)
    cts = [ad.instantiate(g, o) for g, o in zip(gs, ad.outputs)]
    float_out = [i for i, o in enumerate(ad.outputs) if _float(o)]

    def branch(region):
        def fn(*args):
            primals, ct = args[: len(ops)], args[len(ops) :]
            _, pullback = ad.vjp(lambda *p: [ad.inline(region, p)[i] for i in float_out], *primals)
            grads = pullback(list(ct))
            return [ad.instantiate(grads[i], ops[i]) for i in wanted]

        return fn

    result = ad.cond(pred, branch(ad.node.regions[0]), branch(ad.node.regions[1]), *ops, *[cts[i] for i in float_out])
    grads: list[Any] = [None] * len(ad.inputs)
    for i, g in zip(wanted, result):
        grads[1 + i] = g
    return grads


def _loop_jvp(ad, *tangents):
    """The same loop, carrying the tangents next to the values."""
    node = ad.node
    is_fori = node.op.name == "fori_loop"
    head = 2 if is_fori else 0
    carry = ad.inputs[head:]
    if all(t is None for t in tangents[head:]):
        return None
    tans = [ad.instantiate(t, c) for t, c in zip(tangents[head:], carry)]
    n = len(carry)
    if is_fori:
        (body,) = node.regions

        def body_fn(i, *args):
            primals, ts = args[:n], args[n:]
            out, out_t = ad.jvp(lambda *p: ad.inline(body, [i, *p]), primals, ts)
            return [*out, *out_t]

        result = ad.fori_loop(ad.inputs[0], ad.inputs[1], body_fn, [*carry, *tans], step=node.attrs["step"])
    else:
        cond_r, body = node.regions

        def while_body(*args):
            out, out_t = ad.jvp(lambda *p: ad.inline(body, p), args[:n], args[n:])
            return [*out, *out_t]

        result = ad.while_loop(lambda *a: ad.inline(cond_r, a[:n])[0], while_body, [*carry, *tans])
    return tuple(result[n:][: len(node.outputs)])


def _while_vjp(ad, *gs):
    raise TraceError(
        "reverse-mode differentiation through a while loop whose trip count depends on data is not supported: "
        "its iterations are not known when tracing. Use a bounded loop instead: `for i in range(N)` with a "
        "Python int N, or graphc.fori_loop(lower, upper, body, init) with int bounds",
        ad.node.loc,
    )


def _static_bound(v) -> int | None:
    node = v.producer
    if node is not None and node.op.name == "constant":
        return int(node.attrs["value"])
    return None


def _fori_vjp(ad, *gs):
    """A counted loop with bounds known when tracing: differentiate its unrolled iterations."""
    node = ad.node
    lower, upper = (_static_bound(v) for v in node.inputs[:2])
    if lower is None or upper is None:
        _while_vjp(ad, *gs)  # raises: the trip count is not known when tracing
        return None
    (body,) = node.regions
    carry = ad.inputs[2:]
    trips = range(lower, upper, node.attrs["step"])

    def unrolled(*init):
        c = list(init)
        for i in trips:
            c = ad.inline(body, [ad.constant(np.asarray(i, np.int64)), *c])[: len(init)]
        return c

    _, pullback = ad.vjp(unrolled, *carry)
    grads = pullback([ad.instantiate(g, o) for g, o in zip(gs, ad.outputs)])
    return [None, None, *grads]


cond.jvp, cond.vjp = _cond_jvp, _cond_vjp
while_loop.jvp, while_loop.vjp = _loop_jvp, _while_vjp
fori_loop.jvp, fori_loop.vjp = _loop_jvp, _fori_vjp


# --- traits (graphc/core/traits.py) ------------------------------------------------------------
for _op in (cond, while_loop, fori_loop):
    _op.traits = (ControlFlow(),)
