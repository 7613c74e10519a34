"""The registry of ops (name -> OpDef) and the helpers their shape rules share."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.core.errors import ShapeError
from graphc.core.ir import KINDS, OpDef, TensorType

REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in REGISTRY:
        raise ValueError(f"op {op.name} registered twice")
    if op.kind not in KINDS:
        raise ValueError(f"op {op.name}: unknown kind {op.kind}")
    REGISTRY[op.name] = op
    return op


def get_op(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}") from None


# --- helpers shared by the shape rules --------------------------------------------------------


def check_axis(axis: Any, ndim: int, what: str = "axis") -> int:
    """A non-negative, in-range axis (attributes are stored normalized)."""
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise ShapeError(f"{what} must be an int, got {axis!r}")
    if not 0 <= axis < ndim:
        raise ShapeError(f"{what} {axis} is out of range for a {ndim}-d operand")
    return axis


def check_axes(axes: Any, ndim: int) -> tuple[int, ...]:
    if not isinstance(axes, tuple):
        raise ShapeError(f"axes must be a tuple of ints, got {axes!r}")
    for a in axes:
        check_axis(a, ndim)
    if len(set(axes)) != len(axes) or list(axes) != sorted(axes):
        raise ShapeError(f"axes must be sorted and unique, got {axes}")
    return axes


def check_shape(shape: Any, what: str = "shape") -> tuple[int, ...]:
    if not isinstance(shape, tuple) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ShapeError(f"{what} must be a tuple of non-negative ints, got {shape!r}")
    return shape


def same_dtype(in_types: tuple[TensorType, ...], opname: str) -> np.dtype:
    dts = {t.dtype for t in in_types}
    if len(dts) != 1:
        raise ShapeError(f"{opname} needs operands of one dtype, got {', '.join(str(t) for t in in_types)}")
    return in_types[0].dtype
