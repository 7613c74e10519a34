"""Differential fuzzing against numpy: random small programs of numpy operations (ufuncs and
operators with Python and numpy scalars, reductions, einsum, indexing, reshapes and transposes,
where, concatenate and stack, dtype conversions, in-place updates, if/elif on traced values) over bool, int8-int64, uint8,
float32 and float64 arrays whose shapes have size-1 and size-0 dims, and 0-d arrays.

The properties, for each program:

- ``graphc.jit(program)(*inputs)`` equals numpy's result: the same pytree, and for every leaf the
  same dtype and shape, integers and bools equal, floats equal up to rounding (fused kernels sum in
  another order and use their own exp/log/tanh) with nan, +-inf and the sign of zeros exactly
  numpy's. Where numpy raises, graphc raises a ``GraphcError`` (a TraceError, or numpy's own
  exception class combined with a GraphcError); never anything else.
- The traced graph, optimized (the default pipeline, fusion included) and evaluated by the
  reference interpreter, equals the traced graph evaluated by the interpreter.

Programs are drawn by running numpy on the drawn inputs while drawing: most steps are valid
numpy, and a few that numpy rejects are kept as a program's last step (graphc must reject them
too). The default profile runs in about 20 s on 2 cores (numba compiles the fused kernels of each
new program; kernels are cached on disk); ``pytest -m fuzz --hypothesis-profile long`` runs
10,000 programs per target.
"""

from __future__ import annotations

import functools
import string
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import graphc
from graphc.core.errors import GraphcError
from graphc.core.pytree import flatten
from tests.helpers import fuzz_settings

pytestmark = pytest.mark.fuzz

DTYPES = [np.dtype(d) for d in ("bool", "int8", "int16", "int32", "int64", "uint8", "float32", "float64")]
DIMS = [1, 1, 2, 3, 0]  # size-1 dims often, size-0 dims sometimes
FLOAT_SPECIALS = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, -1e-30]
PY_SCALARS = [True, False, 0, 1, 2, -1, 3, 300, -129, 0.5, -0.0, 2.0, -1.0, 1.5, float("inf"), float("nan")]
NP_SCALARS = [np.int8(3), np.float32(0.5), np.float64(-2.0), np.int64(2), np.bool_(True), np.uint8(7)]


def quietly(fn: Callable, *args: Any) -> Any:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return fn(*args)


# --- the operations: plain numpy code, run by numpy and traced by graphc ---------------------------

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
    table = {**UNARY_UFUNCS, **FLOAT_ONLY, **BINARY_UFUNCS, **INT_ONLY, **BOOL_ONLY}
    return table[name](*xs)


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
}


def run_program(steps: tuple, outputs: tuple[int, ...], *inputs: Any) -> tuple:
    """The program: each step appends ``OPS[kind](*static_before, *pool[refs], *static_after)`` to the
    pool of values (the inputs first); returns the pool values named by ``outputs``."""
    pool = list(inputs)
    for kind, before, refs, after in steps:
        pool.append(OPS[kind](*before, *[pool[i] if isinstance(i, int) else i.value for i in refs], *after))
    return tuple(pool[i] for i in outputs)


class Const:
    """A literal operand of a step (a Python or numpy scalar), not a pool reference."""

    def __init__(self, value: Any):
        self.value = value

    def __repr__(self) -> str:
        return f"Const({self.value!r})"


# --- drawing programs ----------------------------------------------------------------------------


def draw_array(draw, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if dtype.kind == "b":
        arr = rng.random(shape) < 0.5
    elif dtype.kind in "iu":
        low = 0 if dtype.kind == "u" else -4
        arr = rng.integers(low, low + 9, size=shape).astype(dtype)
        if arr.size and draw(st.integers(0, 4)) == 0:  # the dtype's extremes: wrapping arithmetic
            info = np.iinfo(dtype)
            arr.reshape(-1)[draw(st.integers(0, arr.size - 1))] = draw(st.sampled_from([info.min, info.max]))
    else:
        arr = (rng.standard_normal(shape) * 2).astype(dtype)
        if arr.size:
            for _ in range(draw(st.integers(0, 2))):
                arr.reshape(-1)[draw(st.integers(0, arr.size - 1))] = draw(st.sampled_from(FLOAT_SPECIALS))
    return np.asarray(arr, dtype=dtype)


def shapes(max_rank: int = 3):
    return st.lists(st.sampled_from(DIMS), min_size=0, max_size=max_rank).map(tuple)


def _axis_choice(draw, ndim: int, allow_tuple: bool = True) -> Any:
    options: list[Any] = [None] if allow_tuple else []
    options += list(range(-ndim, ndim)) or [0]
    if draw(st.integers(0, 9)) == 0:
        options.append(ndim)  # out of range: numpy's AxisError
    if allow_tuple and ndim:
        k = draw(st.integers(0, ndim))
        options.append(tuple(draw(st.permutations(range(ndim)))[:k]))
    return draw(st.sampled_from(options))


def _scalar(draw) -> Const:
    return Const(draw(st.sampled_from(PY_SCALARS + NP_SCALARS)))


def _operand(draw, pool: list, like: Any = None) -> Any:
    """A pool reference (often one that broadcasts with ``like``), or a literal scalar."""
    if draw(st.integers(0, 4)) == 0:
        return _scalar(draw)
    if like is not None and draw(st.booleans()):
        shape = np.shape(like)
        candidates = [i for i, v in enumerate(pool) if _broadcasts(np.shape(v), shape)]
        if candidates:
            return draw(st.sampled_from(candidates))
    return draw(st.integers(0, len(pool) - 1))


def _operand_of_kind(draw, pool: list, kinds: str) -> Any:
    """An operand whose dtype kind is in ``kinds`` (graphc's bitwise ops are the logical ones on
    bools, and its floor division and remainder are integer ones): a pool value or a literal."""
    candidates = [i for i, v in enumerate(pool) if np.result_type(v).kind in kinds]
    literals = [v for v in PY_SCALARS + NP_SCALARS if np.result_type(v).kind in kinds and not isinstance(v, float)]
    if candidates and draw(st.integers(0, 3)):
        return draw(st.sampled_from(candidates))
    return Const(draw(st.sampled_from(literals)))


def _broadcasts(a: tuple, b: tuple) -> bool:
    try:
        np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return True


def _value(pool: list, ref: Any) -> Any:
    return ref.value if isinstance(ref, Const) else pool[ref]


STEP_KINDS = (
    ["ufunc"] * 6
    + ["operator"] * 4
    + ["reduce"] * 3
    + ["getitem"] * 3
    + ["einsum"] * 2
    + ["inplace", "unary_operator", "method_reduce", "ravel", "expand_dims", "repeat", "clip", "stack"]
    + ["reshape", "transpose", "swapaxes", "squeeze", "where", "concatenate", "astype", "matmul", "branch"]
    + ["asarray"]
)


def draw_step(draw, pool: list) -> tuple:
    """One step (kind, static args before, operand refs, static args after) on the pool."""
    kind = draw(st.sampled_from(STEP_KINDS))
    i = draw(st.integers(0, len(pool) - 1))
    return DRAW_STEP[kind](draw, pool, i)


def _either_side(draw, i: int, other: Any) -> tuple:
    return (i, other) if draw(st.booleans()) else (other, i)


def _draw_ufunc(draw, pool: list, i: int) -> tuple:
    table = draw(st.sampled_from(["unary", "binary", "binary", "float", "int", "bool"]))
    dt = np.result_type(pool[i])
    if table == "float" and dt.kind == "f":
        return "ufunc", (draw(st.sampled_from(sorted(FLOAT_ONLY))),), (i,), ()
    if table == "int" and dt.kind in "iu":
        name = draw(st.sampled_from(sorted(INT_ONLY)))
        return "ufunc", (name,), _either_side(draw, i, _operand_of_kind(draw, pool, "iu")), ()
    if table == "bool" and dt.kind == "b":
        name = draw(st.sampled_from(sorted(BOOL_ONLY)))
        return "ufunc", (name,), _either_side(draw, i, _operand_of_kind(draw, pool, "b")), ()
    if table == "unary":
        return "ufunc", (draw(st.sampled_from(sorted(UNARY_UFUNCS))),), (i,), ()
    name = draw(st.sampled_from(sorted(BINARY_UFUNCS)))
    return "ufunc", (name,), _either_side(draw, i, _operand(draw, pool, pool[i])), ()


def _draw_operator(draw, pool: list, i: int) -> tuple:
    x = pool[i]
    names = OPERATORS + (sorted(BOOL_OPERATORS) if np.result_type(x).kind == "b" else [])
    name = draw(st.sampled_from(names))
    other = _operand_of_kind(draw, pool, "b") if name in BOOL_OPERATORS else _operand(draw, pool, x)
    if name == "**" and draw(st.booleans()):
        other = Const(draw(st.sampled_from([2, -1, 0.5, 2.0, 3, 1, 0, -0.5])))  # numpy's ** fast paths
    return "operator", (name,), ((i, other) if draw(st.integers(0, 3)) else (other, i)), ()


def _draw_unary_operator(draw, pool: list, i: int) -> tuple:
    names = ["-", "+", "abs"] + (["~"] if np.result_type(pool[i]).kind == "b" else [])
    return "unary_operator", (draw(st.sampled_from(names)),), (i,), ()


def _draw_reduce(draw, pool: list, i: int) -> tuple:
    name = draw(st.sampled_from(["sum", "mean", "max", "min", "any", "all", "argmax", "argmin", "var", "std"]))
    axis = _axis_choice(draw, np.ndim(pool[i]), name not in ("argmax", "argmin"))
    return "reduce", (name,), (i,), (axis, draw(st.booleans()), draw(st.sampled_from([0, 0, 1, 2])))


def _draw_squeeze(draw, pool: list, i: int) -> tuple:
    ones = [d for d, n in enumerate(np.shape(pool[i])) if n == 1]
    options = [None, *ones] + ([tuple(ones)] if ones else []) + [_axis_choice(draw, np.ndim(pool[i]), False)]
    return "squeeze", (), (i,), (draw(st.sampled_from(options)),)


def _draw_join(kind: str):
    def draw_join(draw, pool: list, i: int) -> tuple:
        x, nd = pool[i], np.ndim(pool[i])
        same = [
            j for j, v in enumerate(pool) if np.shape(v) == np.shape(x) or (kind == "concatenate" and np.ndim(v) == nd)
        ]
        refs = (i, *draw(st.lists(st.sampled_from(same), min_size=0, max_size=2)))
        if kind == "concatenate":
            axis = None if draw(st.integers(0, 5)) == 0 else _axis_choice(draw, nd, False)
        else:
            axis = draw(st.integers(-nd - 1, nd))
        return kind, (axis,), refs, ()

    return draw_join


def _draw_matmul(draw, pool: list, i: int) -> tuple:
    shape = np.shape(pool[i])
    fits = [
        j for j, v in enumerate(pool) if np.ndim(v) >= 1 and shape and np.shape(v)[max(0, np.ndim(v) - 2)] == shape[-1]
    ]
    other = draw(st.sampled_from(fits)) if fits and draw(st.integers(0, 4)) else draw(st.integers(0, len(pool) - 1))
    return "matmul", (), (i, other), ()


def _draw_repeat(draw, pool: list, i: int) -> tuple:
    nd = np.ndim(pool[i])
    n = np.shape(pool[i])[0] if nd else 1
    repeats = draw(st.one_of(st.integers(0, 2), st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    return "repeat", (), (i,), (repeats, 0 if nd else None)


def _draw_transpose(draw, pool: list, i: int) -> tuple:
    perm = None if draw(st.integers(0, 3)) == 0 else tuple(draw(st.permutations(range(np.ndim(pool[i])))))
    return "transpose", (), (i,), (perm,)


def _three(kind: str):
    def draw_three(draw, pool: list, i: int) -> tuple:
        return kind, (), (i, _operand(draw, pool, pool[i]), _operand(draw, pool, pool[i])), ()

    return draw_three


DRAW_STEP: dict[str, Callable] = {
    "ufunc": _draw_ufunc,
    "operator": _draw_operator,
    "inplace": lambda draw, pool, i: (
        "inplace",
        (draw(st.sampled_from(sorted(INPLACE))),),
        (i, _operand(draw, pool, pool[i])),
        (),
    ),
    "unary_operator": _draw_unary_operator,
    "reduce": _draw_reduce,
    "method_reduce": lambda draw, pool, i: (
        "method_reduce",
        (draw(st.sampled_from(["sum", "mean", "max", "min", "any", "all"])),),
        (i,),
        (_axis_choice(draw, np.ndim(pool[i])),),
    ),
    "einsum": lambda draw, pool, i: draw_einsum(draw, pool, i),
    "getitem": lambda draw, pool, i: ("getitem", (), (i,), (draw_index(draw, np.shape(pool[i])),)),
    "reshape": lambda draw, pool, i: ("reshape", (), (i,), (draw_reshape(draw, np.shape(pool[i])),)),
    "transpose": _draw_transpose,
    "swapaxes": lambda draw, pool, i: (
        "swapaxes",
        (),
        (i,),
        (_axis_choice(draw, np.ndim(pool[i]), False), _axis_choice(draw, np.ndim(pool[i]), False)),
    ),
    "expand_dims": lambda draw, pool, i: (
        "expand_dims",
        (),
        (i,),
        (draw(st.integers(-np.ndim(pool[i]) - 1, np.ndim(pool[i]))),),
    ),
    "squeeze": _draw_squeeze,
    "ravel": lambda draw, pool, i: ("ravel", (), (i,), ()),
    "where": _three("where"),
    "clip": _three("clip"),
    "concatenate": _draw_join("concatenate"),
    "stack": _draw_join("stack"),
    "astype": lambda draw, pool, i: ("astype", (), (i,), (draw(st.sampled_from(DTYPES)),)),
    "matmul": _draw_matmul,
    "repeat": _draw_repeat,
    "branch": lambda draw, pool, i: ("branch", (), (i, _operand(draw, pool, pool[i])), ()),
    "asarray": lambda draw, pool, i: ("asarray", (), (i,), ()),
}


def draw_index(draw, shape: tuple[int, ...]) -> Any:
    """A numpy index: ints (sometimes out of range), slices with negative and zero-crossing
    bounds and steps, None, an Ellipsis, an integer list or array on one axis."""
    parts: list[Any] = []
    dims = list(shape)
    used_ellipsis = False
    while dims and draw(st.integers(0, 3)):
        n = dims.pop(0)
        choice = draw(st.integers(0, 9))
        if choice <= 2 and n:
            parts.append(draw(st.integers(-n, n - 1)))
        elif choice == 3:
            parts.append(draw(st.integers(-n - 2, n + 1)))  # maybe out of range: IndexError
        elif choice <= 6:
            step = draw(st.sampled_from([1, 1, 2, -1, -2]))
            start = draw(st.one_of(st.none(), st.integers(-n - 1, n + 1)))
            stop = draw(st.one_of(st.none(), st.integers(-n - 1, n + 1)))
            parts.append(slice(start, stop, step))
        elif choice == 7:
            parts.append(None)
            dims.insert(0, n)
        elif choice == 8 and not used_ellipsis:
            parts.append(Ellipsis)
            used_ellipsis = True
            dims = dims[len(dims) // 2 :]
        else:
            idx = draw(st.lists(st.integers(-max(n, 1), max(n, 1) - 1), min_size=0, max_size=3))
            parts.append(np.asarray(idx, dtype=np.int64) if draw(st.booleans()) else idx)
    if len(parts) == 1 and draw(st.booleans()):
        return parts[0]
    return tuple(parts)


def draw_reshape(draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    size = int(np.prod(shape, dtype=np.int64))
    if size == 0:
        return draw(st.sampled_from([(0,), (-1,), (0, 3), (2, 0), (-1, 0)] + [shape[::-1]]))
    factors = [d for d in range(1, size + 1) if size % d == 0]
    out = []
    rest = size
    for _ in range(draw(st.integers(0, 3))):
        d = draw(st.sampled_from([f for f in factors if rest % f == 0]))
        out.append(d)
        rest //= d
    out.append(rest)
    if draw(st.booleans()):
        out[draw(st.integers(0, len(out) - 1))] = -1
    if draw(st.integers(0, 9)) == 0:
        out.append(2)  # (usually) the wrong size: ValueError
    return tuple(out)


def draw_einsum(draw, pool: list, i: int) -> tuple:
    """Subscripts for one or two operands: letters shared only where the dims agree (or are 1),
    a repeated letter within an operand for a diagonal, '...' now and then, an explicit output
    (a subset of the letters in any order) or numpy's implicit one."""
    refs = [i] if draw(st.booleans()) else [i, draw(st.integers(0, len(pool) - 1))]
    letters = iter(string.ascii_lowercase)
    sizes: dict[str, int] = {}
    specs = []
    for r in refs:
        spec = ""
        shape = np.shape(pool[r])
        ellipsis_at = draw(st.integers(0, len(shape))) if draw(st.integers(0, 5)) == 0 else None
        for d, n in enumerate(shape):
            if ellipsis_at is not None and d >= ellipsis_at:
                break
            # (numpy does not check a diagonal whose first dim is empty: 'ii' of a (0, 2) array is
            # of shape (2,); graphc raises there, so diagonals are drawn of equal dims only)
            fitting = [c for c, m in sizes.items() if c not in spec and (m == n or 1 in (m, n))]
            fitting += [c for c in spec if sizes[c] == n]
            c = draw(st.sampled_from(fitting)) if fitting and draw(st.booleans()) else next(letters)
            sizes.setdefault(c, n)
            spec += c
        specs.append(spec + ("..." if ellipsis_at is not None else ""))
    used = sorted(set("".join(specs).replace(".", "")))
    if draw(st.integers(0, 3)) == 0:
        equation = ",".join(specs)
    else:
        out = draw(st.permutations(used))[: draw(st.integers(0, len(used)))]
        ellipsis = "..." if any("..." in s for s in specs) else ""
        equation = ",".join(specs) + "->" + ellipsis + "".join(out)
    return "einsum", (equation,), tuple(refs), ()


@st.composite
def programs(draw) -> tuple[tuple, tuple, tuple]:
    """(steps, outputs, inputs): 1-3 input arrays, 1-6 steps (numpy succeeds on all but perhaps
    the last), 1-3 outputs among the values."""
    inputs = []
    for _ in range(draw(st.integers(1, 3))):
        inputs.append(draw_array(draw, draw(st.sampled_from(DTYPES)), draw(shapes())))
    pool: list[Any] = list(inputs)
    steps: list[tuple] = []
    raised = False
    for _ in range(draw(st.integers(1, 6))):
        step = draw_step(draw, pool)
        try:
            value = quietly(run_program, (step,), (len(pool),), *pool)[0]
        except Exception:  # numpy rejects it: now and then that is the program's (last) step
            if draw(st.integers(0, 4)) == 0:
                steps.append(step)
                raised = True
                break
            continue
        steps.append(step)
        pool.append(value)
    if not steps:
        steps.append(("ufunc", ("negative",), (0,), ()))
        pool.append(None)
    last = len(pool) - (0 if raised else 1)
    extra = draw(st.lists(st.integers(0, len(pool) - 1), max_size=2))
    outputs = (last, *[j for j in extra if j != last])
    return tuple(steps), outputs, tuple(inputs)


# --- comparing with numpy -----------------------------------------------------------------------------

RTOL = {2: 2e-3, 4: 2e-5, 8: 1e-12}
# steps whose float results graphc may round differently from numpy: transcendental functions (the
# fused kernels' own exp/log/tanh; log2 = log / log(2) and the like; numpy's pow loops change their
# last bit with the operands' memory layout) and sums (kernels and einsum sum in another order)
ROUNDING_UFUNCS = {"exp", "log", "log1p", "expm1", "tanh", "sin", "cos", "exp2", "log2", "logaddexp", "power"}
ROUNDING_REDUCTIONS = {"sum", "mean", "var", "std"}


class Exactness:
    """What a value's comparison with numpy can rely on: ``inexact`` when a rounding step (above)
    made it or a value it depends on (floats then match up to ``rtol`` times ``scale``, the largest
    magnitude in its history); ``unverifiable`` when a discrete result (an int, a bool, an argmax, a
    branch taken) depends on an inexact value: one ulp may flip it, so only its dtype and shape are
    compared."""

    def __init__(self, inexact: bool = False, unverifiable: bool = False, scale: float = 1.0, itemsize: int = 8):
        self.inexact, self.unverifiable, self.scale, self.itemsize = inexact, unverifiable, scale, itemsize

    @property
    def rtol(self) -> float:
        return RTOL[self.itemsize]


def _magnitude(v: Any) -> tuple[float, int]:
    """(largest finite magnitude, smallest float itemsize) of a value (8 when it holds no floats)."""
    arr = np.asarray(v)
    if arr.dtype.kind != "f":
        return (float(np.max(np.abs(arr.astype(np.float64)), initial=0.0)) if arr.dtype.kind in "iub" else 0.0), 8
    finite = arr[np.isfinite(arr)]
    return float(np.max(np.abs(finite.astype(np.float64)), initial=0.0)), arr.dtype.itemsize


def _rounds(step: tuple) -> bool:
    kind, before, _refs, _after = step
    if kind == "ufunc":
        return before[0] in ROUNDING_UFUNCS
    if kind in ("operator", "inplace"):
        return before[0] in ("**", "**=")
    if kind in ("reduce", "method_reduce"):
        return before[0] in ROUNDING_REDUCTIONS
    return kind in ("einsum", "matmul")


def exactness(steps: tuple, outputs: tuple, inputs: tuple) -> list[Exactness]:
    """The Exactness of each output, from numpy's run of the program."""
    pool, info = list(inputs), []
    for x in inputs:
        scale, size = _magnitude(x)
        info.append(Exactness(scale=max(1.0, scale), itemsize=size))
    for step in steps:
        kind, before, refs, after = step
        value = quietly(run_program, (step,), (len(pool),), *pool)[0]
        used = [info[i] if isinstance(i, int) else Exactness(scale=max(1.0, _magnitude(i.value)[0])) for i in refs]
        is_float = np.result_type(value).kind == "f"
        inexact = is_float and (_rounds(step) or any(u.inexact for u in used))
        discrete = not is_float or kind == "branch" or (kind == "reduce" and before[0] in ("argmax", "argmin"))
        unverifiable = any(u.unverifiable for u in used) or (discrete and any(u.inexact for u in used))
        scale, size = _magnitude(value)
        pool.append(value)
        info.append(
            Exactness(
                inexact,
                unverifiable,
                max([1.0, scale] + [u.scale for u in used]),
                min([size] + [u.itemsize for u in used]),
            )
        )
    return [info[i] for i in outputs]


def assert_matches(got: Any, want: Any, what: str, exact: list[Exactness]) -> None:
    """Same pytree; every leaf of the same dtype and shape; ints and bools equal; floats equal, with
    nan, +-inf and the sign of zeros numpy's, up to rounding where a rounding step made them
    (``Exactness``); values that depend on such rounding discretely are not compared."""
    got_leaves, got_tree = flatten(got)
    want_leaves, want_tree = flatten(want)
    assert got_tree == want_tree, f"{what}: structure {got_tree} != numpy's {want_tree}"
    for k, (g, w, e) in enumerate(zip(got_leaves, want_leaves, exact)):
        g, w = np.asarray(g), np.asarray(w)
        assert (g.dtype, g.shape) == (w.dtype, w.shape), (
            f"{what}: output {k} is {g.dtype}{list(g.shape)}, numpy's {w.dtype}{list(w.shape)}"
        )
        if e.unverifiable:
            continue
        if w.dtype.kind != "f":
            np.testing.assert_array_equal(g, w, err_msg=f"{what}: output {k}")
            continue
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"{what}: output {k}: nan positions")
        inf_g, inf_w = np.where(np.isinf(g), np.sign(g), 0), np.where(np.isinf(w), np.sign(w), 0)
        np.testing.assert_array_equal(inf_g, inf_w, err_msg=f"{what}: output {k}: infinities")
        zero = (g == 0) & (w == 0)
        np.testing.assert_array_equal(
            np.signbit(g[zero]), np.signbit(w[zero]), err_msg=f"{what}: output {k}: signed zeros"
        )
        finite = np.isfinite(w)
        g64, w64 = g[finite].astype(np.float64), w[finite].astype(np.float64)
        if e.inexact:
            np.testing.assert_allclose(g64, w64, rtol=e.rtol, atol=e.rtol * e.scale, err_msg=f"{what}: output {k}")
        else:
            np.testing.assert_array_equal(g64, w64, err_msg=f"{what}: output {k}")


def describe(steps: tuple, outputs: tuple, inputs: tuple) -> str:
    lines = [f"input {k}: {x.dtype}{list(x.shape)} {x.tolist()!r}" for k, x in enumerate(inputs)]
    lines += [f"step {len(inputs) + k}: {s!r}" for k, s in enumerate(steps)]
    return "\n".join(lines + [f"outputs: {outputs}"])


def check_program(steps: tuple, outputs: tuple, inputs: tuple, jit: bool) -> None:
    program = functools.partial(run_program, steps, outputs)
    where = describe(steps, outputs, inputs)
    try:
        want = quietly(program, *inputs)
    except Exception as exc:
        want, numpy_error = None, exc
    else:
        numpy_error = None
    runner = graphc.jit(program) if jit else lambda *xs: graphc.evaluate(graphc.trace(program, *xs), *xs)
    try:
        got = quietly(runner, *inputs)
    except GraphcError as exc:
        if numpy_error is None:
            raise AssertionError(f"graphc raised where numpy did not:\n{where}") from exc
        return
    except Exception as exc:
        raise AssertionError(f"graphc raised {type(exc).__name__}, not a GraphcError:\n{where}") from exc
    if numpy_error is not None:
        raise AssertionError(f"numpy raised {numpy_error!r} where graphc did not:\n{where}")
    assert_matches(got, want, where, exactness(steps, outputs, inputs))
    if jit:  # a warm call takes the specialization's generated entry, not the first call's path
        assert_matches(quietly(runner, *inputs), want, where + "\n(second call)", exactness(steps, outputs, inputs))


@given(programs())
@fuzz_settings(400)
def test_jit_equals_numpy(program):
    check_program(*program, jit=True)


@given(programs())
@fuzz_settings(800)
def test_optimized_graph_equals_interpreter(program):
    """numpy vs the interpreter on the traced graph, and the optimized graph (fused) vs the interpreter."""
    steps, outputs, inputs = program
    check_program(steps, outputs, inputs, jit=False)
    fn = functools.partial(run_program, steps, outputs)
    try:
        graph = quietly(graphc.trace, fn, *inputs)
        want = quietly(graphc.evaluate, graph, *inputs)
    except GraphcError:
        return  # (numpy raised too: check_program saw to it)
    optimized = graphc.optimize(graph)
    got = quietly(graphc.evaluate, optimized, *inputs)
    assert_matches(got, want, describe(*program) + "\n(optimized)", exactness(steps, outputs, inputs))
