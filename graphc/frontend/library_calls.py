"""A library function that fails on traced arrays: the error names the user's line that called it
and ends its call chain with the library's lines (frontend/autograph_runtime.py calls this when a
call it made for the user's code raised)."""

from __future__ import annotations

import sys
from types import FrameType

from graphc.core.errors import GraphcError, SourceLoc, TraceError, numpy_error
from graphc.frontend.locations import call_chain, display_path, is_internal, library_path, user_location
from graphc.frontend.tracer import HANDLERS, contains_tracer


def library_failure(exc: BaseException, args: tuple, kwargs: dict) -> TraceError | None:
    """A TraceError for ``exc`` when it was raised inside a library (an installed package, not
    graphc or numpy) that the user's code called with traced arguments: at the user's line that
    called the library, with the library's first and raising lines ending the call chain. It is also
    an instance of ``exc``'s class (an ``except ValueError`` around the call still catches it).
    None for any other exception (the user's own, graphc's)."""
    if isinstance(exc, GraphcError):
        return None
    if not (any(contains_tracer(a) for a in args) or any(contains_tracer(v) for v in kwargs.values())):
        return None
    entries = []  # (frame, line) of the traceback outside graphc and numpy, outermost first
    tb = exc.__traceback__
    while tb is not None:
        if not is_internal(tb.tb_frame.f_code.co_filename):
            entries.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    if not entries or library_path(entries[-1][0].f_code.co_filename) is None:
        return None  # raised by the user's own code
    last_user = max((i for i, (f, _) in enumerate(entries) if library_path(f.f_code.co_filename) is None), default=-1)
    first_library = last_user + 1  # the library function the user's line called

    def text(frame: FrameType, line: int, note: str = "") -> str:
        library = library_path(frame.f_code.co_filename)
        where = library if library is not None else display_path(frame.f_code.co_filename)
        return f"{where}:{line} in {frame.f_code.co_name}" + (f" ({note})" if note else "")

    outer = call_chain(sys._getframe(1))  # the user's frames on the stack, up to the call that failed
    users = tuple(text(f, line) for f, line in entries[:first_library] if library_path(f.f_code.co_filename) is None)
    entered, raised = entries[first_library], entries[-1]
    library = (text(*entered, "library"),) + ((text(*raised, "library, raised here"),) if raised is not entered else ())
    if last_user >= 0:
        file, line = display_path(entries[last_user][0].f_code.co_filename), entries[last_user][1]
    else:
        here = user_location()
        file, line = (here.file, here.line) if here is not None else ("<unknown>", 0)
    loc = SourceLoc(file, line, outer + users + library)
    name = f"{entered[0].f_globals.get('__name__', '?')}.{entered[0].f_code.co_name}"
    message = (
        f"{name}, a library function, failed on a traced array: {type(exc).__name__}: {exc}. graphc traces the "
        "numpy calls a library makes, but not library code that needs concrete values or writes into arrays"
        + HANDLERS.hints.get(f"library:{name}", "")
    )
    return numpy_error(exc, TraceError, loc, message)
