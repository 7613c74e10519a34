"""scipy functions that numpy model code calls, mapped to compositions of graphc's numpy handlers.

graphc never imports scipy. A call reaches this table only when it already holds a traced value:

- scipy's ufuncs (``scipy.special.expit``, ``erf``, ...) are numpy ufuncs, so calling one on a
  traced array reaches ``Tracer.__array_ufunc__`` (frontend/ufuncs.py asks ``scipy_ufunc``);
- scipy's Python functions (``scipy.special.logsumexp``, ``softmax``, ``log_softmax``; the
  methods ``logpdf``, ``pdf`` and ``cdf`` of ``scipy.stats.norm``) would run
  scipy's own code on traced arrays; the source transform routes every call in the user's code
  through ``autograph_runtime.call``, which asks ``library_function`` for a replacement.

Both look the function up by identity in the scipy modules the program imported
(``sys.modules``), so a different object with the same name is never replaced.

``erf`` has no primitive: near 0 it is x * P(x**2), and farther out erfc(|x|) is
exp(-x**2) * Q(2 / |x|) / (|x| sqrt(pi)); P (degree 20, |x| <= 2) and Q (degree 28, |x| >= 1) are
Chebyshev interpolants of erf(x) / x and of erfcx(x) x sqrt(pi), computed from ``math.erf`` and
``math.erfc`` (the coefficients are below). erf uses P up to |x| = 2, erfc up to |x| = 1 (beyond, 1 - erf would lose
relative precision); both are within 1e-13 relative of ``math.erf`` / ``math.erfc`` in float64.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.core import dtypes
from graphc.frontend.functions import max_, norm_axes, sum_
from graphc.frontend.shape_functions import squeeze
from graphc.frontend.tracer import HANDLERS, Tracer, bind, contains_tracer, convert, lift
from graphc.frontend.ufuncs import apply_ufunc, resolve_loop

_SQRT_PI = math.sqrt(math.pi)


# --- erf ------------------------------------------------------------------------------------------


# Chebyshev coefficients (numpy.polynomial.chebyshev.Chebyshev.interpolate, first kind): erf(x) / x
# as a function of t = x**2 on [0, 4] (degree 20), and erfc(x) exp(x**2) x sqrt(pi) as a function of
# u = 2 / x on [0, 2] (degree 28). tests/frontend/test_numpy_coverage.py recomputes both from math.erf and
# math.erfc.
SMALL_DOMAIN, LARGE_DOMAIN = (0.0, 4.0), (0.0, 2.0)
SMALL = (
    0.7415552820424018,
    -0.3010710733865949,
    0.06899483068983163,
    -0.013916271264722193,
    0.0024207995224334007,
    -0.0003658639685847367,
    4.8620984432055566e-05,
    -5.749256557935749e-06,
    6.113243576012552e-07,
    -5.8991015258724616e-08,
    5.207008818765782e-09,
    -4.2329744652591204e-10,
    3.188089459790446e-11,
    -2.2360909572947323e-12,
    1.4662933452838823e-13,
    -8.9794614090436e-15,
    4.192629328307251e-16,
    8.041511287623248e-17,
    -4.85419169667732e-16,
    3.404547717146797e-16,
    -1.2739137698726267e-15,
)
LARGE = (
    0.8932779551393666,
    -0.12781554312812993,
    -0.013285101755558215,
    0.006802769862487118,
    -0.0011361653753692645,
    -2.7544905581262643e-05,
    7.662361086217743e-05,
    -2.4405580782918124e-05,
    3.3229935626174806e-06,
    6.393698099006994e-07,
    -5.378399392458379e-07,
    1.699295298786505e-07,
    -2.40757159766753e-08,
    -5.7058077499973885e-09,
    5.095230683593266e-09,
    -1.8311584773808194e-09,
    3.4113360241811487e-10,
    3.475245953453463e-11,
    -5.706720204156444e-11,
    2.5567014865535776e-11,
    -6.618333275673344e-12,
    3.900013328420853e-13,
    6.234385376044598e-13,
    -3.972736091252247e-13,
    1.3944598992145435e-13,
    -2.7425774911067176e-14,
    -5.186329883862987e-15,
    5.58192812815285e-15,
    -4.2334813079293025e-15,
)


def _const(value: float, dt: np.dtype) -> Tracer:
    return lift(np.asarray(value, dt))


def _clenshaw(coef: tuple[float, ...], domain: tuple[float, float], t: Tracer) -> Tracer:
    """The Chebyshev series at t (inside its domain), by Clenshaw's recurrence."""
    low, high = domain
    dt = t.dtype
    y = bind("mul", bind("sub", t, _const((low + high) / 2, dt)), _const(2 / (high - low), dt))
    two_y = bind("add", y, y)
    b1 = b2 = _const(0.0, dt)
    for c in reversed(coef[1:]):
        b1, b2 = bind("sub", bind("add", bind("mul", two_y, b1), _const(c, dt)), b2), b1
    return bind("sub", bind("add", bind("mul", y, b1), _const(coef[0], dt)), b2)


def _erf_parts(x: Tracer, switch: float) -> tuple[Tracer, Tracer, Tracer]:
    """(small, tail, is_small): erf(x) for |x| <= switch, erfc(|x|) beyond, and which applies
    (switch in [1, 2], where both interpolants hold). Each branch sees its inputs clamped into its
    own range, so neither makes inf or nan (nor do their gradients)."""
    dt = x.dtype
    ax = bind("abs", x)
    is_small = bind("compare", ax, _const(switch, dt), direction="le")
    xs = bind("minimum", bind("maximum", x, _const(-switch, dt)), _const(switch, dt))
    small = bind("mul", xs, _clenshaw(SMALL, SMALL_DOMAIN, bind("mul", xs, xs)))
    xl = bind("maximum", ax, _const(switch, dt))
    q = _clenshaw(LARGE, LARGE_DOMAIN, bind("div", _const(2.0, dt), xl))
    tail = bind(
        "div", bind("mul", bind("exp", bind("neg", bind("mul", xl, xl))), q), bind("mul", xl, _const(_SQRT_PI, dt))
    )
    return small, tail, is_small


def _float_operand(ufunc: np.ufunc, x: Any) -> Tracer:
    """x in the dtype of the scipy ufunc's loop (ints use the float64 loop)."""
    sig = resolve_loop(ufunc, (x,))
    return lift(x, sig[0])


def _in_float64(impl: Callable[[Tracer], Tracer]) -> Callable[[np.ufunc, Any], Tracer]:
    """The erf family computes in float64 and rounds to the loop's dtype, as scipy's float32 loops do
    (exp(-x**2) in float32 would lose relative precision in the tails)."""

    @functools.wraps(impl)
    def run(ufunc: np.ufunc, x: Any) -> Tracer:
        t = _float_operand(ufunc, x)
        return convert(impl(convert(t, np.float64)), t.dtype)

    return run


def _erf64(x: Tracer) -> Tracer:
    small, tail, is_small = _erf_parts(x, 2.0)
    sign = bind("sign", x)
    large = bind("mul", sign, bind("sub", _const(1.0, x.dtype), tail))  # (sign of nan is nan)
    return bind("where", is_small, small, large)


def _erfc64(x: Tracer) -> Tracer:
    small, tail, is_small = _erf_parts(x, 1.0)
    one = _const(1.0, x.dtype)
    negative = bind("compare", x, _const(0.0, x.dtype), direction="lt")
    large = bind("where", negative, bind("sub", _const(2.0, x.dtype), tail), tail)
    return bind("where", is_small, bind("sub", one, small), large)


def _ndtr64(x: Tracer) -> Tracer:
    """The standard normal CDF: erfc(-x / sqrt(2)) / 2."""
    scaled = bind("mul", bind("neg", x), _const(1 / math.sqrt(2.0), x.dtype))
    return bind("mul", _erfc64(scaled), _const(0.5, x.dtype))


erf, erfc, ndtr = _in_float64(_erf64), _in_float64(_erfc64), _in_float64(_ndtr64)


def expit(ufunc: np.ufunc, x: Any) -> Tracer:
    """1 / (1 + exp(-x)), scipy's formula."""
    x = _float_operand(ufunc, x)
    return apply_ufunc(np.true_divide, 1.0, apply_ufunc(np.add, 1.0, apply_ufunc(np.exp, apply_ufunc(np.negative, x))))


def log_expit(ufunc: np.ufunc, x: Any) -> Tracer:
    """log(expit(x)) = -log(1 + exp(-x)), without overflow."""
    x = _float_operand(ufunc, x)
    return apply_ufunc(np.negative, apply_ufunc(np.logaddexp, 0.0, apply_ufunc(np.negative, x)))


def logit(ufunc: np.ufunc, p: Any) -> Tracer:
    p = _float_operand(ufunc, p)
    return apply_ufunc(np.log, apply_ufunc(np.true_divide, p, apply_ufunc(np.subtract, 1.0, p)))


def xlogy(ufunc: np.ufunc, x: Any, y: Any) -> Tracer:
    """x * log(y), and 0 where x == 0 and y is not nan (also where y == 0), as scipy does."""
    sig = resolve_loop(ufunc, (x, y))
    tx, ty = lift(x, sig[0]), lift(y, sig[1])
    zero = apply_ufunc(
        np.logical_and, apply_ufunc(np.equal, tx, 0.0), apply_ufunc(np.logical_not, apply_ufunc(np.isnan, ty))
    )
    safe_y = bind("where", zero, _const(1.0, ty.dtype), ty)
    return bind("where", zero, _const(0.0, tx.dtype), apply_ufunc(np.multiply, tx, apply_ufunc(np.log, safe_y)))


_SPECIAL_UFUNCS: dict[str, Callable[..., Tracer]] = {
    "erf": erf,
    "erfc": erfc,
    "ndtr": ndtr,
    "expit": expit,
    "log_expit": log_expit,
    "logit": logit,
    "xlogy": xlogy,
}


def scipy_ufunc(ufunc: np.ufunc) -> Callable[..., Tracer] | None:
    """graphc's implementation of a scipy.special ufunc, called as ``impl(ufunc, *inputs)``."""
    special = sys.modules.get("scipy.special")
    name = getattr(ufunc, "__name__", None)
    if special is None or name not in _SPECIAL_UFUNCS or getattr(special, name, None) is not ufunc:
        return None
    return _SPECIAL_UFUNCS[name]


# --- scipy.special's Python functions -------------------------------------------------------------


def _float(a: Any) -> Tracer:
    x = lift(a)
    return x if dtypes.is_float(x.dtype) else convert(x, np.float64)


def logsumexp(a, axis=None, b=None, keepdims=False, return_sign=False):
    """log(sum(b * exp(a))) over ``axis``, shifted by the largest finite max as scipy does."""
    x = _float(a)
    axes = norm_axes(axis, x.ndim, "logsumexp")
    top = max_(x, axes, keepdims=True)
    top = bind("where", apply_ufunc(np.isfinite, top), top, _const(0.0, top.dtype))
    terms = apply_ufunc(np.exp, apply_ufunc(np.subtract, x, top))
    if b is not None:
        terms = apply_ufunc(np.multiply, b, terms)
    total = sum_(terms, axes, keepdims=keepdims)
    sign = None
    if return_sign:
        sign = apply_ufunc(np.sign, total)
        total = apply_ufunc(np.absolute, total)
    shift = top if keepdims else squeeze(top, axes)
    out = apply_ufunc(np.add, apply_ufunc(np.log, total), shift)
    return (out, sign) if return_sign else out


def softmax(x, axis=None):
    t = _float(x)
    axes = norm_axes(axis, t.ndim, "softmax")
    e = apply_ufunc(np.exp, apply_ufunc(np.subtract, t, max_(t, axes, keepdims=True)))
    return apply_ufunc(np.true_divide, e, sum_(e, axes, keepdims=True))


def log_softmax(x, axis=None):
    t = _float(x)
    axes = norm_axes(axis, t.ndim, "log_softmax")
    shifted = apply_ufunc(np.subtract, t, max_(t, axes, keepdims=True))
    total = sum_(apply_ufunc(np.exp, shifted), axes, keepdims=True)
    return apply_ufunc(np.subtract, shifted, apply_ufunc(np.log, total))


_SPECIAL_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "logsumexp": logsumexp,
    "softmax": softmax,
    "log_softmax": log_softmax,
}


def _standardized(x: Any, loc: Any, scale: Any) -> Tracer:
    return apply_ufunc(np.true_divide, apply_ufunc(np.subtract, _float(x), loc), scale)


def norm_logpdf(x, loc=0.0, scale=1.0):
    """scipy.stats.norm.logpdf: -z**2 / 2 - log(scale) - log(2 pi) / 2, z = (x - loc) / scale."""
    z = _standardized(x, loc, scale)
    half_square = apply_ufunc(np.multiply, apply_ufunc(np.multiply, z, z), 0.5)
    log_scale = apply_ufunc(np.log, _float(scale))
    return apply_ufunc(
        np.subtract, apply_ufunc(np.negative, half_square), apply_ufunc(np.add, log_scale, 0.5 * math.log(2 * math.pi))
    )


def norm_pdf(x, loc=0.0, scale=1.0):
    return apply_ufunc(np.exp, norm_logpdf(x, loc, scale))


def norm_cdf(x, loc=0.0, scale=1.0):
    special = sys.modules["scipy.special"]  # (scipy.stats imports it)
    return ndtr(special.ndtr, _standardized(x, loc, scale))


_NORM_METHODS: dict[str, Callable[..., Any]] = {"logpdf": norm_logpdf, "pdf": norm_pdf, "cdf": norm_cdf}


def _scipy_replacement(fn: Any) -> Callable[..., Any] | None:
    special = sys.modules.get("scipy.special")
    name = getattr(fn, "__name__", None)
    if special is not None and name in _SPECIAL_FUNCTIONS and getattr(special, name, None) is fn:
        return _SPECIAL_FUNCTIONS[name]
    stats = sys.modules.get("scipy.stats")
    owner = getattr(fn, "__self__", None)
    if stats is not None and owner is not None and owner is getattr(stats, "norm", None) and name in _NORM_METHODS:
        return _NORM_METHODS[name]
    return None


def library_function(fn: Any, args: tuple, kwargs: dict) -> Callable[..., Any] | None:
    """graphc's replacement for ``fn`` when it is one of the scipy functions in the tables and the
    call holds a traced value; None otherwise (the call runs as written)."""
    replacement = _scipy_replacement(fn)
    if replacement is None:
        return None
    if not (any(contains_tracer(a) for a in args) or any(contains_tracer(v) for v in kwargs.values())):
        return None
    return replacement


HANDLERS.library = library_function
_CONVERTED_ONLY = (
    "; graphc implements {name} itself when the call is in code it converts (a function defined in a file, "
    "not a lambda)"
)
for _module, _names in (("scipy.special._logsumexp", ("logsumexp", "softmax", "log_softmax")),):
    for _name in _names:
        HANDLERS.hints[f"library:{_module}.{_name}"] = _CONVERTED_ONLY.format(name=f"scipy.special.{_name}")
HANDLERS.library_ufunc = scipy_ufunc
