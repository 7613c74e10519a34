"""``same`` (graphc/bench/timing.py), the check behind "result equals graphc's interpreter" of
``graphc run`` and the benches: a float32 leaf computed from 16-bit values (the float32 moments of a
mixed-precision step's bfloat16 gradients) carries their rounding, so it is compared at the 16-bit
tolerance of the graph (``narrowest_float``). Before, it was held to float32's 1e-4 and a correct
``graphc run`` of a bfloat16 GPT step on tp=2 said "no" and exited 1. The 16-bit tolerance is 8 ulps
at the leaf's largest magnitude, not at 1 or more: a leaf of gradients near 1e-3 twice too large
passed before."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import graphc
from graphc.bench.timing import narrowest_float, same

BF16_EPS = float(ml_dtypes.finfo(graphc.bfloat16).eps)  # 2**-7


def moments(shift_ulps: float):
    """A float32 leaf like Adam's moment of bfloat16 gradients, and a copy moved by ``shift_ulps``
    bfloat16 ulps of its largest magnitude at one element (a gradient rounded the other way)."""
    want = np.linspace(-0.03, 0.03, 64, dtype=np.float32)
    got = want.copy()
    got[5] += np.float32(shift_ulps * BF16_EPS * 0.03)
    return got, want


def test_a_float32_leaf_of_a_16_bit_computation_gets_its_tolerance():
    got, want = moments(1.0)  # 2.3e-4 off: over float32's 1e-4, one ulp of the bfloat16 values
    assert same(got, want).startswith("no")
    assert same(got, want, np.dtype(graphc.bfloat16)) == "yes"
    far, want = moments(64.0)  # far beyond a few ulps: still a difference
    assert same(far, want, np.dtype(graphc.bfloat16)).startswith("no")
    small = np.full(8, 1e-3, dtype=graphc.bfloat16)  # a 16-bit leaf far below 1 is held to its own scale
    assert same(small * 2, small).startswith("no")
    assert same(np.zeros(3, np.float32), np.zeros(3, np.float32), np.dtype(graphc.bfloat16)) == "yes"
    ints = np.arange(4)
    assert same(ints + 1, ints, np.dtype(graphc.bfloat16)) == "yes"  # as before: only floats are compared


def test_narrowest_float_of_a_graph():
    def mixed(w, x):
        return (x.astype(np.float32) @ w.astype(np.float32)) * 2.0

    x32 = np.ones((2, 3), np.float32)
    w32 = np.ones((3, 4), np.float32)
    assert narrowest_float(graphc.trace(mixed, w32, x32)) is None
    bf = np.dtype(graphc.bfloat16)
    assert narrowest_float(graphc.trace(mixed, w32.astype(bf), x32.astype(bf))) == bf
    # both 16-bit floats: bfloat16, the coarser
    assert narrowest_float(graphc.trace(mixed, w32.astype(bf), x32.astype(np.float16))) == bf
    assert narrowest_float(graphc.trace(mixed, w32.astype(np.float16), x32.astype(np.float16))) == np.float16
