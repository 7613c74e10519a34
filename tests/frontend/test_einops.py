"""einops on traced arrays (frontend/einops_backend.py): rearrange, reduce, repeat and einsum under
graphc.jit equal einops on numpy arrays (also size-0 and size-1 dims), gradients against finite
differences, and graphc never importing einops itself."""

import os
import subprocess
import sys

import numpy as np
import pytest

import graphc
from tests.helpers import numeric_grad

einops = pytest.importorskip("einops")  # a test-only dependency (the test extra)
RNG = np.random.default_rng(32)


def check(fn, *args):
    got, want = graphc.jit(fn)(*args), fn(*args)
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)


@pytest.mark.parametrize(
    "shape, pattern, lengths",
    [
        ((2, 3, 4), "b t (h e) -> b h t e", {"h": 2}),
        ((2, 3, 4), "b t d -> (b t) d", {}),
        ((2, 1, 4), "b 1 d -> b d", {}),
        ((6,), "(a b) -> b a", {"a": 2}),
        ((0, 3, 4), "b t d -> t (b d)", {}),
        ((2, 0, 4), "b t (h e) -> b h t e", {"h": 4}),
        ((1, 1, 1), "a b c -> c b a", {}),
        ((2, 3, 4), "b ... -> ... b", {}),
    ],
)
def test_rearrange(shape, pattern, lengths):
    check(lambda x: einops.rearrange(x, pattern, **lengths), RNG.standard_normal(shape))


@pytest.mark.parametrize("reduction", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize(
    "shape, pattern, lengths",
    [
        ((2, 3, 4), "b t d -> b d", {}),
        ((2, 6, 4), "b (t two) d -> b t d", {"two": 2}),
        ((2, 3, 4), "b t d -> b 1 d", {}),
        ((1, 1, 5), "a b c -> c", {}),
        ((2, 3, 4), "b t d ->", {}),
    ],
)
def test_reduce(reduction, shape, pattern, lengths):
    check(lambda x: einops.reduce(x, pattern, reduction, **lengths), RNG.standard_normal(shape))


def test_reduce_over_empty_dims_and_of_ints():
    check(lambda x: einops.reduce(x, "b t d -> b d", "sum"), np.zeros((2, 0, 3)))
    check(lambda x: einops.reduce(x, "b t d -> b t", "max"), RNG.integers(-5, 5, (2, 3, 4)))
    check(lambda x: einops.reduce(x, "b t d -> b", "any"), RNG.standard_normal((2, 3, 4)) > 1)


@pytest.mark.parametrize(
    "shape, pattern, lengths",
    [
        ((4,), "d -> b 1 d", {"b": 3}),
        ((2, 3), "h w -> h (w r)", {"r": 2}),
        ((2, 3), "h w -> (r h) w", {"r": 1}),
        ((2, 3), "h w -> h w c", {"c": 0}),
        ((0, 3), "h w -> h r w", {"r": 2}),
    ],
)
def test_repeat(shape, pattern, lengths):
    check(lambda x: einops.repeat(x, pattern, **lengths), RNG.standard_normal(shape))


def test_einsum_and_a_list_of_arrays():
    a, b = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((4, 5))
    check(lambda a, b: einops.einsum(a, b, "batch seq d, d out -> batch out seq"), a, b)
    check(lambda a: einops.rearrange([a[0], a[1], 2 * a[0]], "n t d -> t (n d)"), a)


def test_gradients_and_sharding():
    x, w = RNG.standard_normal((2, 6, 4)), RNG.standard_normal((4, 3))

    def f(x):
        heads = einops.rearrange(x, "b t (h e) -> b h t e", h=2)
        pooled = einops.reduce(heads**2, "b h (t two) e -> b t (h e)", "max", two=2)
        return np.sum(np.tanh(einops.repeat(pooled, "b t d -> b t r d", r=2) @ w))

    np.testing.assert_allclose(graphc.grad(f)(x), numeric_grad(f, x), rtol=1e-6, atol=1e-9)
    got = graphc.parallelize(graphc.value_and_grad(f), mesh={"dp": 2}, free_axes=True, cache=False)(x)
    want = graphc.value_and_grad(f)(x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-15)


def run_python(code: str, folder) -> None:
    """``code`` run as a script file (graphc converts functions whose source it can read)."""
    script = folder / "script.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, str(script)], check=True, env=env, timeout=120)


def test_graphc_does_not_import_einops(tmp_path):
    run_python(
        "import sys, numpy as np, graphc\n"
        "graphc.jit(lambda x: np.sum(x.reshape(2, -1), axis=1))(np.ones(4))\n"
        "assert 'einops' not in sys.modules, 'einops was imported'\n",
        tmp_path,
    )


def test_einops_imported_inside_the_traced_function(tmp_path):
    """A program that imports einops only while a function is being traced: the trace started
    before einops was imported, and the converted call to rearrange registers the backend."""
    run_python(
        "import numpy as np, graphc\n"
        "def f(x):\n"
        "    from einops import rearrange\n"
        "    return rearrange(x, 'a (b c) -> c a b', c=2)\n"
        "x = np.arange(12.0).reshape(3, 4)\n"
        "np.testing.assert_array_equal(graphc.jit(f)(x), f(x))\n",
        tmp_path,
    )
