"""``graphc compile FILE:FUNC --mesh dp=2,tp=4``: trace, optimize and auto-shard a function on its
example arguments; print the plan's summary and write the plan JSON atomically.

A mesh with a ``pp`` axis (``--mesh pp=2,dp=2,tp=2 --microbatches 8``) plans a pipeline: stages,
schedule and each stage's sharding; on any other mesh ``--microbatches 4`` plans gradient
accumulation (passes/accumulate.py: four micro-batches one after the other, one update). ``--devices 8`` instead searches the factorizations of 8
into pp x dp x tp and micro-batch counts, prints the choice and the runners-up, and writes the
chosen plan with the search in it.

On a step of repeated layers too large to plan whole (more nodes than passes/search.py's
``WHOLE_PLAN_NODES``: GPT-3 175B), ``--mesh pp=..,dp=..,tp=..`` with pp >= 2 prices that layout by blocks
instead (passes/scale.py, as ``--by-blocks`` does for any step) and says so: the plan written
is a prediction to compare layouts with, not a plan ``graphc run`` runs.

``--resolve-pins EDITED.json`` solves again, keeping the choices a hand-edited plan marks
``"pinned": true`` (``graphc run --plan`` runs a plan as written; this makes a new one). The
outputs (``-o``, default ``plan.json``; ``--dump-ir``) are checked before anything is traced
(graphc/cli/common.py): an existing file that is not a graphc plan is not overwritten without
``--force``; where the plan was written is printed."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import gc
import json
import os
import sys
import time
import warnings
from collections.abc import Iterator

from graphc.api.parallel import PLAN_WARNINGS, Parallelized
from graphc.cli import signals
from graphc.cli.common import (
    Output,
    add_plan_flags,
    check_output_dir,
    check_output_file,
    links_of,
    load_plan,
    mesh_of,
    mesh_text,
    plan_options,
    positive_int,
    process_age,
    run_options,
)
from graphc.cli.loader import UsageError, load_target
from graphc.core.collector import collector_paused
from graphc.core.errors import GraphcError, MeshError, PlanError, PlanWarning
from graphc.core.files import atomic_write
from graphc.core.ir import Graph
from graphc.core.mesh import Mesh
from graphc.core.profiles import PRESETS, get_profile
from graphc.core.pytree import static_argnames
from graphc.passes.manager import run_passes
from graphc.passes.partition import compile_devices, lower, zero3_inputs
from graphc.passes.pipeline import PipelinePlan, pipe_axis
from graphc.passes.scale import layered_model, plan_mesh
from graphc.passes.search import AXES, WHOLE_PLAN_NODES, explain, search_meshes, step_batch
from graphc.passes.sharding import plan as plan_file
from graphc.passes.sharding.plan import ShardingPlan, graph_hash


def add_parser(sub) -> None:
    p = sub.add_parser("compile", help="auto-shard FILE:FUNC on a device mesh and write the partition plan (JSON)")
    p.add_argument("target", help="FILE:FUNC, e.g. models/gpt.py:train_step")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--mesh", type=mesh_text, help="named mesh axes, e.g. dp=2,tp=4 (a pp axis makes a pipeline)")
    where.add_argument(
        "--devices",
        type=positive_int,
        metavar="N",
        help="search the factorizations of N devices into pp x dp x tp (and micro-batch counts)",
    )
    p.add_argument(
        "--profile",
        metavar="NAME|FILE",
        help=f"the hardware to plan for: {', '.join(PRESETS)} (spec-sheet numbers; graphc/core/profiles.py) "
        "or a JSON profile file (default: cpu-here, this machine's 'graphc calibrate' profile)",
    )
    p.add_argument("--link", help="per-axis link model overrides, e.g. dp=1GB/s:50us,tp=10GB/s:5us")
    p.add_argument("--example", help="function in FILE returning (args, kwargs) (default: example_args)")
    p.add_argument("-o", "--output", help="write the plan JSON here (default: plan.json, printed)")
    p.add_argument("--force", action="store_true", help="overwrite -o FILE even if it is not a graphc plan")
    p.add_argument("--mkdir", action="store_true", help="create the folders of -o / --dump-ir outside this folder")
    p.add_argument(
        "--resolve-pins",
        metavar="PLAN",
        help='solve again around the choices marked "pinned": true in a (hand-edited) plan file',
    )
    p.add_argument("--plan", metavar="FILE", help=argparse.SUPPRESS)  # renamed: says so
    p.add_argument("--dump-ir", metavar="DIR", help="write the IR after every pass to DIR")
    add_plan_flags(p)
    p.add_argument(
        "--by-blocks",
        action="store_true",
        help="with --mesh pp=..,dp=..,tp=.. on a step of repeated layers: price that layout with the block "
        "search's model, as --devices does (docs/scale.md; a prediction, not a plan to run)",
    )
    p.add_argument(
        "--no-cache", dest="cache", action="store_false", default=None, help="do not read or write the plan cache"
    )
    p.add_argument(
        "--explain",
        action="append",
        default=[],
        metavar="NAME",
        help="explain the spec of an input (%%x, %%params.w) or a node (%%12) (repeatable)",
    )
    p.add_argument(
        "--alternatives",
        action="store_true",
        help=f"write every input's, node's and output's priced alternatives into the plan file (by default only "
        f"a plan of at most {plan_file.ALTERNATIVES_IN_FILE:,} of them has them: pricing them is slow on a deep model)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress messages")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="--devices: list every mesh shape and micro-batch count the search considered, and why any was skipped",
    )
    p.set_defaults(func=cmd_compile)


def cmd_compile(args: argparse.Namespace) -> int:
    with warnings.catch_warnings():
        # the summary prints the plan's own warnings; the others (a 16-bit sum of micro-batches, new
        # parameters returned in another structure) are shown
        warnings.filterwarnings("ignore", message=PLAN_WARNINGS, category=PlanWarning)
        code = _compile(args)
    signals.end_without_teardown()  # the plan file is written: freeing what planning made is not needed
    return code


def _compile(args: argparse.Namespace) -> int:
    def progress(msg: str) -> None:
        if not args.quiet:
            print(f"[{time.perf_counter() - start:6.2f}s] {msg}", file=sys.stderr, flush=True)

    # the limit counts from launch, imports included (from main's call when graphc runs in-process)
    start = args.started if getattr(args, "started", None) is not None else time.perf_counter() - process_age()
    _check_flags(args)
    output = _check_outputs(args)
    if args.devices is not None or args.by_blocks:
        return _search_or_blocks(args, progress, output, start)
    mesh = mesh_of(args, _profile(args))
    pinned = _load_pinned(args.resolve_pins)
    fn, fargs, fkwargs = load_target(args.target, args.example)
    run = run_options(args)
    if pinned:  # a plan solved around hand-made pins is not one to keep
        run = dataclasses.replace(run, cache=False)
    if not pinned:
        big = _too_big_to_plan_whole(args, mesh, (fn, fargs, fkwargs), progress)
        if big is not None:
            return _mesh_by_blocks(args, progress, output, start, graph=big)
    with _collector_off_to_the_end():
        return _plan_and_write(args, mesh, pinned, (fn, fargs, fkwargs), run, output, progress, start)


@contextlib.contextmanager
def _collector_off_to_the_end() -> Iterator[None]:
    """The cycle collector paused from planning to the plan file written (graphc/core/collector.py),
    and, when graphc is the process, never run again: the process then ends without teardown
    (``signals.end_without_teardown``), and a collection walks the millions of objects a deep
    model's graph, problem and plan are (re-enabled as planning ended, its first collection took
    6-7 s at 1,000 layers, before the summary). ``gc.freeze`` moves them out of its sight at once;
    the traced and intermediate graphs it would have freed stay until the end (peak RSS 2.5
    against 2.3 GiB there). An in-process caller's ``main(argv)`` gets the collector back as it
    was, to collect what the command left."""
    with collector_paused():
        yield
        if signals.is_program():
            gc.freeze()


def _plan_and_write(args: argparse.Namespace, mesh: Mesh, pinned, target, run, output: Output, progress, start) -> int:
    """Plan ``target`` (the loaded function, arguments and keyword arguments) on ``mesh``, print
    the summary, write the plan file (and the IR with ``--dump-ir``), explain what was asked."""
    fn, fargs, fkwargs = target
    pf = Parallelized(fn, mesh, plan_options(args), run, static_argnames=static_argnames(fkwargs))
    if pf.pipelined:
        if pinned:
            raise UsageError("--resolve-pins works on steps of one pass (no pp axis, one micro-batch)")
        return _compile_microbatched(args, pf, fargs, fkwargs, output, progress)
    if pinned:
        n = pf.follow(pinned, *fargs, **fkwargs)
        progress(f"re-solving around {n} pin(s) from {args.resolve_pins}")
    progress(f"tracing {args.target} on mesh {mesh}")
    plan, graph = pf.plan_and_graph(*fargs, progress=progress, start=start, **fkwargs)
    assert isinstance(plan, ShardingPlan)  # a mesh without one plans the sharding
    if (args.explain or args.alternatives) and not plan.alternatives_kept:  # cached without them (a deep plan)
        progress("the cached plan was stored without its alternatives: solving again to price them")
        run = dataclasses.replace(run, cache=False)
        pf = Parallelized(fn, mesh, plan_options(args), run, static_argnames=static_argnames(fkwargs))
        plan, graph = pf.plan_and_graph(*fargs, progress=progress, start=start, **fkwargs)  # the same --time-limit
        assert isinstance(plan, ShardingPlan)
    if args.dump_ir:
        _dump_ir(args.dump_ir, pf, graph, plan, fargs, fkwargs)
    t = plan.timing
    progress(
        f"done: trace {t.get('trace_s', 0):.2f}s, optimize {t.get('optimize_s', 0):.2f}s, "
        f"plan {t.get('plan_s', 0):.2f}s{' (cached)' if t.get('cached') else ''}"
    )
    print(plan.summary())
    t0 = time.perf_counter()
    _write(output, plan.to_json(alternatives=True if args.alternatives else None), args)
    progress(f"wrote the plan in {time.perf_counter() - t0:.2f}s")
    _explain(plan, args.explain)
    return 0


def _compile_microbatched(args: argparse.Namespace, pf: Parallelized, fargs, fkwargs, output: Output, progress) -> int:
    """A pipeline (a mesh with a pp axis) or gradient accumulation (micro-batches on any other
    mesh): its summary, its micro-batch program's sharding plan, the plan file, ``--explain``."""
    if args.alternatives:
        raise UsageError(
            "--alternatives writes the alternatives of a plan of one pass; with a pp axis or --microbatches, "
            "--explain NAME prints those of the micro-batch's program"
        )
    mesh = pf.mesh
    what = "a pipeline" if pipe_axis(mesh) is not None else f"{pf.options.microbatches} micro-batches"
    progress(f"tracing {args.target} and planning {what} on mesh {mesh}")
    pplan = pf.plan(*fargs, **fkwargs)
    assert isinstance(pplan, PipelinePlan)  # a pp axis or micro-batches plan a pipeline (of one stage)
    print(pplan.summary())
    if pplan.sub_plan is not None:
        if pplan.accumulates:
            print(f"each micro-batch's program ({pplan.microbatch_size} samples), as one pass:")
        print(pplan.sub_plan.summary())
    if args.dump_ir:
        _dump_pipeline_ir(args.dump_ir, pf, fargs, fkwargs)
    _write(output, pplan.to_json(), args)
    if args.explain:
        if pplan.sub_plan is None:
            raise UsageError("--explain needs a sharded plan: this one runs every stage on one device")
        _explain(pplan.sub_plan, args.explain)
    return 0


def _check_flags(args: argparse.Namespace) -> None:
    """Refuse a renamed flag and flags that cannot work, before anything is traced."""
    if args.plan:
        raise UsageError(
            f"compile --plan {args.plan}: renamed; --resolve-pins {args.plan} solves again around the plan's "
            "pins, and 'graphc run --plan' runs a plan as written"
        )
    if args.alternatives and (args.devices is not None or args.by_blocks):
        raise UsageError(
            "--alternatives writes the alternatives of one --mesh's plan; a search or --by-blocks has none"
        )


def _check_outputs(args: argparse.Namespace) -> Output:
    """The plan file and the IR folder, checked before anything is traced (graphc/cli/common.py)."""
    output = check_output_file(args.output or "plan.json", "-o", "plan", force=args.force, mkdir=args.mkdir)
    if args.dump_ir:
        check_output_dir(args.dump_ir, "--dump-ir", mkdir=args.mkdir)
    return output


def _load_pinned(path: str | None) -> ShardingPlan | None:
    if not path:
        return None
    try:
        plan = load_plan(path)
    except PlanError as exc:
        raise PlanError(f"--resolve-pins: {exc}") from None
    if not isinstance(plan, ShardingPlan):
        raise UsageError(f"--resolve-pins {path}: a pipeline plan has no pins to solve around")
    return plan


def _write(output: Output, text: str, args: argparse.Namespace) -> None:
    """Write the plan atomically; say where (in full when -o was not given: the default)."""
    atomic_write(output.path, text, make_dirs=output.make_dirs)
    if args.output:
        print(f"wrote {output.path}", file=sys.stderr)
    else:
        print(f"wrote {os.path.abspath(output.path)} (the default; -o FILE writes elsewhere)", file=sys.stderr)


def _explain(plan: ShardingPlan, names: list[str]) -> None:
    """Print why each named tensor got its spec; report the names the plan does not have, after
    the plan was written (a typo loses nothing)."""
    known = [x.name for x in plan.inputs] + [n.name for n in plan.nodes]
    for name in names:
        try:
            print(plan.explain(name))
        except PlanError:
            key = name if name.startswith("%") else f"%{name}"
            close = difflib.get_close_matches(key, known, n=3)
            print(
                f"graphc: warning: --explain {name}: the plan has no input or node named {key}; names are inputs "
                f"(%x, %params.w: {len(plan.inputs)} in this plan) and nodes (%12: {len(plan.nodes)})"
                + (f"; close: {', '.join(close)}" if close else ""),
                file=sys.stderr,
            )


def _dump_ir(folder: str, pf, graph, plan, fargs, fkwargs) -> None:
    """The IR after every pass, then one file per device: its program after lowering and fusion."""
    os.makedirs(folder, exist_ok=True)
    traced, _g, _s = pf.trace_optimized(*fargs, **fkwargs)
    run_passes(traced, dump_dir=folder)
    for p in compile_devices(lower(graph, plan), regather_inputs=zero3_inputs(plan)).devices:
        atomic_write(os.path.join(folder, f"device-{p.device}.gir"), str(p.graph))


def _dump_pipeline_ir(folder: str, pf, fargs, fkwargs) -> None:
    """The IR after every pass, micro-batch 0's program, and every device's tasks of micro-batch 0."""
    os.makedirs(folder, exist_ok=True)
    traced, _g, _s = pf.trace_optimized(*fargs, **fkwargs)
    run_passes(traced, dump_dir=folder)
    compiled = pf.compile(*fargs, **fkwargs)
    atomic_write(os.path.join(folder, "microbatch.gir"), compiled.ir("microbatch"))
    by_device: dict[int, list[str]] = {}
    for (d, ph, k), t in sorted(compiled.program.tasks.items()):
        if k <= 0:
            by_device.setdefault(d, []).append(f"// {ph} task{'' if k < 0 else ' of micro-batch 0'}\n{t.graph}")
    for d, texts in by_device.items():
        atomic_write(os.path.join(folder, f"device-{d}.gir"), "\n".join(texts))


def _search_or_blocks(args: argparse.Namespace, progress, output: Output, start: float) -> int:
    if args.devices is None:
        return _mesh_by_blocks(args, progress, output, start)
    if args.by_blocks:
        raise UsageError("--by-blocks prices one --mesh; --devices searches by blocks already")
    return _search(args, progress, output, start)


def _planning_graph(args: argparse.Namespace, progress, target=None):
    """The graph the planner partitions: ``args.target`` traced on its example (``target``: the
    loaded (function, args, kwargs)) and optimized for planning, without a mesh (the block search
    and the mesh search choose one)."""
    fn, fargs, fkwargs = target or load_target(args.target, args.example)
    # traced without the options: what a mesh of one device could not run (micro-batches with
    # recomputation, a forced ZeRO stage) is the planner's to price, not the trace's to refuse
    pf = Parallelized(fn, {"dp": 1}, static_argnames=static_argnames(fkwargs))
    progress(f"tracing {args.target}")
    return pf.trace_optimized(*fargs, **fkwargs)[1]


def _too_big_to_plan_whole(args: argparse.Namespace, mesh: Mesh, target, progress) -> Graph | None:
    """The traced step when a pipeline ``--mesh`` (a pp axis of 2 or more, with dp and tp) is asked
    of a step of repeated layers larger than the search plans whole (passes/search.py
    ``WHOLE_PLAN_NODES``): it is then priced by blocks, as ``--by-blocks`` does. None (plan it
    whole) for any smaller step, a mesh without pipeline stages (planned whole at any depth: LLaMA-3-8B
    on dp=8,tp=8 in about 4 s, docs/solver.md), another mesh, or flags that need a whole plan
    (--link, --dump-ir, --explain)."""
    if args.link or args.dump_ir or args.explain or not set(mesh.axis_names) <= set(AXES):
        return None
    if dict(zip(mesh.axis_names, mesh.shape)).get("pp", 1) < 2:
        return None
    graph = _planning_graph(args, progress, target)
    if len(graph.nodes) <= WHOLE_PLAN_NODES or layered_model(graph, step_batch(graph), mesh.profile) is None:
        return None
    return graph


def _mesh_by_blocks(
    args: argparse.Namespace, progress, output: Output, start: float, graph: Graph | None = None
) -> int:
    """``--mesh ... --by-blocks``, or ``--mesh`` on a ``graph`` too big to plan whole: the block
    search's composed plan of one mesh (passes/scale.py), a prediction, not a plan to run."""
    profile = _profile(args, "cpu-here")
    mesh = Mesh(args.mesh, profile=profile)  # --mesh checked by the parser (mesh_text)
    options = plan_options(args)
    automatic = graph is not None
    graph = graph if graph is not None else _planning_graph(args, progress)
    model = layered_model(graph, step_batch(graph), profile)
    if model is None:
        raise UsageError(f"--by-blocks: {args.target} has no repeated layers (a list of identical blocks) to price")
    if automatic:
        print(
            f"the step has {len(graph.nodes):,} nodes, more than the {WHOLE_PLAN_NODES:,} planned whole: mesh "
            f"{mesh} is priced by blocks (docs/scale.md), as --by-blocks does; the plan written is that "
            "prediction, not a plan to run"
        )
    axes = dict(zip(mesh.axis_names, mesh.shape))
    plan = plan_mesh(model, axes, options, profile, start + options.time_limit - SEARCH_MARGIN_S)
    plan = dataclasses.replace(plan, graph_hash=graph_hash(graph))
    print(plan.summary())
    _write(output, plan.to_json(), args)
    return 0


def _profile(args: argparse.Namespace, default: str | None = None):
    """The ``--profile`` machine profile (else ``default``'s, or None); an error names the flag."""
    name = args.profile or default
    try:
        return get_profile(name) if name else None
    except MeshError as exc:
        raise GraphcError(f"--profile: {exc}") from None


# kept back from --time-limit for printing and writing the chosen plan after the search stops
SEARCH_MARGIN_S = 1.0


def _search(args: argparse.Namespace, progress, output: Output, start: float) -> int:
    """``--devices N``: plan every factorization, print the choice and why, write the chosen plan."""
    links, profile = links_of(args), _profile(args)
    options = plan_options(args)
    graph = _planning_graph(args, progress)
    progress(f"searching meshes of {args.devices} devices")
    t0 = time.perf_counter()
    cands = search_meshes(
        graph,
        args.devices,
        options,
        links,
        profile,
        progress=lambda c: progress(f"  {c.describe()} [{c.seconds:.2f}s]"),
        deadline=start + options.time_limit - SEARCH_MARGIN_S,  # the whole compile within --time-limit
    )
    seconds = time.perf_counter() - t0
    planned = sum(c.skipped is None for c in cands)
    estimates = sum(c.ok and c.estimate is not None for c in cands)  # scaled from micro-batch 1, not solved
    unsolved = f" ({estimates} of them estimates, not solved)" if estimates else ""
    print(f"searched {planned} plans for {args.devices} devices in {seconds:.2f} s{unsolved}")
    print(explain(cands, verbose=args.verbose))
    best = cands[0]
    if best.plan is None:
        unreached = sum(c.unreached for c in cands)
        if unreached:  # not "no mesh can run": the limit ran out before these were planned
            raise GraphcError(
                f"no plan for {args.devices} devices within --time-limit {options.time_limit:g} s: {unreached} "
                f"candidates were not reached before it ran out (raise --time-limit; the other reasons are above)"
            )
        raise GraphcError(f"no mesh of {args.devices} devices can run {args.target} (the reasons are above)")
    doc = json.loads(best.plan.to_json())
    doc["search"] = {
        "devices": args.devices,
        "seconds": seconds,
        "estimates": estimates,
        "candidates": [c.to_json() for c in cands],
    }
    print(best.plan.summary())
    if isinstance(best.plan, PipelinePlan):  # its own warnings (a 16-bit sum of micro-batches): not in the summary
        for w in best.plan.warnings:
            warnings.warn(PlanWarning(w), stacklevel=1)
    _write(output, json.dumps(doc, indent=1), args)
    return 0
