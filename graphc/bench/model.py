"""``graphc bench FILE:FUNC``: tracing, the text IR round trip, the function called directly
(numpy, or graphc's interpreter where it calls graphc.grad: ``timing.direct_call``), the reference
interpreter and the compiled function, measured in one run on the function's example arguments."""

from __future__ import annotations

import statistics
import time

import numpy as np

from graphc.api.jit import jit
from graphc.bench.timing import direct_call, fmt, result_bounds, same, timed
from graphc.core.pytree import flatten
from graphc.frontend.entry import trace
from graphc.interpreter import evaluate
from graphc.textir import parse


def bench_model(fn, fargs: tuple, fkwargs: dict, repeat: int, run: bool = True, label: str = "") -> None:
    def no_warmup(f, n):
        return timed(f, n, warmup=0)

    n_params = sum(np.size(x) for x in flatten((fargs, fkwargs))[0])
    print(f"graphc bench {label}: {n_params:,} array elements in the arguments")
    t_trace, graph = no_warmup(lambda: trace(fn, *fargs, **fkwargs), repeat)
    t_print, text = no_warmup(lambda: str(graph), repeat)
    t_parse, parsed = no_warmup(lambda: parse(text), repeat)
    t_verify, _ = no_warmup(graph.verify, repeat)
    assert str(parsed) == text, "text round trip changed the graph"
    print(
        f"  graph: {len(graph.nodes)} nodes, {len(graph.inputs)} inputs; IR text {len(text.splitlines())} lines, "
        f"{len(text) / 1e3:.0f} kB"
    )
    print(f"  trace            {fmt(t_trace)}")
    print(f"  print IR         {fmt(t_print)}")
    print(f"  parse IR         {fmt(t_parse)}")
    print(f"  verify           {fmt(t_verify)}")
    if not run:
        return
    baseline, want = direct_call(fn, fargs, fkwargs)
    t_eager, want = timed(lambda: fn(*fargs, **fkwargs), repeat, warmup=0)
    t_eval, _ = no_warmup(lambda: evaluate(graph, *fargs, **fkwargs), repeat)
    ratio = statistics.median(t_eval) / statistics.median(t_eager)
    name = "numpy" if baseline == "numpy" else "called directly"
    print(f"  {name:<16} {fmt(t_eager)}   ({baseline}: the function called directly)")
    print(f"  reference interp {fmt(t_eval)}   ({ratio:.2f}x the direct call's time)")
    jitted = jit(fn)
    start = time.perf_counter()
    compiled = jitted.compile(*fargs, **fkwargs)
    first = time.perf_counter() - start
    bounds = result_bounds(compiled.graph, fargs, fkwargs)
    t_jit, got = timed(lambda: compiled(*fargs, **fkwargs), repeat)
    speedup = statistics.median(t_eager) / statistics.median(t_jit)
    print(f"  graphc compiled  {fmt(t_jit)}   ({speedup:.2f}x faster than {baseline})")
    st = compiled.stats()
    sizes = st["ops_per_kernel"]
    print(
        f"  first call: trace {st['trace_s'] * 1e3:.0f} ms, optimize {st['optimize_s'] * 1e3:.0f} ms, build "
        f"{st['build_s'] * 1e3:.0f} ms (kernel compile/load {st['kernel_compile_s'] * 1e3:.0f} ms); total {first:.2f} s"
    )
    print(
        f"  nodes: {st['nodes_traced']} traced -> {st['nodes_optimized']} optimized; {st['fused_kernels']} fused "
        f"kernels, {min(sizes, default=0)}-{max(sizes, default=0)} ops each (mean {np.mean(sizes) if sizes else 0:.1f})"
    )
    print(f"  compiled result equals {baseline}: {same(got, want, bounds)}")
