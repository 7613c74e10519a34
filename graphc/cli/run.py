"""``graphc run FILE:FUNC (--mesh dp=2,tp=2 | --plan plan.json) [--trace timeline.json]``: plan,
lower and run a function on a mesh of devices (threads), check the result against numpy eager,
print timings and each device's measured peak memory next to the plan's prediction, and
optionally write a Chrome trace (one track per device: kernels and collectives with their bytes;
open it in Perfetto or chrome://tracing)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from graphc.api.parallel import parallelize
from graphc.bench.timing import fmt_range, same, times_of
from graphc.cli.loader import load_target, static_argnames
from graphc.core.errors import GraphcError
from graphc.core.files import atomic_write
from graphc.core.mesh import Mesh, MeshError, parse_links
from graphc.core.units import fmt_bytes, fmt_time
from graphc.interpreter import bind_arguments
from graphc.passes.sharding.plan import ShardingPlan


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run FILE:FUNC on a device mesh (one thread per device), check it against numpy")
    p.add_argument("target", help="FILE:FUNC, e.g. models/gpt.py:train_step")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--mesh", help="named mesh axes, e.g. dp=2,tp=2")
    where.add_argument("--plan", metavar="FILE", help="run this plan (from graphc compile; its mesh is used)")
    p.add_argument("--link", help="per-axis link model overrides for planning, e.g. dp=1GB/s:50us")
    p.add_argument("--memory", help="per-device memory limit for planning, e.g. 2GiB")
    p.add_argument("--example", help="function in FILE returning (args, kwargs) (default: example_args)")
    p.add_argument("--repeat", type=int, default=3, help="timed runs (default 3)")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome trace of one run (JSON, Perfetto)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a collective may wait for its peers")
    p.add_argument("--microbatches", type=int, default=1, help="micro-batches of a pipeline (a mesh with pp)")
    p.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b", help="pipeline schedule (default 1f1b)")
    p.set_defaults(func=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    fn, fargs, fkwargs = load_target(args.target, args.example)
    static = static_argnames(fkwargs)
    loaded = ShardingPlan.load(args.plan) if args.plan else None
    try:
        if loaded is not None:
            mesh = loaded.mesh
        else:
            mesh = Mesh(args.mesh, links=parse_links(args.link) if args.link else None)
    except MeshError as exc:
        raise GraphcError(f"--mesh/--link: {exc}") from None
    pf = parallelize(
        fn,
        mesh=mesh,
        memory_limit=args.memory,
        static_argnames=static,
        timeout_s=args.timeout,
        cache=loaded is None,
        microbatches=args.microbatches,
        schedule=args.schedule,
    )
    if pf.pipelined:
        return _run_pipeline(args, pf, fn, fargs, fkwargs)
    start = time.perf_counter()
    if loaded is not None:
        pf.follow(loaded, *fargs, **fkwargs)
    compiled = pf.compile(*fargs, **fkwargs)
    plan = compiled.plan
    print(
        f"graphc run {args.target} on mesh {mesh} ({mesh.size} devices): compiled in "
        f"{time.perf_counter() - start:.2f} s (plan {fmt_time(plan.cost.total_s)} predicted)"
    )

    def eager():
        return fn(*fargs, **fkwargs)

    want = eager()
    got = compiled(*fargs, **fkwargs)  # first run: kernels compiled or loaded from the disk cache
    verdict = same(got, want)
    t_eager = times_of(eager, args.repeat)
    t_mesh = times_of(lambda: compiled(*fargs, **fkwargs), args.repeat)
    dyn_args, dyn_kwargs, _ = pf.split_static(fargs, fkwargs)
    arrays = bind_arguments(compiled.graph, dyn_args, dyn_kwargs)
    compiled.executable.run_flat(arrays, profile=True)
    prof = compiled.executable.last_profile
    print(f"  numpy eager        {fmt_range(t_eager)}")
    print(
        f"  graphc on {mesh.size} devices {fmt_range(t_mesh)}   ({statistics.median(t_eager) / statistics.median(t_mesh):.2f}x "
        f"numpy eager; predicted step {fmt_time(plan.cost.total_s)})"
    )
    print(f"  result equals numpy eager: {verdict}")
    predicted = plan.memory.held  # values + redistribution buffers: what the runtime holds
    print("  device  peak memory measured  predicted   collectives  comm time")
    for d in sorted(prof):
        p = prof[d]
        comm = [e for e in p["events"] if e[4]]
        print(
            f"  {d:>6}  {fmt_bytes(p.get('peak_bytes', 0)):>20}  {fmt_bytes(predicted[d]):>9}   {len(comm):>11}  "
            f"{fmt_time(sum(e[3] - e[2] for e in comm)):>9}"
        )
    if args.trace:
        atomic_write(args.trace, json.dumps(chrome_trace(prof, mesh)))
        print(f"wrote {args.trace} (open in https://ui.perfetto.dev)", file=sys.stderr)
    return 0 if verdict == "yes" else 1


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


def _run_pipeline(args: argparse.Namespace, pf, fn, fargs, fkwargs) -> int:
    """``graphc run`` on a mesh with a pp axis: the pipeline's timings, measured bubble and memory
    against the plan's, and a trace with one track per device showing stages and micro-batches."""
    start = time.perf_counter()
    compiled = pf.compile(*fargs, **fkwargs)
    plan = compiled.plan
    print(
        f"graphc run {args.target} on mesh {pf.mesh} ({pf.mesh.size} devices): compiled in "
        f"{time.perf_counter() - start:.2f} s"
    )
    print(plan.summary())
    want = fn(*fargs, **fkwargs)
    got = compiled(*fargs, **fkwargs)
    verdict = same(got, want)
    t_eager = times_of(lambda: fn(*fargs, **fkwargs), args.repeat)
    t_pipe = times_of(lambda: compiled(*fargs, **fkwargs), args.repeat)
    dyn_args, dyn_kwargs, _ = pf.split_static(fargs, fkwargs)
    ex = compiled.executable
    ex.run_flat(bind_arguments(compiled.graph, dyn_args, dyn_kwargs), profile=True)
    prof = ex.last_profile
    print(f"  numpy eager        {fmt_range(t_eager)}")
    print(
        f"  graphc pipeline    {fmt_range(t_pipe)}   ({statistics.median(t_eager) / statistics.median(t_pipe):.2f}x "
        f"numpy eager)"
    )
    print(f"  result equals numpy eager: {verdict}")
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
    if args.trace:
        atomic_write(args.trace, json.dumps(pipeline_trace(prof, ex)))
        print(f"wrote {args.trace} (open in https://ui.perfetto.dev)", file=sys.stderr)
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


__all__ = ["add_parser", "chrome_trace", "pipeline_trace"]
