"""What every ``graphc`` command shares: its parser (errors in one line), argument types that name
what they expected, the checks of output paths made before any work starts, and the one- or
two-line report of an error.

Output files (``-o``, ``--trace``, the files of ``--dump-ir``) are checked before the work:

* the folder must exist, or be creatable: a missing folder inside the working directory is
  created; one outside it only with ``--mkdir`` (a typo in an absolute path must not scatter
  folders over the disk);
* the folder must be writable, and the path must not be a folder;
* an existing file is replaced only if it is what the command writes (a graphc plan for
  ``compile -o``, text IR for ``ir -o``, a Chrome trace for ``--trace``, a machine profile for
  ``calibrate -o``) or empty, unless ``--force``.

Files are then written atomically (graphc/core/files.py ``atomic_write``: a temporary file
renamed over the target) with the permissions of a new file under the user's umask (0644 with
the usual 022).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import sys
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import graphc.models  # noqa: F401  (registers the example models as user code: errors name their lines)
from graphc.api.parallel import RunOptions, planned_pipeline
from graphc.cli.loader import UsageError
from graphc.core.errors import GraphcError, GraphcWarning, MeshError, PlanError
from graphc.core.mesh import Mesh, parse_axes, parse_links
from graphc.core.units import parse_bytes
from graphc.frontend.locations import is_user_code
from graphc.passes.options import RECOMPUTE_MODES, SCHEDULES, SOLVERS, ZERO_CHOICES, PlanOptions, zero_from_text
from graphc.passes.pipeline import PipelinePlan
from graphc.passes.search import WHOLE_PLAN_NODES
from graphc.passes.sharding.plan import ShardingPlan

_GRAPHC_DIR = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_INTERNAL_DIRS = tuple(
    os.path.realpath(os.path.join(_GRAPHC_DIR, d)) + os.sep for d in ("", "passes", "runtime")
)  # graphc's own code (passes/ and runtime/ are links); graphc.models registers itself as user code


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: what was wrong, and where the usage is.
    ``commands``: the parser of each subcommand, by name (set by graphc/cli/main.py)."""

    commands: dict[str, argparse.ArgumentParser]

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def parse_known_args(self, args=None, namespace=None):
        """argparse takes ``-1GiB`` or ``-5s`` after ``--memory`` for an unknown option (only plain
        numbers such as ``-5`` count as values) and says "expected one argument": a long flag
        followed by a word that starts like a negative number gets it as its value
        (``--memory=-1GiB``), so the flag's type names what it expected."""
        words = list(sys.argv[1:] if args is None else args)
        joined: list[str] = []
        for k, word in enumerate(words):
            if word == "--":  # the rest is positional
                joined += words[k:]
                break
            flag = joined[-1] if joined else ""
            if _NEGATIVE.match(word) and flag.startswith("--") and flag != "--" and "=" not in flag:
                joined[-1] = f"{flag}={word}"
            else:
                joined.append(word)
        return super().parse_known_args(joined, namespace)


_NEGATIVE = re.compile(r"^-\.?\d")  # a word that starts like a negative number: a value, never a flag


# --- argument types ----------------------------------------------------------------------------


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def mesh_text(text: str) -> str:
    """A ``--mesh`` value, checked as mesh axes (``dp=2,tp=4``: graphc/core/mesh.py) and kept as
    written."""
    try:
        parse_axes(text)
    except MeshError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def links_of(args: argparse.Namespace) -> dict | None:
    """The ``--link`` overrides, or None; an error names the flag."""
    try:
        return parse_links(args.link) if args.link else None
    except MeshError as exc:
        raise GraphcError(f"--link: {exc}") from None


def mesh_of(args: argparse.Namespace, profile=None) -> Mesh:
    """The ``--mesh`` of ``args`` with its ``--link`` overrides (and ``profile``); an error names
    the flags (``--mesh`` itself is checked by the parser: ``mesh_text``)."""
    links = links_of(args)
    try:
        return Mesh(args.mesh, links=links, profile=profile)
    except MeshError as exc:  # a link for an axis the mesh does not have
        raise GraphcError(f"--mesh/--link: {exc}") from None


def memory_size(text: str, allow_zero: bool = False, what: str = "memory size") -> int:
    """A memory size as users write it (``2GiB``, ``512MB``, a number of bytes) -> bytes
    (graphc/core/units.py)."""
    try:
        size = parse_bytes(text, allow_zero=allow_zero, what=what)
    except GraphcError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    assert size is not None
    return size


def bucket_size(text: str) -> int:
    """A gradient bucket size: a memory size, or 0 (no buckets)."""
    return memory_size(text, allow_zero=True, what="bucket size")


# --- the options a command's flags set ----------------------------------------------------------
# A flag that sets an option has the option's name as its ``dest`` (``--memory`` sets
# ``memory_limit``) and default None (not given: the option's own default), and takes its
# ``choices`` from the option's values (passes/options.py).


def add_plan_flags(p: argparse.ArgumentParser) -> None:
    """The flags that set planning options (``graphc compile`` and ``graphc run`` take the same):
    each flag's ``dest`` is its ``PlanOptions`` field, its default None (not given: the option's
    own default), its choices the option's value set (passes/options.py)."""
    p.add_argument(
        "--microbatches",
        type=positive_int,
        metavar="M",
        help="micro-batches: a pipeline's (a mesh with pp), else gradient accumulation (default 1)",
    )
    p.add_argument("--schedule", choices=SCHEDULES, help="pipeline schedule (default 1f1b)")
    p.add_argument(
        "--memory",
        dest="memory_limit",
        metavar="SIZE",
        type=memory_size,
        help="per-device memory limit, e.g. 2GiB (default: none)",
    )
    p.add_argument(
        "--time-limit",
        type=positive_seconds,
        metavar="SECONDS",
        help="wall-time limit of tracing, optimizing and planning in seconds (default 60): "
        "on expiry the best plan so far is used, with its gap",
    )
    p.add_argument(
        "--free-axes",
        action="store_true",
        default=None,
        help="ignore the axis roles (dp splits only batch dims, sp only sequence dims): any axis may split anything",
    )
    p.add_argument(
        "--zero",
        type=zero_from_text,
        choices=ZERO_CHOICES,
        help="ZeRO stage of the training state along the data axes: 1 shards the optimizer state, 2 the "
        "gradients too, 3 the parameters too; 0 none; auto (default): the solver picks per parameter",
    )
    p.add_argument(
        "--recompute",
        nargs="?",
        const="on",
        choices=RECOMPUTE_MODES,
        help="activation recomputation: auto (default: the solver recomputes where a --memory limit needs it), "
        "on (--recompute alone: every value that can be), off",
    )
    p.add_argument(
        "--solver",
        choices=SOLVERS,
        help="the ILP backend: highs (default; HiGHS through highspy, stops at Ctrl-C and at the time limit), "
        "cpsat (OR-Tools' CP-SAT, stops likewise; slower here, docs/solver.md), "
        "CBC or SCIP (through OR-Tools' MIP wrappers, which cannot be interrupted)",
    )
    p.add_argument(
        "--bucket",
        dest="bucket_bytes",
        metavar="SIZE",
        type=bucket_size,
        help="gradient bucket size, e.g. 25MiB (the default); 0 all-reduces each gradient on its own",
    )
    p.add_argument(
        "--no-linear-partials",
        dest="linear_partials",
        action="store_false",
        default=None,
        help="reduce partial sums at once instead of carrying them through linear ops (P + P stays P)",
    )
    p.add_argument(
        "--no-shrink",
        dest="shrink",
        action="store_false",
        default=None,
        help="one ILP variable per node (no tying / follower merging)",
    )


def plan_options(args: argparse.Namespace, plan: ShardingPlan | PipelinePlan | None = None) -> PlanOptions:
    """The PlanOptions the command's flags give; micro-batches and schedule not given are a given
    pipeline plan's own (``planned_pipeline``: PlanError when they differ from it)."""
    given: dict[str, Any] = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(PlanOptions)}
    given = {name: value for name, value in given.items() if value is not None}
    given["microbatches"], given["schedule"] = planned_pipeline(plan, given.get("microbatches"), given.get("schedule"))
    return PlanOptions(**given)


def run_options(args: argparse.Namespace) -> RunOptions:
    """The RunOptions the command's flags give (``--no-cache``, ``--timeout``, ``--backend``)."""
    given: dict[str, Any] = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(RunOptions)}
    return RunOptions(**{name: value for name, value in given.items() if value is not None})


def add_debug(parser: argparse.ArgumentParser) -> None:
    """``--debug``: show the traceback of an error (also GRAPHC_DEBUG=1). On a subcommand it only
    sets the flag when given, so ``graphc --debug run ...`` and ``graphc run ... --debug`` both work."""
    parser.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="on an error, also print the traceback (or set GRAPHC_DEBUG=1)",
    )


def debug_enabled(args: argparse.Namespace | None) -> bool:
    return bool(getattr(args, "debug", False)) or os.environ.get("GRAPHC_DEBUG", "") not in ("", "0")


def process_age() -> float:
    """Seconds since this process started (Linux: /proc), else 0."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, counted after the command name
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


# --- output paths ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Output:
    """An output file, checked: write it with ``make_dirs`` (its folder may be created)."""

    path: str
    make_dirs: bool


def check_output_file(path: str, flag: str, kind: str | None, force: bool = False, mkdir: bool = False) -> Output:
    """UsageError unless ``path`` can be written by the command (the module doc): before any work."""
    where = f"{flag} {path}"
    if path == "" or path.endswith(os.sep):
        raise UsageError(f"{where}: expected a file name")
    if os.path.isdir(path):
        raise UsageError(f"{where}: is a folder; give a file name in it")
    make_dirs = _check_folder(os.path.dirname(os.path.abspath(path)), where, mkdir)
    if os.path.lexists(path):
        if not os.path.isfile(path):
            raise UsageError(f"{where}: exists and is not a regular file; give another name")
        if kind is not None and not force and not _is_kind(path, kind):
            raise UsageError(
                f"{where}: exists and is not a {KINDS[kind]}; refusing to overwrite it (pass --force, "
                "or give another name)"
            )
    return Output(path, make_dirs)


def check_output_dir(path: str, flag: str, mkdir: bool = False) -> str:
    """UsageError unless ``path`` is a folder the command can write into, or one it may create
    (its parent exists and is writable, or is creatable by the --mkdir rule). Creates it."""
    where = f"{flag} {path}"
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UsageError(f"{where}: exists and is not a folder")
    if os.path.isdir(path):
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"{where}: the folder is not writable")
        return path
    make_parents = _check_folder(os.path.dirname(os.path.abspath(path)), where, mkdir)
    try:
        os.makedirs(path, exist_ok=True) if make_parents else os.mkdir(path)
    except OSError as exc:
        raise UsageError(f"{where}: cannot create the folder ({exc.strerror})") from None
    return path


def _check_folder(folder: str, where: str, mkdir: bool) -> bool:
    """Whether ``folder`` must be created (True) or exists and is writable (False)."""
    if os.path.isdir(folder):
        if not os.access(folder, os.W_OK | os.X_OK):
            raise UsageError(f"{where}: the folder {folder} is not writable")
        return False
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"{where}: {existing} is not a folder")
    if not (mkdir or _inside_working_dir(folder)):
        raise UsageError(f"{where}: the folder {folder} does not exist; create it, or pass --mkdir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UsageError(f"{where}: cannot create {folder}: {existing} is not writable")
    return True


def _inside_working_dir(path: str) -> bool:
    cwd = os.path.realpath(os.getcwd())
    return os.path.commonpath([cwd, os.path.abspath(path)]) == cwd


KINDS = {
    "plan": "graphc plan",
    "ir": "graphc IR file",
    "trace": "Chrome trace",
    "profile": "graphc machine profile",
}


def _is_kind(path: str, kind: str) -> bool:
    """Whether the existing file at ``path`` is what a command writing ``kind`` makes (or empty).
    The entries a file starts with decide first (``_head_entries``): a plan of 1,000 layers is
    111 MB, and parsing it all took 4.8 s before each compile that writes over it. So a file that
    begins as graphc's plan is taken as one whatever follows (a plan cut short or edited since);
    any other is parsed whole."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 16)
            if not head.strip():
                return True
            if kind == "ir":
                return _looks_like_ir(head)
            if _doc_is_kind(_head_entries(head), kind):
                return True
            text = head + f.read()
        doc = json.loads(text)
    except (OSError, ValueError, RecursionError):  # unreadable, not UTF-8, not JSON, nested too deep
        return False
    return isinstance(doc, dict) and _doc_is_kind(doc, kind)


def _doc_is_kind(doc: dict, kind: str) -> bool:
    if kind == "plan":
        return "version" in doc and isinstance(doc.get("graph"), dict) and "hash" in doc["graph"] and "mesh" in doc
    if kind == "trace":
        return "traceEvents" in doc
    return "flops" in doc and "link" in doc  # profile


def _head_entries(head: bytes) -> dict:
    """The top-level entries whole in ``head``, the start of a file laid out as graphc writes its
    JSON (``dump_document``: ``{`` on a line, then one entry per line), up to the first line that
    is not a whole entry (a list of records, or the cut at the end of ``head``); {} for any other
    layout."""
    lines = head.split(b"\n")
    if lines[0].strip() != b"{":
        return {}
    found: dict = {}
    for line in lines[1:-1]:  # the last line may be cut short
        try:
            line = line.strip()
            entry = json.loads(b"{" + (line[:-1] if line.endswith(b",") else line) + b"}")
        except ValueError:
            break
        found.update(entry)
    return found


def _looks_like_ir(head: bytes) -> bool:
    for line in head.decode(errors="replace").splitlines():
        line = line.strip()
        if line and not line.startswith("//"):
            return line.startswith("graph @")
    return True


def load_plan(path: str) -> ShardingPlan | PipelinePlan:
    """The sharding or pipeline plan (by its ``kind``) in the file ``path``."""
    try:
        with open(path) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"cannot read plan {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        kind = json.loads(text).get("kind")
    except (ValueError, AttributeError):
        kind = None  # not JSON, or not an object: the plan reader says so, with the line
    if kind == "pipeline":
        return PipelinePlan.from_json(text, path)
    if kind == "composed":
        raise PlanError(
            f"{path}: a layout the block search predicted (docs/scale.md), not a plan graphc can run: it predicts a "
            f"layout with pipeline stages for a step of over {WHOLE_PLAN_NODES:,} nodes, and a layout that offloads; "
            "graphc compile --mesh of the layout writes a plan to run for a smaller step (fewer layers) that fits "
            "without offload"
        )
    return ShardingPlan.from_json(text, path)


# --- errors ------------------------------------------------------------------------------------


def user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of ``exc``'s traceback in the user's code (not graphc's, numpy's or the
    standard library's): where a user's function or example raised, or None."""
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if _is_user_file(frame.filename):
            found = frame
    return found


def _is_graphc_file(filename: str) -> bool:
    real = os.path.realpath(filename)
    return real.startswith(_INTERNAL_DIRS) and not is_user_code(real)


def _is_user_file(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    real = os.path.realpath(filename)
    if is_user_code(real):
        return True
    if _is_graphc_file(filename):
        return False
    library = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return not any(real.startswith(lib + os.sep) for lib in library) and "site-packages" not in real


def _function_name(exc: BaseException, frame: traceback.FrameSummary) -> str:
    """The user's function ``frame`` ran in: a block of it the source transform made a function of
    (``_gc_if_true_1``, frontend/autograph.py) is named by the function around it."""
    if not frame.name.startswith("_gc_"):
        return frame.name
    outer = [
        f.name
        for f in traceback.extract_tb(exc.__traceback__)
        if f.filename == frame.filename and not f.name.startswith("_gc_")
    ]
    return outer[-1] if outer else frame.name


def describe_exception(exc: BaseException) -> tuple[str, int]:
    """(one or two lines, exit status) for an exception that is not a GraphcError. Raised while the
    user's code ran (their function being traced, their example function) -> their innermost line
    and the exception, status 2 (bad input); else a bug in graphc -> status 1, with how to see and
    report it."""
    first = f"{type(exc).__name__}: {exc}".splitlines()[0]
    frame = user_frame(exc)
    if frame is not None:
        where = _display(frame.filename)
        return (
            f"{where}:{frame.lineno}: {first}\n  (in {_function_name(exc, frame)}, while graphc ran it; --debug shows "
            "the traceback)",
            2,
        )
    return f"internal error: {first}\n  (a bug in graphc: rerun with --debug for the traceback and report it)", 1


def _display(filename: str) -> str:
    rel = os.path.relpath(os.path.realpath(filename))
    return filename if rel.startswith("..") else rel


def print_error(text: str) -> None:
    lines = text.splitlines() or [""]
    print(f"graphc: error: {lines[0]}", file=sys.stderr)
    for line in lines[1:]:
        print(line, file=sys.stderr)


@contextlib.contextmanager
def warnings_on_stderr() -> Iterator[None]:
    """graphc's warnings (``GraphcWarning``: a typo'd mesh axis, a plan that replicates work) as
    ``graphc: warning: ...`` lines on stderr while a command runs; other warnings as Python
    shows them."""
    python_shows = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, GraphcWarning):
            print(f"graphc: warning: {message}", file=sys.stderr, flush=True)
        else:
            python_shows(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = python_shows


def print_traceback(exc: BaseException) -> None:
    traceback.print_exception(exc, file=sys.stderr)


__all__: list[Any] = [
    "KINDS",
    "Output",
    "Parser",
    "add_debug",
    "check_output_dir",
    "check_output_file",
    "debug_enabled",
    "memory_size",
    "links_of",
    "mesh_of",
    "mesh_text",
    "plan_options",
    "run_options",
    "describe_exception",
    "positive_int",
    "positive_seconds",
    "process_age",
    "print_error",
    "load_plan",
    "print_traceback",
    "user_frame",
    "warnings_on_stderr",
]
