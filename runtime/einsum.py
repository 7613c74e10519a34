"""The runtime's einsum step: a BLAS matrix product wherever its result cannot differ from numpy's.

The einsum primitive means numpy's einsum as a user calls it (``optimize=False``,
graphc/ops/linalg.py): each output element starts at +0.0 and adds its products one by one. That
loop never calls BLAS; a 256x256 product through it is several times slower than a GEMM.

A two-operand equation whose every label is a *batch* label (in both operands and the output), a
*free* label (in one operand and the output) or a *contracted* label (in both operands, not the
output), with at least one contracted label, is a batched matrix product of the operands
transposed and reshaped to ``[batch, free, contracted]`` and ``[batch, contracted, free]``. BLAS
adds the products in another order (and with fused multiply-adds), so the result can differ from
numpy's in three ways, and the step rules each out:

- **rounding**: both are sums of the same K products, each within (K - 1) * eps * sum|products|
  of the exact sum; the runtime, like any BLAS-backed library, accepts that;
- **inf and nan**: an operand that is inf or nan, or a sum that overflows in one order and not in
  another (1e308 + 1e308 - 1e308), gives inf/nan in one order and a number (or another special
  value) in the other. The step checks at run time that ``max|a| * max|b| * K`` is below half the
  dtype's largest float (``a.max()`` and ``a.min()``: a pass over memory each, no temporary, nan
  propagates to the comparison), so that no product and no partial sum in any order can overflow
  and no operand is inf or nan; otherwise it runs numpy's einsum;
- **the sign of zero**: numpy's einsum starts every element at +0.0, so a sum whose products are
  all -0.0 is +0.0 (even a single product: ``np.einsum('i,j->ij', -0.0 * x, y)`` is +0.0); a
  GEMM may return -0.0 there. The step adds +0.0 to its result (-0.0 + 0.0 = +0.0, every other
  value unchanged), a pass over the output.

Equations that are not such a product (outer and elementwise products, a label summed in one
operand only, three operands), integer operands, and small products (below
``BLAS_MIN_PRODUCTS``, where the run-time checks cost more than the loop) keep numpy's einsum.
bfloat16 and float16 operands reach the step as float32 copies (graphc/ops/precision.py), so they
take the float32 GEMM and their result is rounded after it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import numpy as np

from graphc.core.dtypes import is_low_float
from graphc.core.ir import TensorType
from graphc.ops.linalg import parse_equation
from graphc.ops.precision import COMPUTE

# Below this many multiply-adds numpy's einsum loop is as fast as the checks, transposes and GEMM
# call of the BLAS path (measured: docs/performance.md#einsum).
BLAS_MIN_PRODUCTS = 1 << 15


def einsum_step(equation: str, in_types: Sequence[TensorType]) -> Callable[..., np.ndarray]:
    """The function a program calls for an einsum node: ``BlasEinsum`` where the equation and the
    operand types allow it, else numpy's einsum with the equation bound."""
    plain = functools.partial(_numpy_einsum, equation)
    # bfloat16 and float16 operands arrive as float32 copies (ops/precision.py): a float32 GEMM
    types = [TensorType(t.shape, COMPUTE) if is_low_float(t.dtype) else t for t in in_types]
    if len(types) != 2 or types[0].dtype not in (np.float32, np.float64) or types[1].dtype != types[0].dtype:
        return plain
    blas = BlasEinsum.of(equation, types[0], types[1])
    return blas if blas is not None else plain


def _numpy_einsum(equation: str, *operands: np.ndarray) -> np.ndarray:
    return np.einsum(equation, *operands)


class BlasEinsum:
    """A two-operand einsum as one (batched) GEMM, checked at each call (see the module doc).

    ``left`` and ``right`` are the operands in the order of the product: the operand whose free
    labels come first in the output is on the left. Each is transposed by its ``perm`` and
    reshaped to ``[batch, rows, k]`` (left) or ``[batch, k, cols]`` (right), the batch dim left
    out when there is no batch label; the product is reshaped to ``product_shape`` and, when the
    output's labels are not in the product's order, transposed by ``out_perm`` into a fresh
    contiguous array."""

    def __init__(
        self,
        equation: str,
        swap: bool,
        perms: tuple[tuple[int, ...], tuple[int, ...]],
        shapes: tuple[tuple[int, ...], tuple[int, ...]],
        product_shape: tuple[int, ...],
        out_perm: tuple[int, ...] | None,
        k: int,
        dtype: np.dtype,
    ):
        self.equation = equation
        self.swap = swap
        self.perms = perms
        self.shapes = shapes
        self.product_shape = product_shape
        self.out_perm = out_perm
        self.k = k
        self.limit = float(np.finfo(dtype).max) / 2

    @classmethod
    def of(cls, equation: str, a: TensorType, b: TensorType) -> BlasEinsum | None:
        """The GEMM form of ``equation`` on operands of types ``a`` and ``b``, or None when it is
        not a matrix product or too small to gain from BLAS."""
        (sa, sb), out = parse_equation(equation, 2)
        size = dict(zip(sa, a.shape)) | dict(zip(sb, b.shape))
        batch = [c for c in out if c in sa and c in sb]
        contracted = [c for c in sa if c in sb and c not in out]
        if not contracted or any(c not in out and c not in contracted for c in sa + sb):
            return None
        if math.prod(size.values()) < BLAS_MIN_PRODUCTS:
            return None
        # the output's free labels: the left operand's first when they lead, else a's
        free = [c for c in out if c not in batch]
        lead_is_b = bool(free) and free[0] in sb
        swap = lead_is_b
        left_spec, right_spec = (sb, sa) if swap else (sa, sb)
        rows = [c for c in out if c in left_spec and c not in batch]
        cols = [c for c in out if c in right_spec and c not in batch]
        product_labels = batch + rows + cols
        out_perm = None if product_labels == list(out) else tuple(product_labels.index(c) for c in out)

        def dims(labels):
            return math.prod(size[c] for c in labels)

        head = (dims(batch),) if batch else ()
        left_perm = tuple(left_spec.index(c) for c in batch + rows + contracted)
        right_perm = tuple(right_spec.index(c) for c in batch + contracted + cols)
        k = dims(contracted)
        shapes = (head + (dims(rows), k), head + (k, dims(cols)))
        product_shape = tuple(size[c] for c in product_labels)
        return cls(equation, swap, (left_perm, right_perm), shapes, product_shape, out_perm, k, a.dtype)

    def bounded(self, a: np.ndarray, b: np.ndarray) -> bool:
        """No operand is inf or nan and no sum of K products can overflow, in any order."""
        if a.size == 0 or b.size == 0:
            return False
        largest_a = max(float(a.max()), -float(a.min()))
        largest_b = max(float(b.max()), -float(b.min()))
        return largest_a * largest_b * self.k < self.limit  # False for nan and inf

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        if not self.bounded(a, b):
            return np.einsum(self.equation, a, b)
        left, right = (b, a) if self.swap else (a, b)
        left = left.transpose(self.perms[0]).reshape(self.shapes[0])
        right = right.transpose(self.perms[1]).reshape(self.shapes[1])
        product = np.matmul(left, right).reshape(self.product_shape)
        if self.out_perm is None:
            return np.add(product, 0.0, out=product)  # -0.0 -> +0.0, as numpy's einsum
        out = np.empty([self.product_shape[i] for i in self.out_perm], product.dtype)
        return np.add(product.transpose(self.out_perm), 0.0, out=out)
