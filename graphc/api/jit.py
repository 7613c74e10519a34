"""``graphc.jit``: trace, optimize and run a function on the single-device executor.

The first call with new argument shapes, dtypes or static values traces the function, runs the
default pass pipeline (fusion included) and builds an executable (compiling the fused kernels
with Numba, or loading them from the disk cache); later calls with the same signature run it
directly. Results are numpy arrays equal to the function's.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.core.errors import GraphcError
from graphc.core.ir import Graph, walk
from graphc.core.pytree import TreeDef, flatten, unflatten
from graphc.frontend.entry import trace
from graphc.frontend.tracer import current_context
from graphc.interpreter import as_numpy_result, bind_arguments
from graphc.passes.manager import optimize
from graphc.runtime.executor import Executable


class Compiled:
    """One traced, optimized and compiled specialization of a jitted function."""

    def __init__(self, traced: Graph, optimized: Graph, seconds: dict[str, float], split_static: Callable):
        start = time.perf_counter()
        self._split_static = split_static
        self.traced = traced
        self.graph = optimized
        self.executable = Executable(optimized)
        seconds["build_s"] = time.perf_counter() - start
        self.seconds = seconds

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run on arguments like the function's (static arguments are dropped: they are baked in)."""
        args, kwargs, _ = self._split_static(args, kwargs)
        return self.run(args, kwargs)

    def run(self, args: tuple, kwargs: dict) -> Any:
        """Run on arguments whose static ones were already removed."""
        arrays = bind_arguments(self.graph, args, kwargs)
        outs = self.executable.run_flat(arrays)
        return unflatten(self.graph.out_tree, [as_numpy_result(o) for o in outs])

    def stats(self) -> dict[str, Any]:
        kernels = [len(n.regions[0].nodes) for n in walk(self.graph.nodes) if n.op.name == "fused"]
        return {
            "nodes_traced": len(self.traced.nodes),
            "nodes_optimized": len(self.graph.nodes),
            "fused_kernels": len(kernels),
            "ops_per_kernel": kernels,
            **self.seconds,
            "kernel_compile_s": self.executable.stats.get("compile_s", 0.0),
        }


def _static_key(v: Any) -> Any:
    """Static values are keyed by type and, for floats, by bits: 2 and 2.0 (or 0.0 and -0.0)
    trace to different graphs even though they compare equal."""
    if isinstance(v, float):
        return ("float", v.hex())
    if isinstance(v, tuple):
        return ("tuple", tuple(_static_key(x) for x in v))
    return (type(v).__name__, v)


def _structure_key(t: TreeDef) -> Any:
    if t.kind == "static":
        return ("static", _static_key(t.value))
    return (t.kind, tuple(_static_key(k) for k in t.keys), tuple(_structure_key(c) for c in t.children))


def _hashable(v: Any, name: str) -> Any:
    try:
        hash(v)
    except TypeError:
        raise GraphcError(f"static argument {name!r} must be hashable, got {type(v).__name__}") from None
    return v


class StaticArgs:
    """How calls of ``fn`` split into dynamic arguments (traced: arrays and their containers) and
    the static ones named in ``static_argnames`` (baked into the graph), and the cache key of a
    call: its pytree structure, shapes, dtypes and static values."""

    def __init__(self, fn: Callable, static_argnames: tuple[str, ...] = ()):
        self.fn = fn
        self.names = tuple(static_argnames)
        self.signature: inspect.Signature | None
        try:
            self.signature = inspect.signature(fn)
        except (TypeError, ValueError):
            self.signature = None

    def split(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, dict]:
        """(dynamic args, dynamic kwargs, {static name: value})."""
        if not self.names:
            return args, kwargs, {}
        if self.signature is None:
            raise GraphcError("static_argnames needs a function with an inspectable signature")
        bound = self.signature.bind(*args, **kwargs)
        static = {}
        for name in self.names:
            if name not in self.signature.parameters:
                raise GraphcError(f"static_argnames: {self.fn.__name__} has no parameter {name!r}")
            if name in bound.arguments:
                value = bound.arguments.pop(name)
                value = value.item() if isinstance(value, np.generic) else value
                static[name] = _hashable(value, name)
        return tuple(bound.args), dict(bound.kwargs), static

    def key(self, args: tuple, kwargs: dict, static: dict) -> Any:
        leaves, treedef = flatten((args, kwargs))
        shapes = tuple((np.shape(x), np.result_type(x).str) for x in leaves)
        return (_structure_key(treedef), shapes, tuple(sorted((k, _static_key(v)) for k, v in static.items())))

    def bind(self, static: dict) -> Callable:
        """``fn`` with the static values bound (it keeps ``fn``'s name and source for tracing)."""
        if not static:
            return self.fn
        fn = functools.partial(self.fn, **static)
        functools.update_wrapper(fn, self.fn)
        return fn


class Jitted:
    def __init__(self, fn: Callable, static_argnames: tuple[str, ...] = (), passes: tuple[str, ...] | None = None):
        self.fn = fn
        self.static = StaticArgs(fn, static_argnames)
        self.static_argnames = self.static.names
        self.passes = passes
        self._cache: dict[Any, Compiled] = {}
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    def split_static(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, dict]:
        """(dynamic args, dynamic kwargs, static values) of a call."""
        return self.static.split(args, kwargs)

    def compile(self, *args: Any, **kwargs: Any) -> Compiled:
        """The compiled specialization for these arguments (traced and built on first use)."""
        return self._compile(*self.split_static(args, kwargs))

    def _compile(self, args: tuple, kwargs: dict, static: dict) -> Compiled:
        key = self.static.key(args, kwargs, static)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                return hit
            fn = self.static.bind(static)
            seconds: dict[str, float] = {}
            start = time.perf_counter()
            traced = trace(fn, *args, **kwargs)
            seconds["trace_s"] = time.perf_counter() - start
            start = time.perf_counter()
            optimized = optimize(traced, self.passes)
            seconds["optimize_s"] = time.perf_counter() - start
            compiled = Compiled(traced, optimized, seconds, self.split_static)
            self._cache[key] = compiled
            return compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current_context() is not None:  # called inside a trace (grad of a jitted function...): inline
            return self.fn(*args, **kwargs)
        args, kwargs, static = self.split_static(args, kwargs)  # once per call
        return self._compile(args, kwargs, static).run(args, kwargs)


def jit(
    fn: Callable | None = None,
    *,
    static_argnames: tuple[str, ...] | list[str] = (),
    passes: tuple[str, ...] | None = None,
) -> Any:
    """Decorator or function: ``graphc.jit(fn)`` / ``@graphc.jit(static_argnames=("n_head",))``."""
    if isinstance(static_argnames, str):
        static_argnames = (static_argnames,)
    if fn is None:
        return lambda f: Jitted(f, tuple(static_argnames), passes)
    return Jitted(fn, tuple(static_argnames), passes)


__all__ = ["jit", "Jitted", "Compiled"]
