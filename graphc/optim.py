"""Optimizers as plain functions of pytrees, so a training step that uses them traces to one
graph (their nodes are the step's update part). Leaves whose gradient is None (integer or bool
parameters) are left unchanged."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphc.core.pytree import tree_map


def _fill(new: Any, old: Any) -> Any:
    """Leaves of ``new`` that are None (no gradient) take the value from ``old``."""
    if isinstance(new, dict):
        return {k: _fill(new[k], old[k]) for k in new}
    if type(new) in (list, tuple):
        return type(new)(_fill(n, o) for n, o in zip(new, old))
    return old if new is None else new


def sgd(params: Any, grads: Any, lr: float = 0.01) -> Any:
    """``p - lr * g`` for every parameter."""
    return _fill(tree_map(lambda p, g: p - lr * g, params, grads), params)


def momentum_init(params: Any) -> Any:
    return tree_map(np.zeros_like, params)


def momentum(params: Any, grads: Any, velocity: Any, lr: float = 0.01, beta: float = 0.9) -> tuple[Any, Any]:
    """Heavy-ball SGD: ``v = beta v + g; p = p - lr v``. Returns (params, velocity)."""
    new_v = _fill(tree_map(lambda v, g: beta * v + g, velocity, grads), velocity)
    return _fill(tree_map(lambda p, v: p - lr * v, params, new_v), params), new_v


def adam_init(params: Any) -> dict[str, Any]:
    """Adam state: first and second moments (zeros like the params) and the step count."""
    return {"m": tree_map(np.zeros_like, params), "v": tree_map(np.zeros_like, params), "t": np.zeros((), np.float32)}


def adam(
    params: Any,
    grads: Any,
    state: dict[str, Any],
    lr: float = 1e-3,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
) -> tuple[Any, dict[str, Any]]:
    """One Adam step (Kingma & Ba, with bias correction). Returns (params, state)."""
    t = state["t"] + 1
    m = _fill(tree_map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads), state["m"])
    v = _fill(tree_map(lambda v, g: b2 * v + (1 - b2) * (g * g), state["v"], grads), state["v"])
    c1 = 1 - b1**t  # bias corrections, arrays of the step count's dtype
    c2 = 1 - b2**t

    def update(p, m_, v_):
        m_hat = m_ / c1.astype(m_.dtype)
        v_hat = v_ / c2.astype(v_.dtype)
        return p - lr * m_hat / (np.sqrt(v_hat) + eps)

    new_params = _fill(tree_map(update, params, m, v), params)
    return new_params, {"m": m, "v": v, "t": t}
