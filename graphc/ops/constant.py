"""``constant``: an array baked into the graph (masks, position tables, numpy arrays the user's code
builds from static values). The text IR stores it bit-exactly."""

from __future__ import annotations

import numpy as np

from graphc.core import dtypes
from graphc.core.errors import ShapeError
from graphc.core.ir import OpDef, TensorType
from graphc.core.spec import shard
from graphc.core.traits import Constant, LocalAttrs
from graphc.ops.dims import DimRule
from graphc.ops.registry import register


def _constant_infer(in_types, value):
    if not isinstance(value, np.ndarray):
        raise ShapeError(f"constant: value must be a numpy array, got {type(value).__name__}")
    return (TensorType(value.shape, dtypes.canonical(value.dtype)),)


constant = register(
    OpDef(
        "constant",
        "constant",
        _constant_infer,
        lambda value: value,
        attrs=("value",),
        num_inputs=0,
        doc="a literal array",
    )
)

constant.vjp = lambda ad: []  # no inputs
constant.jvp = lambda ad: None

# sharding: each device slices its share of the literal, no work and no traffic
constant.dim_rule = lambda in_types, out_types, value: DimRule((), (tuple(f"e{d}" for d in range(out_types[0].ndim)),))
constant.cost = lambda in_types, out_types, value: (0.0, 0)


# --- traits (graphc/core/traits.py) ------------------------------------------------------------
def _local_value(node, ins, outs, specs, mesh_shape, coord) -> dict:
    """A constant on a device: its piece of the literal."""
    return {**node.attrs, "value": shard(node.attrs["value"], specs[0], mesh_shape, coord)}


constant.traits = (Constant(), LocalAttrs(_local_value))
