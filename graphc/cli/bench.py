"""``graphc bench``: FILE:FUNC [--mesh ...], or one of the named benchmarks (kernels, pipeline,
comm, fastmath, plans, plantime, ps, runtime, scale). Each prints its figures next to a peer measured in the same run."""

from __future__ import annotations

import argparse

from graphc.bench import comm, mesh, model, pipeline, plans
from graphc.cli.common import mesh_of, mesh_text, positive_int
from graphc.cli.loader import load_target
from graphc.core.errors import GraphcError
from graphc.core.pytree import static_argnames

NAMED = ("runtime", "kernels", "pipeline", "comm", "fastmath", "plans", "plantime", "ps", "scale")


def add_parser(sub) -> None:
    bench = sub.add_parser(
        "bench",
        help="time tracing, IR round trip, the function called directly (numpy, or graphc's interpreter where it calls graphc.grad), the interpreter and compiled "
        "execution of FILE:FUNC; or a named benchmark: " + ", ".join(NAMED),
    )
    bench.add_argument(
        "target",
        help="FILE:FUNC, or one of: runtime (every runtime figure against its ceiling or peer, in one "
        "table), kernels (fused kernels against memory bandwidth), "
        "pipeline (bubble and memory), comm (collective bandwidth), fastmath, plans (the cost "
        "model's predicted step times and memory of many plans against the threaded runtime), plantime (how "
        "long planning takes on a fixed mesh, by stage and depth; --solvers: HiGHS against CP-SAT), ps (parameter "
        "server: sync vs SSP vs async with a straggler), scale (the mesh search on GPT-3 175B, LLaMA-3 8B/70B and "
        "GPT-3 13B at cluster scale: plan time, layout, predicted step and MFU)",
    )
    bench.add_argument("--example", help="function in FILE returning (args, kwargs) (default: example_args)")
    bench.add_argument(
        "--repeat", type=positive_int, help="repetitions per measurement (default 3; plans: 7 interleaved rounds)"
    )
    bench.add_argument("--no-run", action="store_true", help="skip the direct call's and the interpreter's timings")
    bench.add_argument(
        "--mesh",
        type=mesh_text,
        help="also run on this device mesh (e.g. dp=2): the function called directly, graphc on 1 device and "
        "on the mesh, predicted vs measured step time, all-reduce bus bandwidth",
    )
    bench.add_argument("--link", help="per-axis link model overrides for planning, e.g. dp=1GB/s:50us")
    bench.add_argument(
        "--plans",
        action="store_true",
        help="with --mesh: also time several plans of the function (solver's choice and pinned "
        "inputs) and report the rank correlation of predicted and measured step times",
    )
    bench.add_argument(
        "--backend",
        choices=("threads", "mpi"),
        default="threads",
        help="comm: the threaded communicator alone, or MPI processes next to it (launches mpiexec itself)",
    )
    bench.add_argument(
        "--solvers", action="store_true", help="plantime: solve the benchmark ILPs with HiGHS and with CP-SAT"
    )
    bench.add_argument(
        "--deep", action="store_true", help="plantime: also plan the 1,000-layer transformer (minutes; issue 29)"
    )
    bench.add_argument(
        "--only",
        help="runtime: a comma-separated subset of its sections: dp, tp, overhead, rnn, kernels, einsum, train, jax",
    )
    bench.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    if args.repeat is None and args.target not in ("runtime", "plantime"):
        args.repeat = 7 if args.target == "plans" else 3
    if args.target == "plans":
        plans.main(repeat=args.repeat)
        return 0
    if args.target == "plantime":
        from graphc.bench import plantime  # (traces 175B- and 8B-shaped steps: only for this benchmark)

        plantime.main(repeat=args.repeat if args.repeat is not None else 1, solvers=args.solvers, deep=args.deep)
        return 0
    if args.target == "runtime":
        from graphc.bench import runtime  # (loads numba, and jax when it is installed, only for this benchmark)

        sections = tuple(args.only.split(",")) if args.only else runtime.SECTIONS
        unknown = [s for s in sections if s not in runtime.SECTIONS]
        if unknown:
            raise GraphcError(f"--only: unknown section {unknown[0]!r}; sections: {', '.join(runtime.SECTIONS)}")
        runtime.main(rounds=max(args.repeat, 5) if args.repeat is not None else 7, sections=sections)
        return 0
    if args.target == "kernels":
        from graphc.bench import kernels

        print("graphc bench kernels: fused float32 kernels vs np.copyto of the same bytes (read + write)")
        kernels.print_kernel_table(kernels.bench_kernels(repeat=args.repeat))
        return 0
    if args.target == "pipeline":
        pipeline.main(["--repeat", str(args.repeat)])
        return 0
    if args.target == "comm":
        comm.main(["--backend", args.backend, "--repeat", str(args.repeat)])
        return 0
    if args.target == "fastmath":
        from graphc.bench import fastmath

        fastmath.main(["--repeat", str(args.repeat)])
        return 0
    if args.target == "scale":
        from graphc.bench import scale

        scale.main()
        return 0
    if args.target == "ps":
        from graphc.bench import ps

        ps.main(["--repeat", str(args.repeat)])
        return 0
    fn, fargs, fkwargs = load_target(
        args.target, args.example, runs=None if args.no_run and not args.mesh else "graphc bench"
    )
    label = f"{args.target} ({args.example or 'example_args'})"
    if args.mesh:
        verdict = mesh.bench_mesh(
            fn, fargs, fkwargs, static_argnames(fkwargs), mesh_of(args), args.repeat, args.plans, label
        )
        return 0 if verdict == "yes" else 1
    model.bench_model(fn, fargs, fkwargs, args.repeat, run=not args.no_run, label=label)
    return 0
