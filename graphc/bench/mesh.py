"""``graphc bench FILE:FUNC --mesh dp=2 [--plans]``: what a mesh buys, measured in one run.

Prints the function called directly (numpy, or graphc's interpreter: timing.direct_call), graphc on one device (default BLAS threads, and one BLAS thread: one
device's share of the machine), graphc on the mesh per call (inputs split and outputs gathered
every call) and, for a training step whose outputs replace its arguments, per step of a loop that
keeps that state on the devices (``sharded_state=True``); the plan's predicted step against the
measured one; ring all-reduce bus bandwidth against memcpy.

``--plans`` also times several plans of the same function on the same mesh: the solver's choice
and plans with the inputs pinned (all replicated, data parallel, every input split on its first /
last dim), each planned by the ILP around the pins. Predicted and measured step times (devices
running on inputs already in place: what the cost model predicts) and their Spearman rank
correlation say whether the cost model orders plans the way the machine does.

Where a call on the mesh spends its time (``profile_mesh``): the medians over profiled runs of
the call, of each device program's span, of its steps by kind (matmuls, fused kernels,
collectives: their wait for the slowest device included, other steps) and of the time outside
the device programs (splitting the inputs, waking the device threads, gathering the results).
For a data-parallel plan on one mesh axis (every input replicated or split on dim 0) the same
profile of the two-thread ceiling beside it: each device's pieces through the single-device
program, all devices at once on one thread each (one BLAS thread), no runtime at all.
"""

from __future__ import annotations

import functools
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from graphc.api.compiled import ParallelCompiled
from graphc.api.jit import jit
from graphc.api.parallel import parallelize
from graphc.bench.comm import bench_all_reduce, bench_memcpy
from graphc.bench.timing import direct_call, fmt, result_bounds, same, times_of
from graphc.core.errors import GraphcError, PlanError
from graphc.core.mesh import Mesh, as_mesh
from graphc.core.pytree import unflatten
from graphc.core.spec import parse_spec
from graphc.core.traits import Collective, Contraction, Fused
from graphc.core.units import fmt_time
from graphc.interpreter import bind_arguments
from graphc.ops import OPS, REGISTRY
from graphc.passes.partition import state_ties
from graphc.runtime.threads import one_blas_thread


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties); nan for fewer than 2 points."""

    def ranks(v: list[float]) -> np.ndarray:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = np.empty(len(v))
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    if len(xs) < 2:
        return float("nan")
    a, b = ranks(xs), ranks(ys)
    a, b = a - a.mean(), b - b.mean()
    denom = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / denom) if denom else float("nan")


def _split_spec(ndim: int, dim: int, mesh) -> tuple | None:
    """Split ``dim`` over the mesh's first axis, replicate over the others (None for a scalar)."""
    if ndim == 0:
        return None
    return parse_spec([f"S({dim % ndim})"] + ["R"] * (mesh.ndim - 1))


def plan_variants(graph, mesh) -> list[tuple[str, dict[int, tuple], dict[int, str]]]:
    """(name, input pins, node pins) of the plans ``--plans`` compares: the solver's own choice;
    pins on every input leaf (the ILP still plans everything between inputs and outputs); the
    matmuls of the first half of the graph (the forward pass of a training step) replicated; and
    every node replicated (no parallelism: each device computes everything)."""
    replicated = parse_spec(["R"] * mesh.ndim)
    leaves = [v.type for v in graph.inputs]
    first_arg = graph.in_tree.children[0].children[0].num_leaves if graph.in_tree.children[0].children else 0
    variants: list[tuple[str, dict[int, tuple], dict[int, str]]] = [("solver's choice", {}, {})]
    dp = {k: replicated if k < first_arg else _split_spec(t.ndim, 0, mesh) or replicated for k, t in enumerate(leaves)}
    variants.append(("data parallel: 1st argument replicated, the rest split on dim 0", dp, {}))
    variants.append(
        (
            "every input split on its last dim",
            {k: _split_spec(t.ndim, -1, mesh) or replicated for k, t in enumerate(leaves)},
            {},
        )
    )
    half = len(graph.nodes) // 2
    variants.append(
        (
            "matmuls of the first half of the graph replicated",
            {},
            {k: "replicate" for k, n in enumerate(graph.nodes[:half]) if n.op is OPS.matmul},
        )
    )
    variants.append(("every node replicated (no parallelism)", {}, {k: "replicate" for k in range(len(graph.nodes))}))
    return variants


def bench_plans(fn, fargs, fkwargs, static, mesh, repeat: int) -> list[dict[str, Any]]:
    """Plan, build and time every variant of ``plan_variants``; rows with predicted/measured seconds."""
    mesh = as_mesh(mesh)
    base = parallelize(fn, mesh=mesh, static_argnames=static, cache=False, free_axes=True)
    rows: list[dict[str, Any]] = []
    for name, in_pins, node_pins in plan_variants(base.trace_optimized(*fargs, **fkwargs)[1], mesh):
        pf = parallelize(fn, mesh=mesh, static_argnames=static, cache=False, free_axes=True)
        pf.followed = (dict(in_pins), {}, dict(node_pins))
        try:
            compiled = pf.compile(*fargs, **fkwargs)
        except PlanError as exc:
            rows.append({"name": name, "error": str(exc).splitlines()[0]})
            continue
        assert isinstance(compiled, ParallelCompiled)  # (no pp axis: not a pipeline)
        dyn_args, dyn_kwargs, _ = pf.split_static(fargs, fkwargs)
        run = compiled.executable.run_sharded
        pieces = compiled.executable.shard(bind_arguments(compiled.graph, dyn_args, dyn_kwargs))
        run(pieces)  # warm: kernels loaded, buffers pooled
        measured = statistics.median(times_of(functools.partial(run, pieces), repeat))
        rows.append({"name": name, "predicted": compiled.plan.cost.total_s, "measured": measured})
    return rows


def _state_loop(compiled, arrays: list, repeat: int) -> list[float]:
    """Seconds per step of a loop that feeds the tied outputs (new parameters, optimizer state)
    back as the next step's inputs, kept sharded on the devices."""
    ties = state_ties(compiled.graph)
    keep = frozenset(o for _i, o in ties)
    ex = compiled.executable
    state = list(arrays)

    def step():
        outs = ex.run_flat(state, keep_sharded=keep)
        for i, o in ties:
            state[i] = outs[o]

    step()  # the first step splits the state; later ones find it in place
    return times_of(step, repeat)


def _kind(op_name: str) -> str:
    """The profile's bucket of a step: matmul, fused, collective or other (by the op's traits)."""
    op = REGISTRY.get(op_name)
    if op is None:
        return "other"
    if op.has(Collective):
        return "collective"
    if op.has(Fused):
        return "fused"
    return "matmul" if op.has(Contraction) else "other"


KINDS = ("matmul", "fused", "collective", "other")


def _steps(events: list, start: float, end: float) -> dict[str, float]:
    """One device's (or thread's) run from its profile events: its span and its steps by kind,
    and the call's time outside it (``start``/``end``: the call's)."""
    out = dict.fromkeys(KINDS, 0.0)
    for name, _loc, t0, t1, _nbytes in events:
        out[_kind(name)] += t1 - t0
    first = min((e[2] for e in events), default=start)
    last = max((e[3] for e in events), default=start)
    out["span"] = last - first
    out["outside"] = (end - start) - out["span"]
    return out


def _medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in rows) for k in rows[0]}


def ceiling_inputs(compiled, arrays: list, static_kwargs: dict) -> list[tuple[tuple, dict]] | None:
    """Each device's (args, kwargs) for the single-device function, when the plan is data
    parallel on one mesh axis: every input replicated or split on dim 0, the split ones all of
    one length there (the batch: a weight split on its rows is not data parallel); else None."""
    program = compiled.program
    if program.mesh.ndim != 1:
        return None
    batch = set()
    for v, spec in zip(compiled.graph.inputs, program.in_specs):
        if any(p.kind == "P" or (p.is_split and (p.dim != 0 or p.blocks != 1)) for p in spec):
            return None
        if any(p.is_split for p in spec):
            batch.add(v.type.shape[0])
    if len(batch) != 1:
        return None
    pieces = compiled.executable.shard(arrays)
    calls = []
    for p in program.devices:
        args, kwargs = unflatten(compiled.graph.in_tree, pieces[p.device])
        calls.append((tuple(args), {**kwargs, **static_kwargs}))
    return calls


def profile_mesh(fn, compiled, arrays: list, static: tuple[str, ...], fkwargs: dict, repeat: int) -> dict[str, Any]:
    """Medians over ``repeat`` profiled runs (module doc): {"call": seconds, "devices": {d: {kind:
    seconds, "span", "outside"}}, and for a data-parallel plan "ceiling" and "threads" alike, its
    runs interleaved with the call's (a busy moment of the machine hits both)."""
    ex = compiled.executable
    devices: dict[int, list[dict[str, float]]] = {p.device: [] for p in compiled.program.devices}
    calls: list[float] = []

    def call() -> None:
        start = time.perf_counter()
        ex.run_flat(arrays, profile=True)
        end = time.perf_counter()
        calls.append(end - start)
        assert ex.last_profile is not None
        for d, prof in ex.last_profile.items():
            devices[d].append(_steps(prof.get("events", []), start, end))

    execs = []
    inputs = ceiling_inputs(compiled, arrays, {k: v for k, v in fkwargs.items() if k in static})
    try:
        for args, kwargs in inputs or ():  # one executable per thread: each keeps its own buffers
            c = jit(fn, static_argnames=static).compile(*args, **kwargs)
            execs.append(
                (c.executable, bind_arguments(c.graph, args, {k: v for k, v in kwargs.items() if k not in static}))
            )
    except GraphcError:  # the function does not take a device's pieces (a batch it checks): no ceiling
        execs = []
    threads: list[list[dict[str, float]]] = [[] for _ in execs]
    ceilings: list[float] = []
    pool = ThreadPoolExecutor(max(1, len(execs)), thread_name_prefix="graphc-bench")

    def ceiling() -> None:
        profs: list[dict] = [{} for _ in execs]
        with one_blas_thread():
            start = time.perf_counter()
            futures = [pool.submit(e.run_flat, a, prof) for (e, a), prof in zip(execs, profs)]
            for f in futures:
                f.result()
            end = time.perf_counter()
        ceilings.append(end - start)
        for i, prof in enumerate(profs):
            threads[i].append(_steps(prof.get("events", []), start, end))

    try:
        for k in range(repeat + 1):  # round 0 warms both
            for run in (call, ceiling)[:: 1 if k % 2 else -1] if execs else (call,):
                run()
    finally:
        pool.shutdown()
    result: dict[str, Any] = {
        "call": statistics.median(calls[1:]),
        "devices": {d: _medians(rows[1:]) for d, rows in devices.items()},
    }
    if execs:
        result["ceiling"] = statistics.median(ceilings[1:])
        result["threads"] = {i: _medians(rows[1:]) for i, rows in enumerate(threads)}
    return result


def print_profile(prof: dict[str, Any], repeat: int) -> None:
    def line(who: str, r: dict[str, float]) -> str:
        kinds = ", ".join(f"{k} {r[k] * 1e3:.1f}" for k in KINDS if r[k] or k != "collective")
        return f"    {who:<9} program {r['span'] * 1e3:8.1f} ms: {kinds}; outside it {r['outside'] * 1e3:.1f} ms"

    print(
        f"  where a call on the mesh spends its time (profiled, medians of {repeat}, each figure its own; "
        "collectives include the wait for the slowest device):"
    )
    print(f"    call      {prof['call'] * 1e3:8.1f} ms")
    for d, r in prof["devices"].items():
        print(line(f"device {d}", r))
    if "ceiling" not in prof:
        return
    print(
        f"  the ceiling: each device's pieces through the 1-device program, all at once on one thread "
        f"each, no runtime: {prof['ceiling'] * 1e3:.1f} ms; the call's speed against it "
        f"{prof['ceiling'] / prof['call']:.2f}x (ceiling time / call time)"
    )
    for i, r in prof["threads"].items():
        print(line(f"thread {i}", r))


def bench_mesh(
    fn, fargs, fkwargs, static: tuple[str, ...], mesh: Mesh, repeat: int, plans: bool = False, label: str = ""
) -> str:
    """Print the mesh benchmark of ``fn`` on its example arguments; returns whether the result on
    the mesh equals the function called directly ("yes", or why not)."""
    print(f"graphc bench {label} on mesh {mesh} ({mesh.size} devices)")
    one = jit(fn, static_argnames=static)
    pf = parallelize(fn, mesh=mesh, static_argnames=static)
    start = time.perf_counter()
    compiled = pf.compile(*fargs, **fkwargs)
    print(f"  compile on the mesh: {time.perf_counter() - start:.2f} s (trace, optimize, plan, lower, build)")
    dyn_args, dyn_kwargs, _ = pf.split_static(fargs, fkwargs)
    bounds = result_bounds(compiled.graph, dyn_args, dyn_kwargs, mesh.shape, getattr(compiled.plan, "m", 1))
    baseline, want = direct_call(fn, fargs, fkwargs)
    one(*fargs, **fkwargs)
    got = compiled(*fargs, **fkwargs)
    med = statistics.median
    t_eager = times_of(lambda: fn(*fargs, **fkwargs), repeat)
    t_one = times_of(lambda: one(*fargs, **fkwargs), repeat)
    with one_blas_thread():  # one device's share of the machine: what each device of the mesh gets
        t_one1 = times_of(lambda: one(*fargs, **fkwargs), repeat)
    t_mesh = times_of(lambda: compiled(*fargs, **fkwargs), repeat)
    print(f"  {baseline:<32} {fmt(t_eager)}   (the function called directly)")
    print(f"  graphc, 1 device                 {fmt(t_one)}   ({med(t_eager) / med(t_one):.2f}x {baseline})")
    print(f"  graphc, 1 device, 1 BLAS thread  {fmt(t_one1)}")
    print(
        f"  graphc, {mesh.size} devices, per call     {fmt(t_mesh)}   ({med(t_one1) / med(t_mesh):.2f}x 1 device "
        f"with 1 BLAS thread, {med(t_one) / med(t_mesh):.2f}x with default BLAS; splits inputs, gathers outputs)"
    )
    arrays = bind_arguments(compiled.graph, dyn_args, dyn_kwargs)
    measured = t_mesh
    if isinstance(compiled, ParallelCompiled) and compiled.state_outputs:  # (a pipeline has none to keep)
        t_state = _state_loop(compiled, arrays, repeat)
        measured = t_state
        print(
            f"  graphc, {mesh.size} devices, state sharded {fmt(t_state)}   ({med(t_one1) / med(t_state):.2f}x 1 device "
            f"with 1 BLAS thread, {med(t_one) / med(t_state):.2f}x with default BLAS; a training loop's step)"
        )
    cost = getattr(compiled.plan, "cost", None)  # a pipeline's plan predicts its step itself
    predicted = cost.total_s if cost is not None else compiled.plan.step_s
    print(f"  predicted step (plan) {fmt_time(predicted)}, measured {fmt_time(med(measured))}")
    if mesh.size > 1 and isinstance(compiled, ParallelCompiled):  # (a pipeline's tasks are profiled elsewhere)
        print_profile(profile_mesh(fn, compiled, arrays, static, fkwargs, repeat), repeat)
    verdict = same(got, want, bounds)
    print(f"  result on the mesh equals {baseline}: {verdict}")
    n = mesh.size
    if n > 1:
        mem64 = bench_memcpy(n, 64 << 20, repeat=5)
        for nbytes in (1 << 20, 16 << 20):
            mem = bench_memcpy(n, nbytes, repeat=5)
            ar = bench_all_reduce(n, nbytes, repeat=5)
            print(
                f"  all_reduce {nbytes >> 20:>2} MiB x {n} devices: busbw {ar['busbw'] / 1e9:5.2f} GB/s = "
                f"{ar['busbw'] / mem['bandwidth']:.0%} of memcpy of the same size with {n} threads "
                f"({mem['bandwidth'] / 1e9:.1f} GB/s), {ar['busbw'] / mem64['bandwidth']:.0%} of memcpy of 64 MiB "
                f"({mem64['bandwidth'] / 1e9:.1f} GB/s, out of cache)"
            )
    if plans:
        print(f"  plans of {label} on mesh {mesh} (devices on inputs already in place, median of {repeat}):")
        rows = bench_plans(fn, fargs, fkwargs, static, mesh, repeat)
        print(f"    {'plan':<66} {'predicted':>10} {'measured':>10}")
        for r in rows:
            if "error" in r:
                print(f"    {r['name']:<66} no plan: {r['error']}")
            else:
                print(f"    {r['name']:<66} {fmt_time(r['predicted']):>10} {fmt_time(r['measured']):>10}")
        ok = [r for r in rows if "error" not in r]
        rho = spearman([r["predicted"] for r in ok], [r["measured"] for r in ok])
        print(f"    Spearman rank correlation of predicted and measured over {len(ok)} plans: {rho:.2f}")
    return verdict
