"""ndarray subclasses whose operators mean something else (wrong29): ``np.matrix`` (``*`` is a
matrix product) and numpy masked arrays (reductions skip masked items). graphc computed
elementwise over every item silently (``m * m`` gave the squares, a masked sum counted the masked
item); they are now refused: at the trace (an argument, or an array the function reads) and on
warm calls of a specialization traced for plain arrays. Other subclasses compute as ndarrays."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.core.errors import EvaluationError

M = np.matrix([[1.0, 2.0], [3.0, 4.0]])
MASKED = np.ma.array([1.0, 2.0, 3.0], mask=[0, 1, 0])


def product(a, b):
    return a * b


def total(a):
    return a.sum()


@pytest.mark.parametrize("how", ["jit", "dp2"])
def test_a_matrix_argument_is_refused(how):
    f = graphc.jit(product) if how == "jit" else graphc.parallelize(product, mesh={"dp": 2}, cache=False)
    with pytest.raises(
        graphc.TraceError, match=r"argument a is a numpy\.matrix, whose \* and \*\* are matrix products"
    ):
        f(M, M)


def test_a_masked_argument_is_refused_also_after_a_plain_call():
    f = graphc.jit(total)
    assert f(MASKED.data) == 6.0  # a plain array of the same shape: traced, cached
    with pytest.raises(EvaluationError, match="input %a is a numpy masked array with masked items"):
        f(MASKED)  # (numpy: 4.0, the masked 2.0 skipped)
    with pytest.raises(graphc.TraceError, match="argument a is a numpy masked array with masked items"):
        graphc.jit(total)(MASKED)


def test_a_matrix_read_from_a_closure_is_refused_and_a_plain_subclass_computes():
    with pytest.raises(graphc.TraceError, match="this array is a numpy.matrix"):
        graphc.jit(lambda x: x * M)(np.ones((2, 2)))

    class Tagged(np.ndarray):
        pass

    x = np.arange(3.0).view(Tagged)
    assert np.array_equal(graphc.jit(lambda a: a * 2 + 1)(x), np.arange(3.0) * 2 + 1)
