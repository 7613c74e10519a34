"""``sharding``: a sharding constraint (GSPMD's ``sharding_constraint``), emitted by
``graphc.shard(x, "S(0)", "R")``. It is the identity on values; the planner honours its spec (or
fails saying why), and autodiff puts the same constraint on the cotangent / tangent.

  sharding(x) {spec = "[S(0), R]"} -> x
"""

from __future__ import annotations

from graphc.core.errors import ShapeError
from graphc.core.ir import OpDef
from graphc.core.spec import SpecError, parse_spec
from graphc.core.traits import FollowsProducer, ShardingConstraint
from graphc.ops.dims import elementwise_rule
from graphc.ops.registry import register


def _sharding_infer(in_types, spec):
    (x,) = in_types
    try:
        placements = parse_spec(spec)
    except SpecError as exc:
        raise ShapeError(f"sharding: {exc}") from None
    for p in placements:
        if p.is_split and not 0 <= p.dim < x.ndim:
            raise ShapeError(f"sharding: {p} names dim {p.dim} of a {x.ndim}-d tensor {x}")
    return (x,)


sharding = register(
    OpDef(
        "sharding",
        "shape",
        _sharding_infer,
        lambda x, spec: x,
        attrs=("spec",),
        doc="identity that pins its operand's sharding spec",
    )
)
sharding.vjp = lambda ad, g: [ad.bind("sharding", g, spec=ad.attrs["spec"])]
sharding.jvp = lambda ad, t: None if t is None else ad.bind("sharding", t, spec=ad.attrs["spec"])
sharding.dim_rule = lambda in_types, out_types, spec: elementwise_rule(in_types, out_types)
sharding.cost = lambda in_types, out_types, spec: (0.0, 0)


# --- traits (graphc/core/traits.py) ------------------------------------------------------------
# the identity on one device; on a mesh its result is its operand redistributed to the pinned spec
# (a new piece, not a view): neither FreshResult nor ViewOf
sharding.traits = (ShardingConstraint(), FollowsProducer())
