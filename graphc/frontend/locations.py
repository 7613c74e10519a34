"""Where the user's code is: the file and line a traced operation comes from (``user_location``),
the chain of calls through libraries, and ``user_errors``, which turns failures inside graphc and
numpy into TraceErrors at that line.

A frame is the user's when its file is outside graphc (graphc's example models count as user
code), numpy and the installed libraries (site-packages and the standard library).
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any

import numpy as np

from graphc.core.errors import NUMPY_ERRORS, GraphcError, ShapeError, SourceLoc, TraceError, numpy_error
from graphc.core.ir import bounded_put

_GRAPHC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# folders whose code is the user's even inside graphc or an installed package (add_user_code)
_user_dirs: tuple[str, ...] = ()


def add_user_code(folder: str) -> None:
    """Report the lines of code in ``folder`` as the user's in errors and node locations, even
    where it lives inside graphc or an installed package (graphc.models registers itself: its
    example models are user code, also when graphc is installed)."""
    global _user_dirs
    path = os.path.abspath(folder).rstrip(os.sep) + os.sep
    real = os.path.realpath(folder).rstrip(os.sep) + os.sep
    _user_dirs = tuple(dict.fromkeys((*_user_dirs, path, real)))
    for cached in (is_internal, library_path, display_path):
        cached.cache_clear()


def is_user_code(filename: str) -> bool:
    """Whether ``filename`` lies in a folder ``add_user_code`` registered."""
    path = os.path.abspath(filename)
    return path.startswith(_user_dirs) or os.path.realpath(path).startswith(_user_dirs)


_NUMPY_DIR = os.path.dirname(os.path.abspath(np.__file__)) + os.sep


@functools.lru_cache(maxsize=4096)
def display_path(filename: str) -> str:
    """The file as the user knows it: relative to the working directory when inside it, with links
    resolved (graphc/models/ is a link to the repository's models/ folder)."""
    if not filename.startswith("<"):
        filename = os.path.realpath(filename)
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


@functools.lru_cache(maxsize=4096)
def is_internal(filename: str) -> bool:
    """Whether frames of ``filename`` (a code object's co_filename) are graphc's or numpy's."""
    if not filename.startswith("<"):
        filename = os.path.abspath(filename)
    if filename.startswith(_GRAPHC_DIR):
        return not is_user_code(filename)
    return filename.startswith(_NUMPY_DIR) or filename.startswith("<__array_function__")


def _library_roots() -> tuple[str, ...]:
    """Where installed packages and the standard library live (each path also with links resolved)."""
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots |= {os.path.realpath(r) for r in roots}
    return tuple(sorted((r.rstrip(os.sep) + os.sep for r in roots), key=len, reverse=True))


_LIBRARY_ROOTS = _library_roots()


@functools.lru_cache(maxsize=4096)
def library_path(filename: str) -> str | None:
    """For a frame of a library (an installed package or the standard library; not graphc or
    numpy), its path inside the library root (scipy/special/_logsumexp.py); None for user code."""
    if filename.startswith("<"):
        return filename if filename.startswith("<frozen") else None
    path = os.path.abspath(filename)
    if is_user_code(path):  # graphc's example models are user code, also when graphc is installed
        return None
    for root in _LIBRARY_ROOTS:
        if path.startswith(root):
            return path[len(root) :]
    return None


def user_frame() -> FrameType | None:
    """The innermost frame of the user's code (outside graphc, numpy and the libraries); the
    innermost library frame when no user frame is on the stack."""
    frame: FrameType | None = sys._getframe(2)
    outside: FrameType | None = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if not is_internal(filename):
            if library_path(filename) is None:
                return frame
            outside = outside or frame
        frame = frame.f_back
    return outside


def _frame_text(frame: FrameType) -> str:
    library = library_path(frame.f_code.co_filename)
    where = library if library is not None else display_path(frame.f_code.co_filename)
    return f"{where}:{frame.f_lineno} in {frame.f_code.co_name}" + (" (library)" if library is not None else "")


def call_chain(start: FrameType) -> tuple[str, ...]:
    """The frames outside graphc and numpy from the outermost in, ending at ``start``'s innermost
    such frame: the user's frames, then the library frames that made the failing call."""
    frames = []
    frame: FrameType | None = start
    while frame is not None:
        if not is_internal(frame.f_code.co_filename):
            frames.append(frame)
        frame = frame.f_back
    first_user = next((i for i, f in enumerate(frames) if library_path(f.f_code.co_filename) is None), len(frames))
    users = [f for f in frames[first_user:] if library_path(f.f_code.co_filename) is None]
    return tuple(_frame_text(f) for f in reversed(users)) + tuple(_frame_text(f) for f in reversed(frames[:first_user]))


_LOCS: dict[tuple[str, int], SourceLoc] = {}  # (file, line) -> its location (no call chain)


def user_location() -> SourceLoc | None:
    """The user's line that is being traced: the innermost frame outside graphc, numpy and the
    libraries. When the call being traced was made inside a library function that line called, the
    location also holds the call chain (``SourceLoc.via``)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and is_internal(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return None
    if library_path(frame.f_code.co_filename) is None:  # the usual case: the user's own line
        key = (display_path(frame.f_code.co_filename), frame.f_lineno)
        loc = _LOCS.get(key)
        if loc is None:  # one object per line traced, shared by its nodes (ir.INTERN_LIMIT)
            loc = bounded_put(_LOCS, key, SourceLoc(*key))
        return loc
    user = frame.f_back
    while user is not None and (is_internal(user.f_code.co_filename) or library_path(user.f_code.co_filename)):
        user = user.f_back
    target = user if user is not None else frame
    file = display_path(target.f_code.co_filename)
    return SourceLoc(file, target.f_lineno, call_chain(frame))


def warn_from_user_code(message: str, category: type[Warning]) -> None:
    """``warnings.warn(message, category)`` as if numpy had warned from the user's line (the innermost
    frame outside graphc, numpy and the libraries): that line's file, and its module's filters and
    once-per-location registry (Python shows a DeprecationWarning by default in ``__main__`` only)."""
    frame = user_frame()
    if frame is None:
        warnings.warn(message, category, stacklevel=3)
        return
    module_globals = frame.f_globals
    warnings.warn_explicit(
        message,
        category,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=module_globals.get("__name__"),
        registry=module_globals.setdefault("__warningregistry__", {}),
        module_globals=module_globals,
    )


def user_globals() -> dict[str, Any]:
    """The module globals of the user's code being traced (the innermost frame outside graphc,
    numpy and the libraries); empty when there is none."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not is_internal(filename) and library_path(filename) is None:
            return frame.f_globals
        frame = frame.f_back
    return {}


def user_errors(fn: Callable) -> Callable:
    """Entry points from user code: turn op-rule failures into TraceError at the user's line, and
    numpy's own errors (an axis out of range, a Python int out of the dtype's range) into a
    TraceError that is also an instance of numpy's exception class (core/errors.py numpy_error)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return call_with_user_errors(fn, *args, **kwargs)

    return wrapper


def call_with_user_errors(fn: Callable, *args, **kwargs):
    """``user_errors(fn)(*args, **kwargs)`` without making the wrapper: for the tracer's hooks,
    which numpy calls once per traced op."""
    try:
        return fn(*args, **kwargs)
    except TraceError as exc:
        if exc.loc is None:
            raise TraceError(exc.message, user_location()) from None
        raise
    except ShapeError as exc:
        raise TraceError(str(exc), user_location()) from None
    except GraphcError:
        raise
    except NUMPY_ERRORS as exc:  # numpy's own error on these arguments (numpy raises it too)
        raise numpy_error(exc, TraceError, user_location()).with_traceback(exc.__traceback__) from None
