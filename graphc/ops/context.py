"""What an op's autodiff rule may call: the ``RuleContext`` it is given.

Rules are numpy code on traced arrays. ``vjp(ad, *cotangents)`` returns one cotangent per operand
(None: zero, or not differentiable); ``jvp(ad, *tangents)`` returns the result tangent(s) (None:
zero). ``ad`` describes the node being differentiated and emits new nodes into the trace that is
running; graphc/autodiff.py implements it. Rules that must differentiate or run a region (control
flow, fused kernels) do so through ``ad`` too, so every op's rules stay next to the op and the
op registry needs nothing from the layers above it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from graphc.core.ir import Node, Region


class RuleContext(Protocol):
    node: Node  # the node being differentiated
    attrs: dict[str, Any]  # its attributes
    inputs: list[Any]  # its operands, as traced arrays
    outputs: list[Any]  # its results, as traced arrays
    needs: list[bool]  # reverse mode: which operands need a cotangent

    # --- emitting nodes --------------------------------------------------------------------
    def bind(self, opname: str, *xs: Any, **attrs: Any) -> Any:
        """Emit one single-result primitive; returns its traced result."""

    def bind_any(self, opname: str, *xs: Any, **attrs: Any) -> Any:
        """Emit a primitive; its result, or a tuple of results."""

    def constant(self, value: np.ndarray) -> Any:
        """A constant array as a traced value."""

    def zeros(self, like: Any) -> Any:
        """Zeros of ``like``'s shape and dtype."""

    def instantiate(self, t: Any | None, like: Any) -> Any:
        """A symbolic zero (None) made concrete as zeros shaped like ``like``."""

    def unbroadcast(self, g: Any, shape: tuple[int, ...]) -> Any:
        """``g`` summed over the dims broadcasting added or stretched, giving ``shape``."""

    def broadcast_to_output(self, t: Any | None) -> Any | None:
        """``t`` broadcast to the (single) result's shape."""

    # --- regions and transforms ---------------------------------------------------------------
    def inline(self, region: Region, args: Sequence[Any]) -> list[Any]:
        """Emit a region's nodes again on ``args``; returns its results."""

    def vjp(self, fn: Callable, *primals: Any) -> tuple[Any, Callable]:
        """Reverse mode inside the running trace: ``(fn(*primals), pullback)``."""

    def jvp(self, fn: Callable, primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[Any, Any]:
        """Forward mode inside the running trace: ``(fn(*primals), tangents out)``."""

    def cond(self, pred: Any, true_fn: Callable, false_fn: Callable, *operands: Any) -> Any:
        """A ``cond`` node whose regions trace ``true_fn`` and ``false_fn``."""

    def while_loop(self, cond_fn: Callable, body_fn: Callable, init: Sequence[Any]) -> list[Any]:
        """A ``while_loop`` node."""

    def fori_loop(self, lower: Any, upper: Any, body_fn: Callable, init: Sequence[Any], step: int = 1) -> list[Any]:
        """A ``fori_loop`` node."""
