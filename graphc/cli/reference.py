"""The CLI reference, generated from the argparse parser so that it cannot drift from the code:
``python -m graphc.cli.reference > docs/cli_reference.md`` (a test checks the file is up to
date). Each command's section is exactly what ``graphc COMMAND --help`` prints."""

from __future__ import annotations

import os
import sys

from graphc.cli.main import build_parser

HEADER = """# CLI reference

Generated from the parser by `.venv/bin/python -m graphc.cli.reference > docs/cli_reference.md`;
do not edit by hand (a test fails when it is out of date). Each section is what
`.venv/bin/graphc COMMAND --help` prints. The tour, with examples, is [guide/cli.md](guide/cli.md).

Every error is one or two lines on stderr naming the input and what to do, with exit status 2
(1 for a bug in graphc); `--debug` or `GRAPHC_DEBUG=1` adds the traceback. Ctrl-C ends any
command within a second with status 130, SIGTERM with 143.
"""


def markdown() -> str:
    """The reference as Markdown: the top-level help, then each command's, 100 columns wide."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps help to $COLUMNS: the file must not depend on the terminal
    try:
        parser = build_parser()
        out = [HEADER, "## graphc", "", "```", parser.format_help().rstrip(), "```", ""]
        for name, command in parser.commands.items():
            out += [f"## graphc {name}", "", "```", command.format_help().rstrip(), "```", ""]
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
