"""Issue 31's runtime items and the "no silent wrong result" rule checked on models and inputs its
tests do not use: a LLaMA step and the CNN's momentum step trained on pipelines under MPI with 2
and 4 micro-batches, their state fed back; ZeRO dp=2 steps' state (split ShardedArrays) fed to tp=2
steps under MPI; two-operand einsums with inf, nan and -0.0 at sizes that take the BLAS path; and
results that are arguments, views or reshapes of arguments, or gradients equal to an argument,
never sharing memory with the caller's arrays."""

from __future__ import annotations

import os
import re
import sys
import warnings

import numpy as np
import pytest

import graphc
from graphc.core.ir import TensorType
from graphc.core.pytree import flatten, unflatten
from graphc.runtime.einsum import BlasEinsum, einsum_step
from tests.helpers import assert_adam_step_close, assert_normwise_close, cache_of_its_own
from tests.models.unseen_mpi_jobs import train_case
from tests.runtime.test_einsum import assert_same_as_numpy
from tests.runtime.test_mpi import ROOT, mpirun, needs_mpi

JOBS = os.path.join(ROOT, "tests", "models", "unseen_mpi_jobs.py")


@pytest.fixture
def mpi_env(tmp_path, monkeypatch):
    """The jobs' cache and profile, also this process's: the ranks load the threaded run's plans."""
    env = dict(
        os.environ, GRAPHC_CACHE_DIR=cache_of_its_own(tmp_path / "cache"), GRAPHC_PROFILE=str(tmp_path / "none.json")
    )
    monkeypatch.setenv("GRAPHC_CACHE_DIR", env["GRAPHC_CACHE_DIR"])
    monkeypatch.setenv("GRAPHC_PROFILE", env["GRAPHC_PROFILE"])
    return env


def _run_job(n: int, env: dict, *args: str) -> dict:
    res = mpirun(n, sys.executable, JOBS, *args, env=env, timeout=400)
    assert res.returncode == 0, res.stderr
    assert sorted(int(r) for r in re.findall(r"ok (\d+)", res.stdout)) == list(range(n)), res.stdout
    return dict(np.load(args[-1]))


def _whole(x):
    return np.asarray(x.gather(0) if isinstance(x, graphc.ShardedArray) else x)


def _assert_step_close(model: str, got, want, kw: dict) -> None:
    """A step computed on a mesh against one device: the sums the mesh splits (a weight gradient
    over the batch's rows; the CNN's first convolution over 8 images x 28 x 28 positions)."""
    if model == "llama":
        assert_adam_step_close(got, want, lr=kw["lr"], terms=8 * 8)
    else:
        assert_normwise_close(got, want, terms=8 * 28 * 28)


# --- pipelines and resharding under MPI ------------------------------------------------------------


@needs_mpi
@pytest.mark.slow
@pytest.mark.parametrize("microbatches", [2, 4])
@pytest.mark.parametrize("model", ["llama", "cnn"])
def test_a_pipeline_trains_three_steps_under_mpi_as_on_threads_and_one_device(mpi_env, tmp_path, model, microbatches):
    """Each step's results equal the threaded loop's bit for bit, and one device's step from the
    same state (the state each side feeds back drifts apart by rounding, so each step is compared
    from the pipeline's own previous state)."""
    fn, (params, state, *data), kw, static = train_case(model)
    pf = graphc.parallelize(fn, mesh="pp=2", static_argnames=static, microbatches=microbatches)
    one = graphc.jit(fn, static_argnames=static)
    threaded = []
    p, s = params, state
    for _ in range(3):
        p, s, loss = pf(p, s, *data, **kw)
        threaded.append((p, s, loss))
    got = _run_job(2, mpi_env, "train", model, "pp=2", str(microbatches), "3", str(tmp_path / "out.npz"))
    before = (params, state)
    for k, step in enumerate(threaded):
        leaves, treedef = flatten(step)
        mine = [got[f"step{k}_{i}"] for i in range(len(leaves))]
        for i, t in enumerate(leaves):
            assert mine[i].tobytes() == _whole(t).tobytes(), f"step {k} leaf {i}: other bits than threads"
        result = unflatten(treedef, mine)
        _assert_step_close(model, result, one(*before, *data, **kw), kw)
        before = result[:2]
    assert not np.array_equal(got["step0_0"], got["step2_0"])  # the state moved


@needs_mpi
@pytest.mark.slow
@pytest.mark.parametrize(
    "model, zero",
    [
        # llama: 20-25 s loaded each (the cnn cases run ZeRO-1 and ZeRO-3 in the full run)
        pytest.param("llama", 1, marks=pytest.mark.long),
        pytest.param("llama", 3, marks=pytest.mark.long),
        ("cnn", 1),
        ("cnn", 3),
    ],
)
def test_zero_dp2_state_feeds_a_tp2_step_under_mpi(mpi_env, tmp_path, model, zero):
    """The dp=2 step's new state comes back split over the ranks (ZeRO: S(0) pieces); the tp=2
    step wants other specs and gets it redistributed. Threaded bits, and one device's step."""
    fn, (params, state, *data), kw, static = train_case(model)
    dp = graphc.parallelize(fn, mesh="dp=2", static_argnames=static, zero=zero)
    tp = graphc.parallelize(fn, mesh="tp=2", static_argnames=static)
    assert "(S(0),)" in {str(sp) for sp in dp.compile(params, state, *data, **kw).program.out_specs}
    p, s, _ = dp(params, state, *data, **kw)
    threaded = tp(p, s, *data, **kw)
    got = _run_job(2, mpi_env, "reshard", model, str(zero), str(tmp_path / "out.npz"))
    leaves, treedef = flatten(threaded)
    mine = [got[f"r{i}"] for i in range(len(leaves))]
    for i, t in enumerate(leaves):
        assert mine[i].tobytes() == _whole(t).tobytes(), f"leaf {i}: other bits than threads"
    one = graphc.jit(fn, static_argnames=static)
    p1, s1, _ = one(params, state, *data, **kw)
    _assert_step_close(model, unflatten(treedef, mine), one(p1, s1, *data, **kw), kw)


# --- einsum with inf, nan and -0.0 on the BLAS path's sizes -------------------------------------------

EQUATIONS = [
    ("ij,jk->ik", dict(i=64, j=80, k=48)),
    ("ij,kj->ik", dict(i=70, j=60, k=50)),
    ("ji,jk->ki", dict(i=60, j=70, k=40)),
    ("bhtd,bhsd->bhts", dict(b=2, h=3, t=20, s=24, d=16)),  # attention scores
    ("ij,j->i", dict(i=300, j=200)),
    ("i,i->", dict(i=50000)),
    ("ik,kj->", dict(i=50, k=40, j=30)),
    ("ij,jk->ik", dict(i=64, j=0, k=48)),  # an empty sum: +0.0
    ("ij,jk->ik", dict(i=1, j=40000, k=1)),
    ("ij,jk->ki", dict(i=256, j=1, k=256)),  # one product per element: its sign of zero
]
SPECIALS = ["inf", "nan", "all -0.0", "signed zeros", "near overflow", "inf times zero", "mixed"]


def test_the_einsums_above_take_the_blas_path_on_finite_operands():
    """So the special operands below test its checks, not numpy's loop (but for the empty sum and a
    label summed in one operand only, which numpy's loop computes)."""
    for equation, sizes in EQUATIONS:
        types = [
            TensorType(tuple(sizes[c] for c in spec), np.dtype(np.float32))
            for spec in equation.split("->")[0].split(",")
        ]
        on_blas = isinstance(einsum_step(equation, types), BlasEinsum)
        assert on_blas == (sizes.get("j") != 0 and equation != "ik,kj->"), equation


def _special_operands(rng, equation: str, sizes: dict, dtype, kind: str):
    sa, sb = equation.split("->")[0].split(",")
    a = rng.standard_normal([sizes[c] for c in sa]).astype(dtype)
    b = rng.standard_normal([sizes[c] for c in sb]).astype(dtype)
    if not (a.size and b.size):
        return a, b
    if kind == "inf":
        a.flat[rng.integers(0, a.size, 3)] = np.inf
    elif kind == "nan":
        b.flat[rng.integers(0, b.size, 2)] = np.nan
    elif kind == "all -0.0":
        a = -np.zeros_like(a)
    elif kind == "signed zeros":
        a.flat[rng.integers(0, a.size, a.size // 2)] = -0.0
        b.flat[rng.integers(0, b.size, b.size // 2)] = 0.0
    elif kind == "near overflow":  # sums that overflow in one order and not in another
        a *= np.finfo(dtype).max / 4
    elif kind == "inf times zero":
        a.flat[0] = np.inf
        b[...] = 0.0
    else:
        picks = rng.integers(0, a.size, max(1, a.size // 8))
        a.flat[picks] = rng.choice([np.inf, -np.inf, np.nan, -0.0], picks.size)
    return a, b


@pytest.mark.parametrize("kind", SPECIALS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "equation, sizes", EQUATIONS, ids=[f"{e}-{'x'.join(map(str, s.values()))}" for e, s in EQUATIONS]
)
def test_jit_einsum_with_special_operands_equals_numpy(equation, sizes, dtype, kind):
    rng = np.random.default_rng(len(equation) + sum(sizes.values()) + SPECIALS.index(kind))
    a, b = _special_operands(rng, equation, sizes, dtype, kind)
    with np.errstate(all="ignore"):
        want = np.einsum(equation, a, b)
        got = graphc.jit(lambda a, b: np.einsum(equation, a, b))(a, b)
    assert_same_as_numpy(got, np.asarray(want), equation, a, b, sizes)


# --- results never alias the caller's arrays ----------------------------------------------------------

VIEWS = {  # numpy returns a view of (or the) argument for most of these; graphc must hand out new arrays
    "ravel": lambda x, y: x.ravel(),
    "squeeze": lambda x, y: np.squeeze(x[:1]),
    "new axis": lambda x, y: x[:, None],
    "ellipsis": lambda x, y: x[...],
    "asarray": lambda x, y: np.asarray(x),
    "ascontiguousarray": lambda x, y: np.ascontiguousarray(x),
    "atleast_2d": lambda x, y: np.atleast_2d(x),
    "flip": lambda x, y: x[::-1],
    "moveaxis": lambda x, y: np.moveaxis(x, 0, -1),
    "swapaxes": lambda x, y: x.swapaxes(0, 1),
    "split": lambda x, y: np.split(x, 2, axis=1),
    "broadcast_to": lambda x, y: np.broadcast_to(x, x.shape),
    "astype no copy": lambda x, y: x.astype(x.dtype, copy=False),
    "where true": lambda x, y: np.where(True, x, y),
    "maximum with itself": lambda x, y: np.maximum(x, x),
    "second argument": lambda x, y: y,
    "both swapped": lambda x, y: (y, x),
    "x * 0 + y": lambda x, y: x * 0 + y,
    "dict of views": lambda x, y: {"x": x, "yt": y.T, "nested": [x[1:], (y.reshape(-1),)]},
    "grad of sum(x * y)": graphc.grad(lambda x, y: np.sum(x * y), argnums=(0, 1)),  # = (y, x)
    "grad of sums": graphc.grad(lambda x, y: np.sum(x) + np.sum(y), argnums=(0, 1)),  # ones
}
ARGS = {
    "f64": lambda: (np.arange(24.0).reshape(4, 6), np.arange(24.0).reshape(4, 6) + 1),
    "strided": lambda: (np.arange(48.0).reshape(4, 12)[:, ::2], np.arange(48.0).reshape(4, 12)[:, 1::2]),
    "large": lambda: (np.arange(600 * 512.0).reshape(600, 512), np.ones((600, 512))),  # counted program
}


def _assert_no_shared_memory(results, args) -> None:
    outs = [np.asarray(o) for o in flatten(results)[0]]
    for i, o in enumerate(outs):
        assert not any(np.shares_memory(o, a) for a in args), f"result {i} shares memory with an argument"
        assert not any(np.shares_memory(o, outs[j]) for j in range(i)), f"result {i} shares memory with another"


@pytest.mark.parametrize("args", list(ARGS))
@pytest.mark.parametrize("name", list(VIEWS))
def test_jit_and_interpreter_results_are_new_arrays(name, args):
    fn, (x, y) = VIEWS[name], ARGS[args]()
    want = fn(x.copy(), y.copy())
    jitted = graphc.jit(fn)
    for got in (jitted(x, y), jitted(x, y), graphc.evaluate(graphc.trace(fn, x, y), x, y)):
        _assert_no_shared_memory(got, (x, y))
        for g, w in zip(flatten(got)[0], flatten(want)[0]):
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("mesh", [{"tp": 2}, {"dp": 2}], ids=str)
@pytest.mark.parametrize("name", ["ravel", "flip", "split", "both swapped", "dict of views", "grad of sum(x * y)"])
def test_parallelize_results_are_new_arrays(name, mesh):
    fn, (x, y) = VIEWS[name], ARGS["strided"]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a data axis that splits nothing here warns
        got = graphc.parallelize(fn, mesh=mesh, cache=False)(x, y)
    _assert_no_shared_memory(got, (x, y))
    for g, w in zip(flatten(got)[0], flatten(fn(x.copy(), y.copy()))[0]):
        np.testing.assert_array_equal(g, w)
