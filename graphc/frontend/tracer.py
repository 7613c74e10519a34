"""Tracing: run the user's numpy function on ``Tracer`` objects and record every operation as a Node.

Capture goes through numpy's own protocols (``__array_ufunc__``, ``__array_function__``) and the
Tracer's operators and methods. Each recorded node remembers the user's ``file:line``: the innermost
stack frame that is not inside graphc or numpy. Shape errors raised by an op's rule become
``TraceError`` at that line.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
import operator
import threading
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from graphc.core import dtypes, pytree
from graphc.core.buffers import foreign_semantics
from graphc.core.captured import HeldState, function_of, held_state
from graphc.core.errors import ShapeError, SourceLoc, TraceError, numpy_error
from graphc.core.ir import Node, TensorType, Value, clone_region
from graphc.frontend.autograph import unconverted_reason
from graphc.frontend.locations import (
    call_with_user_errors,
    user_errors,  # noqa: F401  (re-exported: entry.py, autograph_runtime.py)
    user_frame,
    user_location,
)
from graphc.frontend.ndarray_methods import FlatReader, NdarrayMethods
from graphc.ops import REGISTRY, get_op


class _State(threading.local):
    def __init__(self) -> None:  # (runs once in each thread that uses it)
        self.stack: list[TraceContext] = []


_state = _State()
_TYPE = operator.attrgetter("type")  # a Value's type
_asarray = np.asarray  # numpy's own (a trace patches np.asarray, which passes a number on to it: entry.py)


def context_stack() -> list[TraceContext]:
    """This thread's open traces, innermost last (regions traced inside a trace push theirs)."""
    return _state.stack


def current_context() -> TraceContext | None:
    stack = context_stack()
    return stack[-1] if stack else None


class TraceContext:
    """The graph under construction. One per ``trace`` call; contexts nest."""

    def __init__(self, name: str, parent: TraceContext | None = None):
        self.name = name
        self.parent = parent  # set for a region being traced inside another trace
        self.inputs: list[Value] = []
        self.nodes: list[Node] = []
        self.captured: dict[Value, Tracer] = {}  # outer value -> this region's input for it
        self.captured_outer: list[Tracer] = []  # the outer values, in input order
        self._constants: dict[int, tuple[Any, Tracer]] = {}
        self._numbers: dict[tuple[np.dtype, bytes], Value] = {}  # 0-d constants by dtype and bytes
        self._scalars: dict[tuple, Value] = {}  # lift's Python numbers: (type, value, dtype) -> their _numbers value
        self.part: str | None = None  # tag for new nodes (autodiff sets "backward")
        self.loc_override: SourceLoc | None = None  # autodiff: backward nodes keep their forward node's line
        # numpy arrays written with traced values: id -> (array, the Tracer that stands for it), see shadows.py
        self.shadows: dict[int, tuple[np.ndarray, Tracer]] = {}
        # numpy arrays carried into a traced if/loop: id -> (array, the context their shadow is made in)
        self.shadow_homes: dict[int, tuple[np.ndarray, TraceContext]] = {}
        # a region's write log: arrays from outside it written in place, id -> (array, its context and value
        # before the first write); control.py makes their new values outputs of the region and restores them
        self.written: dict[int, tuple[Tracer, TraceContext, Value]] = {}
        # the user functions traced, by id: their globals are read at the trace's end (core/captured.py)
        self.functions: dict[int, Any] = {}
        self.held_before: list[HeldState] = []  # what their globals held before they ran (captured.py)

    def read_function(self, fn: Any) -> None:
        """``fn`` (a user function being traced) reads its globals and closure: remember it, and
        what they hold before it runs (to put back a traced value stored there)."""
        root, func = self.root(), function_of(fn)
        if func is not None and id(func) not in root.functions:
            root.functions[id(func)] = func
            root.held_before.extend(held_state(func))

    def root(self) -> TraceContext:
        """The outermost trace (the function's, not a branch's or a loop body's)."""
        ctx = self
        while ctx.parent is not None:
            ctx = ctx.parent
        return ctx

    def log_write(self, target: Tracer) -> None:
        """``target`` is about to be written in place while this region is traced: remember its value
        before the first such write if it comes from outside the region."""
        if self.parent is None or target._born is self or id(target) in self.written:
            return
        self.written[id(target)] = (target, target._c, target._val)

    @contextlib.contextmanager
    def annotate(self, part: str | None = None, loc: SourceLoc | None = None):
        """Tag the nodes emitted inside the block with ``part`` and (if given) ``loc``."""
        saved = self.part, self.loc_override
        self.part, self.loc_override = part or self.part, loc or self.loc_override
        try:
            yield
        finally:
            self.part, self.loc_override = saved

    def new_input(self, type_: TensorType, name: str) -> Tracer:
        v = Value(type_, None, 0, name)
        self.inputs.append(v)
        return Tracer(self, v)

    def local(self, t: Tracer) -> Tracer:
        """``t`` as a value of this context: a value of an enclosing trace becomes a region input
        (captured once; the control-flow op passes it as an operand)."""
        if t._ctx is self:
            return t
        hit = self.captured.get(t._value)
        if hit is not None:
            return hit
        ancestor = self.parent
        while ancestor is not None and ancestor is not t._ctx:
            ancestor = ancestor.parent
        if ancestor is None:
            raise TraceError(
                "a traced value from another trace (or from a trace that has finished) was used here; "
                "do not keep traced values in globals or closures between traces",
                user_location(),
            )
        assert self.parent is not None  # the ancestor search above found t's trace among them
        outer = self.parent.local(t)  # the parent may itself be a region that must capture it
        inner = Tracer(self, Value(t._value.type, None, 0, None))
        self.inputs.append(inner._value)
        self.captured[t._value] = inner
        self.captured_outer.append(Tracer(outer._ctx, outer._value))  # a snapshot: the object may be updated in place
        inner._weak = t._weak
        return inner

    def emit(self, opname: str, inputs: Sequence[Tracer], attrs: dict, regions: tuple = ()) -> tuple[Tracer, ...]:
        op = REGISTRY.get(opname) or get_op(opname)  # (get_op names an unknown op)
        # ``local(t)._value`` of each operand (a non-view of this trace, nearly every one: its own value)
        values = [t._val if t._root is None and t._c is self else self.local(t)._value for t in inputs]
        out_types = op.infer_types(tuple(map(_TYPE, values)), attrs, regions)
        loc = self.loc_override or user_location()
        node = Node(op, values, attrs, out_types, loc, self.part, regions)
        self.nodes.append(node)
        outs = node.outputs
        if len(outs) == 1:  # (nearly every node)
            return (Tracer(self, outs[0]),)
        return tuple([Tracer(self, v) for v in outs])

    def constant(self, array: np.ndarray) -> Tracer:
        """A constant node for ``array``; the same numpy object traced twice gives one node. A numpy
        array written with traced values (or a view of one) is the Tracer that stands for it now."""
        shadow = HANDLERS.shadow(array) if HANDLERS.shadow is not None else None
        if shadow is not None:
            return shadow
        key = id(array)
        hit = self._constants.get(key)
        if hit is not None and hit[0] is array:
            return hit[1]
        try:
            dtypes.canonical(array.dtype)
        except ShapeError as exc:
            raise TraceError(f"constant array: {exc}", user_location()) from None
        if array.ndim == 0:  # a number: equal ones share one node (what CSE would make of them)
            number = (array.dtype, array.tobytes())
            made = self._numbers.get(number)
            if made is not None:
                return Tracer(self, made)
        (t,) = self.emit("constant", [], {"value": array})
        self._constants[key] = (array, t)
        if array.ndim == 0:
            self._numbers[number] = t._value
        return t


def bind(opname: str, *inputs: Tracer, **attrs: Any) -> Tracer:
    """Emit one single-result primitive in the current trace."""
    (out,) = _context_of(inputs).emit(opname, inputs, attrs)
    return out


def bind_multi(opname: str, *inputs: Tracer, **attrs: Any) -> tuple[Tracer, ...]:
    return _context_of(inputs).emit(opname, inputs, attrs)


def _context_of(inputs) -> TraceContext:
    stack = _state.stack  # (current_context, inline: once per traced op)
    if stack:
        return stack[-1]  # values of enclosing traces are captured by ctx.local
    for t in inputs:
        return t._ctx
    raise RuntimeError("graphc: no active trace")


def lift(x: Any, dtype: np.dtype | None = None) -> Tracer:
    """A Tracer for ``x``: tracers pass through (converted to ``dtype`` if given); numpy arrays,
    numpy scalars, Python numbers and nested lists become constant nodes."""
    if isinstance(x, Tracer):
        return convert(x, dtype) if dtype is not None else x
    ctx = current_context()
    if ctx is None:
        raise RuntimeError("graphc: no active trace")
    if isinstance(x, np.ndarray):
        foreign = foreign_semantics(x)
        if foreign is not None:
            raise TraceError(f"this array is {foreign}", user_location())
        arr = x if dtype is None or x.dtype == dtype else x.astype(dtype)
    else:
        # a nonzero Python number that is not nan (equal ones have equal bits) lifted before: its constant
        plain = type(x) in (int, float) and x and x == x and (dtype is None or isinstance(dtype, np.dtype))
        number = (type(x), x, dtype) if plain else None
        known = ctx._scalars.get(number) if number is not None else None
        if known is not None:
            return Tracer(ctx, known)
        if isinstance(x, (list, tuple)) and contains_tracer(x):
            return array_from_nested(x, dtype)
        try:
            arr = _asarray(x, dtype=dtype)
        except (TypeError, ValueError, OverflowError) as exc:  # (also an instance of numpy's error class)
            message = f"cannot use {type(x).__name__} {x!r} as an array: {exc}"
            raise numpy_error(exc, TraceError, user_location(), message) from None
        if arr.dtype == object:
            raise TraceError(f"cannot use {type(x).__name__} as an array", user_location())
        if number is not None:
            made = ctx.constant(arr)
            ctx._scalars[number] = made._value
            return made
    return ctx.constant(arr)


def result_dtype(*xs: Any) -> np.dtype:
    """numpy's result_type, with Python scalars weak (NEP 50), also next to bfloat16 (where
    numpy with ml_dtypes makes them float64; frontend/ufuncs.py)."""
    parts: list[Any] = []
    for x in xs:
        if isinstance(x, Tracer):
            parts.append(
                (0.0 if x.dtype.kind == "f" else 0 if x.dtype.kind in "iu" else x.dtype) if x._weak else x.dtype
            )
        elif isinstance(x, (list, tuple)):
            parts.append(lift(x).dtype)
        else:
            parts.append(x)
    if any(_is_bfloat16(p) for p in parts):
        parts = [p for p in parts if not (isinstance(p, (int, float)) and not isinstance(p, bool))] or parts
    return dtypes.canonical(np.result_type(*parts))


def _is_bfloat16(x: Any) -> bool:
    """``x`` is the bfloat16 dtype, or a numpy array or scalar of it."""
    dt = x if isinstance(x, np.dtype) else getattr(x, "dtype", None)
    return isinstance(dt, np.dtype) and dt == dtypes.BFLOAT16


def array_from_nested(obj: Any, dtype: Any = None) -> Tracer:
    """``np.array([...])`` whose elements include traced values: stack them (numpy's promotion)."""
    if not isinstance(obj, (list, tuple)):
        return lift(obj, dtype)
    if not obj:
        raise TraceError("np.array of an empty list that holds traced values", user_location())
    items = [array_from_nested(v) for v in obj]
    dt = dtypes.canonical(dtype) if dtype is not None else result_dtype(*items)
    return cast(Tracer, np.stack([lift(t, dt) for t in items]))  # (numpy dispatches the stack to graphc)


def convert(x: Tracer, dtype: Any) -> Tracer:
    dt = dtypes.canonical(dtype)
    if x.dtype == dt:
        return x
    return bind("convert", x, dtype=dt)


# --- where numpy's protocols send traced arrays ----------------------------------------------------


class Handlers:
    """graphc's implementations of numpy on traced arrays, filled by the handler modules when they
    are imported (importing graphc.frontend imports them all): ``functions`` maps a numpy function
    to its implementation (``@implements(np.mean)``), ``ufunc`` takes every ufunc call
    (frontend/ufuncs.py), ``gufuncs`` the ufuncs that are not elementwise (np.matmul), and
    ``getitem`` / ``setitem`` indexing (frontend/indexing.py)."""

    def __init__(self):
        self.functions: dict[Callable, Callable] = {}
        self.gufuncs: dict[np.ufunc, Callable] = {}
        self.ufunc: Callable | None = None
        self.getitem: Callable | None = None
        self.setitem: Callable | None = None  # the new value of x after x[key] = v (frontend/indexing.py)
        self.ufunc_inplace: Callable | None = None  # np.add.at and ufuncs with out= (frontend/indexing.py)
        self.scalar_power: Callable | None = None  # ``**`` of a numpy scalar (frontend/ufuncs.py)
        self.methods: dict[str, Callable] = {}  # ndarray methods Tracer does not define: name -> fn(self, ...)
        self.hints: dict[str, str] = {}  # "numpy.nonzero", "ndarray.nonzero" -> the supported rewrite
        self.library: Callable | None = None  # fn, args, kwargs -> graphc's replacement of a library function
        self.library_ufunc: Callable | None = None  # a library's ufunc (scipy.special.erf) -> impl(ufunc, *inputs)
        # views (frontend/views.py): x[key] of a traced array as numpy returns it (a view or a copy), and
        # the results of the functions in VIEW_FUNCTIONS as views of their arguments
        self.index_view: Callable | None = None  # (x, key, result) -> result
        self.function_views: Callable | None = None  # (func, result, args) -> result
        # the Tracer that stands for a numpy array written with traced values, or None (frontend/shadows.py)
        self.shadow: Callable | None = None


HANDLERS = Handlers()


def registered_handler(fn: Callable | None, what: str) -> Callable:
    """``fn``, a handler slot of HANDLERS, checked to be filled (``what`` names it if not)."""
    if fn is None:  # pragma: no cover - importing graphc.frontend registers every handler
        raise RuntimeError(f"graphc: no handler for {what} is registered; import graphc.frontend")
    return fn


def implements(*funcs: Callable):
    """Register the decorated function as graphc's implementation of the numpy functions ``funcs``."""

    def register(handler: Callable) -> Callable:
        for f in funcs:
            HANDLERS.functions[f] = handler
        return handler

    return register


# numpy returns views of the first argument (of each argument: broadcast_arrays, atleast_Nd) from
# these (np.reshape and np.ravel: when the layout allows it); see frontend/views.py
VIEW_FUNCTIONS = {
    np.reshape,
    np.ravel,
    np.transpose,
    np.swapaxes,
    np.moveaxis,
    np.expand_dims,
    np.squeeze,
    np.broadcast_to,
    np.broadcast_arrays,
    np.split,
    np.array_split,
    np.flip,
    np.atleast_1d,
    np.atleast_2d,
    np.atleast_3d,
    np.asarray,
}


# numpy functions that return a 0-d array (not a numpy scalar) for a 0-d result (with VIEW_FUNCTIONS)
ARRAY_FUNCTIONS = {
    np.copy,
    np.where,
    np.tensordot,
    np.tile,
    np.pad,
    np.full_like,
    np.zeros_like,
    np.ones_like,
    np.empty_like,
    np.broadcast_arrays,
    np.take_along_axis,
    np.array,
}


# numpy functions that call the method of their first argument, which a numpy scalar implements
# returning a numpy scalar
_SCALAR_METHODS = {np.reshape, np.transpose, np.squeeze}


def handle_function(func: Callable, args: tuple, kwargs: dict):
    """A numpy function called on traced arrays (``__array_function__``)."""
    handler = HANDLERS.functions.get(func)
    if handler is None:
        mod = getattr(func, "__module__", "numpy") or "numpy"
        mod = "numpy" if mod.startswith("numpy._core") or mod == "numpy" else mod
        name = f"{mod}.{func.__name__}"
        raise TraceError(f"{name} is not supported by graphc{HANDLERS.hints.get(name, '')}", user_location())
    result = handler(*args, **kwargs)
    if func in VIEW_FUNCTIONS:
        result = registered_handler(HANDLERS.function_views, "views")(func, result, args)
    elif isinstance(result, Tracer) and any(result is a for a in args):
        result = fresh(result)  # numpy returned a new array (np.copy, a no-op np.pad, ...)
    if func not in VIEW_FUNCTIONS and func not in ARRAY_FUNCTIONS and kwargs.get("out") is None:
        mark_scalars(result)  # (with out=, numpy returns the out array, 0-d or not)
    elif func in _SCALAR_METHODS and args and isinstance(args[0], Tracer) and args[0]._scalar:
        mark_scalars(result)  # np.reshape(s, ()) of a numpy scalar calls its method: a numpy scalar
    return result


def mark_scalars(result: Any) -> None:
    """numpy returns the 0-d results of ufuncs and of most functions as numpy scalars."""
    for r in result if isinstance(result, (list, tuple)) else (result,):
        if isinstance(r, Tracer) and not r.shape:
            r._scalar = True


def contains_tracer(x: Any) -> bool:
    """Whether ``x`` is a traced array or a (nested) list or tuple holding one."""
    if isinstance(x, Tracer):
        return True
    if isinstance(x, (list, tuple)):
        return any(contains_tracer(v) for v in x)
    return False


def _control_flow_error(what: str) -> TraceError:
    frame = user_frame()
    loc = user_location()
    reason = None
    if frame is not None:
        reason = unconverted_reason(frame.f_code)
        if reason is None and frame.f_code.co_flags & inspect.CO_GENERATOR:
            reason = "it is a generator, which graphc does not transform"
    if frame is not None and reason is not None:
        return TraceError(
            f"{what} of a traced array in {frame.f_code.co_name}: graphc turns `if`/`while` on traced values into "
            f"graph control flow by transforming a function's source, but {reason}. Define the function in a "
            "file, or use np.where / graphc.cond instead",
            loc,
        )
    return TraceError(
        f"{what} of a traced array: its value is not known while tracing. bool(), int(), float(), .item() and "
        "Python control flow that graphc cannot transform here need a concrete value; use np.where or keep such "
        "decisions on static (non-array) arguments",
        loc,
    )


class Tracer(NdarrayMethods):
    """Stands in for a numpy array while tracing. Supports numpy's protocols and ndarray's common
    operators, attributes and methods; each operation is recorded in the trace."""

    __array_priority__ = 1000
    __slots__ = ("_c", "_val", "_root", "_steps", "_layout", "_version", "_born", "_weak", "_scalar", "__weakref__")

    def __init__(self, ctx: TraceContext, value: Value, weak: bool = False):
        self._c = ctx  # the trace that holds the value (read through _ctx)
        self._val = value  # the current value (read through _value)
        # a weak array stands for a Python number (a loop counter, a range index): in numpy's
        # promotion it counts like a Python scalar, so i * x32 stays float32 (NEP 50)
        self._weak = weak
        # a 0-d value that numpy would hold as a numpy scalar (the 0-d result of a ufunc, a reduction
        # or an integer index), not a 0-d array: its ** has no fast path and += makes a new object
        self._scalar = False
        # a view (frontend/views.py): the array whose memory numpy's view would show (not itself a
        # view), the steps that compute the view from it, and a stand-in for numpy's strides
        self._root: Tracer | None = None
        self._steps: tuple = ()
        self._layout: np.ndarray | None = None  # (computed when first asked for: views.layout)
        # an array: bumped by every in-place write; a view: the root's version its value was computed at
        self._version = 0
        stack = _state.stack
        self._born = stack[-1] if stack else ctx  # the trace this array object was made in (see rebind)

    @property
    def _value(self) -> Value:
        """The current value; a view whose root was written since is computed again from the root."""
        root = self._root
        if root is not None and self._version != root._version:
            _sync_view(self)
        return self._val

    @property
    def _ctx(self) -> TraceContext:
        root = self._root
        if root is not None and self._version != root._version:
            _sync_view(self)
        return self._c

    # --- numpy protocols -------------------------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        return call_with_user_errors(registered_handler(HANDLERS.ufunc, "ufunc"), ufunc, method, *inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        return call_with_user_errors(handle_function, func, args, kwargs)

    def __array__(self, dtype=None, copy=None):
        raise TraceError(
            "numpy needed the concrete value of a traced array here. This happens when a numpy array "
            "(not a traced one) is indexed with a traced index, as in table[idx] (use np.take(table, idx, axis=0)), "
            "when a traced value is stored into a numpy array (x[i] = traced), or when a library converts "
            "its input with np.asarray outside the traced function",
            user_location(),
        )

    # --- static attributes -----------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._val.type.shape  # (a view's shape and dtype never change: no need to bring it up to date)

    @property
    def dtype(self) -> np.dtype:
        return self._val.type.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return self._val.type.size

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self._val.type.nbytes

    @property
    def T(self) -> Tracer:
        return cast(Tracer, np.transpose(self))  # (a 1-d or 0-d array is its own transpose, as in numpy)

    @property
    def flat(self) -> FlatReader:
        return FlatReader(self)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __repr__(self) -> str:
        return f"Tracer<{self._val.type}>"

    # --- concrete values are not available ---------------------------------------------------
    def __bool__(self):
        raise _control_flow_error("bool()")

    def __int__(self):
        raise _control_flow_error("int()")

    def __float__(self):
        raise _control_flow_error("float()")

    def __index__(self):
        raise _control_flow_error("use as a Python index")

    def __complex__(self):
        raise _control_flow_error("complex()")

    def item(self, *args):
        raise TraceError(
            ".item() of a traced array: it would turn the array into a Python number, whose value is not known "
            "while tracing. Keep the 0-d array instead (drop .item(), or use x[()] / x.reshape(())), or call "
            ".item() on the result outside the traced function",
            user_location(),
        )

    def tolist(self):
        raise TraceError(
            ".tolist() of a traced array: it would turn the array into Python numbers, whose values are not known "
            "while tracing. Keep the array (index it, or iterate over it: for row in x), or call .tolist() on the "
            "result outside the traced function",
            user_location(),
        )

    def __hash__(self):
        return id(self)

    # --- operators that need more than numpy's function (the rest: frontend/ndarray_methods.py) ---
    def __pow__(self, o):
        return _power_op(self, o)(self, o)

    def __ipow__(self, o):
        return self._inplace(_power_op(self, o), o)

    def _inplace(self, ufunc, other):
        return call_with_user_errors(_inplace_update, self, ufunc, other)

    def __getitem__(self, key):
        result = call_with_user_errors(registered_handler(HANDLERS.getitem, "indexing"), self, key)
        if not result.shape and not any(k is Ellipsis for k in (key if isinstance(key, tuple) else (key,))):
            result = fresh(result) if result is self else result
            result._scalar = True  # x[0] of a vector, x[()]: a numpy scalar (x[0, ...] is a 0-d view)
            return result
        return registered_handler(HANDLERS.index_view, "views")(self, key, result)  # basic indexing gives a view

    def __getattr__(self, name):
        if name.startswith("__"):  # protocol probes (numpy asks for __array_struct__ etc.)
            raise AttributeError(name)
        method = HANDLERS.methods.get(name)
        if method is not None:
            return functools.partial(method, self)
        if hasattr(np.ndarray, name):
            hint = HANDLERS.hints.get(f"ndarray.{name}", "")
            raise TraceError(f"ndarray.{name} is not supported by graphc{hint}", user_location())
        raise AttributeError(f"'Tracer' object has no attribute {name!r}")

    def __setitem__(self, key, value):
        call_with_user_errors(_setitem, self, key, value)

    # --- methods that make copies (the rest: frontend/ndarray_methods.py) ---------------------
    def flatten(self, order="C"):
        return fresh(cast(Tracer, np.reshape(self, (-1,), order=order)))  # (a copy)

    def ravel(self, order="C"):
        return np.ravel(self, order=order)

    def copy(self, order="C"):
        return _like_scalar(fresh(self), self)

    def astype(self, dtype, copy=True):
        result = call_with_user_errors(convert, self, dtype)
        if result is self and not copy:  # numpy returns the array itself when no conversion is needed
            return self
        return _like_scalar(fresh(result) if result is self else result, self)


def _power_op(base: Tracer, exponent: Any) -> Callable[[Any, Any], Any]:
    """What ``ndarray ** exponent`` calls: numpy's ``**`` takes a faster ufunc for some Python-number
    exponents, which differs from np.power in dtype or value (its fast_scalar_power): ``** 2`` is
    np.square for every dtype (``bool_array ** 2`` is int8, not int64), and on floats ``** -1`` is
    np.reciprocal and ``** 0.5`` np.sqrt (``float16 ** 0.5`` of -0.0 is -0.0). Exactly int and
    float only: ``** True`` and ``** np.int64(2)`` are np.power. Called as ``op(base, exponent)``."""
    if base._scalar:  # a numpy scalar's ** is np.power (for floats its pow, without fast paths)
        return functools.partial(call_with_user_errors, registered_handler(HANDLERS.scalar_power, "scalar power"))
    fast: np.ufunc | None = None
    if type(exponent) is int and exponent == 2:
        fast = np.square
    elif base.dtype.kind == "f" and not base._weak:  # (numpy files bfloat16 under "V": no fast path)
        if type(exponent) is int and exponent == -1:
            fast = np.reciprocal
        elif type(exponent) is float and exponent == 0.5:
            fast = np.sqrt
    if fast is None:
        return np.power
    unary = fast

    def op(x: Any, _exponent: Any) -> Any:
        return unary(x)

    op.__name__ = unary.__name__  # (named in in-place casting errors, as numpy names it)
    return op


def _like_scalar(result: Tracer, source: Tracer) -> Tracer:
    """A numpy scalar's copy() and astype() are numpy scalars."""
    result._scalar = source._scalar
    return result


def fresh(t: Tracer) -> Tracer:
    """A new array object with the same value (numpy's copies: in-place updates of it must not
    reach the original object)."""
    value = t._value  # (first: a view is brought up to date)
    return Tracer(t._c, value, t._weak)


_VERSIONS = itertools.count(1)


def _sync_view(view: Tracer) -> None:
    """Compute ``view`` again from its root, which was written in place since. The nodes go into
    the trace that holds the root's value (an enclosing one, when the view is read inside a branch
    or loop body), so that the view's value stays usable there after the region."""
    root = view._root
    assert root is not None
    home = root._c
    with emitting_in(home):
        t = Tracer(home, root._val)
        for step in view._steps:
            t = step.read(t)
    view._c, view._val, view._version = t._c, t._val, root._version


@contextlib.contextmanager
def emitting_in(ctx: TraceContext):
    """New nodes go into ``ctx``, an active trace (the current one or one it is nested in): a
    value computed there stays usable after the branch or loop body being traced now."""
    stack = context_stack()
    if ctx not in stack:
        raise TraceError(
            "a traced array from another trace (or from a trace that has finished) was used here; "
            "do not keep traced values in globals or closures between traces",
            user_location(),
        )
    pushed = stack[-1] is not ctx
    if pushed:
        stack.append(ctx)
    try:
        yield
    finally:
        if pushed:
            stack.pop()


def rebind(target: Tracer, new: Tracer) -> Tracer:
    """numpy's in-place write into ``target``: the Tracer object itself takes the new value, so every
    name holding it sees the update (``x[i] = v``, ``x += v``, ``out=``). Writing into a view writes
    into its root through the view's steps backwards (a transpose transposed back, a slice's region
    updated, ...), and every view of that root is computed again when it is next read. Inside a
    traced branch or loop body, arrays from outside it are logged (TraceContext.log_write), so that
    control.py makes their new values outputs of the region."""
    value = new._value
    if target._root is not None:
        _write_through(target, new)
        return target
    ctx = current_context()
    if ctx is not None:
        ctx.log_write(target)
    target._c, target._val = new._c, value  # (a branch's write into an outer array is logged above)
    target._version = next(_VERSIONS)
    return target


def restore(target: Tracer, ctx: TraceContext, value: Value) -> None:
    """Give an array (not a view) back a value it had (control.py, at the end of a region)."""
    target._c, target._val = ctx, value
    target._version = next(_VERSIONS)


def _write_through(view: Tracer, new: Tracer) -> None:
    """``view`` takes the value ``new``: compute its root's new value through the steps backwards."""
    root = view._root
    assert root is not None
    for step in view._steps:
        step.check_writable()
    bases = [Tracer(root._c, root._val)]
    for step in view._steps[:-1]:
        bases.append(step.read(bases[-1]))
    written = new
    for step, base in zip(reversed(view._steps), reversed(bases)):
        written = step.write(base, written)
    rebind(root, written)
    value = new._value
    view._c, view._val, view._version = new._c, value, root._version


def _setitem(target: Tracer, key: Any, value: Any) -> None:
    if target._weak or target._scalar:
        raise TraceError("a numpy scalar does not support item assignment (numpy raises here too)", user_location())
    rebind(target, registered_handler(HANDLERS.setitem, "indexing")(target, key, value))


def _inplace_update(target: Tracer, ufunc, other) -> Tracer:
    if target._weak or target._scalar:  # a Python number or numpy scalar: += makes a new object
        return ufunc(target, other)
    result = ufunc(target, other)  # through __array_ufunc__: numpy's type resolution
    if result.shape != target.shape:
        raise TraceError(
            f"non-broadcastable output operand with shape {target.shape} doesn't match the broadcast shape "
            f"{result.shape} (numpy raises here too)",
            user_location(),
        )
    if not np.can_cast(result.dtype, target.dtype, "same_kind"):
        raise TraceError(
            f"Cannot cast ufunc '{ufunc.__name__}' output from {result.dtype} to {target.dtype} "
            "with casting rule 'same_kind' (numpy raises here too)",
            user_location(),
        )
    return rebind(target, convert(result, target.dtype))


pytree.register_array_type(Tracer)


def emit_block(
    ctx: TraceContext, inputs: list[Value], nodes: list[Node], outputs: list[Value], args: list[Tracer]
) -> list[Tracer]:
    """Emit a block's nodes (a graph body or a region) again on ``args`` in ``ctx``; nested
    regions are copied, since a region may appear only once in a graph."""
    env: dict[Value, Tracer] = dict(zip(inputs, args))
    for node in nodes:
        with ctx.annotate(loc=node.loc):
            outs = ctx.emit(
                node.op.name, [env[v] for v in node.inputs], node.attrs, tuple(clone_region(r) for r in node.regions)
            )
        env.update(zip(node.outputs, outs))
    return [env[v] for v in outputs]
