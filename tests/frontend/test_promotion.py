"""Promotion to float64 is numpy's, kept by graphc, and named by line: ``promotions``, the
``graphc ir --explain-dtypes`` listing, and the once-per-function ``PromotionWarning`` of jit."""

import math
import subprocess
import sys
import warnings

import numpy as np
import pytest

import graphc
from graphc.frontend.promotion import promotions


def gelu_numpy_scalar(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))  # np.float64: promotes


def gelu_python_float(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def test_promotions_name_the_line_and_keep_numpys_dtype():
    x = np.ones((2, 3), np.float32)
    sites = promotions(graphc.trace(gelu_numpy_scalar, x))
    assert len(sites) == 1
    assert sites[0].loc.line == gelu_numpy_scalar.__code__.co_firstlineno + 1
    assert (sites[0].source, sites[0].target, sites[0].shape) == ("float32", "float64", (2, 3))
    assert "test_promotion.py" in str(sites[0]) and "became float64" in str(sites[0])
    assert graphc.jit(gelu_numpy_scalar)(x).dtype == gelu_numpy_scalar(x).dtype == np.float64


@pytest.mark.parametrize(
    "fn, dtype",
    [
        (gelu_python_float, np.float32),  # Python floats are weak: float32 stays float32
        (lambda x: x * np.float32(2), np.float32),
        (gelu_numpy_scalar, np.float64),  # float64 all along: nothing promoted
        (lambda x: x + np.arange(3), np.int64),
        (lambda x: x * np.float64(2), np.float16),  # float16 -> float64 counts too
    ],
)
def test_promotions_only_where_a_float_became_float64(fn, dtype):
    x = np.ones(3, dtype)
    sites = promotions(graphc.trace(fn, x))
    assert [s.source for s in sites] == (["float16"] if dtype == np.float16 else [])


def test_an_explicit_cast_is_listed_too():
    # a convert is a convert: the user's own astype is named as well (it is their line)
    sites = promotions(graphc.trace(lambda x: x.astype(np.float64) * 2, np.ones(3, np.float32)))
    assert [s.source for s in sites] == ["float32"]


def test_explain_dtypes_cli(tmp_path):
    model = tmp_path / "m.py"
    model.write_text(
        "import numpy as np\n"
        "def f(x):\n"
        "    y = x * 2.0\n"
        "    return y * np.float64(3)\n"
        "def example_args():\n"
        "    return (np.ones(4, np.float32),), {}\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "graphc", "ir", f"{model}:f", "--explain-dtypes"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert f"{model}:4" in out.stdout and "float32[4] value became float64" in out.stdout
    assert "1 line(s) promote" in out.stderr


def test_jit_warns_once_per_function():
    x = np.ones(3, np.float32)
    f = graphc.jit(gelu_numpy_scalar)
    with pytest.warns(graphc.PromotionWarning, match=r"test_promotion.py:\d+: a float32\[3\] value became float64"):
        f(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f(np.ones(5, np.float32))  # a new shape compiles again, but the function was named already
        graphc.jit(gelu_python_float)(x)


def test_float64_computed_inside_and_cast_back_is_not_reported():
    def f(x):
        hi = (x * np.float64(3)).astype(np.float32)  # float64 inside, float32 out
        return hi + 1.0, x.sum()

    assert promotions(graphc.trace(f, np.ones(3, np.float32))) == []
    sites = promotions(graphc.trace(lambda x: (x.astype(np.float32) * np.float64(2), x), np.ones(3, np.float32)))
    assert len(sites) == 1  # ... but one result is float64: reported


def test_remembered_loops_are_numpys_for_every_operand_mix():
    """``resolve_loop`` remembers numpy's loop per (ufunc, operand dtypes): asked twice (the
    second answer from the table), in either order of the mixes, it is numpy's resolve_dtypes
    each time, Python numbers weak (NEP 50)."""
    from graphc.core import dtypes
    from graphc.frontend.ufuncs import _LOOPS, resolve_loop

    kinds = [np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32), np.dtype(np.bool_), dtypes.BFLOAT16]
    operands = [np.zeros((), dt) for dt in kinds] + [2, 0.5]
    mixes = [(a, b) for a in operands for b in operands if not (type(a) in (int, float) and type(b) in (int, float))]
    for ufunc in (np.add, np.multiply, np.maximum, np.less):
        for mix in (*mixes, *reversed(mixes)):
            in_dts = tuple(type(x) if type(x) in (int, float) else x.dtype for x in mix)
            if dtypes.BFLOAT16 in in_dts:  # a Python float next to bfloat16 stays bfloat16 (ufuncs.py)
                in_dts = tuple(dtypes.BFLOAT16 if d is float else d for d in in_dts)
            try:
                want = ufunc.resolve_dtypes((*in_dts, None))
            except TypeError:  # (no loop: resolve_loop raises a TraceError, and remembers nothing)
                assert (ufunc, in_dts) not in _LOOPS
                continue
            assert resolve_loop(ufunc, mix) == want, (ufunc, mix)
            assert _LOOPS[(ufunc, in_dts)] == want
