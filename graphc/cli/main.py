"""The ``graphc`` command line.

graphc ir FILE:FUNC [--example NAME] [--after PASS] [--dump-ir DIR] [-o OUT]
                                                trace FUNC on its example arguments, print the IR
graphc ir FILE.gir                              parse and verify a dumped IR file, print it again
graphc bench FILE:FUNC [--example NAME]         tracing, IR round trip, the direct call, interpreter, compiled
graphc bench kernels|pipeline|comm|fastmath|plans  named benchmarks (fused kernels, pipeline bubble, collectives, cost model vs runtime, ...)
graphc bench FILE:FUNC --mesh dp=2 [--plans]    the direct call vs graphc on 1 device vs on the mesh; collectives' busbw;
                                                predicted vs measured step of several plans
graphc compile FILE:FUNC --mesh dp=2,tp=4 [--memory 2GiB] [--link dp=1GB/s:50us] [-o plan.json]
                                                auto-shard FUNC, print the plan's summary, write the plan JSON
graphc compile FILE:FUNC --mesh dp=2 --resolve-pins edited.json
                                                solve again, keeping the choices pinned in an (edited) plan
graphc run FILE:FUNC (--mesh dp=2,tp=2 | --plan plan.json) [--trace timeline.json] [--backend mpi]
                                                run FUNC on a mesh of devices, check it against FUNC called directly, time it;
                                                a --plan runs exactly as written (checked against the model and --mesh)
                                                (--backend mpi: under mpiexec -n <devices>, one process per device)
graphc calibrate [-o PATH] [--quick]            measure this machine, store the profile the sharding cost model uses
graphc calibrate --show [-o PATH]               print the stored profile (or the built-in defaults) and its path

Every error is one or two lines on stderr naming the input and what to do, exit status 2 (1 for a
bug in graphc); ``--debug`` or GRAPHC_DEBUG=1 adds the traceback. Ctrl-C ends any command within a
second with status 130, SIGTERM with 143 (graphc/cli/signals.py).
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
from graphc.cli import signals
from graphc.cli.common import (
    Parser,
    add_debug,
    check_output_file,
    debug_enabled,
    describe_exception,
    print_error,
    print_traceback,
    process_age,
    warnings_on_stderr,
)
from graphc.core.errors import GraphcError
from graphc.core.profiles import load_profile, profile_path, save_profile
from graphc.runtime.calibrate import calibrate
from graphc.runtime.mpi_world import current_world, note_exit_code


def cmd_calibrate(args: argparse.Namespace) -> int:
    path = args.output or profile_path()
    if args.output and not args.show:
        check_output_file(args.output, "-o", "profile", force=args.force, mkdir=args.mkdir)
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


def build_parser() -> Parser:
    p = Parser(prog="graphc", description="numpy model code -> graph IR -> parallel execution")
    p.add_argument("--debug", action="store_true", help="on an error, also print the traceback (or GRAPHC_DEBUG=1)")
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
    cal.add_argument("--force", action="store_true", help="overwrite -o PATH even if it is not a machine profile")
    cal.add_argument("--mkdir", action="store_true", help="create the folder of -o PATH if it does not exist")
    cal.set_defaults(func=cmd_calibrate)
    for subparser in sub.choices.values():
        add_debug(subparser)
    p.commands = dict(sub.choices)  # name -> its parser (graphc/cli/reference.py walks them)
    return p


def _wrapped_interrupt(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM behind an exception a library raised because of it: a signal landing
    while a C extension initializes (numba, HiGHS, imported lazily) comes back as
    ``ImportError: initialization failed`` caused by the KeyboardInterrupt."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit status. ``argv`` None: the command line of this process
    (graphc is the program: after Ctrl-C or SIGTERM the watchdog also bounds its shutdown)."""
    # when the command started: the process's start for the program (a time limit counts its
    # imports), this call for an in-process caller
    started = time.perf_counter() - (process_age() if argv is None else 0.0)
    try:
        with signals.stopped_by_signals(program=argv is None), warnings_on_stderr():
            code = _command(argv, started)
    except KeyboardInterrupt as exc:  # a signal landing while an error was reported, or at the body's end
        code = signals.report(exc)
    received = signals.received()
    if received is not None:  # it arrived as the work ended: recorded, not raised
        code = signals.report(received)
    note_exit_code(code)  # under MPI, a job that ends through this failure ends with this status
    if argv is None and current_world() is None and (signals.received() is not None or signals.ends_without_teardown()):
        # the program was stopped, or its command asked (compile: its files are written): end it
        # now, without the interpreter's teardown (seconds on a busy machine, tens after a deep
        # plan); an MPI rank still runs its job's shutdown (MpiWorld's atexit)
        signals.end_now(code)
    return code


def _command(argv: list[str] | None, started: float) -> int:
    """Parse ``argv`` and run its command; every way it can end becomes an exit status and at
    most a line or two on stderr. An exception after a signal is reported as that signal: a
    library may have replaced the interrupt by its own error (graphc/cli/signals.py)."""
    args = None
    try:
        args = build_parser().parse_args(argv)
        args.started = started
        return args.func(args)
    except KeyboardInterrupt as exc:  # Ctrl-C (130) or SIGTERM (143): one line
        if debug_enabled(args):
            print_traceback(exc)
        return signals.report(exc)
    except GraphcError as exc:
        if debug_enabled(args):
            print_traceback(exc)
        received = signals.received()
        if received is not None:
            return signals.report(received)
        print_error(str(exc))
        return 2
    except Exception as exc:  # noqa: BLE001 - never a traceback unless asked: one or two lines
        if debug_enabled(args):
            print_traceback(exc)
        interrupt = _wrapped_interrupt(exc)
        if interrupt is not None:
            return signals.report(interrupt)
        received = signals.received()
        if received is not None:
            return signals.report(received)
        text, code = describe_exception(exc)
        print_error(text)
        return code


if __name__ == "__main__":
    sys.exit(main())
