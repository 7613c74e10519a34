"""``graphc ir FILE:FUNC`` (trace and print the IR, optionally after a pass) and ``graphc ir
FILE.gir`` (parse and verify a dumped or hand-edited IR file, print it again)."""

from __future__ import annotations

import argparse
import os
import sys

from graphc.cli.common import check_output_dir, check_output_file
from graphc.cli.loader import UsageError, load_target
from graphc.core.files import atomic_write
from graphc.frontend.entry import trace
from graphc.frontend.promotion import promotions
from graphc.passes.manager import DEFAULT_PASSES, run_passes
from graphc.textir import load as load_ir


def add_parser(sub) -> None:
    ir = sub.add_parser("ir", help="print the IR of FILE:FUNC traced on its example arguments (or of a .gir file)")
    ir.add_argument("target", help="FILE:FUNC (e.g. models/gpt.py:gpt) or a .gir file to parse and verify")
    ir.add_argument("--example", help="function in FILE returning (args, kwargs) (default: example_args)")
    ir.add_argument("-o", "--output", help="write the IR to this file instead of stdout")
    ir.add_argument(
        "--after",
        metavar="PASS",
        default="traced",
        help="print the IR after this pass of the default pass list (traced, "
        + ", ".join(dict.fromkeys(DEFAULT_PASSES))
        + ", optimized; a pass that runs twice: after its first run; default traced)",
    )
    ir.add_argument("--stage", dest="after_old", metavar="PASS", help=argparse.SUPPRESS)  # the old name of --after
    ir.add_argument("--dump-ir", metavar="DIR", help="write the IR after every pass to DIR (NN-<pass>.gir)")
    ir.add_argument("--force", action="store_true", help="overwrite -o FILE even if it is not a graphc IR file")
    ir.add_argument("--mkdir", action="store_true", help="create the folders of -o / --dump-ir outside this folder")
    ir.add_argument(
        "--explain-dtypes",
        action="store_true",
        help="list the lines where numpy's promotion made float32 values float64 (instead of the IR)",
    )
    ir.set_defaults(func=cmd_ir)


def cmd_ir(args: argparse.Namespace) -> int:
    output = check_output_file(args.output, "-o", "ir", args.force, args.mkdir) if args.output else None
    if args.dump_ir:
        check_output_dir(args.dump_ir, "--dump-ir", mkdir=args.mkdir)
    if ":" not in args.target and os.path.isdir(args.target):
        raise UsageError(f"{args.target}: is a folder; expected FILE:FUNC or a .gir file")
    if ":" not in args.target and os.path.isfile(args.target) and not args.target.endswith((".gir", ".py")):
        raise UsageError(f"{args.target}: expected a text IR file (.gir, as graphc ir -o writes) or FILE:FUNC")
    if args.target.endswith(".gir") and ":" not in args.target:
        graph = load_ir(args.target)  # errors name the file, line and column
    else:
        fn, fargs, fkwargs = load_target(args.target, args.example)
        graph = trace(fn, *fargs, **fkwargs)
    if args.explain_dtypes:
        sites = promotions(graph)
        for site in sites:
            print(site)
        print(f"{len(sites)} line(s) promote float values to float64 (numpy's rules, kept by graphc)", file=sys.stderr)
        return 0
    after = args.after
    if args.after_old is not None:
        print("graphc: warning: --stage is now --after (a stage is a pipeline stage)", file=sys.stderr)
        after = args.after_old
    if after != "traced" or args.dump_ir:
        result = run_passes(graph, dump_dir=args.dump_ir)
        graph = result.after(after)
    text = str(graph)
    if output is not None:
        atomic_write(output.path, text, make_dirs=output.make_dirs)
        print(f"wrote {output.path}: {len(graph.nodes)} nodes", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
