"""``graphc run FILE:FUNC (--mesh dp=2,tp=2 | --plan plan.json) [--trace timeline.json]``: plan,
lower and run a function on a mesh of devices (threads), check the result against the function
called directly (plain numpy, or graphc's interpreter where it calls graphc.grad), print timings and each device's measured peak memory next to the plan's prediction, and
optionally write a Chrome trace (one track per device: kernels and collectives with their bytes;
open it in Perfetto or chrome://tracing).

``--plan plan.json`` runs that plan exactly as written (graphc compile wrote it, maybe under a
memory limit this command knows nothing of): nothing is solved. Its mesh is used, and checked
against ``--mesh`` when both are given; its graph hash is checked against the traced model.
Either mismatch is an error naming both (exit status 2). ``--trace`` is checked before the work.

``--backend mpi``, launched as ``mpiexec -n N python -m graphc run FILE:FUNC ...``: every rank
compiles (or loads from its cache) the same plan, checks with the others that it did, and runs its
own device. Rank 0 calls the function directly, gathers the results and prints the same report; every rank
exits with the same status. A repetition's step time is the slowest rank's, the ranks starting
together after a barrier; the trace puts every rank's events on one clock (perf_counter, the
machine's monotonic clock: one machine only)."""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from typing import Any

from graphc.api.parallel import BACKENDS, Parallelized, check_plan_mesh
from graphc.bench.timing import direct_call, fmt_range, result_bounds, same, times_of
from graphc.cli.common import (
    Output,
    add_plan_flags,
    check_output_file,
    load_plan,
    mesh_of,
    mesh_text,
    plan_options,
    positive_int,
    positive_seconds,
    run_options,
)
from graphc.cli.loader import UsageError, load_target
from graphc.core.errors import PlanError
from graphc.core.files import atomic_write
from graphc.core.ir import uses_low_floats
from graphc.core.mesh import Mesh
from graphc.core.pytree import flatten, static_argnames
from graphc.core.units import fmt_bytes, fmt_time
from graphc.frontend import random as traced_random
from graphc.interpreter import bind_arguments, evaluate
from graphc.passes.pipeline import PipelinePlan
from graphc.passes.sharding.plan import ShardingPlan
from graphc.runtime.devices import ShardedArray
from graphc.runtime.mpi_world import MpiWorld, join_world


def add_parser(sub) -> None:
    p = sub.add_parser(
        "run",
        help="run FILE:FUNC on a device mesh (one thread per device, or one MPI process per device), check it "
        "against FUNC called directly (numpy, or graphc's interpreter where FUNC calls graphc.grad)",
    )
    p.add_argument("target", help="FILE:FUNC, e.g. models/gpt.py:train_step")
    p.add_argument(
        "--mesh", type=mesh_text, help="named mesh axes, e.g. dp=2,tp=2 (with --plan: checked against the plan's)"
    )
    p.add_argument(
        "--plan",
        metavar="FILE",
        help="run this plan exactly as written (from graphc compile; its mesh is used, nothing is solved)",
    )
    p.add_argument("--link", help="per-axis link model overrides for planning, e.g. dp=1GB/s:50us")
    p.add_argument("--example", help="function in FILE returning (args, kwargs) (default: example_args)")
    p.add_argument("--repeat", type=positive_int, default=3, help="timed runs (default 3)")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome trace of one run (JSON, Perfetto)")
    p.add_argument("--force", action="store_true", help="overwrite --trace FILE even if it is not a Chrome trace")
    p.add_argument("--mkdir", action="store_true", help="create the folder of --trace FILE outside this folder")
    p.add_argument(
        "--timeout",
        dest="timeout_s",
        metavar="SECONDS",
        type=positive_seconds,
        help="seconds a collective may wait for its peers (default 60 on threads, 30 under MPI, where a failed "
        "or stuck rank ends the whole job within it)",
    )
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        help="threads: one thread per device in this process; mpi: one process per device, launched as "
        "mpiexec -n <devices> python -m graphc run ... (needs pip install 'graphc[mpi]')",
    )
    add_plan_flags(p)
    p.set_defaults(func=cmd_run)


def _mesh_and_plan(args: argparse.Namespace) -> tuple[Mesh, ShardingPlan | PipelinePlan | None]:
    """The mesh to run on and the plan file given, checked against each other before any work."""
    if args.mesh is None and args.plan is None:
        raise UsageError("run needs --mesh (to plan), --plan (a plan to run as written), or both")
    if args.plan and (args.memory_limit or args.link):
        raise UsageError(
            f"--plan {args.plan} runs that plan as written: --memory and --link only plan a new one "
            "(graphc compile ... --memory ... -o plan.json, then run it)"
        )
    loaded = load_plan(args.plan) if args.plan else None
    mesh = mesh_of(args) if args.mesh else None
    if loaded is None:
        assert mesh is not None
        return mesh, None
    if mesh is not None:
        try:
            check_plan_mesh(loaded, mesh)
        except PlanError as exc:
            raise PlanError(f"--plan {args.plan}: {exc} (--mesh {args.mesh})") from None
    return loaded.mesh, loaded


def _check_trace(args: argparse.Namespace) -> Output | None:
    return check_output_file(args.trace, "--trace", "trace", args.force, args.mkdir) if args.trace else None


def _from_example_state(fn, fargs: tuple, fkwargs: dict) -> tuple[Any, tuple, dict]:
    """(the function, its arguments) as every call of the run takes them: each numpy Generator
    among the example's arguments replaced by its state as the example made it (the u64[6] graphc
    passes for one: frontend/random.py), so the compiled step, the rounding bounds, the
    interpreter and every repetition draw the same numbers; the function, called directly, is
    given a Generator at that state again on each call (a Generator advances as it draws)."""
    fargs, fkwargs, bound = traced_random.bind_generators(fargs, fkwargs, ambient=False)
    if not bound:
        return fn, fargs, fkwargs

    def direct(*a: Any, **kw: Any) -> Any:
        for gen, state in bound:
            traced_random.set_philox_state(gen, state)
        return fn(*traced_random.restore_generators(a, bound), **traced_random.restore_generators(kw, bound))

    functools.update_wrapper(direct, fn)
    return direct, fargs, fkwargs


def _compile_given(pf, args: argparse.Namespace, fargs: tuple, fkwargs: dict):
    """``pf.compile``; a plan file made for another graph is an error naming the file."""
    try:
        return pf.compile(*fargs, **fkwargs)
    except PlanError as exc:
        if pf.given_plan is None:
            raise
        raise PlanError(f"--plan {args.plan}: {exc}") from None


def cmd_run(args: argparse.Namespace) -> int:
    mesh, loaded = _mesh_and_plan(args)
    trace_out = _check_trace(args)
    if args.backend == "mpi":
        return cmd_run_mpi(args, mesh, loaded, trace_out)
    options = plan_options(args, loaded)
    fn, fargs, fkwargs = load_target(args.target, args.example, runs="graphc run")
    pf = Parallelized(fn, mesh, options, run_options(args), static_argnames=static_argnames(fkwargs), plan=loaded)
    fn, fargs, fkwargs = _from_example_state(fn, fargs, fkwargs)
    if pf.pipelined:
        return _run_pipeline(args, pf, fn, fargs, fkwargs, trace_out)
    start = time.perf_counter()
    compiled = _compile_given(pf, args, fargs, fkwargs)
    plan = compiled.plan
    print(
        f"graphc run {args.target} on mesh {mesh} ({mesh.size} devices): compiled in "
        f"{time.perf_counter() - start:.2f} s (plan {fmt_time(plan.cost.total_s)} predicted"
        + (f"; {args.plan} run as written)" if loaded is not None else ")")
    )

    bounds = _bounds(pf, compiled, fargs, fkwargs)
    baseline, want, call = _baseline(pf, compiled, fn, fargs, fkwargs)
    got = compiled(*fargs, **fkwargs)  # first run: kernels compiled or loaded from the disk cache
    verdict = same(got, want, bounds)
    t_eager = times_of(call, args.repeat)
    t_mesh = times_of(lambda: compiled(*fargs, **fkwargs), args.repeat)
    dyn_args, dyn_kwargs, _ = pf.split_static(fargs, fkwargs)
    arrays = bind_arguments(compiled.graph, dyn_args, dyn_kwargs)
    compiled.executable.run_flat(arrays, profile=True)
    prof = compiled.executable.last_profile
    print(f"  {baseline:<20} {fmt_range(t_eager)}   ({_baseline_note(baseline, args.target, compiled.graph)})")
    print(
        f"  graphc on {mesh.size} devices {fmt_range(t_mesh)}   ({statistics.median(t_eager) / statistics.median(t_mesh):.2f}x "
        f"{baseline}; predicted step {fmt_time(plan.cost.total_s)})"
    )
    print(f"  result equals {baseline}: {verdict}")
    _report(trace_out, compiled, prof, mesh)
    return 0 if verdict == "yes" else 1


def _bounds(pf, compiled, fargs, fkwargs) -> list:
    """How far each result of the run may be from the baseline's, element by element: the
    graph's rounding bounds on this mesh and its micro-batches (graphc/bench/bounds.py)."""
    dyn_args, dyn_kwargs, _ = pf.split_static(fargs, fkwargs)
    return result_bounds(compiled.graph, dyn_args, dyn_kwargs, pf.mesh.shape, getattr(compiled.plan, "m", 1))


def _baseline(pf, compiled, fn, fargs, fkwargs) -> tuple[str, Any, Any]:
    """(name, result, call) of what a run is checked and timed against: the function called
    directly, or for a graph on bfloat16 or float16 graphc's interpreter on the graph. (numpy with
    ml_dtypes makes ``bf16_array * 0.5`` float32 where graphc keeps the Python float weak: called
    directly, the function would compute another model.)"""
    if not uses_low_floats(compiled.graph):
        baseline, want = direct_call(fn, fargs, fkwargs)
        return baseline, want, lambda: fn(*fargs, **fkwargs)
    dyn_args, dyn_kwargs, _ = pf.split_static(fargs, fkwargs)

    def interpret():
        return evaluate(compiled.graph, *dyn_args, **dyn_kwargs)

    return "graphc's interpreter", interpret(), interpret


def _baseline_note(baseline: str, target: str, graph) -> str:
    """What the baseline row is: the function called directly and what that ran, or the graph."""
    func = target.rsplit(":", 1)[-1]
    if uses_low_floats(graph):
        return f"{func}'s graph on graphc's interpreter: numpy with ml_dtypes promotes bfloat16 otherwise"
    if baseline == "numpy":
        return f"{func} called directly"
    return f"{func} called directly: its graphc.grad / value_and_grad trace and interpret it on every call"


def chrome_trace(profiles: dict[int, dict], mesh) -> dict:
    """Chrome trace events: one thread track per device; kernels and collectives as complete
    events with their source line and, for collectives, the bytes they move."""
    events = []
    t0 = min((p.get("t0", 0.0) for p in profiles.values()), default=0.0)
    for d, p in sorted(profiles.items()):
        coord = dict(zip(mesh.axis_names, mesh.coord(d)))
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": d, "args": {"name": f"device {d} {coord}"}})
        for name, loc, start, end, nbytes in p.get("events", []):
            ev = {
                "name": name,
                "cat": "comm" if nbytes else "compute",
                "ph": "X",
                "pid": 0,
                "tid": d,
                "ts": (start - t0) * 1e6,
                "dur": (end - start) * 1e6,
                "args": {"loc": loc},
            }
            if nbytes:
                ev["args"]["bytes"] = int(nbytes)
            events.append(ev)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"mesh": str(mesh), "peak_bytes": {str(d): p.get("peak_bytes", 0) for d, p in profiles.items()}},
    }


def _run_pipeline(args: argparse.Namespace, pf, fn, fargs, fkwargs, trace_out: Output | None) -> int:
    """``graphc run`` on a mesh with a pp axis: the pipeline's timings, measured bubble and memory
    against the plan's, and a trace with one track per device showing stages and micro-batches."""
    start = time.perf_counter()
    compiled = _compile_given(pf, args, fargs, fkwargs)
    plan = compiled.plan
    print(
        f"graphc run {args.target} on mesh {pf.mesh} ({pf.mesh.size} devices): compiled in "
        f"{time.perf_counter() - start:.2f} s"
    )
    print(plan.summary())
    bounds = _bounds(pf, compiled, fargs, fkwargs)
    baseline, want, call = _baseline(pf, compiled, fn, fargs, fkwargs)
    got = compiled(*fargs, **fkwargs)
    verdict = same(got, want, bounds)
    t_eager = times_of(call, args.repeat)
    t_pipe = times_of(lambda: compiled(*fargs, **fkwargs), args.repeat)
    dyn_args, dyn_kwargs, _ = pf.split_static(fargs, fkwargs)
    ex = compiled.executable
    ex.run_flat(bind_arguments(compiled.graph, dyn_args, dyn_kwargs), profile=True)
    prof = ex.last_profile
    print(f"  {baseline:<20} {fmt_range(t_eager)}   ({_baseline_note(baseline, args.target, compiled.graph)})")
    print(
        f"  graphc pipeline      {fmt_range(t_pipe)}   ({statistics.median(t_eager) / statistics.median(t_pipe):.2f}x "
        f"{baseline})"
    )
    print(f"  result equals {baseline}: {verdict}")
    print(f"  bubble: measured {ex.measured_bubble():.1%}, predicted {plan.predicted['bubble']:.1%}")
    print("  device  stage  peak memory measured  held between tasks  predicted held")
    print(
        "  (held: state, gradient sums and activations kept between tasks; the peak adds the running task's "
        "temporaries)"
    )
    for d in sorted(prof):
        s = ex.stage_of(d)
        print(
            f"  {d:>6}  {s:>5}  {fmt_bytes(prof[d]['peak_bytes']):>20}  {fmt_bytes(prof[d].get('held_bytes', 0)):>18}  "
            f"{fmt_bytes(plan.memory_bytes[s]):>14}"
        )
    if trace_out is not None:
        atomic_write(trace_out.path, json.dumps(pipeline_trace(prof, ex)), make_dirs=trace_out.make_dirs)
        print(f"wrote {trace_out.path} (open in https://ui.perfetto.dev)", file=sys.stderr)
    return 0 if verdict == "yes" else 1


def pipeline_trace(profiles: dict[int, dict], ex) -> dict:
    """Chrome trace of a pipeline run: one track per device, named by stage; every task a complete
    event ("F3" = forward of micro-batch 3, "U" = the update) with its stage and micro-batch;
    the gaps between them are the bubbles."""
    events = []
    t0 = min((p.get("t0", 0.0) for p in profiles.values()), default=0.0)
    for d, p in sorted(profiles.items()):
        s = ex.stage_of(d)
        events.append(
            {
                "name": "thread_name",
                "ph": "M",
                "pid": 0,
                "tid": d,
                "args": {"name": f"device {d} stage {s} {dict(zip(ex.mesh.axis_names, ex.mesh.coord(d)))}"},
            }
        )
        for phase, k, start, end in p.get("events", []):
            events.append(
                {
                    "name": phase if phase == "U" else f"{phase}{k}",
                    "cat": {"F": "forward", "B": "backward"}.get(phase, "update"),
                    "ph": "X",
                    "pid": 0,
                    "tid": d,
                    "ts": (start - t0) * 1e6,
                    "dur": (end - start) * 1e6,
                    "args": {"stage": s, "microbatch": k},
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "mesh": str(ex.mesh),
            "schedule": ex.schedule,
            "microbatches": ex.m,
            "measured_bubble": ex.measured_bubble(),
        },
    }


# --- the MPI backend ------------------------------------------------------------------------------


def cmd_run_mpi(args: argparse.Namespace, mesh, loaded, trace_out: Output | None = None) -> int:
    launch = f"python -m graphc run {args.target} ..."
    world = join_world(mesh.size, launch)  # before anything slow: a wrong -n stops every rank at once
    root = world.rank == 0
    options = plan_options(args, loaded)
    fn, fargs, fkwargs = load_target(args.target, args.example, runs="graphc run")
    pf = Parallelized(fn, mesh, options, run_options(args), static_argnames=static_argnames(fkwargs), plan=loaded)
    fn, fargs, fkwargs = _from_example_state(fn, fargs, fkwargs)
    start = time.perf_counter()
    compiled = _compile_given(pf, args, fargs, fkwargs)
    rank_ex = compiled.rank_executable
    assert rank_ex is not None
    if root:
        print(
            f"graphc run {args.target} on mesh {mesh} ({mesh.size} MPI ranks, one device each): compiled in "
            f"{time.perf_counter() - start:.2f} s on rank 0, plan hash {rank_ex.fingerprint} on every rank"
        )
        if pf.pipelined:
            print(compiled.plan.summary())
    bounds = _bounds(pf, compiled, fargs, fkwargs) if root else []
    baseline, want, call = _baseline(pf, compiled, fn, fargs, fkwargs) if root else ("", None, None)
    got = compiled(*fargs, **fkwargs)  # first run: kernels compiled or loaded, every call checked
    whole = [x.gather(0) if isinstance(x, ShardedArray) else x for x in flatten(got)[0]]
    verdict = same(whole, flatten(want)[0], bounds) if root else ""
    ok = world.broadcast_int(int(verdict == "yes"))
    t_eager = [0.0]
    if root:
        assert call is not None
        t_eager = _times(call, args.repeat)
    t_step = _step_times(world, lambda: compiled(*fargs, **fkwargs), args.repeat)
    dyn_args, dyn_kwargs, _ = pf.split_static(fargs, fkwargs)
    arrays = bind_arguments(compiled.graph, dyn_args, dyn_kwargs)
    rank_ex.run_flat(arrays, profile=True)
    local = rank_ex.last_profile or {}
    gathered = world.gather_bytes(json.dumps({str(d): p for d, p in local.items()}).encode())
    if not root:
        return 0 if ok else 1
    assert gathered is not None and t_step is not None
    profiles = {int(d): p for blob in gathered for d, p in json.loads(blob).items()}
    step = list(t_step.max(axis=0))  # each repetition: the slowest rank
    print(
        f"  {baseline + ' (rank 0)':<24} {fmt_range(t_eager)}   ({_baseline_note(baseline, args.target, compiled.graph)})"
    )
    print(
        f"  graphc on {mesh.size} ranks      {fmt_range(step)}   ({statistics.median(t_eager) / statistics.median(step):.2f}x "
        f"{baseline}; the slowest rank of each step)"
    )
    print(f"  result equals {baseline}: {verdict}")
    if pf.pipelined:
        _report_pipeline(trace_out, compiled, profiles)
    else:
        _report(trace_out, compiled, profiles, mesh)
    return 0 if ok else 1


def _times(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _step_times(world: MpiWorld, step, repeat: int) -> Any:
    """Every rank's seconds for ``repeat`` steps started together, as [ranks, repeat] on rank 0."""
    mine = []
    for _ in range(max(1, repeat)):
        world.barrier(idle=True)
        t0 = time.perf_counter()
        step()
        mine.append(time.perf_counter() - t0)
    return world.gather_floats(mine)


def _report(trace_out: Output | None, compiled, profiles: dict[int, dict], mesh) -> None:
    """Per device: measured peak memory against the plan's (values + redistribution buffers: what
    the runtime holds), its collectives, the time in them and the part of it spent waiting for
    the group's last member to arrive (docs/guide/cli.md); the trace file, if asked for. The time
    in collectives includes that waiting: a device that runs ahead waits for the slowest, so the
    sum can exceed the step."""
    predicted = compiled.plan.memory.held
    print("  device  peak memory measured  predicted   collectives  in collectives  of it waiting")
    for d in sorted(profiles):
        p = profiles[d]
        comm = [e for e in p.get("events", []) if e[4]]
        waits = [c["waited"] for c in p.get("comm_log", []) if "waited" in c]
        waiting = fmt_time(sum(waits)) if waits or not comm else "-"  # "-": the backend does not tell
        print(
            f"  {d:>6}  {fmt_bytes(p.get('peak_bytes', 0)):>20}  {fmt_bytes(predicted[d]):>9}   {len(comm):>11}  "
            f"{fmt_time(sum(e[3] - e[2] for e in comm)):>14}  {waiting:>13}"
        )
    if trace_out is not None:
        atomic_write(trace_out.path, json.dumps(chrome_trace(profiles, mesh)), make_dirs=trace_out.make_dirs)
        print(f"wrote {trace_out.path} (open in https://ui.perfetto.dev)", file=sys.stderr)


def _report_pipeline(trace_out: Output | None, compiled, profiles: dict[int, dict]) -> None:
    plan = compiled.plan
    ex = compiled.rank_executable.pipe  # this rank's PipelineExecutable, given every rank's profile
    ex.last_profile = {d: {**p, "events": [tuple(e) for e in p["events"]]} for d, p in profiles.items()}
    print(f"  bubble: measured {ex.measured_bubble():.1%}, predicted {plan.predicted['bubble']:.1%}")
    print("  device  stage  peak memory measured  held between tasks  predicted held")
    for d in sorted(profiles):
        s = ex.stage_of(d)
        p = profiles[d]
        print(
            f"  {d:>6}  {s:>5}  {fmt_bytes(p['peak_bytes']):>20}  {fmt_bytes(p.get('held_bytes', 0)):>18}  "
            f"{fmt_bytes(plan.memory_bytes[s]):>14}"
        )
    if trace_out is not None:
        atomic_write(trace_out.path, json.dumps(pipeline_trace(ex.last_profile, ex)), make_dirs=trace_out.make_dirs)
        print(f"wrote {trace_out.path} (open in https://ui.perfetto.dev)", file=sys.stderr)


__all__ = ["add_parser", "chrome_trace", "cmd_run_mpi", "pipeline_trace"]
