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
import types
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphc.core.errors import GraphcError, PromotionWarning, RecompileWarning, TraceError, user_stacklevel
from graphc.core.ir import Graph, walk
from graphc.core.pytree import LEAF, StateUpdate, TreeDef, WeakScalar, flatten, unflatten
from graphc.core.traits import Fused
from graphc.frontend import random as traced_random
from graphc.frontend.entry import argument_error, on_a_copy, trace
from graphc.frontend.promotion import promotion_message, promotions
from graphc.frontend.tracer import current_context
from graphc.interpreter import as_numpy_result, bind_arguments, check_call
from graphc.passes.manager import optimize
from graphc.runtime.executor import Executable


class Compiled:
    """One traced, optimized and compiled specialization of a jitted function."""

    _entry: Any  # Jitted's generated entry for calls of this specialization (_entry_of), once made

    def __init__(self, traced: Graph, optimized: Graph, seconds: dict[str, float], split_static: Callable):
        start = time.perf_counter()
        self._split_static = split_static
        self.traced = traced
        self.graph = optimized
        self.executable = Executable(optimized, lend=True)  # results lent: runtime/lending.py
        self._one_result = optimized.out_tree.kind == "leaf"
        seconds["build_s"] = time.perf_counter() - start
        self.seconds = seconds

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run on arguments like the function's (static arguments are dropped: they are baked in)."""
        args, kwargs, _ = self._split_static(args, kwargs)
        return self.run(args, kwargs)

    def run(self, args: tuple, kwargs: dict) -> Any:
        """Run on arguments whose static ones were already removed."""
        arrays = bind_arguments(self.graph, args, kwargs)  # Python floats bind as 0-d float64 arrays
        outs = self.executable.run_flat(arrays)
        out = unflatten(self.graph.out_tree, [as_numpy_result(o) for o in outs])
        if type(out) is StateUpdate:  # the function wrote into its argument objects: store it there
            return out.apply_to(args, kwargs)
        return out

    def run_flat_args(self, arrays: Sequence[np.ndarray]) -> Any:
        """Run on ndarrays that are exactly the graph's inputs (checked by the caller's cache key)."""
        if self.graph.written_inputs or self.graph.global_reads:
            check_call(self.graph, arrays)
        outs = self.executable.run_arrays(arrays)
        if self._one_result:
            return as_numpy_result(outs[0])
        return unflatten(self.graph.out_tree, [as_numpy_result(o) for o in outs])

    def stats(self) -> dict[str, Any]:
        kernels = [len(n.regions[0].nodes) for n in walk(self.graph.nodes) if n.op.has(Fused)]
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
    key = (t.kind, tuple(_static_key(k) for k in t.keys), tuple(_structure_key(c) for c in t.children))
    return key if t.node is None else (*key, t.node)  # an object: its class (and a registered class's aux)


def _leaf_key(x: Any) -> tuple:
    if isinstance(x, WeakScalar):
        return ((), x.dtype.str, "weak")
    return (np.shape(x), np.result_type(x).str)


def _hashable(v: Any, name: str) -> Any:
    try:
        hash(v)
    except TypeError:
        raise GraphcError(f"static argument {name!r} must be hashable, got {type(v).__name__}") from None
    return v


def _is_traced_number(x: Any) -> bool:
    """A Python float (not a numpy scalar: np.float64 is a float too, and is a strong input).
    Python ints stay static: in model code they are sizes, head counts, axes and loop counts,
    which the function needs as Python values (tracing them, as JAX does, broke gpt's ``n_head``
    and the foreign models' class counts and token lists in tests/models/foreign_models.py)."""
    return type(x) is float


def _is_int(x: Any) -> bool:
    """A Python int (not a bool) that fits an int64: one that may be traced (StaticArgs doc)."""
    return type(x) is int and -(2**63) <= x < 2**63


def _map_numbers(tree: Any, fn: Callable[[Any], Any]) -> Any:
    """``tree`` with every traced Python number replaced by ``fn(leaf)``."""
    if _is_traced_number(tree):
        return fn(tree)
    if isinstance(tree, dict):
        return {k: _map_numbers(v, fn) for k, v in tree.items()}
    if type(tree) is list:
        return [_map_numbers(v, fn) for v in tree]
    if type(tree) is tuple:
        return tuple(_map_numbers(v, fn) for v in tree)
    return tree


def _has_number(tree: Any) -> bool:
    if _is_traced_number(tree):
        return True
    if isinstance(tree, dict):
        return any(_has_number(v) for v in tree.values())
    if type(tree) in (list, tuple):
        return any(_has_number(v) for v in tree)
    return False


def _receiver(fn: Callable) -> tuple[Callable, Any]:
    """(the function to trace, the object it is called on, or None). A bound method's object
    (``model.forward``) and a callable object (``model``, whose class defines ``__call__``) are an
    implicit first argument: their arrays are inputs of every call, their other attributes static."""
    if inspect.ismethod(fn):
        obj = fn.__self__
        if isinstance(obj, (type, types.ModuleType)):  # a classmethod, a module's function
            return fn, None
        return fn.__func__, obj
    call = inspect.getattr_static(type(fn), "__call__", None)
    if (
        inspect.isfunction(call)
        and isinstance(getattr(fn, "__dict__", None), dict)
        and not type(fn).__module__.startswith("graphc.")  # jit of a Jitted, a Parallelized...
        and not isinstance(fn, functools.partial)
    ):
        return call, fn
    return fn, None


class StaticArgs:
    """How calls of ``fn`` split into dynamic arguments (traced: arrays, their containers, and
    Python floats as weakly typed values) and the static ones named in ``static_argnames``
    (baked into the graph), and the cache key of a call: its pytree structure, shapes, dtypes and
    static values.

    A bound method's object, or a callable object itself, is the first dynamic argument of every
    call (``receiver``; see ``_receiver``): its arrays are read anew in each call, and a changed
    static attribute compiles again.

    A Python ``float`` that is not named static is traced as a 0-d value of a weak type, as JAX
    does (``WeakScalar``): a learning rate that changes every call does not recompile, and it
    promotes like the Python number it is (NEP 50: ``x_f32 * lr`` stays float32). A float the
    function needs as a Python value (a shape, a loop count, ``int(frac * n)``) belongs in
    ``static_argnames``; the TraceError says so. Python bools, strings and None stay static.

    A Python ``int`` argument is static at first (``_is_traced_number`` says why). When a call
    passes a top-level int argument a value other than the first one it had, the function is
    traced with that int as a weakly typed 0-d value (``traced_ints``), and keeps it traced if
    the trace used it only as data: slice starts, indices, arithmetic, masks. A trace that needs
    its Python value (a shape, ``range()``, a reshape size, a slice whose length it sets) fails,
    and one that feeds it to control flow (an ``if`` or a loop bound become cond / loops) is
    refused (``check_traced_ints``): then it stays static for good (``static_ints``) and each
    value is its own specialization, as before. So a decode loop's ``start_pos`` compiles once,
    and llama3.np's ``cache[:, :start_pos + n]`` specializes per position. A changing static
    value recompiles, and the RecompileWarning names it."""

    def __init__(self, fn: Callable, static_argnames: tuple[str, ...] = ()):
        self.fn, self.receiver = _receiver(fn)
        self.names = tuple(static_argnames)
        self.traced_ints: set[str] = set()  # top-level int arguments traced as values
        self.static_ints: set[str] = set()  # ... found to be needed as Python values
        self._first_ints: dict[str, int] = {}  # the first value of each top-level int argument
        self.signature: inspect.Signature | None
        try:
            self.signature = inspect.signature(self.fn)
        except (TypeError, ValueError):
            self.signature = None
        if self.signature is not None:
            unknown = [n for n in self.names if n not in self.signature.parameters]
            if unknown and not any(p.kind == p.VAR_KEYWORD for p in self.signature.parameters.values()):
                raise GraphcError(
                    f"static_argnames: {getattr(fn, '__name__', 'the function')} has no parameter "
                    f"{', '.join(map(repr, unknown))} (parameters: {', '.join(self.signature.parameters)})"
                )

    def split(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, dict]:
        """(dynamic args, dynamic kwargs, {static name: value}). Python floats stay as they are
        (a compiled graph binds them as 0-d float64 arrays). A receiver comes first."""
        if self.receiver is not None:
            args = (self.receiver, *args)
        if not self.names:
            return args, kwargs, {}
        if self.signature is None:
            raise GraphcError("static_argnames needs a function with an inspectable signature")
        hidden = {k: v for k, v in kwargs.items() if k == traced_random.AMBIENT_KWARG}  # not the function's
        try:
            bound = self.signature.bind(*args, **{k: v for k, v in kwargs.items() if k not in hidden})
        except TypeError as exc:
            raise argument_error(self.fn, exc) from None
        static = {}
        for name in self.names:
            if name in bound.arguments:
                value = bound.arguments.pop(name)
                value = value.item() if isinstance(value, np.generic) else value
                static[name] = _hashable(value, name)
            elif name in bound.kwargs:  # taken by **kwargs
                value = bound.kwargs.pop(name)
                static[name] = _hashable(value.item() if isinstance(value, np.generic) else value, name)
        return tuple(bound.args), {**bound.kwargs, **hidden}, static

    def for_trace(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Dynamic arguments as trace() takes them: Python floats, and the ints in
        ``traced_ints``, become ``WeakScalar`` inputs."""
        if self.traced_ints:
            names = self._positional_names()
            args = tuple(
                WeakScalar.of(v) if _is_int(v) and i < len(names) and names[i] in self.traced_ints else v
                for i, v in enumerate(args)
            )
            kwargs = {k: WeakScalar.of(v) if _is_int(v) and k in self.traced_ints else v for k, v in kwargs.items()}
        return _map_numbers(args, WeakScalar.of), _map_numbers(kwargs, WeakScalar.of)

    def new_traced_ints(self, args: tuple, kwargs: dict) -> set[str]:
        """The top-level int arguments of this call (dynamic ones) that have not been decided on
        and now have a value other than their first: the ones to try tracing."""
        found = set()
        for name, v in self._named(args, kwargs):
            if not _is_int(v) or name in self.traced_ints or name in self.static_ints:
                continue
            first = self._first_ints.setdefault(name, v)
            if first != v:
                found.add(name)
        return found

    def check_traced_ints(self, graph: Graph, targs: tuple, tkwargs: dict) -> None:
        """TraceError if a traced int argument reaches control flow in ``graph`` (traced from
        ``targs``/``tkwargs``): a cond's predicate or a loop's bounds that numpy code decides with
        a Python int; such an int stays static (``StaticArgs`` doc)."""
        if not self.traced_ints:
            return
        ints = {id(v) for name, v in self._named(targs, tkwargs) if name in self.traced_ints}
        leaves, _ = flatten((targs, tkwargs))
        tainted = {graph.inputs[i] for i, leaf in enumerate(leaves) if id(leaf) in ints}
        for node in graph.nodes:
            if not any(v in tainted for v in node.inputs):
                continue
            if node.regions:
                raise TraceError(
                    f"the traced int argument reaches {node.op.name} (control flow): it stays a Python int", node.loc
                )
            tainted.update(node.outputs)

    def trying_traced_ints(self, args: tuple, kwargs: dict, compile_: Callable[[], Any]) -> Any:
        """``compile_()``, first with the int arguments that changed value traced (see the class
        doc); if that fails, they are static for good and it runs again."""
        new = self.new_traced_ints(args, kwargs)
        if new:
            self.traced_ints |= new
            try:
                return compile_()
            except Exception:  # it needs them as Python values (a shape, a name, a key): specialize on them
                self.traced_ints -= new
                self.static_ints |= new
        return compile_()

    def _positional_names(self) -> list[str]:
        params = list(self.signature.parameters.values()) if self.signature is not None else []
        return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    def key(self, args: tuple, kwargs: dict, static: dict) -> Any:
        """The cache key of dynamic arguments as ``for_trace`` makes them, and the static values."""
        try:
            leaves, treedef = flatten((args, kwargs))
        except TypeError as exc:
            raise argument_error(self.fn, exc) from None
        shapes = tuple(_leaf_key(x) for x in leaves)
        return (_structure_key(treedef), shapes, tuple(sorted((k, _static_key(v)) for k, v in static.items())))

    def describe(self, args: tuple, kwargs: dict, static: dict) -> dict[str, tuple[Any, str]]:
        """Every top-level argument of a call by name: (its part of the cache key, what it was:
        shapes and dtypes, or a static value), for the recompile warning."""
        out: dict[str, tuple[Any, str]] = {}
        for name, v in self._named(args, kwargs):
            try:
                leaves, treedef = flatten(v)
            except TypeError:
                continue
            key = (_structure_key(treedef), tuple(_leaf_key(x) for x in leaves))
            out[name] = (key, _describe_value(v, leaves))
        for name, v in static.items():
            out[name] = (("static", _static_key(v)), f"{v!r} (static)")
        return out

    def number_arguments(self, args: tuple, kwargs: dict) -> list[str]:
        """The names of the dynamic arguments that hold Python floats (traced as values)."""
        return [name for name, v in self._named(args, kwargs) if _has_number(v)]

    def _named(self, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
        positional = self._positional_names()
        named = [(positional[i] if i < len(positional) else f"args[{i}]", v) for i, v in enumerate(args)]
        return [*named, *kwargs.items()]

    def bind(self, static: dict) -> Callable:
        """``fn`` with the static values bound (it keeps ``fn``'s name and source for tracing)."""
        if not static:
            return self.fn
        fn = functools.partial(self.fn, **static)
        functools.update_wrapper(fn, self.fn)
        return fn


def _describe_value(v: Any, leaves: list) -> str:
    if isinstance(v, WeakScalar):
        return f"a Python {'float' if v.dtype.kind == 'f' else 'int'}"
    if len(leaves) == 1 and leaves[0] is v:
        shape, dtype = _leaf_key(v)[:2]
        return f"{np.dtype(dtype).name}{list(shape)}"
    if not leaves:  # a value held in the graph's signature (an int, a string, a bool, None)
        text = repr(v)
        return (text if len(text) <= 40 else text[:37] + "...") + " (static)"
    return f"{len(leaves)} arrays"


def trace_hint(exc: TraceError, number_arguments: list[str]) -> TraceError:
    """``exc`` with a hint when the trace failed on a traced value that had to be a Python value
    and some arguments are Python numbers traced as values (a shape, an axis or a loop count must
    be static)."""
    if not number_arguments or "traced" not in exc.message:
        return exc
    names = ", ".join(map(repr, number_arguments))
    hint = (
        f" (graphc traces Python floats as values, as JAX does: if {names} must be a Python number here,"
        " name it in static_argnames)"
    )
    new = type(exc)(exc.message + hint, exc.loc)
    new.__cause__ = exc.__cause__
    return new


MAX_SPECIALIZATIONS = 64  # compiled specializations kept per function (least recently used dropped first)
RECOMPILE_WARNING_AFTER = 8  # recompiles of one function before a RecompileWarning names the arguments


class Specializations:
    """The compiled specializations of one function by cache key, at most ``limit`` (least
    recently used dropped first), and how often the function was compiled: after its
    ``warn_after``-th recompile a ``RecompileWarning`` (once per function) names the arguments
    that changed between compiles and what they were."""

    def __init__(self, fn_name: str, limit: int = MAX_SPECIALIZATIONS, warn_after: int = RECOMPILE_WARNING_AFTER):
        self.fn_name = fn_name
        self.limit = limit
        self.warn_after = warn_after
        self.compiles = 0
        self._entries: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._last: dict[str, tuple[Any, str]] | None = None
        self._changed: dict[str, list[str]] = {}  # argument -> what it was in each compile it changed in
        self._warned = False

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Any) -> Any:
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
            return hit

    def put(self, key: Any, value: Any, described: dict[str, tuple[Any, str]]) -> None:
        """Keep a newly compiled specialization; ``described``: its arguments (StaticArgs.describe)."""
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.limit:
                self._entries.popitem(last=False)
            self.compiles += 1
            if self._last is not None:
                for name, (k, what) in described.items():
                    old = self._last.get(name)
                    if old is None or old[0] != k:
                        seen = self._changed.setdefault(name, [old[1] if old else "absent"])
                        seen.append(what)
            self._last = described
            message = None
            if self.compiles - 1 >= self.warn_after and not self._warned:
                self._warned = True
                message = self._message()
        if message is not None:
            warnings.warn(message, RecompileWarning, stacklevel=user_stacklevel())

    def _message(self) -> str:
        ranked = sorted(self._changed.items(), key=lambda kv: -len(kv[1]))
        parts = []
        for name, seen in ranked[:3]:
            shown = ", ".join(seen[:3]) + (", ..." if len(seen) > 3 else "")
            parts.append(f"{name!r} changed in {len(seen) - 1} of them ({shown})")
        why = "; ".join(parts) or "no argument changed (the function's static values are unhashable?)"
        return (
            f"{self.fn_name} was compiled {self.compiles} times ({self.compiles - 1} recompiles: each new shape, "
            f"dtype or static value compiles it again; the last {self.limit} are kept): {why}. A value that "
            "changes every call is traced if it is an array or a numpy scalar (np.int64(step)), a Python "
            "float not in static_argnames, or a Python int the function uses only as data (not as a shape, "
            "a loop count or an if); shapes that vary can be padded to a few sizes"
        )


class Jitted:
    def __init__(self, fn: Callable, static_argnames: tuple[str, ...] = (), passes: tuple[str, ...] | None = None):
        self.fn = fn
        self.static = StaticArgs(fn, static_argnames)
        self.static_argnames = self.static.names
        self.passes = passes
        self._cache = Specializations(getattr(fn, "__name__", "the function"))
        # calls with only positional numpy arrays (the common case): (shape, dtype) of each ->
        # the full cache key, so a warm call skips flattening and the key's pytree walk
        # (docs/measurements.md#jit-entry)
        self._fast: dict[tuple, Any] = {}
        self._last_fast: Callable[[tuple], Any] | None = None  # see _fast_entry
        self._promotions_named = False  # a PromotionWarning was given for this function
        self._plain = not self.static.names and self.static.receiver is None  # calls may take the fast path
        self._lock = threading.Lock()
        functools.update_wrapper(self, fn)

    def split_static(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, dict]:
        """(dynamic args, dynamic kwargs, static values) of a call."""
        return self.static.split(args, kwargs)

    def compile(self, *args: Any, **kwargs: Any) -> Compiled:
        """The compiled specialization for these arguments (traced and built on first use)."""
        args, kwargs, static = self.static.split(args, kwargs)
        args, kwargs, _ = traced_random.bind_generators(args, kwargs)  # a Generator stands for its state
        return self._compile(args, kwargs, static)

    def _compile(self, args: tuple, kwargs: dict, static: dict) -> Compiled:
        return self._compile_keyed(args, kwargs, static)[0]

    def _compile_keyed(self, args: tuple, kwargs: dict, static: dict) -> tuple[Compiled, Any]:
        return self.static.trying_traced_ints(args, kwargs, lambda: self._compile_now(args, kwargs, static))

    def _compile_now(self, args: tuple, kwargs: dict, static: dict) -> tuple[Compiled, Any]:
        targs, tkwargs = self.static.for_trace(args, kwargs)
        key = self.static.key(targs, tkwargs, static)
        hit = self._cache.get(key)
        if hit is not None:
            return hit, key
        return self._build(key, targs, tkwargs, args, kwargs, static), key

    def _build(self, key, targs: tuple, tkwargs: dict, args: tuple, kwargs: dict, static: dict) -> Compiled:
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                return hit
            fn = self.static.bind(static)
            seconds: dict[str, float] = {}
            start = time.perf_counter()
            try:
                traced = trace(fn, *targs, **tkwargs)
            except TraceError as exc:
                raise trace_hint(exc, self.static.number_arguments(args, kwargs)) from None
            self.static.check_traced_ints(traced, targs, tkwargs)
            seconds["trace_s"] = time.perf_counter() - start
            if not self._promotions_named:
                sites = promotions(traced)
                if sites:
                    self._promotions_named = True
                    message = promotion_message(getattr(self.fn, "__qualname__", "the function"), sites)
                    warnings.warn(message, PromotionWarning, stacklevel=user_stacklevel())
            start = time.perf_counter()
            optimized = optimize(traced, self.passes)
            seconds["optimize_s"] = time.perf_counter() - start
            compiled = Compiled(traced, optimized, seconds, self.split_static)
            self._cache.put(key, compiled, self.static.describe(targs, tkwargs, static))
            return compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current_context() is not None:  # called inside a trace (grad of a jitted function...): inline
            return on_a_copy(self.fn)(*args, **kwargs)  # (a method's writes to self stay off the object)
        fast = None
        if not kwargs and self._plain and not traced_random.ambient_active():
            entry = self._last_fast  # the last fast call's specialization, with its argument check
            if entry is not None:
                result = entry(args)
                if result is not _MISS:
                    return result
            fast = tuple([(a.shape, a.dtype) for a in args if type(a) is np.ndarray])
            if len(fast) == len(args):
                key = self._fast.get(fast)
                hit = self._cache.get(key) if key is not None else None
                if hit is not None:  # the arguments are the graph's inputs, of its shapes and dtypes
                    self._last_fast = _entry_of(hit, functools.partial(_fast_entry, fast, hit))
                    return hit.run_flat_args(args)
            else:
                fast = None
        args, kwargs, static = self.static.split(args, kwargs)  # once per call
        args, kwargs, generators = traced_random.bind_generators(args, kwargs)  # Generator -> its state
        compiled, key = self._compile_keyed(args, kwargs, static)
        if fast is not None:
            if len(self._fast) >= 4 * MAX_SPECIALIZATIONS:
                self._fast.clear()
            self._fast[fast] = key
        elif not kwargs and not generators and self._plain and not traced_random.ambient_active():
            entry = _entry_of(compiled, lambda: _tree_entry(args, compiled))  # dicts and lists of arrays
            self._last_fast = entry or self._last_fast
        result = compiled.run(args, kwargs)
        if generators:  # each Generator moves past the words the call drew, as numpy's would
            traced_random.advance_generators(compiled.traced, *self.static.for_trace(args, kwargs), generators)
        return result


_MISS = object()


def _entry_of(compiled: Compiled, make: Callable[[], Callable | None]) -> Callable[[tuple], Any] | None:
    """The specialization's generated entry (None: its calls cannot take one), made once: calls
    that alternate between specializations switch entries without generating code again."""
    entry = compiled.__dict__.get("_entry", _MISS)
    if entry is _MISS:
        entry = compiled._entry = make()
    return entry


def _fast_entry(signature: tuple, compiled: Compiled) -> Callable[[tuple], Any]:
    """A call of ``compiled`` for positional ndarrays of these (shape, dtype)s (see ``_entry``)."""
    return _entry([LEAF] * len(signature), compiled)


def _tree_entry(args: tuple, compiled: Compiled) -> Callable[[tuple], Any] | None:
    """``_entry`` for positional arguments that are ndarrays in dicts, lists and tuples (a model's
    parameters), as ``args`` are; None for other calls (numbers, objects, static values)."""
    leaves, tree = flatten(args)
    if not all(type(x) is np.ndarray for x in leaves) or not _containers_only(tree):
        return None
    return _entry(list(tree.children), compiled)


def _containers_only(tree: TreeDef) -> bool:
    if tree.kind == "leaf":
        return True
    if tree.kind == "dict" and not all(type(k) is str for k in tree.keys):  # (1 == 1.0 == True)
        return False
    return tree.kind in ("dict", "list", "tuple") and tree.node is None and all(map(_containers_only, tree.children))


def _entry(trees: list[TreeDef], compiled: Compiled) -> Callable[[tuple], Any]:
    """A call of ``compiled`` as generated Python: it checks that the positional arguments have
    the trees' structure (dict keys in order) with ndarray leaves of the graph's input shapes and
    dtypes, returning ``_MISS`` if not, and runs. It replaces the cache key and
    ``bind_arguments``, which walk the argument tree in Python, by one check of each array
    (docs/measurements.md#jit-entry)."""
    env: dict[str, Any] = {"ndarray": np.ndarray, "MISS": _MISS, "run": compiled.executable.run_arrays}
    lines = ["def entry(args):", f"    if len(args) != {len(trees)}:", "        return MISS"]
    leaves: list[str] = []

    def visit(t: TreeDef, var: str) -> None:
        if t.kind == "leaf":
            k = len(leaves)
            leaves.append(var)
            env[f"s{k}"], env[f"d{k}"] = compiled.graph.inputs[k].type.shape, compiled.graph.inputs[k].type.dtype
            lines.append(f"    if type({var}) is not ndarray or {var}.dtype != d{k} or {var}.shape != s{k}:")
            lines.append("        return MISS")
            return
        n = len(t.children)
        if t.kind == "dict":
            env[f"k{var}"] = t.keys
            lines.append(f"    if type({var}) is not dict or tuple({var}) != k{var}:")
        else:
            lines.append(f"    if type({var}) is not {t.kind} or len({var}) != {n}:")
        lines.append("        return MISS")
        for i, child in enumerate(t.children):
            name = f"{var}_{i}"
            lines.append(f"    {name} = {var}[k{var}[{i}]]" if t.kind == "dict" else f"    {name} = {var}[{i}]")
            visit(child, name)

    if trees:
        lines.append(f"    {', '.join(f'a{i}' for i in range(len(trees)))}, = args")
    for i, t in enumerate(trees):
        visit(t, f"a{i}")
    arrays = f"[{', '.join(leaves)}]"
    if compiled.graph.written_inputs or compiled.graph.global_reads:  # (interpreter.check_call)
        env.update(check=check_call, graph=compiled.graph)
        lines.append(f"    check(graph, {arrays})")
    if compiled._one_result:
        lines += [f"    o = run({arrays})[0]", "    return o if o.ndim else o[()]"]
    else:
        env.update(tree=compiled.graph.out_tree, unflatten=unflatten, result=as_numpy_result, State=StateUpdate)
        lines.append(f"    out = unflatten(tree, [result(o) for o in run({arrays})])")
        lines.append("    return out.apply_to(args, {}) if type(out) is State else out")
    exec(compile("\n".join(lines) + "\n", "<graphc jit entry>", "exec"), env)
    return env["entry"]


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


__all__ = ["Compiled", "Jitted", "Specializations", "StaticArgs", "jit", "trace_hint"]
