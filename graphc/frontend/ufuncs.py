"""numpy ufuncs on traced arrays.

Type resolution is numpy's own: ``ufunc.resolve_dtypes`` picks the inner loop from the operand
dtypes, with Python scalars weak and numpy scalars strong (NEP 50). Operands are converted to the
loop's input dtypes, then one primitive is emitted.

One exception: next to a bfloat16 operand a Python float stays weak (``x_bf16 * 0.5`` is
bfloat16, as in JAX). numpy with ml_dtypes picks a float32 loop there, which would silently turn
a bfloat16 model into a float32 one at its first scalar.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.core import dtypes
from graphc.core.errors import TraceError, numpy_error
from graphc.core.ir import bounded_put
from graphc.frontend.tracer import HANDLERS, Tracer, bind, fresh, lift, mark_scalars, registered_handler, user_location

# ufunc -> (primitive, attrs). The primitive sees operands already converted to the loop dtype.
_SIMPLE: dict[np.ufunc, tuple[str, dict[str, Any]]] = {
    np.add: ("add", {}),
    np.subtract: ("sub", {}),
    np.multiply: ("mul", {}),
    np.true_divide: ("div", {}),
    np.power: ("pow", {}),
    np.float_power: ("pow", {}),
    np.maximum: ("maximum", {}),
    np.minimum: ("minimum", {}),
    np.negative: ("neg", {}),
    np.exp: ("exp", {}),
    np.log: ("log", {}),
    np.log1p: ("log1p", {}),
    np.expm1: ("expm1", {}),
    np.tanh: ("tanh", {}),
    np.sqrt: ("sqrt", {}),
    np.sin: ("sin", {}),
    np.cos: ("cos", {}),
    np.absolute: ("abs", {}),
    np.sign: ("sign", {}),
    np.logical_not: ("logical_not", {}),
    np.logical_and: ("logical_and", {}),
    np.logical_or: ("logical_or", {}),
    np.equal: ("compare", {"direction": "eq"}),
    np.not_equal: ("compare", {"direction": "ne"}),
    np.less: ("compare", {"direction": "lt"}),
    np.less_equal: ("compare", {"direction": "le"}),
    np.greater: ("compare", {"direction": "gt"}),
    np.greater_equal: ("compare", {"direction": "ge"}),
}

# bitwise ops on bool arrays are the logical ops (masks combined with & | ^ ~)
_BOOL_ONLY = {
    np.bitwise_and: "logical_and",
    np.bitwise_or: "logical_or",
    np.bitwise_xor: "logical_xor",
    np.invert: "logical_not",
}
# numpy's logical ufuncs take numbers too (loops like 'dd->?'): an operand is true where it is
# nonzero (nan included), as ``astype(bool)`` makes it
_LOGICAL: dict[np.ufunc, str] = {
    np.logical_and: "logical_and",
    np.logical_or: "logical_or",
    np.logical_xor: "logical_xor",
}

_REDUCE: dict[np.ufunc, Callable[..., Any]] = {np.add: np.sum, np.maximum: np.max, np.minimum: np.min}


def _operand_dtype(x: Any):
    """What resolve_dtypes needs: a dtype for arrays and numpy scalars, the Python type for
    Python int/float (weak scalars, NEP 50)."""
    if type(x) in (int, float):  # (a Python number, the other usual operand: at once; not a bool)
        return type(x)
    if isinstance(x, Tracer):
        if x._weak:  # stands for a Python number
            return np.dtype(np.bool_) if x.dtype.kind == "b" else (float if x.dtype.kind == "f" else int)
        return x.dtype
    if type(x).__name__ == "_Undefined":
        raise x.error() if x.name else TraceError("a variable is used before it has a value", user_location())
    if isinstance(x, (np.ndarray, np.generic)):
        return x.dtype
    if isinstance(x, bool):
        return np.dtype(np.bool_)
    if isinstance(x, (int, float)):
        return type(x)
    if isinstance(x, complex):
        raise TraceError("complex numbers are not supported", user_location())
    if isinstance(x, (list, tuple)):
        return lift(x).dtype
    raise TraceError(f"cannot use {type(x).__name__} as an array operand", user_location())


def resolve_loop(ufunc: np.ufunc, inputs: tuple) -> tuple[np.dtype, ...]:
    """numpy's loop signature (input dtypes..., output dtypes...) for these operands."""
    # (a traced array that is not weak, nearly every operand: its dtype, without a call)
    in_dts = tuple([x._val.type.dtype if type(x) is Tracer and not x._weak else _operand_dtype(x) for x in inputs])
    if dtypes.BFLOAT16 in in_dts:  # Python floats stay weak next to bfloat16 (the module doc)
        in_dts = tuple(dtypes.BFLOAT16 if d is float else d for d in in_dts)
    # only Python numbers (some as weak arrays): their own dtypes
    if isinstance(in_dts[0], type) and all([isinstance(d, type) for d in in_dts]):
        in_dts = tuple(x.dtype if isinstance(x, Tracer) else d for x, d in zip(inputs, in_dts))
    key = (ufunc, in_dts)
    loop = _LOOPS.get(key)
    if loop is not None:
        return loop
    try:
        loop = ufunc.resolve_dtypes(in_dts + (None,) * ufunc.nout)  # (a tuple of dtypes)
    except (TypeError, np.exceptions.DTypePromotionError) as exc:  # (numpy raises it: a TypeError)
        shown = ", ".join(str(getattr(d, "__name__", d)) for d in in_dts)
        message = f"{ufunc_name(ufunc)} has no loop for operand dtypes ({shown}): {exc}"
        raise numpy_error(exc, TraceError, user_location(), message) from None
    return bounded_put(_LOOPS, key, loop)


# numpy's loop per (ufunc, operand dtypes and Python number types): resolve_dtypes is a function of
# them alone, and a model calls the same few ufuncs on the same few dtypes in every layer
_LOOPS: dict[tuple, tuple[np.dtype, ...]] = {}


def apply_ufunc(ufunc: np.ufunc, *inputs: Any) -> Tracer:
    """Call a supported elementwise ufunc with numpy's exact type resolution."""
    plain = _PLAIN.get(ufunc)
    if plain is not None:  # one primitive on the operands converted to the loop's dtypes (most calls)
        sig = resolve_loop(ufunc, inputs)
        # lift(x, dt) of each operand (a traced array of that dtype already, the usual one: itself)
        out = bind(
            plain, *[x if type(x) is Tracer and x._val.type.dtype is dt else lift(x, dt) for x, dt in zip(inputs, sig)]
        )
        assert out.dtype == sig[-1], (ufunc, sig, out.dtype)
        out._weak = _all_weak(inputs) and out.dtype.kind != "b"
        return out
    gufunc = HANDLERS.gufuncs.get(ufunc)
    if gufunc is not None:  # not elementwise (np.matmul): frontend/functions.py implements it
        return gufunc(*inputs)
    sig = resolve_loop(ufunc, inputs)
    loop_in = sig[: ufunc.nin]
    if ufunc in _COMPARISONS:
        known = _compare_out_of_range(_COMPARISONS[ufunc], inputs, loop_in[0])
        if known is not None:
            return known
    operands = [lift(x, dt) for x, dt in zip(inputs, loop_in)]
    if ufunc is np.positive or (ufunc is np.absolute and sig[0].kind in "bu"):  # |x| of bool, uint: x
        return fresh(operands[0])
    if ufunc is np.negative and sig[0].kind == "u":  # numpy wraps modulo 2**n: 0 - x
        return bind("sub", lift(np.zeros((), sig[0])), operands[0])
    if ufunc is np.square:
        return bind("mul", operands[0], operands[0])
    if ufunc is np.reciprocal:
        if not dtypes.is_float(sig[0]):
            raise TraceError("np.reciprocal of integers is not supported (it truncates)", user_location())
        return bind("div", lift(np.ones((), sig[0])), operands[0])
    if ufunc in COMPOSITE:
        return _composite(ufunc, sig, operands)
    if ufunc in _BOOL_ONLY:
        if any(dt.kind != "b" for dt in loop_in):
            raise TraceError(
                f"numpy.{ufunc.__name__} is supported on bool arrays only (as logical and/or/xor/not)", user_location()
            )
        return _logical(_BOOL_ONLY[ufunc], operands)
    if ufunc in _LOGICAL or ufunc is np.logical_not:
        truth = [x if x.dtype.kind == "b" else bind("convert", x, dtype=np.dtype(np.bool_)) for x in operands]
        return _logical(_LOGICAL.get(ufunc, "logical_not"), truth)
    if ufunc in _COMPARISONS and loop_in[0] != loop_in[1]:
        return _mixed_sign_compare(_COMPARISONS[ufunc], *operands)
    prim, attrs = _SIMPLE[ufunc]
    out = bind(prim, *operands, **attrs)
    assert out.dtype == sig[-1], (ufunc, sig, out.dtype)
    out._weak = _all_weak(inputs) and out.dtype.kind != "b"
    return out


def _all_weak(inputs: tuple) -> bool:
    """Whether every operand stands for a Python number (the result is weak too)."""
    for x in inputs:
        if type(x) is Tracer and not x._weak or not _is_weak(x):  # (a traced array that is not weak: at once)
            return False
    return True


def _logical(prim: str, operands: list[Tracer]) -> Tracer:
    """and / or / not of bool operands; xor is ``a != b``."""
    if prim == "logical_xor":
        return bind("compare", *operands, direction="ne")
    return bind(prim, *operands)


def _mixed_sign_compare(direction: str, a: Tracer, b: Tracer) -> Tracer:
    """numpy 2 compares int64 with uint64 exactly (loops 'qQ->?' and 'Qq->?', no common dtype):
    a negative signed value is below every unsigned one, and otherwise the two compare as uint64."""
    if a.dtype.kind == "u":
        a, b, direction = b, a, _SWAPPED[direction]  # now a (signed) <direction> b (unsigned)
    negative = bind("compare", a, lift(np.zeros((), a.dtype)), direction="lt")
    as_unsigned = bind("compare", bind("convert", a, dtype=b.dtype), b, direction=direction)
    if direction in ("lt", "le", "ne"):  # true for every negative a
        return bind("logical_or", negative, as_unsigned)
    return bind("logical_and", bind("logical_not", negative), as_unsigned)  # eq, gt, ge: false for them


def _is_weak(x: Any) -> bool:
    return (isinstance(x, Tracer) and x._weak) or (isinstance(x, (int, float)) and not isinstance(x, (bool, Tracer)))


_COMPARISONS = {u: attrs["direction"] for u, (prim, attrs) in _SIMPLE.items() if prim == "compare"}
# the ufuncs that are one primitive without attributes whatever their loop: apply_ufunc emits them at once
# (the others of _SIMPLE: |x| and -x of unsigned ints, the logical ops on numbers, mixed-sign comparisons)
_PLAIN: dict[np.ufunc, str] = {
    u: prim
    for u, (prim, attrs) in _SIMPLE.items()
    if not attrs and u not in (np.absolute, np.negative, np.logical_not) and u not in _LOGICAL
}
_SWAPPED = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def _compare_out_of_range(direction: str, inputs: tuple, loop_dt: np.dtype) -> Tracer | None:
    """numpy 2 compares an integer array with a Python int outside the array's dtype by value
    (``int8_array < 1000`` is all True, ``uint8_array == -1`` all False) instead of raising
    OverflowError: the result does not depend on the array, only on its shape."""
    if loop_dt.kind not in "iu":
        return None
    info = np.iinfo(loop_dt)
    for i, v in enumerate(inputs):
        if type(v) is int and not info.min <= v <= info.max:
            other = lift(inputs[1 - i])
            d = direction if i == 1 else _SWAPPED[direction]  # now `other <d> v`
            above = v > info.max  # v is above (or below) every value other can hold
            value = {"eq": False, "ne": True, "lt": above, "le": above, "gt": not above, "ge": not above}[d]
            return bind("broadcast_to", lift(np.asarray(value)), shape=other.shape)
    return None


_LOG_BASE = {np.log2: np.log(2.0), np.log10: np.log(10.0)}


# --- integer floor division -------------------------------------------------------------------

_U64, _F64 = np.dtype(np.uint64), np.dtype(np.float64)
_BELOW_ONE = 1.0 - 2.0**-49  # scales a float64 quotient estimate so that it errs low, never high


def _const(value: Any, dt: np.dtype) -> Tracer:
    return lift(np.asarray(value, dt))


def _udivmod(n: Tracer, d: Tracer, steps: int) -> tuple[Tracer, Tracer]:
    """Exact quotient and remainder of uint64 ``n`` by uint64 ``d >= 1``. Each step adds
    trunc(float64(r) / float64(d) * (1 - 2**-49)) to the quotient: the estimate is never above r / d
    (the four roundings err by less than 2**-50), so the remainder stays non-negative, and it loses
    less than r * 2**-48 + d. One step leaves r < 2d when n < 2**53 (the 8- to 32-bit dtypes), two
    steps do for any uint64; one compare then brings r below d."""
    fd = bind("convert", d, dtype=_F64)
    q, r = None, n
    for _ in range(steps):
        est = bind("mul", bind("div", bind("convert", r, dtype=_F64), fd), _const(_BELOW_ONE, _F64))
        t = bind("convert", est, dtype=_U64)
        q = t if q is None else bind("add", q, t)
        r = bind("sub", r, bind("mul", t, d))
    assert q is not None, "at least one step"
    over = bind("compare", r, d, direction="ge")
    return bind("add", q, bind("convert", over, dtype=_U64)), bind("where", over, bind("sub", r, d), r)


def _magnitude(x: Tracer, negative: Tracer) -> Tracer:
    """|x| as uint64, exact for the most negative int too (0 - x wraps to 2**63)."""
    ux = bind("convert", x, dtype=_U64)
    return bind("where", negative, bind("sub", _const(0, _U64), ux), ux)


def _int_floor_divmod(a: Tracer, b: Tracer) -> tuple[Tracer, Tracer]:
    """numpy's integer // and % exactly: the quotient rounds toward -inf, the remainder has the
    divisor's sign, both are 0 where the divisor is 0, and MIN // -1 wraps to MIN. The magnitudes
    are divided in uint64 (``_udivmod``), then the quotient gets its sign (and, when the signs differ
    and something remains, one more step down); the remainder is a - q * b, which wraps back to the
    exact value."""
    dt = a.dtype
    zero = _const(0, dt)
    by_zero = bind("compare", b, zero, direction="eq")
    b = bind("where", by_zero, _const(1, dt), b)
    steps = 2 if dt.itemsize == 8 else 1
    if dt.kind == "u":
        qu, _ = _udivmod(bind("convert", a, dtype=_U64), bind("convert", b, dtype=_U64), steps)
        q = bind("convert", qu, dtype=dt)
    else:
        a_neg = bind("compare", a, zero, direction="lt")
        b_neg = bind("compare", b, zero, direction="lt")
        qu, ru = _udivmod(_magnitude(a, a_neg), _magnitude(b, b_neg), steps)
        signs_differ = bind("compare", a_neg, b_neg, direction="ne")
        step_down = bind("logical_and", signs_differ, bind("compare", ru, _const(0, _U64), direction="ne"))
        qu = bind("add", qu, bind("convert", step_down, dtype=_U64))
        q = bind("convert", bind("where", signs_differ, bind("sub", _const(0, _U64), qu), qu), dtype=dt)
    r = bind("sub", a, bind("mul", q, b))
    return bind("where", by_zero, zero, q), bind("where", by_zero, zero, r)


def _composite(ufunc: np.ufunc, sig: tuple, operands: list[Tracer]) -> Tracer:
    """ufuncs that numpy itself defines from the primitives' functions."""
    if ufunc in _LOG_BASE:  # log2(x) = log(x) / log(2)
        return bind("div", bind("log", operands[0]), lift(np.asarray(_LOG_BASE[ufunc], sig[0])))
    if ufunc is np.exp2:  # 2**x
        return bind("pow", lift(np.asarray(2, sig[0])), operands[0])
    if ufunc is np.isnan:  # x != x
        return bind("compare", operands[0], operands[0], direction="ne")
    if ufunc in (np.isfinite, np.isinf):  # |x| < inf, |x| == inf (nan is neither); ints and bools are finite
        x = operands[0]
        if not dtypes.is_float(sig[0]):
            return bind("broadcast_to", lift(np.asarray(ufunc is np.isfinite)), shape=x.shape)
        inf = lift(np.asarray(np.inf, sig[0]))
        return bind("compare", bind("abs", x), inf, direction="lt" if ufunc is np.isfinite else "eq")
    if ufunc in _DIVISION:
        if sig[0].kind not in "iu":
            raise TraceError(
                f"numpy.{ufunc.__name__} of {sig[0]} operands is not supported: graphc has no exact decomposition "
                "of numpy's float floor division (it needs fmod); it is supported for integers",
                user_location(),
            )
        q, r = _int_floor_divmod(*operands)
        results: dict[np.ufunc, Any] = {np.floor_divide: q, np.remainder: r, np.divmod: (q, r)}
        return results[ufunc]
    if ufunc in _ROUNDING:
        return _round_to_integer(ufunc, operands[0])
    if ufunc is np.logaddexp:  # a == b: a + log(2); else max(a, b) + log1p(exp(-|a - b|)), as numpy does
        a, b = operands
        big = bind("maximum", a, b)
        diff = bind("abs", bind("sub", a, b))
        general = bind("add", big, bind("log1p", bind("exp", bind("neg", diff))))
        equal = bind("add", a, lift(np.asarray(np.log(2.0), sig[0])))
        return bind("where", bind("compare", a, b, direction="eq"), equal, general)
    raise AssertionError(ufunc)


_DIVISION = (np.floor_divide, np.remainder, np.divmod)
_ROUNDING = (np.floor, np.ceil, np.trunc)


def _round_to_integer(ufunc: np.ufunc, x: Tracer) -> Tracer:
    """floor / ceil / trunc of floats: t = x converted to int64 and back (truncation), one step
    down (floor) or up (ceil) where t is on the wrong side of x. Values of magnitude 2**(mantissa
    bits) and more are integers already, and nan and inf stay; a zero result takes x's sign
    (floor(-0.0) and ceil(-0.5) are -0.0). numpy's integer and bool loops return the values."""
    if not dtypes.is_float(x.dtype):
        return fresh(x)
    dt = x.dtype
    exact = lift(np.asarray(2.0 ** (np.finfo(dt).nmant if dt.kind == "f" else 7), dt))
    small = bind("compare", bind("abs", x), exact, direction="lt")  # (false for nan and inf)
    safe = bind("where", small, x, lift(np.zeros((), dt)))
    t = bind("convert", bind("convert", safe, dtype=np.dtype(np.int64)), dtype=dt)
    one = lift(np.ones((), dt))
    if ufunc is np.floor:
        t = bind("sub", t, bind("convert", bind("compare", t, safe, direction="gt"), dtype=dt))
    elif ufunc is np.ceil:
        t = bind("add", t, bind("convert", bind("compare", t, safe, direction="lt"), dtype=dt))
    signed_zero = bind("mul", safe, lift(np.zeros((), dt)))  # (safe, not x: inf * 0 would warn)
    t = bind("where", bind("compare", t, bind("sub", one, one), direction="eq"), signed_zero, t)
    return bind("where", small, t, x)


COMPOSITE = set(_LOG_BASE) | set(_DIVISION) | set(_ROUNDING) | {np.exp2, np.isnan, np.isfinite, np.isinf, np.logaddexp}
SUPPORTED = (
    set(_SIMPLE) | set(_BOOL_ONLY) | set(_LOGICAL) | COMPOSITE | {np.positive, np.square, np.reciprocal, np.matmul}
)


def scalar_power(base: Tracer, exponent: Any) -> Tracer:
    """``base ** exponent`` for a base numpy would hold as a numpy scalar (Tracer._scalar): np.power's
    dtype, computed as pow. numpy's scalar arithmetic has none of the fast paths of its float power
    loop, which sees a 0-d exponent with stride 0 and takes sqrt for 0.5 (-0.0 ** 0.5 is -0.0, not
    0.0): the pow runs on (1,)-shaped operands, which that loop walks with their strides."""
    sig = resolve_loop(np.power, (base, exponent))
    x, e = (lift(v, dt) for v, dt in zip((base, exponent), sig[:2]))
    if sig[0].kind != "f" or x.shape or e.shape:  # an array exponent: numpy's ufunc call
        return apply_ufunc(np.power, base, exponent)
    one = (1,)
    out = bind("reshape", bind("pow", bind("reshape", x, shape=one), bind("reshape", e, shape=one)), shape=())
    out._scalar = True
    return out


def ufunc_name(ufunc: np.ufunc) -> str:
    """The ufunc as the user's code names it: ``numpy.exp`` for numpy's; for another library's
    (scipy's are numpy ufuncs too, and reach graphc the same way), the shortest public module of
    the program's imports that holds it (``scipy.special.gammaln``), found by identity. Only error
    messages ask, so the walk over ``sys.modules`` costs nothing when tracing succeeds."""
    name = ufunc.__name__
    if getattr(np, name, None) is ufunc:
        return f"numpy.{name}"
    holders = [
        module_name
        for module_name, module in list(sys.modules.items())
        if not any(part.startswith("_") for part in module_name.split("."))
        and getattr(module, "__dict__", {}).get(name) is ufunc
    ]
    if not holders:
        return f"numpy.{name}"  # (a ufunc no imported module names, as numpy's repr shows it)
    return f"{min(holders, key=lambda m: (m.count('.'), m))}.{name}"


def _ufunc_hint(ufunc: np.ufunc) -> str:
    """The supported rewrite of an unsupported ufunc, if there is one (HANDLERS.hints)."""
    return HANDLERS.hints.get(ufunc_name(ufunc), "")


HANDLERS.hints.update(
    {
        "numpy.fmax": "; np.maximum(x, y) is supported (it propagates nan where fmax ignores it)",
        "numpy.fmin": "; np.minimum(x, y) is supported (it propagates nan where fmin ignores it)",
        "numpy.heaviside": "; use np.where(x > 0, 1.0, np.where(x == 0, h0, 0.0))",
        "numpy.sinh": "; use (np.exp(x) - np.exp(-x)) / 2",
        "numpy.cosh": "; use (np.exp(x) + np.exp(-x)) / 2",
        "numpy.tan": "; use np.sin(x) / np.cos(x)",
        "numpy.cbrt": "; use np.sign(x) * np.abs(x) ** (1 / 3)",
        "numpy.arctanh": "; use 0.5 * np.log1p(2 * x / (1 - x))",
    }
)


def handle_ufunc(ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any):
    if method == "__call__" and not kwargs and ufunc in SUPPORTED:  # a plain call (no library's ufunc is one)
        result = apply_ufunc(ufunc, *inputs)
        if type(result) is not Tracer:
            mark_scalars(result)
        elif not result._val.type.shape:  # (mark_scalars of one traced array)
            result._scalar = True
        return result
    if method == "at" or kwargs.get("out") is not None:  # in-place writes: frontend/indexing.py
        return registered_handler(HANDLERS.ufunc_inplace, "in-place ufunc")(ufunc, method, *inputs, **kwargs)
    kwargs.pop("out", None)
    if method == "reduce":
        if ufunc not in _REDUCE:
            raise TraceError(f"{ufunc_name(ufunc)}.reduce is not supported", user_location())
        axis = kwargs.pop("axis", 0)
        return _REDUCE[ufunc](inputs[0], axis=axis, **kwargs)
    if method != "__call__":
        raise TraceError(f"{ufunc_name(ufunc)}.{method} is not supported", user_location())
    library = HANDLERS.library_ufunc(ufunc) if HANDLERS.library_ufunc is not None else None
    if library is not None:  # a scipy.special ufunc (frontend/scipy_table.py)
        if kwargs:
            raise TraceError(f"{ufunc_name(ufunc)}: unsupported arguments {sorted(kwargs)}", user_location())
        result = library(ufunc, *inputs)
        mark_scalars(result)
        return result
    if ufunc not in SUPPORTED:
        raise TraceError(f"{ufunc_name(ufunc)} is not supported by graphc{_ufunc_hint(ufunc)}", user_location())
    dtype = kwargs.pop("dtype", None)
    if kwargs.pop("where", True) is not True:
        raise TraceError(f"{ufunc_name(ufunc)}(..., where=...) is not supported", user_location())
    kwargs.pop("casting", None)
    if kwargs:
        raise TraceError(f"{ufunc_name(ufunc)}: unsupported arguments {sorted(kwargs)}", user_location())
    if dtype is not None:  # numpy then picks the loop for that dtype
        inputs = tuple(lift(x, np.dtype(dtype)) for x in inputs)
    result = apply_ufunc(ufunc, *inputs)
    mark_scalars(result)  # (numpy returns a ufunc's 0-d results as numpy scalars)
    return result


HANDLERS.ufunc = handle_ufunc
HANDLERS.scalar_power = scalar_power
