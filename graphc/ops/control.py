"""Control flow: ``cond``, ``while_loop`` and ``fori_loop``, ops with regions.

Regions are isolated (every value they use is an operand), so each later stage sees all of a
control-flow op's data dependencies on the node itself. A stage that cannot look inside a region
treats the whole op as one unit.

  cond(pred, *xs) {true: (*xs) -> ys} {false: (*xs) -> ys}           -> ys
  while_loop(*init) {cond: (*carry) -> bool[]} {body: (*carry) -> carry} -> carry
  fori_loop(lower, upper, *init, step=s) {body: (i, *carry) -> carry}  -> carry
      runs the body for i in range(lower, upper, step)

Their reference implementations receive ``run(region, arrays) -> arrays`` from the interpreter.
The autodiff rules trace new regions, so they live with the frontend (graphc/frontend/control.py).
"""

from __future__ import annotations

import numpy as np

from graphc.core.errors import ShapeError
from graphc.core.ir import TensorType
from graphc.ops import OpDef, register

SCALAR_BOOL = TensorType((), np.bool_)
SCALAR_INDEX = TensorType((), np.int64)


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


cond = register(OpDef("cond", "control", _cond_infer, _cond_impl, num_inputs=None, min_inputs=1, num_regions=2,
                      doc="run the true or the false region on the operands"))


def _while_infer(in_types, regions):
    cond_r, body_r = regions
    _check_region("while_loop", "cond", cond_r, in_types, (SCALAR_BOOL,))
    _check_region("while_loop", "body", body_r, in_types, in_types)
    return tuple(in_types)


def _while_impl(run, regions, *carry):
    cond_r, body_r = regions
    carry = list(carry)
    while bool(run(cond_r, carry)[0]):
        carry = run(body_r, carry)
    return tuple(carry)


while_loop = register(OpDef("while_loop", "control", _while_infer, _while_impl, num_inputs=None, min_inputs=0,
                            num_regions=2, doc="repeat the body region while the cond region returns true"))


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


def _fori_impl(run, regions, lower, upper, *carry, step):
    carry = list(carry)
    for i in range(int(lower), int(upper), step):
        carry = run(regions[0], [np.asarray(i, np.int64), *carry])
    return tuple(carry)


fori_loop = register(OpDef("fori_loop", "control", _fori_infer, _fori_impl, attrs=("step",), num_inputs=None,
                           min_inputs=2, num_regions=1, doc="run the body region for i in range(lower, upper, step)"))


# sharding: no finer rule, so the planner runs a control op replicated (one strategy for the whole
# op, with a warning in the plan); its cost is one pass over its regions' nodes (trip counts are
# data-dependent).
def _control_cost(in_types, out_types, regions, **_attrs):
    from graphc.ops.dims import region_cost

    flops = sum(region_cost(r, in_types, out_types)[0] for r in regions)
    return flops, sum(t.nbytes for t in in_types) + sum(t.nbytes for t in out_types)


for _op in (cond, while_loop, fori_loop):
    _op.cost = _control_cost
