"""Contractions: ``matmul`` (numpy semantics for operands of rank >= 2, batch dims broadcast) and
``einsum`` with an explicit equation of single letters (the tracer expands ``...`` and 1-d cases)."""

from __future__ import annotations

import re

import numpy as np

from graphc.core.errors import ShapeError
from graphc.core.ir import OpDef, TensorType
from graphc.core.traits import Contraction, FreshResult, LinearIn
from graphc.ops.dims import DimRule, io_bytes
from graphc.ops.elementwise import broadcast_shapes, sum_tangents
from graphc.ops.registry import register, same_dtype


def _matmul_infer(in_types):
    a, b = in_types
    dt = same_dtype(in_types, "matmul")
    if dt.kind == "b":
        raise ShapeError("matmul of bool operands is not supported")
    if a.ndim < 2 or b.ndim < 2:
        raise ShapeError(f"matmul primitive needs operands of rank >= 2, got {a} and {b}")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(
            f"matmul: shapes {a.shape} and {b.shape} not aligned: "
            f"{a.shape[-1]} (dim {a.ndim - 1}) != {b.shape[-2]} (dim {b.ndim - 2})"
        )
    batch = broadcast_shapes("matmul", a.shape[:-2], b.shape[:-2])
    return (TensorType(batch + (a.shape[-2], b.shape[-1]), dt),)


matmul = register(
    OpDef(
        "matmul",
        "contraction",
        _matmul_infer,
        np.matmul,
        num_inputs=2,
        doc="batched matrix product, batch dims broadcast",
    )
)

_EQUATION = re.compile(r"^([a-zA-Z]*(,[a-zA-Z]*)*)->([a-zA-Z]*)$")


def parse_equation(equation: str, n_operands: int) -> tuple[list[str], str]:
    if not isinstance(equation, str) or not _EQUATION.match(equation):
        raise ShapeError(f"einsum: equation must look like 'ij,jk->ik' (letters only, explicit '->'), got {equation!r}")
    lhs, out = equation.split("->")
    ins = lhs.split(",")
    if len(ins) != n_operands:
        raise ShapeError(f"einsum: equation {equation!r} names {len(ins)} operands, got {n_operands}")
    for s in ins + [out]:
        if len(set(s)) != len(s):
            raise ShapeError(f"einsum: repeated index in {s!r} (diagonals are not supported)")
    missing = set(out) - set("".join(ins))
    if missing:
        raise ShapeError(f"einsum: output index {''.join(sorted(missing))} does not appear in any operand")
    return ins, out


def _einsum_infer(in_types, equation):
    dt = same_dtype(in_types, "einsum")
    if dt.kind == "b":
        raise ShapeError("einsum of bool operands is not supported")
    ins, out = parse_equation(equation, len(in_types))
    sizes: dict[str, int] = {}
    for spec, t in zip(ins, in_types):
        if len(spec) != t.ndim:
            raise ShapeError(f"einsum: operand {t} has rank {t.ndim} but its subscripts {spec!r} have {len(spec)}")
        for letter, n in zip(spec, t.shape):
            if sizes.setdefault(letter, n) != n:
                raise ShapeError(f"einsum: index {letter!r} has size {sizes[letter]} in one operand and {n} in another")
    return (TensorType(tuple(sizes[c] for c in out), dt),)


# numpy's einsum as a user calls it (optimize=False): each output element is the sum over the
# summed indices of the operands' products. An optimized order (optimize=True) contracts some
# operands first and so differs: 'i,qi->i' with a = inf and b[:, i] = [1, -1] is nan in numpy
# (inf - inf) but inf when b is summed over q first, and a sum of -0.0 products is -0.0 there.
# The runtime runs matrix-product equations on BLAS where the result cannot differ beyond
# rounding (graphc/runtime/einsum.py).
einsum = register(
    OpDef(
        "einsum",
        "contraction",
        _einsum_infer,
        lambda *xs, equation: np.einsum(equation, *xs),
        attrs=("equation",),
        num_inputs=None,
        doc="Einstein summation, explicit form",
    )
)


# --- autodiff rules (see graphc/autodiff.py) --------------------------------------------------


def _matmul_vjp(ad, g):  # C = A B: dA = g B^T, dB = A^T g (summed over broadcast batch dims)
    a, b = ad.inputs
    ga = ad.unbroadcast(g @ np.swapaxes(b, -1, -2), a.shape) if ad.needs[0] else None
    gb = ad.unbroadcast(np.swapaxes(a, -1, -2) @ g, b.shape) if ad.needs[1] else None
    return [ga, gb]


def _matmul_jvp(ad, ta, tb):
    a, b = ad.inputs
    terms = [ta @ b if ta is not None else None, a @ tb if tb is not None else None]
    return sum_tangents(*(ad.broadcast_to_output(t) for t in terms if t is not None))


matmul.vjp, matmul.jvp = _matmul_vjp, _matmul_jvp


def _einsum_vjp(ad, g):
    """The cotangent of operand i is an einsum of g with the other operands onto operand i's
    subscripts; indices that only operand i has (summed away) are broadcast back."""
    ins, out = parse_equation(ad.attrs["equation"], len(ad.inputs))
    grads: list = []
    for i, (spec, x) in enumerate(zip(ins, ad.inputs)):
        if not ad.needs[i]:
            grads.append(None)
            continue
        others = [(s, y) for j, (s, y) in enumerate(zip(ins, ad.inputs)) if j != i]
        available = set(out).union(*(set(s) for s, _ in others))
        kept = "".join(c for c in spec if c in available)
        eq = ",".join([out] + [s for s, _ in others]) + "->" + kept
        r = ad.bind("einsum", g, *(y for _, y in others), equation=eq)
        if kept != spec:
            r = np.broadcast_to(r.reshape(tuple(n if c in available else 1 for c, n in zip(spec, x.shape))), x.shape)
        grads.append(r)
    return grads


def _einsum_jvp(ad, *tangents):  # product rule: one einsum per operand with a tangent
    terms = []
    for i, t in enumerate(tangents):
        if t is not None:
            operands = list(ad.inputs)
            operands[i] = t
            terms.append(ad.bind("einsum", *operands, **ad.attrs))
    return sum_tangents(*terms)


einsum.vjp, einsum.jvp = _einsum_vjp, _einsum_jvp


# --- sharding rules (see graphc/ops/dims.py) --------------------------------------------------
# Contracted dims are summed away: splitting them leaves partial sums (P). Broadcast batch dims of
# size 1 cannot carry a split.


def _matmul_dim_rule(in_types, out_types):
    a, b = in_types
    (out,) = out_types
    nb = out.ndim - 2
    batch = [f"b{d}" for d in range(nb)]

    def operand(t, last_two):
        off = nb - (t.ndim - 2)
        dims = [None if (t.shape[d] == 1 and out.shape[off + d] != 1) else batch[off + d] for d in range(t.ndim - 2)]
        return tuple(dims) + last_two

    return DimRule(
        (operand(a, ("m", "k")), operand(b, ("k", "n"))), (tuple(batch) + ("m", "n"),), sums=frozenset({"k"})
    )


def _matmul_cost(in_types, out_types):
    (out,) = out_types
    return 2.0 * out.size * in_types[0].shape[-1], io_bytes(in_types, out_types)


def _einsum_dim_rule(in_types, out_types, equation):
    ins, out = parse_equation(equation, len(in_types))
    summed = frozenset("".join(ins)) - frozenset(out)
    return DimRule(tuple(tuple(s) for s in ins), (tuple(out),), sums=summed)


def _einsum_cost(in_types, out_types, equation):
    ins, _out = parse_equation(equation, len(in_types))
    sizes = {c: n for spec, t in zip(ins, in_types) for c, n in zip(spec, t.shape)}
    work = 1
    for n in sizes.values():
        work *= n
    return 2.0 * work * max(1, len(in_types) - 1), io_bytes(in_types, out_types)


matmul.dim_rule, matmul.cost = _matmul_dim_rule, _matmul_cost
einsum.dim_rule, einsum.cost = _einsum_dim_rule, _einsum_cost


# --- traits (graphc/core/traits.py) ------------------------------------------------------------
def _each_operand(node) -> tuple[frozenset[int], ...]:
    """An einsum is linear in each of its operands."""
    return tuple(frozenset({i}) for i in range(len(node.inputs)))


matmul.traits = (Contraction(), FreshResult(), LinearIn((frozenset({0}), frozenset({1}))))
einsum.traits = (Contraction(), FreshResult(), LinearIn(of_node=_each_operand))
