"""Drawing random numpy programs (hypothesis strategies) for the differential fuzz targets.

A program is ``(steps, outputs, inputs)``: 1-3 input arrays, 1-6 steps, each appending one value to
a pool that starts with the inputs (``steps.run_program``), and 1-3 pool values as its outputs.
Programs are drawn by running numpy on the drawn inputs while drawing, so each step is drawn for
the shapes and dtypes numpy computed, and almost every step is valid numpy; a step numpy rejects
is kept now and then as the program's last (graphc must reject it too).

A ``Flavor`` says what may be drawn: ``NUMPY`` everything (every dtype, nan, +-inf, -0.0 and the
integers' extremes among the inputs); ``GRAD`` float64 inputs of moderate finite values and the
steps gradients are defined for (and keeps a step only when its values are finite), for the
gradient targets.
"""

from __future__ import annotations

import dataclasses
import string
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

from tests.fuzz.steps import (
    BINARY_UFUNCS,
    BOOL_ONLY,
    BOOL_OPERATORS,
    BUFFERS,
    FLOAT_ONLY,
    INPLACE,
    INT_ONLY,
    OPERATORS,
    UNARY_UFUNCS,
    WRITES,
    Const,
    buffer,
    run_program,
    view,
    views,
)

DTYPES = [np.dtype(d) for d in ("bool", "int8", "int16", "int32", "int64", "uint8", "float32", "float64")]
DIMS = [1, 1, 2, 3, 0]  # size-1 dims often, size-0 dims sometimes
FLOAT_SPECIALS = [np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, -1e-30]
PY_SCALARS = [True, False, 0, 1, 2, -1, 3, 300, -129, 0.5, -0.0, 2.0, -1.0, 1.5, float("inf"), float("nan")]
NP_SCALARS = [np.int8(3), np.float32(0.5), np.float64(-2.0), np.int64(2), np.bool_(True), np.uint8(7)]


def quietly(fn: Callable, *args: Any) -> Any:
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return fn(*args)


@dataclasses.dataclass(frozen=True)
class Flavor:
    """What a program may be made of."""

    dtypes: tuple  # of the inputs, and the targets of astype
    specials: bool  # nan, +-inf, -0.0, huge and tiny floats, the integers' extremes among the inputs
    scalars: tuple  # literal operands
    step_kinds: tuple  # a kind listed twice is drawn twice as often (and hypothesis favours the first)
    unary: tuple  # ufunc names
    binary: tuple
    reductions: tuple
    writes: tuple  # steps.WRITES
    sorts: tuple


NUMPY = Flavor(
    dtypes=tuple(DTYPES),
    specials=True,
    scalars=tuple(PY_SCALARS + NP_SCALARS),
    step_kinds=tuple(
        ["write"] * 8
        + ["ufunc"] * 6
        + ["operator"] * 4
        + ["reduce"] * 3
        + ["getitem"] * 3
        + ["einsum"] * 2
        + ["view"] * 2
        + ["out"] * 3
        + ["scan"] * 2
        + ["sort"] * 2
        + ["inplace", "unary_operator", "method_reduce", "ravel", "expand_dims", "repeat", "clip", "stack"]
        + ["reshape", "transpose", "swapaxes", "squeeze", "where", "concatenate", "astype", "matmul", "branch"]
        + ["asarray", "two_names", "mask_write", "mask_write"]
    ),
    unary=tuple(sorted(UNARY_UFUNCS)),
    binary=tuple(sorted(BINARY_UFUNCS)),
    reductions=("sum", "mean", "max", "min", "any", "all", "argmax", "argmin", "var", "std"),
    writes=tuple(WRITES),
    sorts=("sort", "argsort", ".sort"),
)

# Differentiable almost everywhere (kinks and jumps are found and skipped by the oracle); the
# comparisons make masks for np.where, argmax and argsort make indices.
GRAD = Flavor(
    dtypes=(np.dtype("float64"),),
    specials=False,
    scalars=(0, 1, 2, -1, 3, 0.5, -0.0, 2.0, -1.0, 1.5, np.float64(-2.0), np.int64(2), True),
    step_kinds=tuple(
        ["write"] * 8
        + ["ufunc"] * 6
        + ["operator"] * 4
        + ["reduce"] * 3
        + ["getitem"] * 3
        + ["einsum"] * 2
        + ["view"] * 2
        + ["out"] * 2
        + ["scan"] * 2
        + ["sort"]
        + ["two_names", "mask_write", "inplace", "unary_operator", "ravel", "expand_dims", "repeat", "clip"]
        + ["stack"]
        + ["reshape", "transpose", "swapaxes", "squeeze", "where", "concatenate", "matmul", "branch"]
    ),
    unary=("negative", "absolute", "positive", "exp", "log1p", "expm1", "tanh", "sin", "cos", "square", "sqrt"),
    binary=("add", "subtract", "multiply", "true_divide", "maximum", "minimum", "logaddexp", "less", "greater_equal"),
    reductions=("sum", "mean", "max", "min", "var", "std", "argmax"),
    writes=("=", "=", "+=", "-=", "*=", "add.at", "subtract.at", "multiply.at", "maximum.at", "minimum.at"),
    sorts=("sort", ".sort", "argsort"),
)


def draw_array(draw, dtype: np.dtype, shape: tuple[int, ...], flavor: Flavor = NUMPY) -> np.ndarray:
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if dtype.kind == "b":
        arr = rng.random(shape) < 0.5
    elif dtype.kind in "iu":
        low = 0 if dtype.kind == "u" else -4
        arr = rng.integers(low, low + 9, size=shape).astype(dtype)
        if arr.size and flavor.specials and draw(st.integers(0, 4)) == 0:  # wrapping arithmetic
            info = np.iinfo(dtype)
            arr.reshape(-1)[draw(st.integers(0, arr.size - 1))] = draw(st.sampled_from([info.min, info.max]))
    else:
        arr = (rng.standard_normal(shape) * 2).astype(dtype)
        if arr.size and flavor.specials:
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


def _operand(draw, pool: list, flavor: Flavor, like: Any = None) -> Any:
    """A pool reference (often one that broadcasts with ``like``), or a literal scalar."""
    if draw(st.integers(0, 4)) == 0:
        return Const(draw(st.sampled_from(flavor.scalars)))
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


def _value_for(draw, pool: list, flavor: Flavor, shape: tuple, strict: bool = False) -> Any:
    """An operand to write into a region of ``shape``: a pool value that broadcasts to it (numpy's
    rule for ``a[k] = v``), or a literal scalar; now and then any operand, unless ``strict``."""
    fits = [i for i, v in enumerate(pool) if _broadcasts_to(np.shape(v), shape)]
    if fits and draw(st.integers(0, 3)):
        return draw(st.sampled_from(fits))
    if strict:
        return Const(draw(st.sampled_from(flavor.scalars)))
    return _operand(draw, pool, flavor)


def _broadcasts(a: tuple, b: tuple) -> bool:
    try:
        np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return True


def _broadcasts_to(a: tuple, b: tuple) -> bool:
    return _broadcasts(a, b) and np.broadcast_shapes(a, b) == tuple(b)


def _value(pool: list, ref: Any) -> Any:
    return ref.value if isinstance(ref, Const) else pool[ref]


def _either_side(draw, i: int, other: Any) -> tuple:
    return (i, other) if draw(st.booleans()) else (other, i)


# --- steps --------------------------------------------------------------------------------------------


def _draw_ufunc(draw, pool: list, i: int, flavor: Flavor) -> tuple:
    table = draw(st.sampled_from(["unary", "binary", "binary", "float", "int", "bool"]))
    dt = np.result_type(pool[i])
    if flavor is NUMPY and table == "float" and dt.kind == "f":
        return "ufunc", (draw(st.sampled_from(sorted(FLOAT_ONLY))),), (i,), ()
    if flavor is NUMPY and table == "int" and dt.kind in "iu":
        name = draw(st.sampled_from(sorted(INT_ONLY)))
        other = _operand_of_kind(draw, pool, "iu")
        # (only on integer results: numpy's int64 or int8 with uint64 is float64, and float floor
        # division and remainder are a documented gap: docs/fuzzing_numpy.md, the deviations)
        if np.result_type(pool[i], _value(pool, other)).kind in "iu":
            return "ufunc", (name,), _either_side(draw, i, other), ()
    if flavor is NUMPY and table == "bool" and dt.kind == "b":
        name = draw(st.sampled_from(sorted(BOOL_ONLY)))
        return "ufunc", (name,), _either_side(draw, i, _operand_of_kind(draw, pool, "b")), ()
    if table == "unary":
        return "ufunc", (draw(st.sampled_from(flavor.unary)),), (i,), ()
    name = draw(st.sampled_from(flavor.binary))
    return "ufunc", (name,), _either_side(draw, i, _operand(draw, pool, flavor, pool[i])), ()


def _draw_operator(draw, pool: list, i: int, flavor: Flavor) -> tuple:
    x = pool[i]
    names = OPERATORS + (sorted(BOOL_OPERATORS) if np.result_type(x).kind == "b" and flavor is NUMPY else [])
    name = draw(st.sampled_from(names))
    other = _operand_of_kind(draw, pool, "b") if name in BOOL_OPERATORS else _operand(draw, pool, flavor, x)
    if name == "**" and (flavor is GRAD or draw(st.booleans())):
        other = Const(draw(st.sampled_from([2, -1, 0.5, 2.0, 3, 1, 0, -0.5])))  # numpy's ** fast paths
        return "operator", (name,), (i, other), ()
    return "operator", (name,), ((i, other) if draw(st.integers(0, 3)) else (other, i)), ()


def _draw_unary_operator(draw, pool: list, i: int, flavor: Flavor) -> tuple:
    names = ["-", "+", "abs"] + (["~"] if np.result_type(pool[i]).kind == "b" else [])
    return "unary_operator", (draw(st.sampled_from(names)),), (i,), ()


def _draw_reduce(draw, pool: list, i: int, flavor: Flavor) -> tuple:
    name = draw(st.sampled_from(flavor.reductions))
    axis = _axis_choice(draw, np.ndim(pool[i]), name not in ("argmax", "argmin"))
    ddof = draw(st.sampled_from([0, 0, 1, 2]))
    return "reduce", (name,), (i,), (axis, draw(st.booleans()), ddof)


def _draw_squeeze(draw, pool: list, i: int, flavor: Flavor) -> tuple:
    return "squeeze", (), (i,), (_squeeze_axis(draw, np.shape(pool[i])),)


def _squeeze_axis(draw, shape: tuple) -> Any:
    ones = [d for d, n in enumerate(shape) if n == 1]
    options = [None, *ones] + ([tuple(ones)] if ones else []) + [_axis_choice(draw, len(shape), False)]
    return draw(st.sampled_from(options))


def _draw_join(kind: str):
    def draw_join(draw, pool: list, i: int, flavor: Flavor) -> tuple:
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


def _draw_matmul(draw, pool: list, i: int, flavor: Flavor) -> tuple:
    shape = np.shape(pool[i])
    fits = [
        j for j, v in enumerate(pool) if np.ndim(v) >= 1 and shape and np.shape(v)[max(0, np.ndim(v) - 2)] == shape[-1]
    ]
    other = draw(st.sampled_from(fits)) if fits and draw(st.integers(0, 4)) else draw(st.integers(0, len(pool) - 1))
    return "matmul", (), (i, other), ()


def _draw_repeat(draw, pool: list, i: int, flavor: Flavor) -> tuple:
    nd = np.ndim(pool[i])
    n = np.shape(pool[i])[0] if nd else 1
    repeats = draw(st.one_of(st.integers(0, 2), st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    return "repeat", (), (i,), (repeats, 0 if nd else None)


def _draw_transpose(draw, pool: list, i: int, flavor: Flavor) -> tuple:
    perm = None if draw(st.integers(0, 3)) == 0 else tuple(draw(st.permutations(range(np.ndim(pool[i])))))
    return "transpose", (), (i,), (perm,)


def _three(kind: str):
    def draw_three(draw, pool: list, i: int, flavor: Flavor) -> tuple:
        x = pool[i]
        return kind, (), (i, _operand(draw, pool, flavor, x), _operand(draw, pool, flavor, x)), ()

    return draw_three


def _draw_scan(draw, pool: list, i: int, flavor: Flavor) -> tuple:
    name = draw(st.sampled_from(["cumsum", "cumsum", "cumprod", ".cumsum", ".cumprod"]))
    axis = None if draw(st.integers(0, 2)) == 0 else _axis_choice(draw, np.ndim(pool[i]), False)
    return "scan", (name, axis), (i,), ()


def _draw_sort(draw, pool: list, i: int, flavor: Flavor) -> tuple:
    axis = draw(st.sampled_from([-1, -1, None])) if draw(st.booleans()) else _axis_choice(draw, np.ndim(pool[i]), False)
    return "sort", (draw(st.sampled_from(flavor.sorts)), axis), (i,), ()


VIEW_FORMS = ["slice", "slice", "transpose", ".T", "reshape", "ravel", "swapaxes", "moveaxis", "expand_dims"]
VIEW_FORMS += ["squeeze", "flip", "atleast_1d", "atleast_2d", "atleast_3d", "asarray", "einsum"]


def draw_view_chain(draw, shape: tuple, length: int) -> tuple:
    """``length`` numpy view functions applied one after another, each drawn for the shape the ones
    before it made (a basic index, reshape, transpose, an einsum that sums nothing, ...; now and
    then an integer-array index, which numpy answers with a copy, or arguments numpy rejects)."""
    chain = []
    dummy = np.zeros(shape)
    for _ in range(length):
        form = draw(st.sampled_from(VIEW_FORMS))
        nd = dummy.ndim
        if form == "slice":
            args: tuple = (draw_index(draw, dummy.shape, fancy=draw(st.integers(0, 9)) == 0),)
        elif form == "transpose":
            args = (None if draw(st.integers(0, 3)) == 0 else tuple(draw(st.permutations(range(nd)))),)
        elif form == "reshape":
            args = (draw_reshape(draw, dummy.shape),)
        elif form in ("swapaxes", "moveaxis"):
            args = (_axis_choice(draw, nd, False), _axis_choice(draw, nd, False))
        elif form == "expand_dims":
            args = (draw(st.integers(-nd - 1, nd)),)
        elif form == "squeeze":
            args = (_squeeze_axis(draw, dummy.shape),)
        elif form == "flip":
            args = (_axis_choice(draw, nd),)
        elif form == "einsum":
            args = (_view_equation(draw, dummy.shape),)
        else:
            args = ()
        chain.append((form, args))
        try:
            dummy = view(form, args, dummy)
        except Exception:
            break  # (numpy rejects the chain: the step will fail to draw, or be the last)
    return tuple(chain)


def _view_equation(draw, shape: tuple) -> str:
    """einsum subscripts of one operand that sum nothing: a permutation (explicit, or implicit
    'ba'), or a diagonal of two equal dims ('ii->i'); numpy returns a view of the operand."""
    letters = string.ascii_lowercase[: len(shape)]
    if len(shape) >= 2 and shape[0] == shape[1] and draw(st.integers(0, 2)) == 0:
        spec = "a" + letters[1:].replace("b", "a", 1)  # (dims 0 and 1: one letter, the diagonal)
        return f"{spec}->{''.join(draw(st.permutations(sorted(set(spec)))))}"
    perm = "".join(draw(st.permutations(letters)))
    return perm if draw(st.integers(0, 3)) == 0 else f"{letters}->{perm}"


def _draw_view(draw, pool: list, i: int, flavor: Flavor) -> tuple:
    return "view", (draw_view_chain(draw, np.shape(pool[i]), draw(st.integers(1, 3))),), (i,), ()


def _draw_write(draw, pool: list, i: int, flavor: Flavor) -> tuple:
    """``b = BUFFER(x); w = VIEWS(b); b-or-w[key] WRITE v``, then b, w or x: every index form,
    the views written after they are taken (either way round), copies written afterwards."""
    filled = [j for j, v in enumerate(pool) if np.size(v)]
    if filled and draw(st.integers(0, 4)):  # (mostly a value with elements: a write into nothing shows little)
        i = draw(st.sampled_from(filled))
    x = pool[i]
    form = draw(st.sampled_from(BUFFERS))
    into = draw(st.sampled_from(["base", "view", "base", "view", "helper"]))
    length = draw(st.integers(1 if into == "view" else 0, 2))
    chain = draw_view_chain(draw, np.shape(x), length)
    how = draw(st.sampled_from(flavor.writes))
    other = "base" if into == "view" else "view"
    written = "view" if into == "view" else "base"
    result = draw(st.sampled_from([other, other, written, "original"] if chain else ["base", "base", "original"]))
    try:
        b = quietly(buffer, form, x)
        target = quietly(views, chain, b) if into == "view" else b  # (into "helper": b, in a function)
        key = draw_key(draw, np.shape(target))
        region = np.shape(target[key])
    except Exception:  # numpy rejects the buffer, the views or the key
        key, region = 0, ()
    # (numpy 2.4's ufunc.at crashes, a segmentation fault, on a value that does not broadcast to
    # the region, with an Ellipsis in the index: np.add.at(np.zeros((1, 3)), (..., 2), np.zeros((2, 2, 3))))
    value = _value_for(draw, pool, flavor, region, strict=how.endswith(".at"))
    return "write", (form, chain, into, how, result, key), (i, value), ()


def _draw_mask_write(draw, pool: list, i: int, flavor: Flavor) -> tuple:
    """A write through a traced boolean mask: a bool pool value that covers some of the buffer's
    dims (where the key puts it), or ``b > 0`` computed in the step; a value for all the selected
    elements (a scalar, a 0-d or 1-element array, a row) and now and then one per element (numpy
    takes it when the count fits; graphc cannot know the count while tracing)."""
    filled = [j for j, v in enumerate(pool) if np.size(v)]
    if filled and draw(st.integers(0, 4)):
        i = draw(st.sampled_from(filled))
    shape = np.shape(pool[i])
    place = draw(st.sampled_from(["alone", "alone", "after slice", "after ellipsis", "before ellipsis"]))

    def covers(m: tuple) -> bool:
        if place == "alone" or place == "before ellipsis":
            return 0 < len(m) <= len(shape) and shape[: len(m)] == m
        if place == "after slice":
            return 0 < len(m) <= len(shape) - 1 and shape[1 : 1 + len(m)] == m
        return 0 < len(m) <= len(shape) and shape[len(shape) - len(m) :] == m

    masks = [j for j, v in enumerate(pool) if np.result_type(v).kind == "b" and covers(np.shape(v))]
    mask: Any = draw(st.sampled_from(masks)) if masks and draw(st.integers(0, 2)) else Const(None)
    if isinstance(mask, Const) and place != "alone":
        place = "alone"  # (b > 0 covers every dim)
    small = [j for j, v in enumerate(pool) if np.size(v) == 1 or np.ndim(v) == 0]
    choice = draw(st.integers(0, 5))
    if choice == 0 and small:
        value: Any = draw(st.sampled_from(small))
    elif choice == 1:
        value = draw(st.integers(0, len(pool) - 1))  # (per element, a row, or numpy rejects it)
    else:
        value = Const(draw(st.sampled_from(flavor.scalars)))
    form = draw(st.sampled_from(BUFFERS))
    how = draw(st.sampled_from(["=", "=", "+=", "-=", "*="]))
    return "mask_write", (form, how, place), (i, mask, value), ()


def _draw_two_names(draw, pool: list, i: int, flavor: Flavor) -> tuple:
    v = pool[i]
    shape = draw(shapes(2)) if draw(st.integers(0, 2)) == 0 else (2, *np.shape(v))
    dtype = draw(st.sampled_from(flavor.dtypes))
    key = draw_key(draw, shape)
    other_key = draw_key(draw, shape)
    const = draw(st.sampled_from(flavor.scalars))
    return "two_names", (shape, dtype, key, other_key, const, draw(st.sampled_from(["b", "c"]))), (i,), ()


def _draw_out(draw, pool: list, i: int, flavor: Flavor) -> tuple:
    """A ufunc (or np.clip) with ``out=buf`` or ``out=(buf,)``: a new np.zeros buffer of the
    result's shape (now and then with a leading dim more, or another dtype), or a copy of a pool
    value of that shape."""
    if draw(st.integers(0, 4)) == 0:
        kind, before, refs, _ = _three("clip")(draw, pool, i, flavor)
        name = "clip"
    else:
        kind, before, refs, _ = _draw_ufunc(draw, pool, i, flavor)
        name = before[0]
    try:
        like = np.asarray(quietly(run_program, ((kind, before, refs, ()),), (len(pool),), *pool)[0])
    except Exception:
        like = np.zeros(())
    shape, dtype = like.shape, like.dtype
    if draw(st.integers(0, 5)) == 0:
        shape = (2, *shape)
    if draw(st.integers(0, 4)) == 0:
        dtype = draw(st.sampled_from(flavor.dtypes))
    same = [j for j, v in enumerate(pool) if np.shape(v) == shape]
    form = draw(st.sampled_from(["zeros", "zeros", "copy", "array"])) if same else "zeros"
    src = draw(st.sampled_from(same)) if same else i
    as_tuple = draw(st.booleans())
    result = draw(st.sampled_from(["buffer", "returned"]))
    return "out", (name, form, as_tuple, result, shape, dtype), (src, *refs), ()


def _draw_astype(draw, pool: list, i: int, flavor: Flavor) -> tuple:
    return "astype", (), (i,), (draw(st.sampled_from(flavor.dtypes)),)


DRAW_STEP: dict[str, Callable] = {
    "ufunc": _draw_ufunc,
    "operator": _draw_operator,
    "inplace": lambda draw, pool, i, flavor: (
        "inplace",
        (draw(st.sampled_from(sorted(INPLACE) if flavor is NUMPY else ["+=", "-=", "*="])),),
        (i, _operand(draw, pool, flavor, pool[i])),
        (),
    ),
    "unary_operator": _draw_unary_operator,
    "reduce": _draw_reduce,
    "method_reduce": lambda draw, pool, i, flavor: (
        "method_reduce",
        (draw(st.sampled_from(["sum", "mean", "max", "min", "any", "all"])),),
        (i,),
        (_axis_choice(draw, np.ndim(pool[i])),),
    ),
    "einsum": lambda draw, pool, i, flavor: draw_einsum(draw, pool, i),
    "getitem": lambda draw, pool, i, flavor: ("getitem", (), (i,), (draw_index(draw, np.shape(pool[i]), mask=True),)),
    "reshape": lambda draw, pool, i, flavor: ("reshape", (), (i,), (draw_reshape(draw, np.shape(pool[i])),)),
    "transpose": _draw_transpose,
    "swapaxes": lambda draw, pool, i, flavor: (
        "swapaxes",
        (),
        (i,),
        (_axis_choice(draw, np.ndim(pool[i]), False), _axis_choice(draw, np.ndim(pool[i]), False)),
    ),
    "expand_dims": lambda draw, pool, i, flavor: (
        "expand_dims",
        (),
        (i,),
        (draw(st.integers(-np.ndim(pool[i]) - 1, np.ndim(pool[i]))),),
    ),
    "squeeze": _draw_squeeze,
    "ravel": lambda draw, pool, i, flavor: ("ravel", (), (i,), ()),
    "where": _three("where"),
    "clip": _three("clip"),
    "concatenate": _draw_join("concatenate"),
    "stack": _draw_join("stack"),
    "astype": _draw_astype,
    "matmul": _draw_matmul,
    "repeat": _draw_repeat,
    "branch": lambda draw, pool, i, flavor: ("branch", (), (i, _operand(draw, pool, flavor, pool[i])), ()),
    "asarray": lambda draw, pool, i, flavor: ("asarray", (), (i,), ()),
    "scan": _draw_scan,
    "sort": _draw_sort,
    "view": _draw_view,
    "write": _draw_write,
    "two_names": _draw_two_names,
    "mask_write": _draw_mask_write,
    "out": _draw_out,
}


def draw_step(draw, pool: list, flavor: Flavor = NUMPY) -> tuple:
    """One step (kind, static args before, operand refs, static args after) on the pool."""
    kind = draw(st.sampled_from(flavor.step_kinds))
    i = draw(st.integers(0, len(pool) - 1))
    return DRAW_STEP[kind](draw, pool, i, flavor)


# --- indices, shapes, einsum ----------------------------------------------------------------------------


def draw_index(draw, shape: tuple[int, ...], fancy: bool = True, mask: bool = False) -> Any:
    """A numpy index: ints (sometimes out of range), slices with negative and zero-crossing
    bounds and steps, None, an Ellipsis; with ``fancy`` integer lists or arrays (duplicates
    likely) on one axis; with ``mask`` a static bool array over the leading dims."""
    parts: list[Any] = []
    dims = list(shape)
    used_ellipsis = False
    if mask and dims and draw(st.integers(0, 5)) == 0:
        k = draw(st.integers(1, len(dims)))
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        parts.append(rng.random(tuple(dims[:k])) < 0.5)
        dims = dims[k:]
    while dims and draw(st.integers(0, 3)):
        n = dims.pop(0)
        choice = draw(st.integers(0, 9 if fancy else 8))
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


def draw_key(draw, shape: tuple[int, ...]) -> Any:
    """An index to write through: every form of ``draw_index``, and more often an integer array
    with duplicates, a bool mask of the whole array, or an Ellipsis with an int."""
    choice = draw(st.integers(0, 7))
    nd = len(shape)
    if choice == 0 and nd and shape[0]:
        n = shape[0]
        idx = draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=4))
        return idx + idx[:1] if draw(st.booleans()) else np.asarray(idx)  # duplicates
    if choice == 1:
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        return rng.random(shape) < 0.5
    if choice == 2 and nd and shape[-1]:
        return (Ellipsis, draw(st.integers(-shape[-1], shape[-1] - 1)))
    if choice == 3:
        return Ellipsis
    return draw_index(draw, shape, mask=True)


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


# --- programs ------------------------------------------------------------------------------------------------


@st.composite
def programs(draw, flavor: Flavor = NUMPY) -> tuple[tuple, tuple, tuple]:
    """(steps, outputs, inputs): 1-3 input arrays, 1-6 steps (numpy succeeds on all but perhaps
    the last), 1-3 outputs among the values."""
    inputs = []
    for _ in range(draw(st.integers(1, 3))):
        inputs.append(draw_array(draw, draw(st.sampled_from(flavor.dtypes)), draw(shapes()), flavor))
    pool: list[Any] = list(inputs)
    steps: list[tuple] = []
    raised = False
    branch_scalars: set[int] = set()
    for _ in range(draw(st.integers(1, 6))):
        step = draw_step(draw, pool, flavor)
        if step[0] in ("write", "mask_write", "out", "inplace") and step[2][0] in branch_scalars:
            continue  # (a documented deviation: a value that leaves a traced if is a 0-d array to graphc)
        if step[:2] == ("operator", ("**",)) and any(r in branch_scalars for r in step[2] if isinstance(r, int)):
            continue  # (the same: its ** is the 0-d array's, with numpy's fast paths, not a scalar's pow)
        try:
            value = quietly(run_program, (step,), (len(pool),), *pool)[0]
        except Exception as exc:  # numpy rejects it: now and then that is the program's (last) step
            if flavor is NUMPY and not _value_dependent(step, exc) and draw(st.integers(0, 4)) == 0:
                steps.append(step)
                raised = True
                break
            continue
        if flavor is GRAD and not _finite(value):
            continue  # (a nan or inf value: its derivative is nan, even times a zero cotangent)
        steps.append(step)
        if step[0] == "branch" and isinstance(value, np.generic):
            branch_scalars.add(len(pool))
        pool.append(value)
    if not steps:
        steps.append(("ufunc", ("negative",), (0,), ()))
        pool.append(None)
    last = len(pool) - (0 if raised else 1)
    extra = draw(st.lists(st.integers(0, len(pool) - 1), max_size=2))
    outputs = (last, *[j for j in extra if j != last])
    return tuple(steps), outputs, tuple(inputs)


def _value_dependent(step: tuple, exc: Exception) -> bool:
    """numpy's error depends on the traced values, which graphc does not check (a documented
    deviation, docs/fuzzing_numpy.md): ``y[i] += v`` with an integer index takes numpy's scalar
    path, which stores ``y[i] + v`` into the element and raises OverflowError when a wider
    integer result is out of its range; graphc wraps it."""
    kind, before, refs, _after = step
    return kind == "write" and before[3] in ("+=", "-=", "*=") and isinstance(exc, OverflowError)


def _finite(value: Any) -> bool:
    arr = np.asarray(value)
    return arr.dtype.kind != "f" or bool(np.all(np.isfinite(arr)))


def describe(steps: tuple, outputs: tuple, inputs: tuple) -> str:
    """The program as text, to reproduce a failure: its inputs, steps and outputs."""
    lines = [f"input {k}: np.array({x.tolist()!r}, {str(x.dtype)!r}).reshape({x.shape})" for k, x in enumerate(inputs)]
    lines += [f"step {len(inputs) + k}: {s!r}" for k, s in enumerate(steps)]
    return "\n".join(lines + [f"outputs: {outputs}"])
