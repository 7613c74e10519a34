"""Assignment through a traced boolean mask: ``dX[cache <= 0] = 0``, ``x[x < 0] *= 0.1``.

Reading ``x[mask]`` has a shape that depends on the data (the number of True elements), but
writing through it keeps x's shape: it is ``np.where(mask, v, x)``. numpy assigns the value to the
selected elements in order, broadcast to the selected shape ``x.shape[:d] + (count,) +
x.shape[d + mask.ndim:]`` (the mask covering dims d...); that does not depend on the data when the
value has no count dim or a count dim of 1 (a scalar, a 0-d or 1-element array, a row for every
selected row). A value with one entry per selected element needs the count: a TraceError.

Supported keys: the mask alone, or with whole slices (``:``) and one Ellipsis around it.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from graphc.core.errors import TraceError, numpy_error
from graphc.frontend.functions import broadcast, reshape_to
from graphc.frontend.tracer import Tracer, convert, fresh, lift, user_location


def traced_mask(key: Any) -> bool:
    """Whether ``key`` holds a traced boolean array (a mask whose count is not known)."""
    parts = key if type(key) is tuple else (key,)
    return any(isinstance(k, Tracer) and k.dtype.kind == "b" for k in parts)


def _mask_and_dim(x: Tracer, key: Any) -> tuple[Tracer, int]:
    """The mask and the first dim of x it covers; a TraceError for keys this module does not take."""
    parts = list(key) if type(key) is tuple else [key]
    masks = [i for i, k in enumerate(parts) if isinstance(k, Tracer) and k.dtype.kind == "b"]
    others = [k for i, k in enumerate(parts) if i not in masks]
    if len(masks) != 1 or not all(k is Ellipsis or k == slice(None) for k in others) or others.count(Ellipsis) > 1:
        raise TraceError(
            "assignment through a traced boolean mask is supported as x[mask] = v, also with whole slices and one "
            "Ellipsis around the mask (x[:, mask] = v); this key mixes it with other indices",
            user_location(),
        )
    mask = cast(Tracer, parts[masks[0]])
    before = parts[: masks[0]]
    after = parts[masks[0] + 1 :]
    if Ellipsis in before:
        d = x.ndim - mask.ndim - len(after)
    else:
        d = len(before)
    if d < 0 or d + mask.ndim > x.ndim or x.shape[d : d + mask.ndim] != mask.shape:
        raise TraceError(
            f"boolean index did not match indexed array: mask of shape {mask.shape} for dims starting at {d} of "
            f"an array of shape {x.shape}",
            user_location(),
        )
    return mask, d


def _spread(x: Tracer, mask: Tracer, d: int, value: Any, dtype: np.dtype | None) -> tuple[Tracer, Tracer]:
    """The mask and the value, both shaped to broadcast against x elementwise (the value cast to
    ``dtype`` unless it is None)."""
    if isinstance(value, Tracer):
        v = value if dtype is None else convert(value, dtype)
    else:
        v = lift(value, dtype)  # (a Python int out of the dtype's range raises, as in numpy)
    pre, post = x.shape[:d], x.shape[d + mask.ndim :]
    target = pre + (1,) + post  # the selected shape, with the count as a dim of 1
    while v.ndim > len(target) and v.shape[0] == 1:  # (numpy drops leading dims of 1)
        v = reshape_to(v, v.shape[1:])
    try:
        fits = np.broadcast_shapes(v.shape, target) == target
    except ValueError:
        fits = False
    if not fits:
        count_dim = v.ndim - len(post) - 1
        if v.ndim > len(post) and 0 <= count_dim < v.ndim and v.shape[count_dim] != 1:
            raise TraceError(
                f"x[mask] = v with v of shape {v.shape}: one value per selected element needs the number of True "
                "elements in the traced mask, which is not known while tracing; give one value for all "
                "(a scalar or a 1-element array) or compute the array: x = np.where(mask, new_values, x)",
                user_location(),
            )
        raise TraceError(
            f"could not broadcast input array from shape {v.shape} into the selected shape {pre + ('count',) + post}",
            user_location(),
        )
    v = reshape_to(
        broadcast(reshape_to(v, (1,) * (len(target) - v.ndim) + v.shape), target), pre + (1,) * mask.ndim + post
    )
    m = reshape_to(mask, (1,) * d + mask.shape + (1,) * len(post))
    return m, v


def masked_setitem(x: Tracer, key: Any, value: Any) -> Tracer:
    """The value of ``x`` after ``x[key] = value`` with a traced boolean mask in ``key``."""
    mask, d = _mask_and_dim(x, key)
    m, v = _spread(x, mask, d, value, x.dtype)
    return cast(Tracer, np.where(m, v, x))


def masked_augmented(x: Tracer, key: Any, value: Any, op: Any) -> Tracer:
    """The value of ``x`` after ``x[key] op= value`` (``op``: operator.iadd...) with a traced
    boolean mask in ``key``: numpy's in-place op on the selected elements (its casting rule and
    error included), written back where the mask is True."""
    mask, d = _mask_and_dim(x, key)
    selected = x.ndim - mask.ndim + 1
    if np.ndim(value) > selected:  # (x[key] op= v is x[key] = x[key].__iop__(v): v may not add dims)
        shape = x.shape[:d] + ("count",) + x.shape[d + mask.ndim :]
        error = ValueError(f"non-broadcastable output operand with shape {shape} doesn't match the broadcast shape")
        raise numpy_error(error, TraceError, user_location())
    if type(value) in (bool, int, float):  # a Python number stays weak (NEP 50): uint8 += 2 is uint8
        m, _ = _spread(x, mask, d, False, None)
        updated = op(fresh(x), value)
    else:
        m, v = _spread(x, mask, d, value, None)
        updated = op(fresh(x), v)  # (an in-place op on a copy of every element: numpy's dtype rules)
    return cast(Tracer, np.where(m, updated, x))
