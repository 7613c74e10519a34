"""The block search's layouts and the plan it composes (passes/scale.py): a ``Layout`` (pp, dp,
tp, micro-batch size and count, ZeRO, recomputation, offload) and the ``ComposedPlan`` of one,
with its JSON, its step term by term and its summary."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.core.profiles import ClusterFigures
from graphc.passes import offload as offloading
from graphc.passes.sharding.plan import ShardingPlan
from graphc.passes.sharding.records import MFU_FORMULA, Mfu

COMPOSED_PLAN_VERSION = 1


@dataclass(frozen=True, slots=True)
class Layout:
    pp: int
    dp: int
    tp: int
    micro_batch: int  # sequences per device per micro-batch
    microbatches: int
    zero: int
    recompute: str  # "off" | "full"
    offload: str = "off"  # passes/offload.py OFFLOADS: the optimizer state and/or activations in host memory

    @property
    def axes(self) -> dict[str, int]:
        return {a: n for a, n in (("pp", self.pp), ("dp", self.dp), ("tp", self.tp)) if n > 1}


@dataclass(frozen=True)
class ComposedPlan:
    """The plan the scale search chose: a layout, its stages, and the step it predicts (module
    doc), with the block's own sharding plan on the tp sub-mesh. A prediction to compare
    layouts with: graphc runs a plan made for one mesh (``graphc compile --mesh``)."""

    graph_name: str
    layout: Layout
    devices: int
    stage_layers: tuple[int, ...]
    predicted: dict[str, float]
    memory_bytes: tuple[int, ...]  # per device of each stage
    model_flops: float
    peak_dtype: str
    peak_flops: float
    figures: ClusterFigures
    block_plan: ShardingPlan | None = field(default=None, repr=False)
    profile: MachineProfile | None = field(default=None, repr=False)
    graph_hash: str = ""  # filled for the chosen plan (hashing a large step's text takes seconds)
    offload: offloading.OffloadCost | None = None  # what offloading costs one device of the slowest stage
    offloaded: tuple[str, ...] = ()  # the step's inputs held in host memory
    activations: offloading.ActivationOffload | None = None  # the slowest stage's stash in host memory, per micro-batch

    @property
    def mfu(self) -> float:
        return self.model_flops / (self.predicted["step_s"] * self.devices * self.peak_flops)

    def to_json(self, indent: int | None = 1) -> str:
        axes = self.layout.axes or {"dp": 1}
        doc = {
            "version": COMPOSED_PLAN_VERSION,
            "kind": "composed",
            "graph": {"name": self.graph_name, "hash": self.graph_hash},
            "mesh": Mesh(axes, profile=self.profile).to_json(),
            "layout": dataclasses.asdict(self.layout),
            "devices": self.devices,
            "stage_layers": list(self.stage_layers),
            "predicted": dict(self.predicted),
            "memory_bytes": list(self.memory_bytes),
            "mfu": Mfu(
                value=self.mfu,
                model_flops=self.model_flops,
                step_s=self.predicted["step_s"],
                devices=self.devices,
                peak_dtype=self.peak_dtype,
                peak_flops=self.peak_flops,
            ).to_json(),
            "cluster_figures": dataclasses.asdict(self.figures),
            "block_plan": None if self.block_plan is None else json.loads(self.block_plan.to_json()),
            "offload": offloading.composed_json(self.offload, self.offloaded, self.activations),
        }
        return json.dumps(doc, indent=indent)

    def breakdown(self) -> str:
        """The predicted step term by term (the slowest stage's k micro-batches, the fill and
        drain, the exposed communication, the update), each with its share of the step."""
        p = self.predicted
        if "gemm_s" not in p:
            return "step breakdown: not recorded in this plan"
        names = [
            ("GEMM", "gemm_s"),
            ("attention", "attention_s"),
            ("non-GEMM", "non_gemm_s"),
            ("TP collectives (exposed)", "tp_comm_s"),
            ("kernel launches (exposed)", "launch_s"),
            ("recompute", "recompute_s"),
            ("activation copies (exposed)", "act_offload_s"),
            ("bubble (fill and drain)", "bubble_s"),
            ("pipeline sends", "p2p_s"),
            ("DP collectives (exposed)", "dp_s"),
            ("optimizer step", "update_s"),
            ("update's TP re-layout", "relayout_s"),
        ]
        unit, scale = ("s", 1.0) if p["step_s"] >= 1 else ("ms", 1e3)
        parts = [
            f"{name} {p.get(key, 0.0) * scale:.3f} {unit} ({p.get(key, 0.0) / p['step_s']:.1%})" for name, key in names
        ]
        return "step breakdown: " + ", ".join(parts)

    def summary(self) -> str:
        lo, p = self.layout, self.predicted
        return "\n".join(
            [
                f"layout pp={lo.pp} dp={lo.dp} tp={lo.tp}: micro-batch {lo.micro_batch} x {lo.microbatches} "
                f"micro-batches, ZeRO {lo.zero}, recompute {lo.recompute}, offload {lo.offload}; layers per stage {list(self.stage_layers)}",
                f"predicted step {p['step_s']:.3f} s (pipeline {p['pipeline_s']:.3f} s, of it idle {p['bubble']:.1%}: fill, drain and unequal stages; "
                f"exposed sends {p['p2p_s']:.3f} s, exposed gradient reduction {p['dp_s']:.3f} s, "
                f"update {p['update_s']:.3f} s); MFU {self.mfu:.1%} ({MFU_FORMULA}, peak {self.peak_dtype})",
                self.breakdown(),
                f"memory per device {max(self.memory_bytes) / 2**30:.1f} GiB at most",
            ]
            + ([] if self.offload is None else [self.offload.why() + " (a prediction: the runtime has no host tier)"])
            + ([] if self.activations is None else [self.activations.why() + " (a prediction, not run)"])
        )


__all__ = ["COMPOSED_PLAN_VERSION", "ComposedPlan", "Layout"]
