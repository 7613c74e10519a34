"""``graphc bench plans``: does the cost model rank plans the way the threaded runtime runs them?

Several plans of several models' training steps, each on several meshes (the solver's choice and
plans with pinned inputs or nodes, ``bench/mesh.py: plan_variants``), are compiled and run on the
threaded runtime with their inputs already on the devices (what the planner predicts: one step,
no splitting or gathering). The contenders are interleaved (one step of every plan per round, so
a slow moment of the machine hits them all) and each gets the median and spread of its rounds.
Printed: every plan's predicted and measured step, Spearman's rank correlation of the two
overall and per model, and every plan's predicted and measured peak memory per device.

Measured memory is what the process really allocated (``tracemalloc``, which numpy reports its
array buffers to) during one step, plus what the runtime held when the step began (the inputs
and the buffer pools' free buffers), divided by the number of devices: the plan predicts the same
peak for every device, and the devices share one heap here.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphc.api.compiled import ParallelCompiled
from graphc.api.parallel import parallelize
from graphc.bench.mesh import plan_variants, spearman
from graphc.core.errors import PlanError
from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.core.profiles import load_profile
from graphc.core.spec import parse_spec
from graphc.core.units import fmt_bytes, fmt_time
from graphc.interpreter import bind_arguments
from graphc.models import cnn, gpt, llama, mlp
from graphc.passes.partition import state_ties
from graphc.passes.sharding.plan import ShardingPlan


@dataclass(frozen=True)
class Case:
    """One model's training step at one size: ``fn(*args, **kwargs)``, ``static`` argument names."""

    model: str
    fn: Callable
    args: tuple
    kwargs: dict
    static: tuple[str, ...]


def default_cases() -> list[Case]:
    """The models of ``graphc bench plans``: training steps that take 20-300 ms on one device here."""
    cases = []
    a, kw = mlp.example_train_args(batch=512, sizes=(512, 1024, 1024, 16))
    cases.append(Case("mlp", mlp.train_step, a, kw, ("lr",)))
    a, kw = gpt.example_train_args(batch=8, seq=64, n_vocab=512, d=128, n_layer=2, n_head=4)
    cases.append(Case("gpt", gpt.train_step, a, kw, ("n_head", "lr")))
    a, kw = llama.example_train_args(batch=8, seq=64, n_vocab=512, d=128, n_layer=2, n_head=4, n_kv_head=2, ffn=352)
    cases.append(Case("llama", llama.train_step, a, kw, ("n_head", "n_kv_head", "lr")))
    a, kw = cnn.example_train_args(batch=64)
    cases.append(Case("cnn", cnn.train_step, a, kw, ("lr",)))
    return cases


def tiny_cases() -> list[Case]:
    """Two small models, for tests of the machinery."""
    a, kw = mlp.example_train_args(batch=16, sizes=(8, 16, 4))
    b, kwb = gpt.example_train_args(batch=2, seq=8, n_vocab=32, d=16, n_layer=1, n_head=2)
    return [Case("mlp", mlp.train_step, a, kw, ("lr",)), Case("gpt", gpt.train_step, b, kwb, ("n_head", "lr"))]


MESHES = ("dp=2", "tp=2", "dp=2,tp=2", "dp=4")
VARIANTS = ("solver's choice", "data parallel", "forward matmuls replicated")


def plan_pins(graph, mesh, variant: str) -> tuple[dict[int, tuple], dict[int, str]]:
    """(input pins, node pins) of a variant; the ILP plans everything else around them.

    solver's choice             nothing pinned
    data parallel               the state (inputs a training step returns updated) replicated,
                                the other inputs (the batch) split on dim 0 over the first axis
    forward matmuls replicated  the matmuls of the first half of the graph replicated
                                (bench/mesh.py: plan_variants)
    """
    if variant == "solver's choice":
        return {}, {}
    if variant == "data parallel":
        state = {i for i, _o in state_ties(graph)}
        replicated = parse_spec(["R"] * mesh.ndim)
        split = parse_spec(["S(0)"] + ["R"] * (mesh.ndim - 1))
        return {
            k: replicated if k in state or not v.type.ndim or v.type.shape[0] % mesh.shape[0] else split
            for k, v in enumerate(graph.inputs)
        }, {}
    if variant == "forward matmuls replicated":
        return {}, dict(plan_variants(graph, mesh)[3][2])
    raise ValueError(f"unknown plan variant {variant!r} (expected one of {', '.join(VARIANTS)})")


@dataclass
class PlanRow:
    """One plan of one model on one mesh, with what was predicted and what was measured."""

    model: str
    mesh: str
    variant: str
    predicted_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    times: list[float] = field(default_factory=list)
    peak_predicted: int = 0
    peak_measured: int = 0
    peak_executor: int = 0  # the executor's own count of live values (runtime/executor.py)
    error: str | None = None
    case: Case | None = field(default=None, repr=False)
    run: Callable[[], Any] | None = field(default=None, repr=False)
    compiled: ParallelCompiled | None = field(default=None, repr=False)
    pieces: dict | None = field(default=None, repr=False)

    @property
    def measured_s(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    @property
    def spread_s(self) -> float:
        return (max(self.times) - min(self.times)) / 2 if self.times else float("nan")

    @property
    def memory_error(self) -> float:
        """(predicted - measured) / measured peak memory per device."""
        return (self.peak_predicted - self.peak_measured) / self.peak_measured if self.peak_measured else float("nan")


def _plan_key(compiled: ParallelCompiled) -> tuple:
    plan = compiled.plan
    return (
        str(plan.mesh),
        tuple(x.spec for x in plan.inputs),
        tuple(x.spec for x in plan.outputs),
        tuple((n.strategy, n.out_specs) for n in plan.nodes),
    )


def build_plans(
    cases: list[Case], meshes=MESHES, variants=VARIANTS, profile: MachineProfile | None = None
) -> list[PlanRow]:
    """Plan, lower and build every (case, mesh, variant); plans equal to one already built are
    left out (a pin the solver's choice already meets gives the same plan)."""
    profile = profile or load_profile()
    rows: list[PlanRow] = []
    for case in cases:
        seen: set[tuple] = set()
        for mesh_text in meshes:
            mesh = Mesh(mesh_text, profile=profile)
            base = parallelize(case.fn, mesh=mesh, static_argnames=case.static, cache=False)
            graph = base.trace_optimized(*case.args, **case.kwargs)[1]
            for name in variants:
                in_pins, node_pins = plan_pins(graph, mesh, name)
                row = PlanRow(case.model, mesh_text, name)
                pf = parallelize(case.fn, mesh=mesh, static_argnames=case.static, cache=False)
                if in_pins or node_pins:
                    pf.followed = (in_pins, {}, node_pins)
                try:
                    compiled = pf.compile(*case.args, **case.kwargs)
                except PlanError as exc:
                    row.error = str(exc).splitlines()[0]
                    rows.append(row)
                    continue
                assert isinstance(compiled, ParallelCompiled)  # (no pp axis: not a pipeline)
                key = _plan_key(compiled)
                if key in seen:
                    continue
                seen.add(key)
                cost = compiled.plan.cost
                row.predicted_s, row.compute_s, row.comm_s = cost.total_s, cost.compute_s, cost.comm_s
                row.peak_predicted = max(compiled.plan.memory.held)
                dyn_args, dyn_kwargs, _ = pf.split_static(case.args, case.kwargs)
                row.pieces = compiled.executable.shard(bind_arguments(compiled.graph, dyn_args, dyn_kwargs))
                row.compiled = compiled
                row.case = case
                row.run = _runner(compiled, row.pieces)
                rows.append(row)
    return rows


def reprice(row: PlanRow, profile: MachineProfile) -> float:
    """The predicted step of ``row``'s plan (every input, output and node pinned to its choice)
    on the same mesh priced with ``profile``."""
    assert row.compiled is not None and row.case is not None
    plan = row.compiled.plan
    pins = (
        {x.index: x.spec for x in plan.inputs},
        {x.index: x.spec for x in plan.outputs},
        {n.index: n.strategy for n in plan.nodes},
    )
    pf = parallelize(row.case.fn, mesh=Mesh(plan.mesh, profile=profile), static_argnames=row.case.static, cache=False)
    pf.followed = pins
    again = pf.plan(*row.case.args, **row.case.kwargs)
    assert isinstance(again, ShardingPlan)  # (no pp axis)
    return again.cost.total_s


def ablations(profile: MachineProfile) -> dict[str, MachineProfile]:
    """The profile with the pricing of issue 16 added one piece at a time, from none of it."""
    none = dataclasses.replace(
        profile,
        matmul_table={},
        cores=None,
        dispatch_s=0.0,
        concurrent_dispatch_s=0.0,
        oversubscribed_dispatch_s=0.0,
        shared_mem_bandwidth=0.0,
    )
    cores = dataclasses.replace(none, cores=profile.cores)
    table = dataclasses.replace(cores, matmul_table=profile.matmul_table)
    return {
        "one rate, no core sharing, no overhead": none,
        "+ cores shared": cores,
        "+ matmul table": table,
        "+ op overhead and shared bandwidth (all)": profile,
    }


def _runner(compiled: ParallelCompiled, pieces: dict) -> Callable[[], Any]:
    run = compiled.executable.run_sharded
    return lambda: run(pieces)


def measure_memory(row: PlanRow) -> None:
    """The step's real peak per device (the module doc) and the executor's own count."""
    assert row.compiled is not None and row.run is not None and row.pieces is not None
    ex = row.compiled.executable
    n = len(row.pieces)
    inputs = sum(_nbytes(p) for pieces in row.pieces.values() for p in pieces)
    pooled = sum(_pool_bytes(e.pool) for e in ex.executables.values())
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        outs = row.run()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del outs
    row.peak_measured = int((inputs + pooled + peak - before) / n)
    ex.run_sharded(row.pieces, profile=True)
    profiles = ex.last_profile or {}
    row.peak_executor = max((p.get("peak_bytes", 0) for p in profiles.values()), default=0)


def _nbytes(a: Any) -> int:
    return int(np.asarray(a).nbytes)


def _pool_bytes(pool) -> int:
    """Bytes of the free buffers a BufferPool holds (runtime/executor.py)."""
    return sum(a.nbytes for bucket in pool._free.values() for a in bucket)


def time_plans(rows: list[PlanRow], repeat: int) -> float | None:
    """``repeat`` rounds of one step of every plan, interleaved; each row gets its times.
    Returns the share of the machine's cores other processes used meanwhile (None if unknown)."""
    live = [(r, r.run) for r in rows if r.run is not None]
    for _r, run in live:
        run()  # warm: kernels loaded, buffers pooled
        run()
    busy0, own0, start0 = _busy_s(), _own_cpu_s(), time.perf_counter()
    for _ in range(repeat):
        gc.collect()
        for r, run in live:
            start = time.perf_counter()
            run()
            r.times.append(time.perf_counter() - start)
    busy1, own1, wall = _busy_s(), _own_cpu_s(), time.perf_counter() - start0
    if busy0 is None or busy1 is None:
        return None
    return max(0.0, (busy1 - busy0) - (own1 - own0)) / (wall * (os.cpu_count() or 1))


def _busy_s() -> float | None:
    """CPU seconds every process of the machine has used (Linux /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def rank_correlations(rows: list[PlanRow]) -> dict[str, float]:
    """Spearman's rho of predicted and measured step times: "overall" and per model."""
    ok = [r for r in rows if r.times]
    out = {"overall": spearman([r.predicted_s for r in ok], [r.measured_s for r in ok])}
    for model in dict.fromkeys(r.model for r in ok):
        mine = [r for r in ok if r.model == model]
        out[model] = spearman([r.predicted_s for r in mine], [r.measured_s for r in mine])
    return out


@dataclass
class Result:
    """What ``bench_plans`` measured: the plans, the rank correlations of their predicted and
    measured steps, the same with the profile's pricing added piece by piece, and how busy the
    machine was with other work while the plans were timed."""

    rows: list[PlanRow]
    rhos: dict[str, float]
    ablation: dict[str, dict[str, float]]
    other_load: float | None


def bench_plans(
    cases: list[Case] | None = None,
    meshes=MESHES,
    variants=VARIANTS,
    repeat: int = 7,
    profile: MachineProfile | None = None,
    ablate: bool = True,
) -> Result:
    """Build, measure memory, time (interleaved), rank; ``ablate`` also re-prices every plan
    with the profile's pricing added piece by piece (``ablations``)."""
    profile = profile or load_profile()
    rows = build_plans(cases if cases is not None else default_cases(), meshes, variants, profile)
    for r in rows:
        if r.run is not None:
            r.run()
            r.run()
            measure_memory(r)
    other = time_plans(rows, repeat)
    ablation = {}
    if ablate:
        ok = [r for r in rows if r.times]
        for name, variant in ablations(profile).items():
            priced = [dataclasses.replace(r, predicted_s=reprice(r, variant)) for r in ok]
            ablation[name] = rank_correlations(priced)
    return Result(rows, rank_correlations(rows), ablation, other)


def report(result: Result) -> str:
    """The table of plans, the rank correlations and the memory errors, as printed."""
    rows, rhos = result.rows, result.rhos
    lines = [
        f"  {'model':<6} {'mesh':<10} {'plan':<28} {'predicted':>10} {'measured':>10} {'spread':>10}"
        f"   {'peak pred':>10} {'peak meas':>10} {'error':>7}"
    ]
    for r in rows:
        if r.error:
            lines.append(f"  {r.model:<6} {r.mesh:<10} {r.variant:<28} no plan: {r.error}")
            continue
        lines.append(
            f"  {r.model:<6} {r.mesh:<10} {r.variant:<28} {fmt_time(r.predicted_s):>10} "
            f"{fmt_time(r.measured_s):>10} {'±' + fmt_time(r.spread_s):>10}   {fmt_bytes(r.peak_predicted):>10} "
            f"{fmt_bytes(r.peak_measured):>10} {r.memory_error:>+7.0%}"
        )
    ok = [r for r in rows if r.times]
    lines.append(f"  Spearman rank correlation of predicted and measured step times over {len(ok)} plans:")
    lines.append("    " + ", ".join(f"{k} {v:.2f}" for k, v in rhos.items()))
    if result.ablation:
        lines.append("  the same plans priced with the profile's pieces added one at a time (rho overall, per model):")
        for name, by_model in result.ablation.items():
            lines.append(f"    {name:<42} " + ", ".join(f"{k} {v:.2f}" for k, v in by_model.items()))
    errors = [abs(r.memory_error) for r in ok if r.peak_measured]
    if errors:
        lines.append(
            f"  peak memory per device, |predicted - measured| / measured: median {statistics.median(errors):.0%}, "
            f"max {max(errors):.0%}"
        )
    if result.other_load is not None:
        lines.append(
            f"  other processes used {result.other_load:.0%} of the machine's cores while the plans were timed"
            + (" (the timings are not to be trusted)" if result.other_load > 0.1 else "")
        )
    return "\n".join(lines)


def main(repeat: int = 7) -> None:
    profile = load_profile()
    print(
        f"graphc bench plans: {len(MESHES)} meshes x {len(VARIANTS)} plans per model (duplicates left out), "
        f"{repeat} interleaved rounds"
    )
    print(f"  machine profile: {profile.name}, {profile.source}")
    if profile.source == "default":
        print("  (no 'graphc calibrate' profile is stored: the fixed defaults price every device as a core of its own)")
    print(report(bench_plans(repeat=repeat, profile=profile)))
