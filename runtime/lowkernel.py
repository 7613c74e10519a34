"""Fused kernels on bfloat16 values: one elementwise loop computing in float32 and rounding to
bfloat16 exactly where the graph's types say, with the bits of the op-by-op path
(graphc/ops/precision.py ``in_float32``).

Numba has no bfloat16 type, so the kernel sees a bfloat16 array as its uint16 bits: an element is
loaded as float32 by shifting its bits up 16 (exact), every op whose result the graph types as
bfloat16 rounds its float32 result to the nearest bfloat16 (ties to even; a NaN becomes the quiet
NaN of its sign, as ml_dtypes' ``astype`` gives) and keeps it as a float32, and a stored result is
the upper 16 bits of that float32. The fusion pass lets only the ops of
``graphc.ops.precision.BF16_KERNEL_OPS`` into such a kernel (exactly rounded in float32, so the
rounded result is the same whichever routine computes it) and no reductions: a kernel here is one
loop over the elements of its rows. Ops on float32 values in the same loop compute as in a float32
kernel (runtime/kernelsource.py), so their results are the bits they had when only they were fused.
"""

from __future__ import annotations

import hashlib
import pathlib
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from graphc.core.dtypes import BFLOAT16
from graphc.core.ir import Node, Value
from graphc.core.traits import Constant
from graphc.runtime.kernelexpr import arithmetic_expr, constant_text, logical_expr, np_type, select_expr
from graphc.runtime.kernelsource import FASTMATH_VERSION, KernelSpec, OperandKind

# part of every kernel's text: editing this file gives the kernels new cache entries
LOWKERNEL_VERSION = hashlib.sha256(pathlib.Path(__file__).read_bytes()).hexdigest()[:12]


def _f32_of_bits_typing(typingctx, bits):
    """The float32 whose bits are the low 32 bits of the unsigned integer ``bits`` (Numba computes
    uint32 arithmetic in uint64)."""
    width = getattr(bits, "bitwidth", 0)
    if not isinstance(bits, types.Integer) or getattr(bits, "signed", True) or width < 32:
        return None

    def codegen(context, builder, sig, args):
        low = args[0] if width == 32 else builder.trunc(args[0], ir.IntType(32))
        return builder.bitcast(low, ir.FloatType())

    return types.float32(bits), codegen


def _bits_of_f32_typing(typingctx, x):
    """The bits of the float32 ``x`` as a uint32."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


# (typed for their callers: mypy would see the typing functions' signatures)
_f32_of_bits_typing.__name__ = _f32_of_bits_typing.__qualname__ = "_f32_of_bits"
_bits_of_f32_typing.__name__ = _bits_of_f32_typing.__qualname__ = "_bits_of_f32"
_f32_of_bits: Callable[..., Any] = intrinsic(_f32_of_bits_typing)
_bits_of_f32: Callable[..., Any] = intrinsic(_bits_of_f32_typing)


@numba.njit("float32(uint16)", cache=True, nogil=True, error_model="numpy")
def load_bf16(b):
    """The float32 value of the bfloat16 with bits ``b`` (exact)."""
    return _f32_of_bits(np.uint32(b) << np.uint32(16))


@numba.njit("float32(float32)", cache=True, nogil=True, error_model="numpy")
def round_bf16(x):
    """``x`` rounded to the nearest bfloat16, ties to even (as a float32): the upper 16 bits of
    x's bits plus 0x7fff plus the lowest kept bit; a NaN gives the quiet NaN of its sign."""
    bits = _bits_of_f32(x)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    nan = (bits & np.uint32(0x80000000)) | np.uint32(0x7FC00000)
    return _f32_of_bits(rounded if x == x else nan)


@numba.njit("uint16(float32)", cache=True, nogil=True, error_model="numpy")
def bf16_bits(x):
    """The bits of the bfloat16 ``x`` (a float32 holding a bfloat16 value: its upper 16 bits)."""
    return np.uint16(_bits_of_f32(x) >> np.uint32(16))


def _compute_type(dtype: np.dtype) -> np.dtype:
    """The dtype a value of ``dtype`` is held in inside the kernel (bfloat16 in float32)."""
    return np.dtype(np.float32) if dtype == BFLOAT16 else dtype


def _expr(spec: KernelSpec, node: Node, ref: Callable[[Value], str]) -> str:
    """The node's result for one element: a result that is not bfloat16 as in a float32 kernel
    (``KernelSpec.expr``: the ops of a float32 kernel may share the loop), a bfloat16 one
    computed in float32 and rounded."""
    out = node.outputs[0].dtype
    if out != BFLOAT16:
        return spec.expr(node, ref)
    name = node.op.name
    args = [ref(v) for v in node.inputs]
    f32 = np.dtype(np.float32)
    text: str | None
    if name == "convert":
        text = f"np.float32({args[0]})"
    else:
        text = arithmetic_expr(name, args, f32) or select_expr(name, args, f32)
        text = text or logical_expr(name, args, f32, node.attrs)
    if text is None:
        raise NotImplementedError(f"no bfloat16 kernel code for {name}")
    return f"lk.round_bf16({text})"


def low_float_source(spec: KernelSpec, kinds: list[OperandKind]) -> str:
    """The kernel ``kernel(in0, ..., out0, ..., r0, r1, n)`` for a region of elementwise ops
    (``spec``'s), bfloat16 operands and results passed as uint16 arrays."""
    region = spec.region
    names = spec.names
    operands = [f"in{i}" for i in range(len(region.inputs))]
    results = [f"out{k}" for k in range(len(region.outputs))]
    lines = [
        f"# graphc fused bfloat16 kernel (lowkernel {LOWKERNEL_VERSION}, fastmath {FASTMATH_VERSION})",
        "import math",
        "import numpy as np",
        "import numba",
        "from graphc.runtime import fastmath as fm",
        "from graphc.runtime import lowkernel as lk",
        "",
        '@numba.njit(nogil=True, error_model="numpy")',
        f"def kernel({', '.join(operands + results)}, r0, r1, n):",
    ]
    body = []
    for node in region.nodes:
        if node.op.has(Constant):
            out = node.outputs[0]
            value = np.asarray(node.attrs["value"]).astype(_compute_type(out.dtype))
            body.append(f"{names[out]} = {np_type(_compute_type(out.dtype))}({constant_text(value)})")
    element = {v: f"e_{names[v]}" for v in region.inputs}  # an operand's element, loaded once
    ref = lambda v: element.get(v, names[v])  # noqa: E731
    loop = []
    for i, v in enumerate(region.inputs):
        read = kinds[i].read(names[v], "r")
        loop.append(f"{ref(v)} = {'lk.load_bf16(' + read + ')' if v.dtype == BFLOAT16 else read}")
    for node in region.nodes:
        if node.op.has(Constant):
            continue
        loop.append(f"{names[node.outputs[0]]} = {_expr(spec, node, ref)}")
    for k, v in enumerate(region.outputs):
        loop.append(f"out{k}[r, j] = {'lk.bf16_bits(' + ref(v) + ')' if v.dtype == BFLOAT16 else ref(v)}")
    body.append("for r in range(r0, r1):")
    body.append("    for j in range(n):")
    body.extend("        " + s for s in loop)
    return "\n".join(lines + ["    " + s for s in body]) + "\n"
