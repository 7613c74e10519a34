"""A device's shared constants (runtime/constants.py ``ConstantTable``): one read-only array per
distinct value, equal meaning same dtype, shape and bytes."""

import numpy as np

from graphc.runtime.constants import ConstantTable


def _frozen(x):
    x = np.array(x)
    x.flags.writeable = False
    return x


def test_equal_constants_are_one_array_and_different_ones_are_not():
    table = ConstantTable()
    mask = _frozen(np.tril(np.ones((4, 4), np.float32)))
    first = table.get(mask)
    assert first is mask  # read-only already: kept, not copied
    assert table.get(_frozen(mask.copy())) is first
    assert table.get(_frozen(mask.T.copy().T)) is first  # a strided copy has the same value
    others = [
        _frozen(mask.astype(np.float64)),  # dtype
        _frozen(mask.reshape(2, 8)),  # shape
        _frozen(np.triu(np.ones((4, 4), np.float32))),  # bytes
        _frozen(np.zeros((0, 4), np.float32)),  # size 0
        _frozen(np.zeros((1, 4), np.float32)),
    ]
    got = [table.get(x) for x in others]
    assert all(g is x for g, x in zip(got, others))
    assert len(table.arrays()) == 1 + len(others)


def test_nan_and_signed_zeros_are_told_apart_bytewise():
    table = ConstantTable()
    nan, zero, minus = _frozen([np.nan, 1.0]), _frozen([0.0]), _frozen([-0.0])
    assert table.get(nan) is nan and table.get(_frozen([np.nan, 1.0])) is nan
    assert table.get(zero) is zero and table.get(minus) is minus


def test_a_writeable_constant_is_copied_read_only():
    table = ConstantTable()
    x = np.arange(6.0)
    got = table.get(x)
    assert not got.flags.writeable and not np.shares_memory(got, x)
    x[0] = 7.0  # the caller's array is not the device's constant
    assert got[0] == 0.0 and table.get(np.arange(6.0)) is got
