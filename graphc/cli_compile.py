"""``graphc compile FILE:FUNC --mesh dp=2,tp=4``: trace, optimize and auto-shard a function on its
example arguments; print the plan's summary and write the plan JSON atomically."""

from __future__ import annotations

import argparse
import os
import sys
import time

from graphc.errors import GraphcError


def add_parser(sub) -> None:
    p = sub.add_parser("compile", help="auto-shard FILE:FUNC on a device mesh and write the partition plan (JSON)")
    p.add_argument("target", help="FILE:FUNC, e.g. models/gpt.py:train_step")
    p.add_argument("--mesh", required=True, help="named mesh axes, e.g. dp=2,tp=4")
    p.add_argument("--link", help="per-axis link model overrides, e.g. dp=1GB/s:50us,tp=10GB/s:5us")
    p.add_argument("--memory", help="per-device memory limit, e.g. 2GiB (default: none)")
    p.add_argument("--example", help="function in FILE returning (args, kwargs) (default: example_args)")
    p.add_argument("-o", "--output", help="write the plan JSON here (default: plan.json)", default="plan.json")
    p.add_argument("--plan", metavar="FILE", help="re-solve around the pins of an (edited) plan file")
    p.add_argument("--dump-ir", metavar="DIR", help="write the IR after every pass to DIR")
    p.add_argument("--time-limit", type=float, default=60.0, help="ILP time limit in seconds (default 60)")
    p.add_argument("--no-shrink", action="store_true", help="one ILP variable per node (no tying / follower merging)")
    p.add_argument("--no-cache", action="store_true", help="do not read or write the plan cache")
    p.add_argument("--explain", action="append", default=[], metavar="NAME", help="explain the spec of a tensor (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress messages")
    p.set_defaults(func=cmd_compile)


def cmd_compile(args: argparse.Namespace) -> int:
    from graphc.loader import load_target
    from graphc.mesh import Mesh, MeshError, parse_links
    from graphc.parallel import parallelize
    from graphc.plan import Plan

    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - start:6.2f}s] {msg}", file=sys.stderr, flush=True)

    start = time.perf_counter()
    try:
        links = parse_links(args.link) if args.link else None
        mesh = Mesh(args.mesh, links=links)
    except MeshError as exc:
        raise GraphcError(f"--mesh/--link: {exc}") from None
    fn, fargs, fkwargs = load_target(args.target, args.example)
    static = tuple(k for k, v in fkwargs.items() if not _has_arrays(v))
    pf = parallelize(fn, mesh=mesh, memory_limit=args.memory, static_argnames=static, shrink=not args.no_shrink,
                     time_limit_s=args.time_limit, cache=not args.no_cache and not args.plan)
    if args.plan:
        n = pf.follow(Plan.load(args.plan), *fargs, **fkwargs)
        progress(f"re-solving around {n} pin(s) from {args.plan}")
    progress(f"tracing {args.target} on mesh {mesh}")
    plan = pf.plan(*fargs, progress=progress, **fkwargs)
    if args.dump_ir:
        _dump_ir(args.dump_ir, pf, plan, mesh, fargs, fkwargs)
    t = plan.doc.get("timing", {})
    progress(f"done: trace {t.get('trace_s', 0):.2f}s, optimize {t.get('optimize_s', 0):.2f}s, "
             f"plan {t.get('plan_s', 0):.2f}s{' (cached)' if t.get('cached') else ''}")
    print(plan.summary())
    for name in args.explain:
        print(plan.explain(name))
    plan.save(args.output)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _has_arrays(v) -> bool:
    from graphc.pytree import flatten

    try:
        leaves, _ = flatten(v)
    except TypeError:
        return False
    return bool(leaves)


def _dump_ir(folder: str, pf, plan, mesh, fargs, fkwargs) -> None:
    """The IR after every pass, then one file per device: its program after lowering and fusion."""
    from graphc.cli import write_atomically
    from passes import optimize, run_pipeline
    from passes.lower import lower, verify_programs
    from runtime.parallel import DEVICE_PASSES

    os.makedirs(folder, exist_ok=True)
    traced, _g, _s = pf.trace_optimized(*fargs, **fkwargs)
    run_pipeline(traced, dump_dir=folder)
    programs = lower(plan.graph, plan, mesh)
    verify_programs(programs)
    for p in programs:
        write_atomically(os.path.join(folder, f"device-{p.device}.gir"), str(optimize(p.graph, DEVICE_PASSES)))
