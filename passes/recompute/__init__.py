"""Recomputation in one place: a value the backward pass needs is computed again instead of kept
from the forward pass, trading compute for memory. Two modules, one idea:

    cheap.py     the pass ``recompute_cheap`` (in the default pass list and the device passes):
                 cheap elementwise forward values recomputed inside the backward's fused kernels,
                 where that keeps fewer bytes and costs next to nothing
    choices.py   the planner's: recomputing a forward value before the backward pass is a
                 strategy of its item in the sharding problem, chosen by the ILP under a memory
                 limit (``recompute`` option: "auto", "on", "off"; ``recompute_mode``)

    segments.py  the forward pass cut into segments (half a transformer layer): a segment's
                 recomputed values form chains with one point each, from checkpoints the solver
                 keeps (issue 30; docs/remat.md)
"""
