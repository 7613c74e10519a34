"""The runtime's einsum (graphc/runtime/einsum.py) against numpy's einsum (optimize=False).

A contraction that is a matrix product runs on BLAS when its operands are bounded; it must then
agree with numpy within the rounding of a sum of K products in another order (K * eps times the
sum of the products' magnitudes), with the same dtype, shape and sign of zeros. Every other case
(inf, nan, sums that could overflow, integer operands, equations that are not a product) must
equal numpy's einsum bit for bit. Random equations cover batch, free, contracted and one-operand
summed labels, with dims of size 0 and 1.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphc
import graphc.runtime.einsum as runtime_einsum
from graphc.core.ir import TensorType
from graphc.runtime.einsum import BlasEinsum, einsum_step

LABELS = "abcdefghij"


def random_equation(rng) -> tuple[str, dict[str, int]]:
    """Two operands' subscripts and the output's, with each kind of label drawn 0-2 times (a
    label summed in one operand only, 0-1 times), and each label's size from 0-5."""
    letters = iter(rng.permutation(list(LABELS)))
    kinds = {kind: [next(letters) for _ in range(rng.integers(0, 3))] for kind in ("batch", "fa", "fb", "k")}
    only_a = [next(letters) for _ in range(rng.integers(0, 2) * (rng.random() < 0.3))]
    spec_a = list(rng.permutation(kinds["batch"] + kinds["fa"] + kinds["k"] + only_a))
    spec_b = list(rng.permutation(kinds["batch"] + kinds["fb"] + kinds["k"]))
    out = list(rng.permutation(kinds["batch"] + kinds["fa"] + kinds["fb"]))
    sizes = {c: int(rng.choice([0, 1, 1, 2, 3, 5])) if rng.random() < 0.3 else int(rng.integers(1, 6)) for c in LABELS}
    return f"{''.join(spec_a)},{''.join(spec_b)}->{''.join(out)}", sizes


def operands(rng, equation: str, sizes: dict[str, int], dtype, special: bool):
    """Random operands of ``equation``; with ``special``, some elements inf, -inf, nan, 0.0 or
    -0.0 (or all of ``a`` -0.0)."""
    (sa, sb) = equation.split("->")[0].split(",")
    out = []
    for spec in (sa, sb):
        shape = tuple(sizes[c] for c in spec)
        if np.dtype(dtype).kind == "i":
            out.append(rng.integers(-50, 50, shape).astype(dtype))
            continue
        x = rng.standard_normal(shape).astype(dtype)
        if special and x.size:
            flat = x.reshape(-1)
            picks = rng.integers(0, flat.size, max(1, flat.size // 4))
            flat[picks] = rng.choice([np.inf, -np.inf, np.nan, 0.0, -0.0], picks.size)
        out.append(x)
    if special and rng.random() < 0.3:
        out[0] = -np.zeros_like(out[0])
    return out


def products_per_element(equation: str, sizes: dict[str, int]) -> int:
    lhs, out = equation.split("->")
    return int(np.prod([sizes[c] for c in set(lhs) - set(out) - {","}]))


def assert_same_as_numpy(got, want, equation: str, a, b, sizes: dict[str, int]) -> None:
    """Same dtype and shape; the same nan, infinities and sign of zeros; other elements within
    2 * K * eps * (the einsum of |a| and |b|), the bound of two sums of the K products in any
    order (exactly equal for integers)."""
    got = np.asarray(got)
    assert got.dtype == want.dtype and got.shape == want.shape, (equation, got.dtype, got.shape, want.shape)
    if want.dtype.kind == "i":
        np.testing.assert_array_equal(got, want, err_msg=equation)
        return
    special = ~np.isfinite(want) | (want == 0)
    np.testing.assert_array_equal(got[special], want[special], err_msg=equation)  # nan == nan here
    assert np.array_equal(np.signbit(got[want == 0]), np.signbit(want[want == 0])), equation
    eps = np.finfo(want.dtype).eps
    k = products_per_element(equation, sizes)
    scale = np.einsum(equation, np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))[~special]
    excess = np.abs(got[~special].astype(np.float64) - want[~special]) - 2 * k * eps * scale
    assert np.all(excess <= 0), f"{equation}: beyond 2*K*eps*scale by {excess.max():.3g}"


@pytest.fixture
def blas_for_every_size(monkeypatch):
    """The BLAS path also for the tiny operands a test can afford."""
    monkeypatch.setattr(runtime_einsum, "BLAS_MIN_PRODUCTS", 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("special", [False, True])
def test_einsum_step_matches_numpy_on_random_equations(dtype, special, blas_for_every_size):
    rng = np.random.default_rng([31, special, np.dtype(dtype).num])
    took_blas = 0
    for _ in range(150):
        equation, sizes = random_equation(rng)
        a, b = operands(rng, equation, sizes, dtype, special)
        step = einsum_step(equation, [TensorType(a.shape, a.dtype), TensorType(b.shape, b.dtype)])
        took_blas += isinstance(step, BlasEinsum) and step.bounded(a, b)
        assert_same_as_numpy(step(a, b), np.einsum(equation, a, b), equation, a, b, sizes)
    if np.dtype(dtype).kind == "f" and not special:
        assert took_blas > 30  # the draw exercises the BLAS path, not only the fallback


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_jit_einsum_matches_numpy(dtype, blas_for_every_size):
    rng = np.random.default_rng([310, np.dtype(dtype).num])
    for i in range(24):
        equation, sizes = random_equation(rng)
        a, b = operands(rng, equation, sizes, dtype, special=i % 3 == 2)
        got = graphc.jit(lambda a, b, equation=equation: np.einsum(equation, a, b))(a, b)
        assert_same_as_numpy(got, np.einsum(equation, a, b), equation, a, b, sizes)


def test_sums_that_could_overflow_keep_numpys_order(blas_for_every_size):
    """Finite operands whose partial sums overflow: the order of summation decides between inf
    and nan (1e308 + 1e308 is inf, and inf - 1e308 stays inf; in an order that pairs 1e308 with
    -1e308 first, the two overflow with opposite signs and give nan; 1e308 - 1e308 + 1 is 1 in
    one order, 0 in another). numpy's result."""
    a = np.ones((2, 8))
    a[:, [0, 1]], a[:, [4, 7]] = 1e308, -1e308
    f = graphc.jit(lambda a, b: np.einsum("ij,jk->ik", a, b))
    for x, y in [(a[:1], np.ones((8, 8))), (a, np.ones((8, 1))), (a, np.ones((8, 3)))]:
        np.testing.assert_array_equal(f(x, y), np.einsum("ij,jk->ik", x, y))


def test_sums_of_negative_zeros_are_positive_zero(blas_for_every_size, monkeypatch):
    """numpy's einsum starts each element at +0.0, so all products -0.0 give +0.0; a GEMM may give
    -0.0 there (stood in for by a matmul that returns -0.0 for every zero), the step still +0.0."""
    matmul = np.matmul

    def gemm_with_negative_zeros(x, y):
        r = matmul(x, y)
        r[r == 0] = -0.0
        return r

    monkeypatch.setattr(np, "matmul", gemm_with_negative_zeros)
    cases = [("ij,jk->ik", (3, 1), (1, 4)), ("ij,jk->ik", (3, 5), (5, 4)), ("bij,bkj->bki", (2, 3, 2), (2, 4, 2))]
    for equation, sa, sb in cases:
        a, b = -np.zeros(sa, np.float32), np.ones(sb, np.float32)
        step = einsum_step(equation, [TensorType(sa, a.dtype), TensorType(sb, b.dtype)])
        assert isinstance(step, BlasEinsum) and step.bounded(a, b)
        want = np.einsum(equation, a, b)
        assert not np.signbit(want).any()
        assert_same_as_numpy(step(a, b), want, equation, a, b, dict(zip("bijk", (2, 3, 5, 4))))


def test_large_products_take_blas_under_jit(monkeypatch):
    """A 256x256 product (and its transposed forms) under jit runs as a GEMM; integers, outer
    products and small products keep numpy's einsum."""
    calls = []
    monkeypatch.setattr(BlasEinsum, "bounded", lambda self, a, b: calls.append(self.equation) or True)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    for equation in ["ij,jk->ik", "ij,kj->ik", "ji,jk->ki"]:
        got = graphc.jit(lambda a, b, equation=equation: np.einsum(equation, a, b))(a, b)
        want = np.einsum(equation, a, b)
        assert_same_as_numpy(got, want, equation, a, b, dict(zip("ijk", (256,) * 3)))
    assert calls == ["ij,jk->ik", "ij,kj->ik", "ji,jk->ki"]

    def types(*shapes, dtype=np.float32):
        return [TensorType(s, np.dtype(dtype)) for s in shapes]

    assert not isinstance(einsum_step("ij,jk->ik", types((256, 256), (256, 256), dtype=np.int64)), BlasEinsum)
    assert not isinstance(einsum_step("i,j->ij", types((256,), (256,))), BlasEinsum)
    assert not isinstance(einsum_step("ij,jk->ik", types((8, 8), (8, 8))), BlasEinsum)
