"""How a GPU runs a segment's matmuls, as the block search prices them (passes/scale.py
``solve_segment``) on a profile with cluster figures (graphc/core/profiles.py ``ClusterFigures``):

    gemm_absorbed(g)          nodes the GEMM library runs inside the GEMM (operand transposes, a
                              weight gradient's sum over the batch): no kernel of their own
    GemmWaves(g, ...)         a matmul's seconds with its last wave of output tiles priced whole
                              (``wave_efficiency``)
    kernel_launches(g, plan)  the kernels one device launches for a segment's forward and backward
                              (``launch_gap`` prices the host's launches against them)

A matmul's rows and columns are those of its result on one device (its spec over the mesh): the
rows of every leading axis when the right operand is one matrix (a layer's input times its
weight, one GEMM over batch x sequence rows), else a batch of matrices (the batched attention
products); a product whose batch sum the GEMM takes (a weight gradient) is one matrix.
"""

from __future__ import annotations

import math

from graphc.core.ir import Graph
from graphc.core.profiles import ClusterFigures, gemm_tiles, wave_efficiency
from graphc.core.spec import local_shape
from graphc.core.traits import Contraction
from graphc.passes.sharding.fusion import fused_values


def gemm_absorbed(g: Graph) -> set[int]:
    """Nodes a GPU GEMM library runs inside the GEMM, not as kernels of their own: a transpose of
    the last two axes read only by contractions (cuBLAS's transa / transb operand flags), and a
    sum over the leading batch axes of a contraction's product (the weight gradient over a batch
    of sequences is one GEMM over batch x sequence rows: Megatron-LM's tensor_parallel/layers.py
    ``grad_output.view(s * b, h).t().matmul(total_input.view(s * b, h))``)."""
    readers: dict = {}
    for n in g.nodes:
        for v in n.inputs:
            readers.setdefault(v, []).append(n)
    out = set()
    for k, n in enumerate(g.nodes):
        if n.op.name == "transpose" and n.outputs:
            perm, r = tuple(n.attrs.get("perm", ())), len(n.attrs.get("perm", ()))
            swap_last = r >= 2 and perm == (*range(r - 2), r - 1, r - 2)
            users = readers.get(n.outputs[0], [])
            if swap_last and users and all(u.op.has(Contraction) for u in users):
                out.add(k)
        elif n.op.name == "reduce_sum" and n.inputs and n.inputs[0].producer is not None:
            axes, rank = tuple(n.attrs.get("axes", ())), n.inputs[0].type.ndim
            batch_only = axes == tuple(range(len(axes))) and 0 < len(axes) <= rank - 2
            if batch_only and n.inputs[0].producer.op.has(Contraction) and not n.attrs.get("keepdims"):
                out.add(k)
    return out


class GemmWaves:
    """The seconds of each matmul of ``g`` on one device of ``mesh_shape``: its per-op time (the
    sustained GEMM rate) over ``wave_efficiency`` of its output tiles (module doc)."""

    def __init__(self, g: Graph, absorbed: set[int], mesh_shape: tuple[int, ...], figures: ClusterFigures) -> None:
        self.g, self.mesh_shape, self.figures = g, tuple(mesh_shape), figures
        # products whose batch sum the GEMM takes: one matrix, the batch in its inner dimension
        self.summed = {g.nodes[k].inputs[0] for k in absorbed if g.nodes[k].op.name == "reduce_sum"}

    def tiles(self, index: int, out_spec) -> int | None:
        """The output tiles of node ``index`` (a matmul) on one device; None for other ops."""
        n = self.g.nodes[index]
        if n.op.name != "matmul" or len(n.inputs) != 2 or not n.outputs or n.outputs[0].type.ndim < 2:
            return None
        out = local_shape(n.outputs[0].type.shape, out_spec, self.mesh_shape)
        rows, cols, lead = out[-2], out[-1], math.prod(out[:-2])
        if n.outputs[0] in self.summed:
            lead = 1  # one GEMM over the batch (``gemm_absorbed``)
        elif n.inputs[1].type.ndim == 2:
            rows, lead = rows * lead, 1  # a weight shared by every row: one GEMM over them all
        return gemm_tiles(rows, cols, self.figures.gemm_tile, lead)

    def seconds(self, nc) -> float:
        """The seconds of the plan's node ``nc`` (a matmul): its per-op time stretched by its last
        wave; as it is for other contractions or without a wave size."""
        tiles = self.tiles(nc.index, nc.out_specs[0]) if self.figures.gemm_wave else None
        if tiles is None:
            return nc.compute_s
        return nc.compute_s / wave_efficiency(tiles, self.figures.gemm_wave)


def kernel_launches(g: Graph, plan, skipped: set[int], scores: set, virtual_axis: str) -> dict[str, int]:
    """{"forward": n, "backward": m}: the kernels one device launches for the segment ``g`` under
    ``plan``: every node that takes time, but those ``skipped`` (inside the GEMM or the fused
    attention kernel), an attention product reading the scores (inside the kernel whose product
    makes them: one fused attention kernel forward, one backward), and an elementwise node whose
    results all stay inside a fused kernel (graphc/passes/sharding/fusion.py: its chain is one
    kernel, launched for the node that ends it); and every collective that takes time but those on
    the virtual batch axis (priced for the real one)."""
    in_kernels = fused_values(g) if plan.mesh.profile.fuses_elementwise else frozenset()
    out = {"forward": 0, "backward": 0}
    for nc in plan.nodes:
        n = g.nodes[nc.index]
        if nc.index in skipped or nc.compute_s <= 0:
            continue
        if n.op.has(Contraction) and any(v in scores for v in n.inputs):
            continue
        if not n.op.has(Contraction) and n.outputs and all(o in in_kernels for o in n.outputs):
            continue
        out["backward" if n.part == "backward" else "forward"] += 1
    for c in plan.collectives:
        if c.time_s > 0 and virtual_axis not in c.axes:
            out["backward" if c.part == "backward" else "forward"] += 1
    return out


__all__ = ["GemmWaves", "gemm_absorbed", "kernel_launches"]
