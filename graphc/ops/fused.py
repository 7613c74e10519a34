"""``fused``: a cluster of elementwise ops (and reductions over the last axis with their
elementwise prologue and epilogue, as in softmax, layer norm and GELU) that the fusion pass
groups into one node. Its region holds the original ops; the runtime compiles it into one Numba
kernel, the interpreter simply runs the region.

  fused(*xs) {(*xs) -> ys} -> ys
"""

from __future__ import annotations

from graphc.core.errors import ShapeError
from graphc.core.ir import OpDef
from graphc.core.traits import FollowsProducer, FreshResult, Fused
from graphc.ops.dims import region_cost, region_rule
from graphc.ops.registry import register


def _fused_infer(in_types, regions):
    (region,) = regions
    if region.in_types != tuple(in_types):
        raise ShapeError("fused: the region's inputs do not match the operands")
    return region.out_types


def _fused_impl(run, regions, *xs):
    return tuple(run(regions[0], list(xs)))


fused = register(
    OpDef(
        "fused",
        "fused",
        _fused_infer,
        _fused_impl,
        num_inputs=None,
        min_inputs=0,
        num_regions=1,
        doc="a fused elementwise / row-reduction cluster, compiled to one kernel",
    )
)


def _fused_vjp(ad, *gs):
    """Differentiate the region's nodes as if they were not fused (fusion runs after autodiff,
    so this serves differentiating an optimized graph again)."""
    (region,) = ad.node.regions
    _, pullback = ad.vjp(lambda *xs: ad.inline(region, xs), *ad.inputs)
    grads = pullback([ad.instantiate(g, o) for g, o in zip(gs, ad.outputs)])
    return list(grads)


def _fused_jvp(ad, *tangents):
    (region,) = ad.node.regions
    ts = [ad.instantiate(t, x) for t, x in zip(tangents, ad.inputs)]
    _, out = ad.jvp(lambda *xs: ad.inline(region, xs), ad.inputs, ts)
    return tuple(out)


fused.vjp, fused.jvp = _fused_vjp, _fused_jvp

# sharding: the rule composed from the region's nodes (a dim splits when every inner op can run
# on its slices), the flops of the region's nodes and the bytes of the fused node's operands and
# results only
fused.dim_rule = lambda in_types, out_types, regions: region_rule(regions[0])
fused.cost = lambda in_types, out_types, regions: region_cost(regions[0], in_types, out_types)


# --- traits (graphc/core/traits.py) ------------------------------------------------------------
fused.traits = (Fused(), FreshResult(), FollowsProducer())
