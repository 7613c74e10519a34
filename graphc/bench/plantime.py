"""``graphc bench plantime``: how long planning a training step on a fixed mesh takes, by stage,
and how it grows with depth.

Each case is traced, optimized and planned by the steps of ``plan_sharding`` run one by one
(passes/partition.py: build_problem, shrink, solve, make_plan), each timed on its own, and its
plan JSON written to a file as ``graphc compile`` writes it (the "write" stage: what a user waits
for after planning). Printed per case: the seconds of each stage, the ILP's size (items, groups,
columns), the plan file's size and the solver's status;
then the ratios the depth targets name (issue 29): the GPT-3 175B slice at 12 layers over 4 (by
the stages above, and by the wall clock of ``graphc compile`` run as a user runs it, the two slices
interleaved), and LLaMA-3-8B at 32 layers over 8, and the 8B step as a checker runs it (``_llama_bf16``).

``graphc bench plantime --solvers`` instead solves the ILPs of the solver benchmarks (the 8B step,
the 3-axis GPT, one GPT-3 175B layer) with HiGHS and with CP-SAT, interleaved, and prints each
one's seconds, status and objective (docs/solver.md).
"""

from __future__ import annotations

import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from graphc.api.parallel import parallelize
from graphc.core.collector import collector_paused
from graphc.core.errors import GraphcError
from graphc.core.files import atomic_write
from graphc.core.pytree import static_argnames
from graphc.core.units import fmt_time
from graphc.models import gpt, gpt3, llama
from graphc.passes.manager import release_unshared
from graphc.passes.options import PlanOptions, Solver
from graphc.passes.partition import build_problem, make_plan, shrink, state_ties
from graphc.passes.sharding.ilp import solve

GIB = 2**30


@dataclass(frozen=True)
class Case:
    """A training step at one size on one mesh: ``fn(*args, **kwargs)`` with ``static`` names."""

    name: str
    fn: Callable
    example: Callable[[], tuple[tuple, dict]]
    mesh: dict[str, int]
    profile: str | None = None
    memory_limit: int | None = None


def _gpt3(n_layer: int, batch: int = 64) -> Case:
    return Case(
        f"GPT-3 175B shapes, {n_layer} layer(s), batch {batch}",
        gpt3.train_step,
        lambda: gpt3.example_train_specs(n_layer=n_layer, batch=batch),
        {"dp": 8, "tp": 8},
        "a100-sxm",
        80 * GIB,
    )


def _llama(n_layer: int) -> Case:
    return Case(
        f"LLaMA-3-8B shapes, {n_layer} layers",
        llama.train_step,
        lambda: llama.example_train_specs(n_layer=n_layer),
        {"dp": 8, "tp": 8},
        None,
        80 * GIB,
    )


def _llama_bf16() -> Case:
    """The repo's bf16 8B example on a GPU profile, as ``graphc compile models/llama.py:train_step
    --example example_train_specs_8b_bf16 --mesh dp=8,tp=8 --profile h100-sxm`` plans it (64
    sequences of 2048 tokens, no memory limit): the GPU profile brings the optimizer-state
    offload columns (passes/sharding/offload_terms.py) and its own GEMM costs."""
    return Case(
        "LLaMA-3-8B bf16 h100-sxm, 32 layers",
        llama.train_step,
        llama.example_train_specs_8b_bf16,
        {"dp": 8, "tp": 8},
        "h100-sxm",
    )


def _small_gpt(n_layer: int) -> Case:
    """Aceso's depth test: a d=256 GPT (``gpt.example_train_specs_1000l`` at ``n_layer`` layers)."""
    return Case(
        f"GPT d=256, {n_layer} layers",
        gpt.train_step,
        lambda: gpt.example_train_specs(n_layer=n_layer, d=256, n_head=4, batch=8, seq=128),
        {"dp": 2, "tp": 2},
    )


def depth_cases(deep: bool = False) -> list[Case]:
    """The fixed-mesh cases of issue 29's targets: the GPT-3 175B slice at 4 and 12 layers,
    LLaMA-3-8B at 8 and 32 (f32 on this machine's profile, and bf16 on h100-sxm), and the d=256
    GPT at 100 layers, or (``deep``) at the target's 1,000 (minutes: the default run leaves it out)."""
    return [_gpt3(4), _gpt3(12), _llama(8), _llama(32), _llama_bf16(), _small_gpt(1000 if deep else 100)]


def solver_cases() -> list[Case]:
    """The solver benchmarks (issue 29 item 4): the 8B step, the 3-axis GPT, one 175B layer at
    micro-batch 1 per data-parallel rank."""
    return [
        _llama(32),
        Case("GPT train step, dp=2,tp=2,sp=2", gpt.train_step, gpt.example_train_args, {"dp": 2, "tp": 2, "sp": 2}),
        _gpt3(1, batch=8),
    ]


@dataclass
class Timing:
    stages: dict[str, float]
    sizes: dict[str, int]
    status: str
    objective_s: float

    @property
    def total(self) -> float:
        return sum(self.stages.values())


def _parallel(case: Case, solver: Solver, kwargs: dict):
    return parallelize(
        case.fn,
        mesh=case.mesh,
        memory_limit=case.memory_limit,
        static_argnames=static_argnames(kwargs),  # the same rule as the CLI: numbers static, a Generator traced
        profile=case.profile,
        cache=False,
        time_limit=600.0,
        solver=solver,
    )


def plan_case(case: Case, solver: Solver = "highs") -> Timing:
    """Plan ``case`` once, stage by stage (the steps of ``plan_sharding``), the cycle collector
    paused throughout as ``parallelize``'s ``plan_and_graph`` pauses it; "collect" is the
    collection it postponed, run as the pause ends with the graph, the problem and the plan
    alive, as after ``plan_and_graph`` (what planning left as garbage is freed then; the three
    are freed after, untimed). "write" is the plan's JSON written to a file, as ``graphc compile``
    writes it (its size in ``sizes["plan_bytes"]``)."""
    args, kwargs = case.example()
    par = _parallel(case, solver, kwargs)
    gc.collect()
    with collector_paused():
        timing, kept = _plan_stages(par, args, kwargs, solver)
        t0 = time.perf_counter()  # the collection runs as the pause ends
    gc.collect()
    timing.stages["collect"] = time.perf_counter() - t0
    plan = kept[2]
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "plan.json")
        t0 = time.perf_counter()
        atomic_write(path, plan.to_json())
        timing.stages["write"] = time.perf_counter() - t0
        timing.sizes["plan_bytes"] = os.path.getsize(path)
    del kept, plan
    return timing


def _plan_stages(par, args: tuple, kwargs: dict, solver: Solver) -> tuple[Timing, tuple]:
    traced, graph, seconds = par.trace_optimized(*args, **kwargs)
    release_unshared([traced], [graph])  # as plan_and_graph does
    del traced
    options: PlanOptions = par.options
    t1 = time.perf_counter()
    problem = build_problem(graph, par.mesh, options, par.pins(graph), state_ties(graph))
    t2 = time.perf_counter()
    groups, of = shrink(problem, options.shrink)
    t3 = time.perf_counter()
    sol = solve(problem, groups, of, options.memory_limit, options.time_limit, options.solver)
    t4 = time.perf_counter()
    plan = make_plan(problem, sol, options, t2 - t1)
    t5 = time.perf_counter()
    stages = {
        "trace": seconds["trace_s"],
        "optimize": seconds["optimize_s"],
        "problem": t2 - t1,
        "shrink": t3 - t2,
        "solve": t4 - t3,
        "plan": t5 - t4,
    }
    sizes = {k: int(sol.stats[k]) for k in ("items", "groups", "variables")}
    return Timing(stages, sizes, sol.status, sol.objective), (graph, problem, plan)


def main(repeat: int = 1, solvers: bool = False, deep: bool = False) -> None:
    """Print the stage table of ``depth_cases(deep)`` and the depth ratios (``solvers``: the
    HiGHS / CP-SAT table instead)."""
    if solvers:
        _main_solvers(repeat)
        return
    print("graphc bench plantime: planning a training step on a fixed mesh, by stage (seconds; median of")
    print(f"{repeat} run(s); stages: trace, optimize, build the problem, shrink, solve the ILP, make the plan, the")
    print("cycle collection postponed while planning, and writing the plan JSON as graphc compile does; MB: its size)")
    cases = depth_cases(deep)
    runs: dict[str, list[Timing]] = {c.name: [] for c in cases}
    for _round in range(repeat):
        for c in cases:
            runs[c.name].append(plan_case(c))
    head = f"{'case':<40} {'mesh':<10} {'items':>7} {'groups':>6} {'columns':>8} {'MB':>6} " + " ".join(
        f"{s:>8}" for s in ("trace", "optimize", "problem", "shrink", "solve", "plan", "collect", "write", "total")
    )
    print(head)
    total: dict[str, float] = {}
    planning: dict[str, float] = {}  # without the write: a plan of over 5,000 items writes no alternatives
    for c in cases:
        ts = runs[c.name]
        med = {s: statistics.median(t.stages[s] for t in ts) for s in ts[0].stages}
        total[c.name] = statistics.median(t.total for t in ts)
        planning[c.name] = statistics.median(t.total - t.stages["write"] for t in ts)
        mesh = ",".join(f"{k}={v}" for k, v in c.mesh.items())
        sz = ts[0].sizes
        cells = " ".join(f"{med[s]:>8.2f}" for s in med)
        print(
            f"{c.name:<40} {mesh:<10} {sz['items']:>7} {sz['groups']:>6} {sz['variables']:>8} "
            f"{sz['plan_bytes'] / 1e6:>6.1f} {cells} "
            f"{total[c.name]:>8.2f}  {ts[0].status}"
        )
    g4, g12, l8, l32, bf16 = (c.name for c in cases[:5])
    rounds = [  # each round's pair (the rounds are interleaved): the spread of the ratio
        (b.total - b.stages["write"]) / (a.total - a.stages["write"]) for a, b in zip(runs[g4], runs[g12])
    ]
    print(
        f"GPT-3 175B slice, 12 layers / 4 layers: {total[g12] / total[g4]:.2f}x; without writing the plan file "
        f"{planning[g12] / planning[g4]:.2f}x, rounds {min(rounds):.2f}-{max(rounds):.2f}x (the 4-layer plan's file "
        "keeps its alternatives, the 12-layer one's, over 5,000 items, does not; target <= 1.3x, 12 layers <= 20 s)"
    )
    _print_compile_walls(repeat)
    print(f"LLaMA-3-8B shapes, 32 layers / 8 layers: {total[l32] / total[l8]:.2f}x (32 layers: target <= 5 s)")
    print(f"{bf16}: {total[bf16]:.2f} s (target <= 5 s)")
    deepest = cases[5]
    print(f"{deepest.name}: {total[deepest.name]:.1f} s (target at 1,000 layers: <= 60 s; --deep plans that one)")


# ``graphc compile``'s example of each slice (models/gpt3.py), as a user plans it
COMPILE_SLICES = {4: "example_train_specs_175b_4l", 12: "example_train_specs_175b_12l"}
COMPILE_ROUNDS = 3  # at least, interleaved: the wall clock of a process varies more than a stage's


def compile_wall(n_layer: int, folder: str) -> float:
    """Seconds of one ``graphc compile`` of the GPT-3 175B slice of ``n_layer`` layers on
    dp=8,tp=8, a process of its own started to exit, as a user waits for it (the import, tracing,
    planning, the summary, the plan file; no plan cache)."""
    cmd = [
        sys.executable,
        "-m",
        "graphc",
        "compile",
        f"{gpt3.__file__}:train_step",
        "--example",
        COMPILE_SLICES[n_layer],
        "--mesh",
        "dp=8,tp=8",
        "--profile",
        "a100-sxm",
        "--memory",
        "80GiB",
        "--no-cache",
        "--quiet",
        "-o",
        os.path.join(folder, f"plan{n_layer}.json"),
    ]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode:
        raise GraphcError(
            f"graphc compile of the {n_layer}-layer slice failed (exit {done.returncode}):\n{done.stderr}"
        )
    return seconds


def _print_compile_walls(repeat: int) -> None:
    """The 12/4-layer ratio of ``graphc compile``'s wall clock: the two interleaved, the median
    and the spread (lowest-highest) of each, and of the ratio of each round's pair."""
    rounds = max(repeat, COMPILE_ROUNDS)
    walls: dict[int, list[float]] = {4: [], 12: []}
    with tempfile.TemporaryDirectory() as folder:
        for _round in range(rounds):
            for n in walls:
                walls[n].append(compile_wall(n, folder))
    ratios = [b / a for a, b in zip(walls[4], walls[12])]
    cells = ", ".join(f"{n} layers {statistics.median(w):.2f} s ({min(w):.2f}-{max(w):.2f})" for n, w in walls.items())
    print(
        f"graphc compile of the slice, wall clock over {rounds} interleaved rounds: {cells}; 12 / 4 layers "
        f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
    )


def _main_solvers(repeat: int, limit_s: float = 120.0) -> None:
    print("graphc bench plantime --solvers: each benchmark's ILP (tied groups, memory limit) built once, then")
    print(f"solved by HiGHS and by CP-SAT in turn, {repeat} round(s), at most {limit_s:.0f} s each; seconds of `solve`")
    print("(objective terms, the backend's model, the search, the memory rounds), the median")
    print(f"{'case':<40} {'solver':<6} {'columns':>8} {'solve s':>8} {'status':<11} {'objective':>12} {'gap':>7}")
    for c in solver_cases():
        args, kwargs = c.example()
        par = _parallel(c, "highs", kwargs)
        graph = par.trace_optimized(*args, **kwargs)[1]
        problem = build_problem(graph, par.mesh, par.options, par.pins(graph), state_ties(graph))
        groups, of = shrink(problem, True)
        seconds: dict[str, list[float]] = {"highs": [], "cpsat": []}
        last = {}
        for _round in range(repeat):
            for solver in seconds:
                t0 = time.perf_counter()
                last[solver] = solve(problem, groups, of, c.memory_limit, limit_s, solver)
                seconds[solver].append(time.perf_counter() - t0)
        for solver, secs in seconds.items():
            sol = last[solver]
            print(
                f"{c.name:<40} {solver:<6} {sol.stats['variables']:>8} {statistics.median(secs):>8.2f} "
                f"{sol.status:<11} {fmt_time(sol.objective):>12} {sol.gap:>7.2%}",
                flush=True,
            )
