"""The operations of the fuzzed programs: plain numpy code, run by numpy and traced by graphc.

Each ``op_*`` takes its static arguments first and its operands (pool values or literals) last, and
returns one new value; ``OPS`` names them. A step never changes an operand: the in-place steps
write into a fresh buffer they make first (a copy of an operand, or ``np.zeros``), so the pool of
values a program builds stays as numpy computed it, and the inputs are never written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

UNARY_UFUNCS = {
    "negative": np.negative,
    "absolute": np.absolute,
    "positive": np.positive,
    "exp": np.exp,
    "log": np.log,
    "log1p": np.log1p,
    "expm1": np.expm1,
    "sqrt": np.sqrt,
    "tanh": np.tanh,
    "sin": np.sin,
    "cos": np.cos,
    "sign": np.sign,
    "square": np.square,
    "logical_not": np.logical_not,
    "isnan": np.isnan,
    "isinf": np.isinf,
    "isfinite": np.isfinite,
    "exp2": np.exp2,
    "log2": np.log2,
}
FLOAT_ONLY = {"reciprocal": np.reciprocal}  # (numpy's integer reciprocal truncates: graphc rejects it)
BINARY_UFUNCS = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "true_divide": np.true_divide,
    "power": np.power,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "equal": np.equal,
    "not_equal": np.not_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
    "logaddexp": np.logaddexp,
}
INT_ONLY = {"floor_divide": np.floor_divide, "remainder": np.remainder}  # (floats: graphc rejects them)
BOOL_ONLY = {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor}
UFUNCS = {**UNARY_UFUNCS, **FLOAT_ONLY, **BINARY_UFUNCS, **INT_ONLY, **BOOL_ONLY}


def _operator(name: str) -> Callable:
    table = {
        "+": lambda a, b: a + b,
        "-": lambda a, b: a - b,
        "*": lambda a, b: a * b,
        "/": lambda a, b: a / b,
        "**": lambda a, b: a**b,
        "<": lambda a, b: a < b,
        ">=": lambda a, b: a >= b,
        "==": lambda a, b: a == b,
        "!=": lambda a, b: a != b,
    }
    return table[name]


OPERATORS = ["+", "-", "*", "/", "**", "<", ">=", "==", "!="]
BOOL_OPERATORS = {"&": lambda a, b: a & b, "|": lambda a, b: a | b, "^": lambda a, b: a ^ b}
INPLACE = {
    "+=": lambda a, b: _iadd(a, b),
    "*=": lambda a, b: _imul(a, b),
    "-=": lambda a, b: _isub(a, b),
    "**=": lambda a, b: _ipow(a, b),
}


def _iadd(a, b):
    a += b
    return a


def _isub(a, b):
    a -= b
    return a


def _imul(a, b):
    a *= b
    return a


def _ipow(a, b):
    a **= b
    return a


def op_ufunc(name: str, *xs: Any) -> Any:
    return UFUNCS[name](*xs)


def op_operator(name: str, a: Any, b: Any) -> Any:
    return BOOL_OPERATORS[name](a, b) if name in BOOL_OPERATORS else _operator(name)(a, b)


def op_inplace(name: str, a: Any, b: Any) -> Any:
    target = a.copy() if hasattr(a, "copy") else a  # (an input is never updated: numpy runs the program twice)
    return INPLACE[name](target, b)


def op_unary_operator(name: str, a: Any) -> Any:
    return {"-": lambda x: -x, "+": lambda x: +x, "abs": lambda x: abs(x), "~": lambda x: ~x}[name](a)


def op_reduce(name: str, x: Any, axis: Any, keepdims: bool, ddof: int) -> Any:
    fn = getattr(np, name)
    if name in ("var", "std"):
        return fn(x, axis=axis, keepdims=keepdims, ddof=ddof)
    return fn(x, axis=axis, keepdims=keepdims)


def op_method_reduce(name: str, x: Any, axis: Any) -> Any:
    return getattr(x, name)(axis=axis)


def op_einsum(equation: str, *xs: Any) -> Any:
    return np.einsum(equation, *xs)


def op_getitem(x: Any, key: Any) -> Any:
    return x[key]


def op_reshape(x: Any, shape: tuple[int, ...]) -> Any:
    return np.reshape(x, shape)


def op_transpose(x: Any, perm: tuple[int, ...] | None) -> Any:
    return np.transpose(x, perm) if perm is not None else x.T


def op_swapaxes(x: Any, a: int, b: int) -> Any:
    return np.swapaxes(x, a, b)


def op_expand_dims(x: Any, axis: int) -> Any:
    return np.expand_dims(x, axis)


def op_squeeze(x: Any, axis: Any) -> Any:
    return np.squeeze(x, axis=axis)


def op_ravel(x: Any) -> Any:
    return np.ravel(x)


def op_where(c: Any, x: Any, y: Any) -> Any:
    return np.where(c, x, y)


def op_concatenate(axis: Any, *xs: Any) -> Any:
    return np.concatenate(xs, axis=axis)


def op_stack(axis: int, *xs: Any) -> Any:
    return np.stack(xs, axis=axis)


def op_astype(x: Any, dtype: np.dtype) -> Any:
    return np.asarray(x).astype(dtype) if not hasattr(x, "astype") else x.astype(dtype)


def op_matmul(a: Any, b: Any) -> Any:
    return a @ b


def op_repeat(x: Any, repeats: Any, axis: Any) -> Any:
    return np.repeat(x, repeats, axis=axis)


def op_clip(x: Any, lo: Any, hi: Any) -> Any:
    return np.clip(x, lo, hi)


def op_asarray(x: Any) -> Any:
    return np.asarray(x)  # (of a numpy scalar: a 0-d array, whose ** and += differ)


def op_branch(x: Any, y: Any) -> Any:
    """if / elif on traced values (graph control flow under graphc); every branch broadcasts x with
    y to the same shape and dtype, so whichever numpy takes, graphc's cond has the same type."""
    if np.sum(x) > 0:
        r = x + y
    elif np.any(x < y):
        r = x * y
    else:
        r = np.maximum(x, y)
    return r


# --- scans and sorts -----------------------------------------------------------------------------


def op_scan(name: str, axis: Any, x: Any) -> Any:
    """np.cumsum / np.cumprod (axis None flattens), or the method form."""
    if name.startswith("."):
        return getattr(x, name[1:])(axis=axis)
    return getattr(np, name)(x, axis=axis)


def op_sort(name: str, axis: Any, x: Any) -> Any:
    """np.sort / np.argsort, stable (equal values, -0.0 and 0.0 among them, keep their order; nan
    sorts last), or ``y = x.copy(); y.sort()`` in place."""
    if name == ".sort":
        y = x.copy()
        y.sort(axis=axis, kind="stable")
        return y
    return getattr(np, name)(x, axis=axis, kind="stable")


# --- views ------------------------------------------------------------------------------------------


VIEWS: dict[str, Callable] = {
    "slice": lambda x, args: x[args[0]],
    "transpose": lambda x, args: np.transpose(x, args[0]),
    ".T": lambda x, args: x.T,
    "reshape": lambda x, args: np.reshape(x, args[0]),
    "ravel": lambda x, args: np.ravel(x),
    "swapaxes": lambda x, args: np.swapaxes(x, args[0], args[1]),
    "moveaxis": lambda x, args: np.moveaxis(x, args[0], args[1]),
    "expand_dims": lambda x, args: np.expand_dims(x, args[0]),
    "squeeze": lambda x, args: np.squeeze(x, axis=args[0]),
    "flip": lambda x, args: np.flip(x, axis=args[0]),
    "atleast_1d": lambda x, args: np.atleast_1d(x),
    "atleast_2d": lambda x, args: np.atleast_2d(x),
    "atleast_3d": lambda x, args: np.atleast_3d(x),
    "asarray": lambda x, args: np.asarray(x),
    "einsum": lambda x, args: np.einsum(args[0], x),  # (one operand, nothing summed: numpy returns a view)
}


def view(form: str, args: tuple, x: Any) -> Any:
    """One numpy function that returns a view of ``x`` (of the same memory)."""
    return VIEWS[form](x, args)


def views(chain: tuple, x: Any) -> Any:
    """A view of a view ...: ``chain`` is ((form, args), ...)."""
    for form, args in chain:
        x = view(form, args, x)
    return x


def op_view(chain: tuple, x: Any) -> Any:
    return views(chain, x)


# --- writes ------------------------------------------------------------------------------------------

BUFFERS = ["copy", "array", "np.copy", "astype", "zeros", "zeros_like", "full"]


def buffer(form: str, x: Any) -> Any:
    """A fresh array to write into: a copy of ``x`` (four spellings), or a new numpy array of its
    shape and dtype (``np.zeros``: not traced; ``np.zeros_like``, ``np.full``)."""
    if form == "copy":
        return x.copy()
    if form == "array":
        return np.array(x)
    if form == "np.copy":
        return np.copy(x)
    if form == "astype":
        return x.astype(x.dtype)
    if form == "zeros":
        return np.zeros(np.shape(x), np.result_type(x))
    if form == "zeros_like":
        return np.zeros_like(x)
    if form == "full":
        return np.full(np.shape(x), 3, np.result_type(x))
    raise AssertionError(form)


WRITES = ["=", "+=", "-=", "*=", "add.at", "subtract.at", "multiply.at", "maximum.at", "minimum.at"]


def op_write(form: str, chain: tuple, into: str, how: str, result: str, key: Any, x: Any, v: Any) -> Any:  # noqa: C901
    """``b = BUFFER(x); w = VIEWS(b)``; ``b[key] = v`` or ``w[key] = v`` (``into``; or ``+= -= *=``:
    numpy's buffered update, a duplicate index counts once; or ``np.UFUNC.at(b, key, v)``:
    unbuffered, every duplicate counts); then ``b``, ``w`` or ``x`` (``result``). With a view taken
    before the write, the result shows whether the view sees a write into its base, or the base a
    write through its view; ``x`` shows that a copy written afterwards leaves its original as it was.
    (The writes are spelled out here, each through the name that holds the buffer; ``into`` "helper"
    writes into ``b`` inside a called function.)"""
    b = buffer(form, x)
    w = views(chain, b)
    if into == "base":
        if how == "=":
            b[key] = v
        elif how == "+=":
            b[key] += v
        elif how == "-=":
            b[key] -= v
        elif how == "*=":
            b[key] *= v
        elif how == "add.at":
            np.add.at(b, key, v)
        elif how == "subtract.at":
            np.subtract.at(b, key, v)
        elif how == "multiply.at":
            np.multiply.at(b, key, v)
        elif how == "maximum.at":
            np.maximum.at(b, key, v)
        else:
            np.minimum.at(b, key, v)
    elif into == "view":
        if how == "=":
            w[key] = v
        elif how == "+=":
            w[key] += v
        elif how == "-=":
            w[key] -= v
        elif how == "*=":
            w[key] *= v
        elif how == "add.at":
            np.add.at(w, key, v)
        elif how == "subtract.at":
            np.subtract.at(w, key, v)
        elif how == "multiply.at":
            np.multiply.at(w, key, v)
        elif how == "maximum.at":
            np.maximum.at(w, key, v)
        else:
            np.minimum.at(w, key, v)
    else:
        write_in_helper(how, b, key, v)
    if result == "base":
        return b
    if result == "view":
        return w
    return x


def write_in_helper(how: str, target: Any, key: Any, v: Any) -> None:
    """A write inside a called function: the caller's name for ``target`` must see it."""
    if how == "=":
        target[key] = v
    elif how == "+=":
        target[key] += v
    elif how == "-=":
        target[key] -= v
    elif how == "*=":
        target[key] *= v
    else:
        getattr(np, how[: -len(".at")]).at(target, key, v)


def op_mask_write(form: str, how: str, place: str, x: Any, m: Any, v: Any) -> Any:
    """``b = BUFFER(x); b[MASK] = v`` (or ``+= -= *=``) through a traced boolean mask: ``m`` itself,
    or ``b > 0`` when ``m`` is None; the key is the mask alone, ``(:, mask)``, ``(..., mask)`` or
    ``(mask, ...)`` (``place``)."""
    b = buffer(form, x)
    mask = b > 0 if m is None else m
    if place == "alone":
        key = mask
    elif place == "after slice":
        key = (slice(None), mask)
    elif place == "after ellipsis":
        key = (Ellipsis, mask)
    else:
        key = (mask, Ellipsis)
    if how == "=":
        b[key] = v
    elif how == "+=":
        b[key] += v
    elif how == "-=":
        b[key] -= v
    else:
        b[key] *= v
    return b


def op_two_names(shape: tuple, dtype: np.dtype, key: Any, other_key: Any, const: Any, result: str, v: Any) -> Any:
    """One numpy buffer under two names: ``c = b; c[key] = v; b[other_key] = const``; the result,
    read through either name, holds both writes."""
    b = np.zeros(shape, dtype)
    c = b
    c[key] = v
    b[other_key] = const
    if result == "b":
        return b
    return c


def op_out(name: str, form: str, as_tuple: bool, result: str, shape: tuple, dtype: np.dtype, src: Any, *xs: Any) -> Any:
    """``UFUNC(*xs, out=buf)`` or ``out=(buf,)`` (``np.clip`` too), into ``np.zeros(shape, dtype)``
    or into a copy of ``src``; the result is the buffer or what the call returned (the buffer)."""
    buf = np.zeros(shape, dtype) if form == "zeros" else buffer(form, src)
    out = (buf,) if as_tuple else buf
    if name == "clip":
        r = np.clip(xs[0], xs[1], xs[2], out=out)
    else:
        r = UFUNCS[name](*xs, out=out)
    if result == "buffer":
        return buf
    return r


OPS: dict[str, Callable] = {
    "branch": op_branch,
    "asarray": op_asarray,
    "ufunc": op_ufunc,
    "operator": op_operator,
    "inplace": op_inplace,
    "unary_operator": op_unary_operator,
    "reduce": op_reduce,
    "method_reduce": op_method_reduce,
    "einsum": op_einsum,
    "getitem": op_getitem,
    "reshape": op_reshape,
    "transpose": op_transpose,
    "swapaxes": op_swapaxes,
    "expand_dims": op_expand_dims,
    "squeeze": op_squeeze,
    "ravel": op_ravel,
    "where": op_where,
    "concatenate": op_concatenate,
    "stack": op_stack,
    "astype": op_astype,
    "matmul": op_matmul,
    "repeat": op_repeat,
    "clip": op_clip,
    "scan": op_scan,
    "sort": op_sort,
    "view": op_view,
    "write": op_write,
    "two_names": op_two_names,
    "mask_write": op_mask_write,
    "out": op_out,
}


class Const:
    """A literal operand of a step (a Python or numpy scalar, or a static numpy array), not a pool
    reference."""

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        if isinstance(self.value, np.ndarray):
            return f"Const(np.array({self.value.tolist()!r}, {str(self.value.dtype)!r}))"
        return f"Const({self.value!r})"


def run_program(steps: tuple, outputs: tuple[int, ...], *inputs: Any) -> tuple:
    """The program: each step appends ``OPS[kind](*static_before, *pool[refs], *static_after)`` to the
    pool of values (the inputs first); returns the pool values named by ``outputs``."""
    pool = list(inputs)
    for kind, before, refs, after in steps:
        pool.append(OPS[kind](*before, *[pool[i] if isinstance(i, int) else i.value for i in refs], *after))
    return tuple(pool[i] for i in outputs)
