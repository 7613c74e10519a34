"""Shared test helpers."""

import numpy as np

from graphc.pytree import flatten


def tolerance(dtype) -> float:
    return {np.dtype(np.float64): 1e-6, np.dtype(np.float32): 1e-4, np.dtype(np.float16): 1e-2}.get(np.dtype(dtype), 0.0)


def assert_same_pytree(got, want):
    """Same structure and static leaves, same shapes and dtypes, allclose values (exact for ints)."""
    got_leaves, got_tree = flatten(got)
    want_leaves, want_tree = flatten(want)
    assert got_tree == want_tree, f"structure differs: {got_tree} vs {want_tree}"
    for g, w in zip(got_leaves, want_leaves):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, (g.shape, w.shape)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        rtol = tolerance(w.dtype)
        if rtol:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * max(1.0, float(np.nanmax(np.abs(w), initial=0))) * 1e-2)
        else:
            np.testing.assert_array_equal(g, w)
