"""``graphc compile FILE:FUNC --mesh dp=2,tp=4``: trace, optimize and auto-shard a function on its
example arguments; print the plan's summary and write the plan JSON atomically.

A mesh with a ``pp`` axis (``--mesh pp=2,dp=2,tp=2 --microbatches 8``) plans a pipeline: stages,
schedule and each stage's sharding. ``--devices 8`` instead searches the factorizations of 8
into pp x dp x tp and micro-batch counts, prints the choice and the runners-up, and writes the
chosen plan with the search in it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from graphc.api.parallel import parallelize
from graphc.cli.loader import load_target, static_argnames
from graphc.core.errors import GraphcError
from graphc.core.files import atomic_write
from graphc.core.mesh import Mesh, MeshError, parse_links
from graphc.core.profiles import PRESETS, get_profile
from graphc.core.units import parse_bytes
from graphc.passes.manager import run_pipeline
from graphc.passes.partition import compile_devices, lower
from graphc.passes.search import explain, search_meshes
from graphc.passes.sharding.plan import ShardingPlan


def add_parser(sub) -> None:
    p = sub.add_parser("compile", help="auto-shard FILE:FUNC on a device mesh and write the partition plan (JSON)")
    p.add_argument("target", help="FILE:FUNC, e.g. models/gpt.py:train_step")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--mesh", help="named mesh axes, e.g. dp=2,tp=4 (a pp axis makes a pipeline)")
    where.add_argument(
        "--devices",
        type=int,
        metavar="N",
        help="search the factorizations of N devices into pp x dp x tp (and micro-batch counts)",
    )
    p.add_argument("--microbatches", type=int, default=1, help="micro-batches of a pipeline (--mesh with pp)")
    p.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b", help="pipeline schedule (default 1f1b)")
    p.add_argument(
        "--profile",
        metavar="NAME|FILE",
        help=f"the hardware to plan for: {', '.join(PRESETS)} (spec-sheet numbers; graphc/core/profiles.py) "
        "or a JSON profile file (default: cpu-here, this machine's 'graphc calibrate' profile)",
    )
    p.add_argument("--link", help="per-axis link model overrides, e.g. dp=1GB/s:50us,tp=10GB/s:5us")
    p.add_argument("--memory", help="per-device memory limit, e.g. 2GiB (default: none)")
    p.add_argument("--example", help="function in FILE returning (args, kwargs) (default: example_args)")
    p.add_argument("-o", "--output", help="write the plan JSON here (default: plan.json)", default="plan.json")
    p.add_argument("--plan", metavar="FILE", help="re-solve around the pins of an (edited) plan file")
    p.add_argument("--dump-ir", metavar="DIR", help="write the IR after every pass to DIR")
    p.add_argument(
        "--time-limit",
        type=float,
        default=60.0,
        help="wall-time limit of the compile (trace, optimize, plan) in seconds (default 60): "
        "on expiry the best plan so far is written, with its gap",
    )
    p.add_argument(
        "--free-axes",
        action="store_true",
        help="ignore the axis roles (dp splits only batch dims, sp only sequence dims): any axis may split anything",
    )
    p.add_argument("--no-shrink", action="store_true", help="one ILP variable per node (no tying / follower merging)")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the plan cache")
    p.add_argument(
        "--explain", action="append", default=[], metavar="NAME", help="explain the spec of a tensor (repeatable)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress messages")
    p.set_defaults(func=cmd_compile)


def cmd_compile(args: argparse.Namespace) -> int:
    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - start:6.2f}s] {msg}", file=sys.stderr, flush=True)

    start = time.perf_counter() - _process_age()  # the limit counts from launch, imports included
    if not args.time_limit > 0:
        raise GraphcError(f"--time-limit must be a positive number of seconds, got {args.time_limit}")
    if args.devices is not None:
        return _search(args, progress)
    try:
        links = parse_links(args.link) if args.link else None
        profile = get_profile(args.profile) if args.profile else None
        mesh = Mesh(args.mesh, links=links, profile=profile)
    except MeshError as exc:
        raise GraphcError(f"--mesh/--link/--profile: {exc}") from None
    fn, fargs, fkwargs = load_target(args.target, args.example)
    pf = parallelize(
        fn,
        mesh=mesh,
        memory_limit=args.memory,
        static_argnames=static_argnames(fkwargs),
        shrink=not args.no_shrink,
        time_limit=args.time_limit,
        cache=not args.no_cache and not args.plan,
        microbatches=args.microbatches,
        schedule=args.schedule,
        free_axes=args.free_axes,
    )
    if pf.pipelined:
        if args.plan or args.explain:
            raise GraphcError("--plan and --explain work on meshes without a pp axis")
        progress(f"tracing {args.target} and planning a pipeline on mesh {mesh}")
        pplan = pf.plan(*fargs, **fkwargs)
        print(pplan.summary())
        if pplan.sub_plan is not None:
            print(pplan.sub_plan.summary())
        if args.dump_ir:
            _dump_pipeline_ir(args.dump_ir, pf, fargs, fkwargs)
        atomic_write(args.output, pplan.to_json())
        print(f"wrote {args.output}", file=sys.stderr)
        return 0
    if args.plan:
        n = pf.follow(ShardingPlan.load(args.plan), *fargs, **fkwargs)
        progress(f"re-solving around {n} pin(s) from {args.plan}")
    progress(f"tracing {args.target} on mesh {mesh}")
    plan, graph = pf.plan_and_graph(*fargs, progress=progress, start=start, **fkwargs)
    if args.dump_ir:
        _dump_ir(args.dump_ir, pf, graph, plan, fargs, fkwargs)
    t = plan.timing
    progress(
        f"done: trace {t.get('trace_s', 0):.2f}s, optimize {t.get('optimize_s', 0):.2f}s, "
        f"plan {t.get('plan_s', 0):.2f}s{' (cached)' if t.get('cached') else ''}"
    )
    print(plan.summary())
    for name in args.explain:
        print(plan.explain(name))
    plan.save(args.output)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _process_age() -> float:
    """Seconds since this process started (Linux: /proc), else 0."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, counted after the command name
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def _dump_ir(folder: str, pf, graph, plan, fargs, fkwargs) -> None:
    """The IR after every pass, then one file per device: its program after lowering and fusion."""
    os.makedirs(folder, exist_ok=True)
    traced, _g, _s = pf.trace_optimized(*fargs, **fkwargs)
    run_pipeline(traced, dump_dir=folder)
    for p in compile_devices(lower(graph, plan)).devices:
        atomic_write(os.path.join(folder, f"device-{p.device}.gir"), str(p.graph))


def _dump_pipeline_ir(folder: str, pf, fargs, fkwargs) -> None:
    """The IR after every pass, micro-batch 0's program, and every device's tasks of micro-batch 0."""
    os.makedirs(folder, exist_ok=True)
    traced, _g, _s = pf.trace_optimized(*fargs, **fkwargs)
    run_pipeline(traced, dump_dir=folder)
    compiled = pf.compile(*fargs, **fkwargs)
    atomic_write(os.path.join(folder, "microbatch.gir"), compiled.ir("microbatch"))
    by_device: dict[int, list[str]] = {}
    for (d, ph, k), t in sorted(compiled.program.tasks.items()):
        if k <= 0:
            by_device.setdefault(d, []).append(f"// {ph} task{'' if k < 0 else ' of micro-batch 0'}\n{t.graph}")
    for d, texts in by_device.items():
        atomic_write(os.path.join(folder, f"device-{d}.gir"), "\n".join(texts))


def _search(args: argparse.Namespace, progress) -> int:
    """``--devices N``: plan every factorization, print the choice and why, write the chosen plan."""
    try:
        links = parse_links(args.link) if args.link else None
        profile = get_profile(args.profile) if args.profile else None
    except MeshError as exc:
        raise GraphcError(f"--link/--profile: {exc}") from None
    fn, fargs, fkwargs = load_target(args.target, args.example)
    pf = parallelize(fn, mesh={"dp": 1}, static_argnames=static_argnames(fkwargs))
    progress(f"tracing {args.target}")
    _traced, graph, _s = pf.trace_optimized(*fargs, **fkwargs)
    progress(f"searching meshes of {args.devices} devices")
    t0 = time.perf_counter()
    cands = search_meshes(
        graph,
        args.devices,
        parse_bytes(args.memory),
        links,
        profile,
        schedule=args.schedule,
        time_limit_s=args.time_limit,
        progress=lambda c: progress(f"  {c.describe()} [{c.seconds:.2f}s]"),
    )
    seconds = time.perf_counter() - t0
    print(f"searched {len(cands)} plans for {args.devices} devices in {seconds:.2f} s")
    print(explain(cands))
    best = cands[0]
    if best.plan is None:
        raise GraphcError(f"no mesh of {args.devices} devices can run {args.target} (the reasons are above)")
    doc = json.loads(best.plan.to_json())
    doc["search"] = {"devices": args.devices, "seconds": seconds, "candidates": [c.to_json() for c in cands]}
    print(best.plan.summary())
    atomic_write(args.output, json.dumps(doc, indent=1))
    print(f"wrote {args.output}", file=sys.stderr)
    return 0
