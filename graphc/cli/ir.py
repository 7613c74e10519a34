"""``graphc ir FILE:FUNC`` (trace and print the IR, optionally after a pass) and ``graphc ir
FILE.gir`` (parse and verify a dumped or hand-edited IR file, print it again)."""

from __future__ import annotations

import argparse
import sys

from graphc.cli.loader import load_target
from graphc.core.errors import GraphcError, ParseError
from graphc.core.files import atomic_write
from graphc.frontend.entry import trace
from graphc.passes.manager import run_pipeline
from graphc.textir import parse


def add_parser(sub) -> None:
    ir = sub.add_parser("ir", help="print the IR of FILE:FUNC traced on its example arguments (or of a .gir file)")
    ir.add_argument("target", help="FILE:FUNC (e.g. models/gpt.py:gpt) or a .gir file to parse and verify")
    ir.add_argument("--example", help="function in FILE returning (args, kwargs) (default: example_args)")
    ir.add_argument("-o", "--output", help="write the IR to this file instead of stdout")
    ir.add_argument(
        "--stage",
        default="traced",
        help="print the IR after this pass of the default pipeline (traced, fold_constants, simplify, "
        "cse, dce, optimized; default traced)",
    )
    ir.add_argument("--dump-ir", metavar="DIR", help="write the IR after every pass to DIR (NN-<pass>.gir)")
    ir.set_defaults(func=cmd_ir)


def cmd_ir(args: argparse.Namespace) -> int:
    if args.target.endswith(".gir") and ":" not in args.target:
        try:
            with open(args.target) as f:
                text = f.read()
        except OSError as exc:
            raise GraphcError(f"{args.target}: {exc.strerror}") from None
        try:
            graph = parse(text)
        except ParseError as exc:
            raise GraphcError(f"{args.target}: {exc}") from None
    else:
        fn, fargs, fkwargs = load_target(args.target, args.example)
        graph = trace(fn, *fargs, **fkwargs)
    if args.stage != "traced" or args.dump_ir:
        result = run_pipeline(graph, dump_dir=args.dump_ir)
        graph = result.stage(args.stage)
    text = str(graph)
    if args.output:
        atomic_write(args.output, text)
        print(f"wrote {args.output}: {len(graph.nodes)} nodes", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
