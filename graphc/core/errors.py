"""Errors users see. Each one says where (user's file:line, IR line:col, or node) and what was expected."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLoc:
    """Where in the user's source a node was created."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


class GraphcError(Exception):
    """Base class of every error graphc raises on purpose."""


class TraceError(GraphcError):
    """The traced function did something graphc cannot capture, or has a shape error.

    ``str(err)`` starts with the user's ``file:line``; ``err.loc`` holds it.
    """

    def __init__(self, message: str, loc: SourceLoc | None = None):
        self.message = message
        self.loc = loc
        super().__init__(f"{loc}: {message}" if loc else message)

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
    """Malformed IR text. ``str(err)`` starts with ``line L, column C``."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        self.message = message
        self.line = line
        self.column = column
        where = f"line {line}, column {column}: " if line is not None else ""
        super().__init__(where + message)


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
