"""The ``graphc`` command line.

    graphc ir FILE:FUNC [--example NAME] [--stage PASS] [--dump-ir DIR] [-o OUT]
                                                    trace FUNC on its example arguments, print the IR
    graphc ir FILE.gir                              parse and verify a dumped IR file, print it again
    graphc bench FILE:FUNC [--example NAME]         time tracing, IR round trip, numpy eager, interpreter, compiled
    graphc bench kernels                            fused GELU / softmax / layer-norm kernels vs memory bandwidth
    graphc bench FILE:FUNC --mesh dp=2 [--plans]    numpy eager vs graphc on 1 device vs on the mesh; collectives' busbw;
                                                    predicted vs measured step of several plans
    graphc compile FILE:FUNC --mesh dp=2,tp=4 [--memory 2GiB] [--link dp=1GB/s:50us] [-o plan.json]
                                                    auto-shard FUNC, print the plan's summary, write the plan JSON
    graphc run FILE:FUNC (--mesh dp=2,tp=2 | --plan plan.json) [--trace timeline.json]
                                                    run FUNC on a mesh of devices, check it against numpy, time it
    graphc calibrate [-o PATH] [--quick]            measure this machine, store the profile the sharding cost model uses
    graphc calibrate --show [-o PATH]               print the stored profile (or the built-in defaults) and its path
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from graphc.core.errors import GraphcError
from graphc.core.files import atomic_write


def cmd_ir(args: argparse.Namespace) -> int:
    import graphc

    if args.target.endswith(".gir") and ":" not in args.target:
        try:
            with open(args.target) as f:
                text = f.read()
        except OSError as exc:
            raise GraphcError(f"{args.target}: {exc.strerror}") from None
        try:
            graph = graphc.parse(text)
        except graphc.ParseError as exc:
            raise GraphcError(f"{args.target}: {exc}") from None
    else:
        from graphc.loader import load_target

        fn, fargs, fkwargs = load_target(args.target, args.example)
        graph = graphc.trace(fn, *fargs, **fkwargs)
    if args.stage != "traced" or args.dump_ir:
        from graphc.passes import run_pipeline

        result = run_pipeline(graph, dump_dir=args.dump_ir)
        graph = result.stage(args.stage)
    text = str(graph)
    if args.output:
        atomic_write(args.output, text)
        print(f"wrote {args.output}: {len(graph.nodes)} nodes", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    import graphc
    from graphc.loader import load_target
    from graphc.runtime.bench import fmt as _fmt
    from graphc.runtime.bench import timed

    def _timed(fn, repeat):
        return timed(fn, repeat, warmup=0)

    if args.target == "kernels":
        from graphc.runtime.bench import bench_kernels, print_kernel_table

        print("graphc bench kernels: fused float32 kernels vs np.copyto of the same bytes (read + write)")
        print_kernel_table(bench_kernels(repeat=args.repeat))
        return 0
    if args.mesh:
        from graphc.runtime.bench_mesh import bench_mesh

        return bench_mesh(args)
    fn, fargs, fkwargs = load_target(args.target, args.example)
    n_params = sum(np.size(x) for x in _array_leaves((fargs, fkwargs)))
    print(f"graphc bench {args.target} ({args.example or 'example_args'}): {n_params:,} array elements in the arguments")
    t_trace, graph = _timed(lambda: graphc.trace(fn, *fargs, **fkwargs), args.repeat)
    t_print, text = _timed(lambda: str(graph), args.repeat)
    t_parse, parsed = _timed(lambda: graphc.parse(text), args.repeat)
    t_verify, _ = _timed(graph.verify, args.repeat)
    assert str(parsed) == text, "text round trip changed the graph"
    print(f"  graph: {len(graph.nodes)} nodes, {len(graph.inputs)} inputs; IR text {len(text.splitlines())} lines, {len(text) / 1e3:.0f} kB")
    print(f"  trace            {_fmt(t_trace)}")
    print(f"  print IR         {_fmt(t_print)}")
    print(f"  parse IR         {_fmt(t_parse)}")
    print(f"  verify           {_fmt(t_verify)}")
    if not args.no_run:
        t_eager, want = timed(lambda: fn(*fargs, **fkwargs), args.repeat)
        t_eval, _ = _timed(lambda: graphc.evaluate(graph, *fargs, **fkwargs), args.repeat)
        ratio = statistics.median(t_eval) / statistics.median(t_eager)
        print(f"  numpy eager      {_fmt(t_eager)}")
        print(f"  reference interp {_fmt(t_eval)}   ({ratio:.2f}x numpy eager's time)")
        jitted = graphc.jit(fn)
        start = time.perf_counter()
        compiled = jitted.compile(*fargs, **fkwargs)
        first = time.perf_counter() - start
        t_jit, got = timed(lambda: compiled(*fargs, **fkwargs), args.repeat)
        speedup = statistics.median(t_eager) / statistics.median(t_jit)
        print(f"  graphc compiled  {_fmt(t_jit)}   ({speedup:.2f}x faster than numpy eager)")
        st = compiled.stats()
        sizes = st["ops_per_kernel"]
        print(f"  first call: trace {st['trace_s'] * 1e3:.0f} ms, optimize {st['optimize_s'] * 1e3:.0f} ms, build "
              f"{st['build_s'] * 1e3:.0f} ms (kernel compile/load {st['kernel_compile_s'] * 1e3:.0f} ms); total {first:.2f} s")
        print(f"  nodes: {st['nodes_traced']} traced -> {st['nodes_optimized']} optimized; {st['fused_kernels']} fused "
              f"kernels, {min(sizes, default=0)}-{max(sizes, default=0)} ops each (mean {np.mean(sizes) if sizes else 0:.1f})")
        print(f"  compiled result equals numpy eager: {_same(got, want)}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from graphc.core.mesh import load_profile, profile_path, save_profile
    from graphc.runtime.calibrate import calibrate

    path = args.output or profile_path()
    if args.show:
        profile = load_profile(path)
        stored = os.path.exists(path)
        print(f"machine profile {path}" + ("" if stored else " (no such file: the built-in defaults)"))
        print(profile.describe())
        return 0
    print(f"graphc calibrate: measuring this machine{' (quick)' if args.quick else ''}, one thread per device",
          file=sys.stderr)
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:
        print("  note: threadpoolctl is not installed, so the matmul may use several BLAS threads",
              file=sys.stderr)
    start = time.perf_counter()
    profile = calibrate(quick=args.quick)
    elapsed = time.perf_counter() - start
    print(profile.describe())
    save_profile(profile, path)
    print(f"wrote {path} (measured in {elapsed:.1f} s)")
    return 0


def _same(got, want) -> str:
    from graphc.core.pytree import flatten

    g, w = flatten(got)[0], flatten(want)[0]
    for a, b in zip(g, w):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"no ({a.dtype}{a.shape} vs {b.dtype}{b.shape})"
        tol = 1e-4 if a.dtype == np.float32 else 1e-6
        if a.dtype.kind == "f" and not np.allclose(a, b, rtol=tol, atol=tol):
            return f"no (max abs diff {np.max(np.abs(a - b)):.3g})"
    return "yes"


def _array_leaves(tree):
    from graphc.core.pytree import flatten

    return flatten(tree)[0]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="graphc", description="numpy model code -> graph IR -> parallel execution")
    sub = p.add_subparsers(dest="command", required=True)

    ir = sub.add_parser("ir", help="print the IR of FILE:FUNC traced on its example arguments (or of a .gir file)")
    ir.add_argument("target", help="FILE:FUNC (e.g. models/gpt.py:gpt) or a .gir file to parse and verify")
    ir.add_argument("--example", help="function in FILE returning (args, kwargs) (default: example_args)")
    ir.add_argument("-o", "--output", help="write the IR to this file instead of stdout")
    ir.add_argument("--stage", default="traced",
                    help="print the IR after this pass of the default pipeline (traced, fold_constants, simplify, "
                         "cse, dce, optimized; default traced)")
    ir.add_argument("--dump-ir", metavar="DIR", help="write the IR after every pass to DIR (NN-<pass>.gir)")
    ir.set_defaults(func=cmd_ir)

    bench = sub.add_parser("bench", help="time tracing, IR round trip, numpy eager, the interpreter and compiled "
                                         "execution of FILE:FUNC; 'graphc bench kernels' measures fused kernels")
    bench.add_argument("target", help="FILE:FUNC, or 'kernels' for the fused GELU/softmax/layer-norm benchmark")
    bench.add_argument("--example", help="function in FILE returning (args, kwargs) (default: example_args)")
    bench.add_argument("--repeat", type=int, default=3, help="repetitions per measurement (default 3)")
    bench.add_argument("--no-run", action="store_true", help="skip numpy eager and interpreter timings")
    bench.add_argument("--mesh", help="also run on this device mesh (e.g. dp=2): numpy eager, graphc on 1 device and "
                                      "on the mesh, predicted vs measured step time, all-reduce bus bandwidth")
    bench.add_argument("--link", help="per-axis link model overrides for planning, e.g. dp=1GB/s:50us")
    bench.add_argument("--plans", action="store_true",
                       help="with --mesh: also time several plans of the function (solver's choice and pinned "
                            "inputs) and report the rank correlation of predicted and measured step times")
    bench.set_defaults(func=cmd_bench)

    from graphc.cli_compile import add_parser as add_compile

    add_compile(sub)

    from graphc.cli_run import add_parser as add_run

    add_run(sub)

    cal = sub.add_parser("calibrate", help="measure matmul speed, memory bandwidth and thread-to-thread links of "
                                           "this machine and store them for the sharding cost model")
    cal.add_argument("-o", "--output", metavar="PATH",
                     help="profile file (default $GRAPHC_PROFILE, else $GRAPHC_CACHE_DIR/profile.json, "
                          "else ~/.cache/graphc/profile.json)")
    cal.add_argument("--show", action="store_true", help="print the stored profile (or the defaults) without measuring")
    cal.add_argument("--quick", action="store_true", help="smaller, fewer measurements (well under a second)")
    cal.set_defaults(func=cmd_calibrate)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except GraphcError as exc:
        print(f"graphc: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("graphc: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
