"""Reductions over a sorted tuple of axes. The result dtype is the operand's dtype: the tracer first
converts to numpy's accumulation dtype (``np.sum`` of int32 accumulates in int64, ``np.mean`` of
ints in float64)."""

from __future__ import annotations

import numpy as np

from graphc.core.errors import ShapeError
from graphc.core.ir import OpDef, TensorType
from graphc.core.traits import FreshResult, LinearIn, Reduction
from graphc.ops.dims import DimRule, io_bytes
from graphc.ops.registry import check_axes, check_axis, register


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _check_keepdims(keepdims) -> None:
    if not isinstance(keepdims, bool):
        raise ShapeError(f"keepdims must be a bool, got {keepdims!r}")


def _reduce(name: str, fn, needs_elements: bool, doc: str) -> OpDef:
    def infer(in_types, axes, keepdims):
        (x,) = in_types
        check_axes(axes, x.ndim)
        _check_keepdims(keepdims)
        if needs_elements and any(x.shape[a] == 0 for a in axes):
            raise ShapeError(f"{name}: zero-size reduction over axes {axes} of shape {x.shape} has no identity")
        if name == "reduce_sum" and x.dtype.kind == "b":
            raise ShapeError("reduce_sum of bool: convert to an integer dtype first")
        return (TensorType(reduced_shape(x.shape, axes, keepdims), x.dtype),)

    def impl(x, axes, keepdims):
        # the ufunc's reduce, as np.sum/np.max call it but without their Python wrapper
        # (docs/measurements.md#reduce);
        # all axes as None, as numpy's own np.sum(x) (one pass over a contiguous array)
        axis = None if len(axes) == np.ndim(x) else axes
        return fn.reduce(x, axis=axis, keepdims=keepdims, dtype=x.dtype)

    return register(OpDef(name, "reduction", infer, impl, attrs=("axes", "keepdims"), doc=doc))


# the result dtype is the operand's (np.sum would widen small ints; the tracer converts first)
reduce_sum = _reduce("reduce_sum", np.add, False, "sum over axes")
reduce_max = _reduce("reduce_max", np.maximum, True, "max over axes (nan-propagating)")
reduce_min = _reduce("reduce_min", np.minimum, True, "min over axes (nan-propagating)")


def _argmax_infer(in_types, axis, keepdims):
    (x,) = in_types
    check_axis(axis, x.ndim)
    _check_keepdims(keepdims)
    if x.shape[axis] == 0:
        raise ShapeError(f"argmax of an empty axis {axis} of shape {x.shape}")
    return (TensorType(reduced_shape(x.shape, (axis,), keepdims), np.dtype(np.int64)),)


argmax = register(
    OpDef(
        "argmax",
        "reduction",
        _argmax_infer,
        lambda x, axis, keepdims: np.argmax(x, axis=axis, keepdims=keepdims).astype(np.int64),
        attrs=("axis", "keepdims"),
        doc="index of the first maximum along axis (int64)",
    )
)


# --- autodiff rules (see graphc/autodiff.py) --------------------------------------------------


def _keepdims_shape(x, axes):
    return tuple(1 if i in axes else d for i, d in enumerate(x.shape))


def _sum_vjp(ad, g):  # every input element contributes once: broadcast g back
    (x,) = ad.inputs
    return [np.broadcast_to(g.reshape(_keepdims_shape(x, ad.attrs["axes"])), x.shape)]


def _sum_jvp(ad, t):
    return None if t is None else ad.bind("reduce_sum", t, **ad.attrs)


reduce_sum.vjp, reduce_sum.jvp = _sum_vjp, _sum_jvp


def _extremum_weights(ad):
    """1/count at the positions that attain the max (min), 0 elsewhere: ties share evenly."""
    (x,), (y,) = ad.inputs, ad.outputs
    axes = ad.attrs["axes"]
    hit = (x == y.reshape(_keepdims_shape(x, axes))).astype(x.dtype)
    return hit / ad.bind("reduce_sum", hit, axes=axes, keepdims=True)


def _extremum_vjp(ad, g):
    (x,) = ad.inputs
    return [g.reshape(_keepdims_shape(x, ad.attrs["axes"])) * _extremum_weights(ad)]


def _extremum_jvp(ad, t):
    return None if t is None else ad.bind("reduce_sum", t * _extremum_weights(ad), **ad.attrs)


reduce_max.vjp, reduce_max.jvp = _extremum_vjp, _extremum_jvp
reduce_min.vjp, reduce_min.jvp = _extremum_vjp, _extremum_jvp
argmax.vjp, argmax.jvp = (lambda ad, g: [None]), (lambda ad, t: None)  # integer result


# --- sharding rules (see graphc/ops/dims.py) --------------------------------------------------
# A split of a summed axis leaves partial sums (P); max, min and argmax have no partial form, so
# their reduced axes cannot be split.


def _reduce_dim_rule(summing: bool):
    def rule(in_types, out_types, axes=None, keepdims=False, axis=None):
        axes = axes if axes is not None else (axis,)
        (x,) = in_types
        ins = tuple(f"r{d}" if (d not in axes or summing) else None for d in range(x.ndim))
        outs = tuple(None if d in axes else f"r{d}" for d in range(x.ndim) if keepdims or d not in axes)
        sums = frozenset(f"r{d}" for d in axes) if summing else frozenset()
        return DimRule((ins,), (outs,), sums=sums)

    return rule


def _reduce_cost(in_types, out_types, **_attrs):
    return float(in_types[0].size), io_bytes(in_types, out_types)


reduce_sum.dim_rule = _reduce_dim_rule(True)
for _op in (reduce_max, reduce_min, argmax):
    _op.dim_rule = _reduce_dim_rule(False)
for _op in (reduce_sum, reduce_max, reduce_min, argmax):
    _op.cost = _reduce_cost


# --- traits (graphc/core/traits.py) ------------------------------------------------------------
reduce_sum.traits = (Reduction("add"), FreshResult(), LinearIn((frozenset({0}),), on_meshes=True))
reduce_max.traits = (Reduction("max"), FreshResult())
reduce_min.traits = (Reduction("min"), FreshResult())
argmax.traits = (Reduction("argmax"), FreshResult())
