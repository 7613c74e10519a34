"""Load ``FILE:FUNC`` targets and their example arguments for the CLI."""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from graphc.core.errors import GraphcError
from graphc.core.pytree import ArraySpec, WeakScalar, flatten, leaf_paths


class UsageError(GraphcError):
    """Bad command-line input: the message says what was expected."""


def load_module(path: str) -> ModuleType:
    if os.path.isdir(path):
        raise UsageError(f"{path}: is a folder; expected a Python file (.py)")
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no such file")
    if not path.endswith(".py"):
        raise UsageError(f"{path}: expected a Python file (.py)")
    if not os.access(path, os.R_OK):
        raise UsageError(f"{path}: cannot read the file (permission denied)")
    abspath = os.path.abspath(path)
    name = "graphc_user_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, abspath)
    if spec is None or spec.loader is None:
        raise UsageError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(abspath))
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:  # (null bytes or bad UTF-8 have no line)
        where = f"{exc.filename or path}:{exc.lineno}" if exc.lineno else path
        raise UsageError(f"{where}: syntax error: {exc.msg}") from None
    except OSError as exc:  # the file went away, or could not be read, between the checks and the import
        raise UsageError(f"{path}: cannot read the file ({exc.strerror or exc})") from None
    finally:
        sys.path.pop(0)
    return module


def load_target(target: str, example: str | None = None, runs: str | None = None) -> tuple[Callable, tuple, dict]:
    """``FILE:FUNC`` -> (function, args, kwargs), the arguments from ``example`` (a function in the
    same file returning ``(args, kwargs)``; default ``example_args``). ``runs``: the command, when
    it runs the step (``graphc run``, ``graphc bench``), which needs arrays where an example for
    planning may give types alone (``ArraySpec``): refused before any tracing."""
    path, sep, func_name = target.rpartition(":")
    if not sep or not path or not func_name:
        example = f"{target}:{_first_function(target)}" if target.endswith(".py") else "models/gpt.py:gpt"
        raise UsageError(f"{target!r}: expected FILE:FUNC, e.g. {example}")
    module = load_module(path)
    fn = getattr(module, func_name, None)
    if not callable(fn):
        funcs = sorted(
            k for k, v in vars(module).items() if callable(v) and getattr(v, "__module__", None) == module.__name__
        )
        raise UsageError(f"{path}: no function {func_name!r} (functions: {', '.join(funcs) or 'none'})")
    ex_name = example or "example_args"
    ex = getattr(module, ex_name, None)
    if not callable(ex):
        raise UsageError(
            f"{path}: no function {ex_name!r} giving example arguments; write one returning (args, kwargs) "
            "or name one with --example"
        )
    result: Any = ex()
    if not (
        isinstance(result, tuple)
        and len(result) == 2
        and isinstance(result[0], (tuple, list))
        and isinstance(result[1], dict)
    ):
        raise UsageError(f"{path}:{ex_name}() must return (args, kwargs): a tuple of positional arguments and a dict")
    args, kwargs = tuple(result[0]), dict(result[1])
    _check_binds(fn, func_name, path, f"{path}:{ex_name}()", args, kwargs)
    if runs is not None:
        _check_data(runs, f"{path}:{ex_name}()", args, kwargs)
    return fn, args, kwargs


def _check_data(runs: str, example: str, args: tuple, kwargs: dict) -> None:
    """UsageError when the example gives an ``ArraySpec`` (a shape and dtype, no data) for an
    argument of a step ``runs`` runs, naming the first such argument."""
    leaves, treedef = flatten((args, kwargs))
    for leaf, keys in zip(leaves, leaf_paths(treedef)):
        if isinstance(leaf, ArraySpec) and not isinstance(leaf, WeakScalar):
            where = ("arguments" if keys[0] == 0 else "keyword arguments") + "".join(f"[{k!r}]" for k in keys[1:])
            raise UsageError(
                f"{example} gives types, not data ({where} is an ArraySpec {leaf.dtype}{list(leaf.shape)}): "
                f"{runs} runs the step, so its example must return arrays; graphc compile plans from types alone"
            )


def _check_binds(fn: Callable, name: str, path: str, example: str, args: tuple, kwargs: dict) -> None:
    """UsageError, naming the example and the function's ``file:line``, when the example's
    arguments do not fit the function's parameters (a keyword it does not take, one too many or
    too few): said before any tracing, and not as a static_argnames or tracing error."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to check (a builtin): tracing says what is wrong
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        code = getattr(inspect.unwrap(fn), "__code__", None)
        where = ""
        if code is not None:
            same = os.path.abspath(code.co_filename) == os.path.abspath(path)
            where = f" ({path if same else code.co_filename}:{code.co_firstlineno})"
        raise UsageError(
            f"{example} returns arguments that {name}{where} does not take: {exc} "
            f"(parameters: {', '.join(signature.parameters)})"
        ) from None


def _first_function(path: str) -> str:
    """The first top-level ``def`` in the Python file ``path`` (for an example in a message)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("def "):
                    return line[4:].split("(")[0].strip()
    except (OSError, UnicodeDecodeError):
        pass
    return "FUNC"
