"""Errors users see. Each one says where (user's file:line, IR line:col, or node) and what was expected."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TypeVar


@dataclass(frozen=True)
class SourceLoc:
    """Where in the user's source a node was created.

    When the user's line called a library function (scipy, an installed helper package) that made
    the call graphc records, ``file:line`` is still the user's line and ``via`` holds how it got
    there: the user's frames from the outermost in, then the library's frames, each as
    ``file:line in function`` (library frames marked ``(library)``). ``via`` does not take part in
    comparisons."""

    file: str
    line: int
    via: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


class GraphcError(Exception):
    """Base class of every error graphc raises on purpose."""


def _located(message: str, loc: SourceLoc | None) -> str:
    """``file:line: message``, and the call chain when the failing call was made inside a library."""
    if loc is None:
        return message
    text = f"{loc}: {message}"
    if loc.via:
        text += "\n  call chain (outermost first): " + "\n    -> ".join(loc.via)
    return text


class TraceError(GraphcError):
    """The traced function did something graphc cannot capture, or has a shape error.

    ``str(err)`` starts with the user's ``file:line``; ``err.loc`` holds it. When the failing call
    was made inside a library function the user's line called, the message ends with the call
    chain: the user's frames, then the library's (``err.chain``).
    """

    def __init__(self, message: str, loc: SourceLoc | None = None):
        self.message = message
        self.loc = loc
        super().__init__(_located(message, loc))

    @property
    def chain(self) -> tuple[str, ...]:
        return self.loc.via if self.loc else ()

    @property
    def filename(self) -> str | None:
        return self.loc.file if self.loc else None

    @property
    def lineno(self) -> int | None:
        return self.loc.line if self.loc else None


class ShapeError(GraphcError, ValueError):
    """An op's shape/dtype/attribute rule rejected its inputs (no location yet).

    The tracer turns it into a TraceError at the user's line; the verifier into a VerifyError.
    """


class ParseError(GraphcError):
    """Malformed IR text. ``str(err)`` starts with ``line L, column C``, after ``FILE: `` when the
    text came from a file (``source``)."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None, source: str | None = None):
        self.message = message
        self.line = line
        self.column = column
        self.source = source
        where = f"line {line}, column {column}: " if line is not None else ""
        super().__init__((f"{source}: " if source else "") + where + message)


class VerifyError(GraphcError):
    """A graph breaks an IR invariant. The message names the offending node."""


class EvaluationError(GraphcError):
    """Arguments given to ``evaluate`` do not match the graph's signature."""


class PlanError(GraphcError):
    """No sharding plan satisfies the request (memory limit, pinned specs, stale plan file).

    ``min_memory_bytes`` is set when the memory limit is below what every plan needs."""

    def __init__(self, message: str, min_memory_bytes: int | None = None):
        self.min_memory_bytes = min_memory_bytes
        super().__init__(message)


class TimeLimitError(PlanError):
    """The time limit ran out before the solver found a plan (within the memory limit, when there
    is one): more time may find one (the mesh search gives such a mesh the time the others left)."""


class MemoryLimitError(PlanError):
    """No plan fits the memory limit, though the step could be planned without one: more devices,
    micro-batches or memory per device may help (the mesh search tries more micro-batches on a
    mesh only after this error)."""


class MeshError(GraphcError, ValueError):
    """A bad mesh, link, or machine profile (argument, string or file). The message says what was expected."""


class GraphcWarning(UserWarning):
    """Base class of the warnings graphc gives: something was skipped or replaced, and work went on."""


class RecompileWarning(GraphcWarning):
    """A jitted or parallelized function keeps being compiled again (a new shape, dtype or static
    value each call). The message names the arguments that changed."""


class PromotionWarning(GraphcWarning):
    """numpy's promotion made a jitted function's float32 values float64 (graphc keeps numpy's
    dtypes); the message names the line. See graphc/frontend/promotion.py."""


class CacheWarning(GraphcWarning):
    """An on-disk cache (its folder or one entry) was not used: not the user's alone, corrupt, or
    made from something else. The message names the path and why; graphc rebuilt what it needed."""


class MeshWarning(GraphcWarning):
    """A mesh axis name is close to a role name without being one (``dq`` for ``dp``): the axis has
    no role, so it may split anything. The message names the role(s) it would have had."""


class PlanWarning(GraphcWarning):
    """A plan does not do all that was asked of it: an axis that replicates the work it was meant to
    split (a data axis that divides no batch dim), an op without a sharding rule run whole on every
    device, a ZeRO stage a parameter cannot take. Given once per compile, with the plan's
    warnings (``plan.warnings``)."""


_GRAPHC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def user_stacklevel() -> int:
    """The ``warnings.warn`` stacklevel of the innermost caller outside graphc (the user's call):
    the warning then names the user's file and line."""
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_GRAPHC_DIR):
        frame = frame.f_back
        level += 1
    return level


def note_where(exc: BaseException, opname: str, loc: SourceLoc | None) -> None:
    """Attach ``graphc: in <op> at <file:line>`` to an exception raised while running a node (once:
    an exception passing through nested regions keeps its innermost node). The note prints with
    the traceback; graphc reads it back to name the user's line (``__notes__``, Python 3.11's
    add_note, kept by hand on 3.10)."""
    notes = getattr(exc, "__notes__", None)
    if notes is None:
        notes = []
        exc.__notes__ = notes  # type: ignore[attr-defined]  # what BaseException.add_note does
    if not any(n.startswith("graphc: in ") for n in notes):
        notes.append(f"graphc: in {opname} at {loc}" if loc else f"graphc: in {opname}")


class NumpyError(GraphcError):
    """numpy itself raised while graphc ran an op on the user's values, where numpy raises on the
    same values too (an integer to a negative power, an index out of bounds). The exception is
    also an instance of numpy's own class: see ``numpy_error``."""


# (graphc class, numpy's class) -> the class deriving from both
_NUMPY_ERROR_CLASSES: dict[tuple[type, type], Any] = {}
NUMPY_ERRORS = (ArithmeticError, IndexError, TypeError, ValueError)  # what numpy raises on bad values or arguments


def _combined_init(self, message: str, loc: SourceLoc | None = None) -> None:
    """The __init__ of the classes numpy_error makes (not numpy's: its arguments differ)."""
    self.message = message
    self.loc = loc
    BaseException.__init__(self, _located(message, loc))


E = TypeVar("E", bound=GraphcError)


def numpy_error(exc: BaseException, kind: type[E], loc: SourceLoc | None = None, message: str | None = None) -> E:
    """``exc``, an exception numpy raised, as a GraphcError of class ``kind`` (TraceError while
    tracing, NumpyError while running) that is also an instance of ``type(exc)``: ``except
    ValueError`` (or ``np.exceptions.AxisError``) and ``except GraphcError`` both catch it. The
    message is numpy's (or ``message``), after the user's ``file:line`` when ``loc`` is given;
    numpy's attributes and the notes are kept."""
    if isinstance(exc, kind):
        return exc
    base = type(exc)
    cls: type[E] | None = _NUMPY_ERROR_CLASSES.get((kind, base))
    if cls is None:
        namespace = {"__module__": kind.__module__, "__init__": _combined_init, "__str__": BaseException.__str__}
        try:
            cls = type(f"{kind.__name__}[{base.__name__}]", (kind, base), namespace)
        except TypeError:  # a class that cannot be combined with an Exception subclass
            cls = kind
        _NUMPY_ERROR_CLASSES[(kind, base)] = cls
    new = cls.__new__(cls)
    new.__dict__.update(vars(exc))  # numpy's attributes and the notes
    for slot in {s for c in base.__mro__ for s in getattr(c, "__slots__", ())}:  # an AxisError's axis and ndim
        if hasattr(exc, slot):
            setattr(new, slot, getattr(exc, slot))
    _combined_init(new, str(exc) if message is None else message, loc)
    return new


def relabel(exc: BaseException, message: str) -> BaseException:
    """An exception of ``exc``'s type saying ``message`` (a GraphcError naming the type when that
    type takes other arguments), caused by ``exc``: how a thread's failure reaches the caller."""
    try:
        new = type(exc)(message)
    except Exception:  # an exception type that takes other arguments
        new = GraphcError(f"{type(exc).__name__}: {message}")
    new.__cause__ = exc
    return new
