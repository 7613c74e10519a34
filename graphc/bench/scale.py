"""``graphc bench scale``: the mesh search at cluster scale. Each row traces a model's training
step (types only: models/gpt3.py, models/llama3.py), searches its layouts on a GPU cluster
(passes/search.py, the block search of passes/scale.py) within a time limit, and prints the
plan time, the chosen layout, the predicted step and MFU, and the published MFU where one
exists for that model on that cluster."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from graphc.api.parallel import Parallelized
from graphc.core.profiles import get_profile
from graphc.core.pytree import static_argnames
from graphc.models import gpt3, llama3
from graphc.passes.options import PlanOptions
from graphc.passes.scale import ComposedPlan
from graphc.passes.search import search_meshes


@dataclass(frozen=True)
class Row:
    model: str
    step: Callable
    example: Callable  # () -> (args, kwargs): ArraySpecs
    devices: int
    profile: str
    memory_gib: int
    published: str  # the published MFU and its source, or "-"
    time_limit: float = 60.0  # seconds for tracing and the search


ROWS = (
    Row(
        "GPT-3 175B",
        gpt3.train_step,
        gpt3.example_train_specs_175b,
        1024,
        "a100-sxm",
        80,
        # Narayanan et al.'s 140 TFLOP/s counts the recomputed forward (96 B s l h^2 flops an
        # iteration); in model flops, as the MFU column counts them, 0.751 of it (docs/scale.md)
        "33.7% (45% counting the recomputed forward: 140 TFLOP/s per GPU; Narayanan et al. 2021, Megatron-LM)",
    ),
    Row("LLaMA-3-8B", llama3.train_step, llama3.example_train_specs_8b, 64, "h100-sxm", 80, "-", 120.0),
    Row("LLaMA-3-70B", llama3.train_step, llama3.example_train_specs_70b, 512, "h100-sxm", 80, "-", 120.0),
    Row("GPT-3 13B", gpt3.train_step, gpt3.example_train_specs_13b, 128, "a100-sxm", 80, "-", 120.0),
)


def run_row(row: Row) -> list[str]:
    """The table cells of one row: trace, search within the row's time limit, the choice."""
    start = time.perf_counter()
    fargs, fkwargs = row.example()
    pf = Parallelized(row.step, {"dp": 1}, static_argnames=static_argnames(fkwargs))
    _traced, graph, _s = pf.trace_optimized(*fargs, **fkwargs)
    options = PlanOptions(memory_limit=row.memory_gib * 2**30, time_limit=row.time_limit)
    deadline = start + row.time_limit
    cands = search_meshes(graph, row.devices, options, profile=get_profile(row.profile), deadline=deadline)
    seconds = time.perf_counter() - start
    cluster = f"{row.devices} x {row.profile}"
    best = cands[0]
    skipped = sum(c.skipped is not None and c.skipped.startswith("time limit") for c in cands)
    plan_time = f"{seconds:.1f} s ({row.time_limit:.0f} s)" + (f", {skipped} layouts not reached" if skipped else "")
    estimates = sum(c.ok and c.estimate is not None for c in cands)  # scaled from micro-batch 1, not solved
    plan_time += f", {estimates} estimates not solved" if estimates else ""
    if not best.ok:
        return [row.model, cluster, plan_time, "no plan", "-", "-", "-", row.published]
    composed = best.composed or best.plan  # (a small step's choice is then planned whole: passes/search.py)
    if isinstance(composed, ComposedPlan):
        lo = composed.layout
        layout = (
            f"pp={lo.pp} dp={lo.dp} tp={lo.tp} mb={lo.micro_batch}x{lo.microbatches} zero={lo.zero} rc={lo.recompute}"
        )
        mfu = f"{composed.mfu:.1%}" if composed.mfu >= 0.01 else f"{composed.mfu:.3%}"  # a toy step's
    else:
        layout, mfu = best.mesh_text, "-"
    return [row.model, cluster, plan_time, layout, f"{best.step_s:.2f} s", mfu, row.published]


def main(rows: tuple[Row, ...] = ROWS) -> list[list[str]]:
    """Print the table (module doc); return its rows."""
    head = [
        "model",
        "cluster",
        "plan time (limit)",
        "layout (pp dp tp micro-batch ZeRO recompute)",
        "step",
        "MFU",
        "published MFU",
    ]
    print("graphc bench scale: the block search within each row's time limit (plan time includes tracing)")
    table = []
    for row in rows:
        cells = run_row(row)
        table.append(cells)
        print(" | ".join(cells), flush=True)
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for cells in table:
        print("| " + " | ".join(cells) + " |")
    return table
