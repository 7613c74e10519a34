"""ArrayTokens (passes/sharding/problem.py): the node keys and the shrink labels tell constant
arrays apart by their shape, dtype and bytes, without copying or hashing a large one that no
other array could equal; the tokens must be equal exactly when the old keys (shape, dtype str,
bytes) were."""

import numpy as np

from graphc.passes.sharding.groups import _attr_key, _AttrKeys
from graphc.passes.sharding.problem import ArrayTokens


def _old_key(a):
    return (a.shape, a.dtype.str, a.tobytes())


def test_tokens_are_equal_exactly_when_shape_dtype_and_bytes_are():
    rng = np.random.default_rng(0)
    base = rng.standard_normal((3, 4)).astype(np.float32)
    arrays = [
        base,
        base.copy(),  # equal bytes, another object
        base.T.copy().T,  # equal values in another memory order: tobytes is C order either way
        base + 1,
        base.reshape(4, 3),  # same bytes, another shape
        base.astype(np.float64),
        np.zeros((0, 4), np.float32),
        np.zeros((0, 4), np.float32),  # size 0
        np.zeros((0, 3), np.float32),
        np.array(1.5, np.float32),
        np.float32(1.5),  # a numpy scalar keys as the 0-d array of its dtype and bytes did
        np.array(-0.0, np.float32),  # -0.0 == 0.0, yet other bytes
        np.array(0.0, np.float32),
        np.array(np.nan, np.float32),
        np.array(np.nan, np.float32),  # NaN != NaN, yet equal bytes
    ]
    tokens = ArrayTokens()
    got = [tokens(a) for a in arrays]
    for i, a in enumerate(arrays):
        for j, b in enumerate(arrays):
            assert (got[i] == got[j]) == (_old_key(a) == _old_key(b)), (i, j)
    assert tokens(arrays[0]) == got[0]  # asking again gives the same token
    hash(tuple(got))


def test_shrink_labels_tell_arrays_apart_as_the_digest_did():
    a = np.arange(6, dtype=np.int64).reshape(2, 3)
    values = [a, a.copy(), a + 1, a.reshape(3, 2), a.astype(np.int32), np.dtype(np.float32), (1, 2), "x"]
    keys = _AttrKeys()
    for u in values:
        for v in values:
            same_digest = _attr_key(u) == _attr_key(v)
            assert (keys(u) == keys(v)) == same_digest
