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
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from graphc import dtypes
from graphc.errors import ShapeError, SourceLoc, TraceError
from graphc.ir import Graph, Node, TensorType, Value
from graphc.ops import get_op
from graphc.pytree import ArraySpec, flatten, leaf_paths, unflatten

_GRAPHC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_NUMPY_DIR = os.path.dirname(os.path.abspath(np.__file__)) + os.sep
_state = threading.local()


def _ctx_stack() -> list[TraceContext]:
    if not hasattr(_state, "stack"):
        _state.stack = []
    return _state.stack


def current_context() -> TraceContext | None:
    stack = _ctx_stack()
    return stack[-1] if stack else None


@functools.lru_cache(maxsize=4096)
def _display_path(filename: str) -> str:
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def _is_internal(filename: str) -> bool:
    return filename.startswith(_GRAPHC_DIR) or filename.startswith(_NUMPY_DIR) or filename.startswith("<__array_function__")


def user_location() -> SourceLoc | None:
    """The innermost frame outside graphc and numpy: the user's line that is being traced."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _is_internal(os.path.abspath(filename) if not filename.startswith("<") else filename):
            return SourceLoc(_display_path(filename), frame.f_lineno)
        frame = frame.f_back
    return None


def user_errors(fn: Callable) -> Callable:
    """Entry points from user code: turn op-rule failures into TraceError at the user's line."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TraceError as exc:
            if exc.loc is None:
                raise TraceError(exc.message, user_location()) from None
            raise
        except ShapeError as exc:
            raise TraceError(str(exc), user_location()) from None

    return wrapper


class TraceContext:
    """The graph under construction. One per ``trace`` call; contexts nest."""

    def __init__(self, name: str):
        self.name = name
        self.inputs: list[Value] = []
        self.nodes: list[Node] = []
        self._constants: dict[int, tuple[Any, Tracer]] = {}

    def new_input(self, type_: TensorType, name: str) -> Tracer:
        v = Value(type_, None, 0, name)
        self.inputs.append(v)
        return Tracer(self, v)

    def emit(self, opname: str, inputs: list[Tracer], attrs: dict[str, Any]) -> tuple[Tracer, ...]:
        op = get_op(opname)
        for t in inputs:
            if t._ctx is not self:
                raise TraceError(
                    "a traced value from another trace (or from a trace that has finished) was used here; "
                    "do not keep traced values in globals or closures between traces",
                    user_location(),
                )
        out_types = op.infer_types(tuple(t._value.type for t in inputs), attrs)
        node = Node(op, [t._value for t in inputs], attrs, out_types, user_location())
        self.nodes.append(node)
        return tuple(Tracer(self, v) for v in node.outputs)

    def constant(self, array: np.ndarray) -> Tracer:
        """A constant node for ``array``; the same numpy object traced twice gives one node."""
        key = id(array)
        hit = self._constants.get(key)
        if hit is not None and hit[0] is array:
            return hit[1]
        try:
            dtypes.canonical(array.dtype)
        except ShapeError as exc:
            raise TraceError(f"constant array: {exc}", user_location()) from None
        (t,) = self.emit("constant", [], {"value": array})
        self._constants[key] = (array, t)
        return t


def bind(opname: str, *inputs: Tracer, **attrs: Any) -> Tracer:
    """Emit one single-result primitive in the current trace."""
    (out,) = _context_of(inputs).emit(opname, list(inputs), attrs)
    return out


def bind_multi(opname: str, *inputs: Tracer, **attrs: Any) -> tuple[Tracer, ...]:
    return _context_of(inputs).emit(opname, list(inputs), attrs)


def _context_of(inputs) -> TraceContext:
    for t in inputs:
        return t._ctx
    ctx = current_context()
    if ctx is None:
        raise RuntimeError("graphc: no active trace")
    return ctx


def lift(x: Any, dtype: np.dtype | None = None) -> Tracer:
    """A Tracer for ``x``: tracers pass through (converted to ``dtype`` if given); numpy arrays,
    numpy scalars, Python numbers and nested lists become constant nodes."""
    if isinstance(x, Tracer):
        return convert(x, dtype) if dtype is not None else x
    ctx = current_context()
    if ctx is None:
        raise RuntimeError("graphc: no active trace")
    if isinstance(x, np.ndarray):
        arr = x if dtype is None or x.dtype == dtype else x.astype(dtype)
    else:
        if isinstance(x, (list, tuple)) and _contains_tracer(x):
            from graphc.frontend.functions import array_from_nested

            return array_from_nested(x, dtype)
        try:
            arr = np.asarray(x, dtype=dtype)
        except (TypeError, ValueError) as exc:
            raise TraceError(f"cannot use {type(x).__name__} {x!r} as an array: {exc}", user_location()) from None
        if arr.dtype == object:
            raise TraceError(f"cannot use {type(x).__name__} as an array", user_location())
    return ctx.constant(arr)


def convert(x: Tracer, dtype: Any) -> Tracer:
    dt = dtypes.canonical(dtype)
    if x.dtype == dt:
        return x
    return bind("convert", x, dtype=dt)


def _contains_tracer(x: Any) -> bool:
    if isinstance(x, Tracer):
        return True
    if isinstance(x, (list, tuple)):
        return any(_contains_tracer(v) for v in x)
    return False


def _control_flow_error(what: str) -> TraceError:
    return TraceError(
        f"{what} of a traced array: its value is not known while tracing. Python `if`, `while`, "
        "`and`/`or`, bool(), int(), float() and .item() need a concrete value; use np.where or "
        "keep such decisions on static (non-array) arguments",
        user_location(),
    )


class Tracer:
    """Stands in for a numpy array while tracing. Supports numpy's protocols and ndarray's common
    operators, attributes and methods; each operation is recorded in the trace."""

    __array_priority__ = 1000
    __slots__ = ("_ctx", "_value")

    def __init__(self, ctx: TraceContext, value: Value):
        self._ctx = ctx
        self._value = value

    # --- numpy protocols -------------------------------------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        from graphc.frontend.ufuncs import handle_ufunc

        return user_errors(handle_ufunc)(ufunc, method, *inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        from graphc.frontend.functions import handle_function

        return user_errors(handle_function)(func, args, kwargs)

    def __array__(self, dtype=None, copy=None):
        raise _control_flow_error("a concrete numpy array was requested (np.asarray / np.array)")

    # --- static attributes -----------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._value.type.shape

    @property
    def dtype(self) -> np.dtype:
        return self._value.type.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return self._value.type.size

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self._value.type.nbytes

    @property
    def T(self) -> Tracer:
        return np.transpose(self)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __repr__(self) -> str:
        return f"Tracer<{self._value.type}>"

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
        raise _control_flow_error(".item()")

    def tolist(self):
        raise _control_flow_error(".tolist()")

    def __hash__(self):
        return id(self)

    # --- operators ---------------------------------------------------------------------------
    def __add__(self, o): return np.add(self, o)  # noqa: E704
    def __radd__(self, o): return np.add(o, self)  # noqa: E704
    def __sub__(self, o): return np.subtract(self, o)  # noqa: E704
    def __rsub__(self, o): return np.subtract(o, self)  # noqa: E704
    def __mul__(self, o): return np.multiply(self, o)  # noqa: E704
    def __rmul__(self, o): return np.multiply(o, self)  # noqa: E704
    def __truediv__(self, o): return np.true_divide(self, o)  # noqa: E704
    def __rtruediv__(self, o): return np.true_divide(o, self)  # noqa: E704
    def __pow__(self, o): return np.power(self, o)  # noqa: E704
    def __rpow__(self, o): return np.power(o, self)  # noqa: E704
    def __matmul__(self, o): return np.matmul(self, o)  # noqa: E704
    def __rmatmul__(self, o): return np.matmul(o, self)  # noqa: E704
    def __neg__(self): return np.negative(self)  # noqa: E704
    def __pos__(self): return self  # noqa: E704
    def __abs__(self): return np.absolute(self)  # noqa: E704
    def __invert__(self): return np.invert(self)  # noqa: E704
    def __and__(self, o): return np.bitwise_and(self, o)  # noqa: E704
    def __rand__(self, o): return np.bitwise_and(o, self)  # noqa: E704
    def __or__(self, o): return np.bitwise_or(self, o)  # noqa: E704
    def __ror__(self, o): return np.bitwise_or(o, self)  # noqa: E704
    def __lt__(self, o): return np.less(self, o)  # noqa: E704
    def __le__(self, o): return np.less_equal(self, o)  # noqa: E704
    def __gt__(self, o): return np.greater(self, o)  # noqa: E704
    def __ge__(self, o): return np.greater_equal(self, o)  # noqa: E704
    def __eq__(self, o): return np.equal(self, o)  # noqa: E704
    def __ne__(self, o): return np.not_equal(self, o)  # noqa: E704

    def __floordiv__(self, o): return np.floor_divide(self, o)  # noqa: E704
    def __mod__(self, o): return np.remainder(self, o)  # noqa: E704

    def __getitem__(self, key):
        from graphc.frontend.indexing import getitem

        return user_errors(getitem)(self, key)

    def __setitem__(self, key, value):
        raise TraceError(
            "in-place assignment into an array (x[...] = v) is not supported while tracing; "
            "build the result with np.where, np.concatenate or np.stack instead",
            user_location(),
        )

    # --- methods (all routed through numpy so each rule lives in one place) -------------------
    def reshape(self, *shape, order="C"):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return np.reshape(self, shape, order=order)

    def transpose(self, *axes):
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return np.transpose(self, axes or None)

    def swapaxes(self, a, b): return np.swapaxes(self, a, b)  # noqa: E704
    def squeeze(self, axis=None): return np.squeeze(self, axis)  # noqa: E704
    def flatten(self, order="C"): return np.reshape(self, (-1,), order=order)  # noqa: E704
    def ravel(self, order="C"): return np.reshape(self, (-1,), order=order)  # noqa: E704
    def copy(self, order="C"): return self  # noqa: E704  (values are immutable in the graph)
    def dot(self, b): return np.dot(self, b)  # noqa: E704
    def clip(self, min=None, max=None): return np.clip(self, min, max)  # noqa: E704
    def repeat(self, repeats, axis=None): return np.repeat(self, repeats, axis)  # noqa: E704
    def take(self, indices, axis=None): return np.take(self, indices, axis)  # noqa: E704

    def sum(self, axis=None, dtype=None, keepdims=False): return np.sum(self, axis, dtype, keepdims=keepdims)  # noqa: E704
    def mean(self, axis=None, dtype=None, keepdims=False): return np.mean(self, axis, dtype, keepdims=keepdims)  # noqa: E704
    def max(self, axis=None, keepdims=False): return np.max(self, axis, keepdims=keepdims)  # noqa: E704
    def min(self, axis=None, keepdims=False): return np.min(self, axis, keepdims=keepdims)  # noqa: E704
    def argmax(self, axis=None, keepdims=False): return np.argmax(self, axis, keepdims=keepdims)  # noqa: E704
    def argmin(self, axis=None, keepdims=False): return np.argmin(self, axis, keepdims=keepdims)  # noqa: E704
    def all(self, axis=None, keepdims=False): return np.all(self, axis, keepdims=keepdims)  # noqa: E704
    def any(self, axis=None, keepdims=False): return np.any(self, axis, keepdims=keepdims)  # noqa: E704

    def var(self, axis=None, dtype=None, ddof=0, keepdims=False):
        return np.var(self, axis, dtype, ddof=ddof, keepdims=keepdims)

    def std(self, axis=None, dtype=None, ddof=0, keepdims=False):
        return np.std(self, axis, dtype, ddof=ddof, keepdims=keepdims)

    def astype(self, dtype, copy=True):
        return user_errors(convert)(self, dtype)


# --- numpy entry points that do not dispatch on their argument: patched while tracing ----------

_PATCHED = ("asarray", "array", "asanyarray", "ascontiguousarray")
_patch_lock = threading.Lock()
_patch_depth = 0
_originals: dict[str, Callable] = {}


def _make_patch(name: str, original: Callable) -> Callable:
    @functools.wraps(original)
    def patched(obj, *args, **kwargs):
        if current_context() is not None and _contains_tracer(obj):
            dtype = kwargs.get("dtype", args[0] if args else None)
            return user_errors(lift)(obj, None if dtype is None else dtypes.canonical(dtype))
        return original(obj, *args, **kwargs)

    return patched


@contextlib.contextmanager
def numpy_patches():
    """While any thread traces, ``np.asarray(tracer)`` and ``np.array([tracer, ...])`` return
    tracers (other threads, and calls without tracers, reach numpy unchanged)."""
    global _patch_depth
    with _patch_lock:
        if _patch_depth == 0:
            for name in _PATCHED:
                _originals[name] = getattr(np, name)
                setattr(np, name, _make_patch(name, _originals[name]))
        _patch_depth += 1
    try:
        yield
    finally:
        with _patch_lock:
            _patch_depth -= 1
            if _patch_depth == 0:
                for name in _PATCHED:
                    setattr(np, name, _originals.pop(name))


# --- trace ---------------------------------------------------------------------------------------


def _input_names(fn: Callable, args: tuple, kwargs: dict) -> list[str]:
    """A readable name per array leaf: the parameter name followed by the dict keys / indices."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_pos = next((p.name for p in params if p.kind == p.VAR_POSITIONAL), "args")
    _, treedef = flatten((args, kwargs))
    names = []
    for path in leaf_paths(treedef):
        top, first, *rest = path
        if top == 0:
            head = positional[first] if first < len(positional) else f"{var_pos}{first - len(positional)}"
        else:
            head = str(first)
        names.append(".".join([head, *map(str, rest)]))
    return names


def _input_type(leaf: Any, name: str) -> TensorType:
    if isinstance(leaf, ArraySpec):
        shape, dt = leaf.shape, leaf.dtype
    else:
        arr = np.asarray(leaf)
        shape, dt = arr.shape, arr.dtype
    try:
        return TensorType(shape, dtypes.canonical(dt))
    except ShapeError as exc:
        raise TraceError(f"argument {name}: {exc}") from None


def trace(fn: Callable, *args: Any, **kwargs: Any) -> Graph:
    """Trace ``fn(*args, **kwargs)`` into a Graph.

    Array leaves of the argument pytrees (numpy arrays, numpy scalars, ``ArraySpec``) become graph
    inputs; every other leaf (int, float, bool, str, None) is static and recorded in the signature.
    """
    try:
        leaves, in_tree = flatten((args, kwargs))
    except TypeError as exc:
        raise TraceError(f"cannot trace {getattr(fn, '__name__', fn)}: {exc}") from None
    name = getattr(fn, "__name__", "fn")
    ctx = TraceContext(name if name.isidentifier() else "fn")
    names = _input_names(fn, args, kwargs)
    tracers = [ctx.new_input(_input_type(leaf, n), n) for leaf, n in zip(leaves, names)]
    targs, tkwargs = unflatten(in_tree, tracers)
    stack = _ctx_stack()
    stack.append(ctx)
    try:
        with numpy_patches():
            result = fn(*targs, **tkwargs)
            try:
                out_leaves, out_tree = flatten(result, is_leaf=lambda x: isinstance(x, Tracer), path="result")
            except TypeError as exc:
                raise TraceError(f"{name} returned something graphc cannot represent: {exc}") from None
            outputs = [user_errors(lift)(leaf)._value for leaf in out_leaves]
            for leaf in out_leaves:
                if isinstance(leaf, Tracer) and leaf._ctx is not ctx:
                    raise TraceError(f"{name} returned a traced value from another trace")
    finally:
        stack.pop()
    graph = Graph(ctx.name, ctx.inputs, ctx.nodes, outputs, in_tree, out_tree)
    return graph
