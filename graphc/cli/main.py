"""The ``graphc`` command line.

graphc ir FILE:FUNC [--example NAME] [--stage PASS] [--dump-ir DIR] [-o OUT]
                                                trace FUNC on its example arguments, print the IR
graphc ir FILE.gir                              parse and verify a dumped IR file, print it again
graphc bench FILE:FUNC [--example NAME]         time tracing, IR round trip, numpy eager, interpreter, compiled
graphc bench kernels|pipeline|comm|fastmath|plans  named benchmarks (fused kernels, pipeline bubble, collectives, cost model vs runtime, ...)
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
import sys
import time

from graphc.cli import bench as cli_bench
from graphc.cli import compile as cli_compile
from graphc.cli import ir as cli_ir
from graphc.cli import run as cli_run
from graphc.core.errors import GraphcError
from graphc.core.mesh import load_profile, profile_path, save_profile
from graphc.runtime.calibrate import calibrate


def cmd_calibrate(args: argparse.Namespace) -> int:
    path = args.output or profile_path()
    if args.show:
        profile = load_profile(path)
        stored = os.path.exists(path)
        print(f"machine profile {path}" + ("" if stored else " (no such file: the built-in defaults)"))
        print(profile.describe())
        return 0
    print(
        f"graphc calibrate: measuring this machine{' (quick)' if args.quick else ''}, one thread per device",
        file=sys.stderr,
    )
    start = time.perf_counter()
    profile = calibrate(quick=args.quick)
    elapsed = time.perf_counter() - start
    print(profile.describe())
    save_profile(profile, path)
    print(f"wrote {path} (measured in {elapsed:.1f} s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="graphc", description="numpy model code -> graph IR -> parallel execution")
    sub = p.add_subparsers(dest="command", required=True)

    for command in (cli_ir, cli_bench, cli_compile, cli_run):
        command.add_parser(sub)

    cal = sub.add_parser(
        "calibrate",
        help="measure matmul speed, memory bandwidth and thread-to-thread links of "
        "this machine and store them for the sharding cost model",
    )
    cal.add_argument(
        "-o",
        "--output",
        metavar="PATH",
        help="profile file (default $GRAPHC_PROFILE, else $GRAPHC_CACHE_DIR/profile.json, "
        "else ~/.cache/graphc/profile.json)",
    )
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
