"""Shared test helpers."""

import contextlib
import io
import os

import numpy as np
import pytest

from graphc.core.cache import private_dir
from graphc.core.files import cache_dir
from graphc.core.pytree import flatten

# the kernel cache of the user running the tests (GRAPHC_CACHE_DIR, XDG_CACHE_HOME or ~/.cache, as
# at the start of the session), which the tests that keep the default cache share
_KERNELS = cache_dir("kernels")


def cache_of_its_own(folder) -> str:
    """A graphc cache folder (``GRAPHC_CACHE_DIR``) for a test or its subprocesses: plans and
    machine profile of its own, and the kernels of the default cache (``_KERNELS``) through a
    link. A kernel compiled once serves every test, as it serves a user's runs; in folders of
    their own the CLI, MPI and plan-file tests compiled about 170 kernels again, a minute of CI on
    an empty cache. Tests of the kernel cache itself make an empty folder instead."""
    shared = private_dir(_KERNELS)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    link = os.path.join(folder, "kernels")
    if shared is not None and not os.path.lexists(link):  # (a module's folder is asked for again)
        os.symlink(shared, link)
    return str(folder)


def tolerance(dtype) -> float:
    return {np.dtype(np.float64): 1e-6, np.dtype(np.float32): 1e-4, np.dtype(np.float16): 1e-2}.get(
        np.dtype(dtype), 0.0
    )


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
            np.testing.assert_allclose(
                g, w, rtol=rtol, atol=rtol * max(1.0, float(np.nanmax(np.abs(w), initial=0))) * 1e-2
            )
        else:
            np.testing.assert_array_equal(g, w)


def assert_normwise_close(got, want, terms: int) -> None:
    """``got`` and ``want`` are two float computations of one pytree of arrays (sums in any order,
    on any machine): the same structure, shapes and dtypes, other leaves equal, NaN and inf in the
    same places, and the finite float values, taken together as one vector, within
    ||got - want||_2 <= 2 * terms * eps * ||want||_2 (eps of the widest float dtype there).

    ``terms`` is the length of the longest sum behind a value (a dot product's k, a reduction's
    n): a sum of k terms computed in any order is within (k - 1) * eps of the sum of their
    magnitudes, so normwise within about k * eps of the result where the terms do not cancel
    (Higham, Accuracy and Stability of Numerical Algorithms, 3.1 and 3.5), once for each side. One
    norm over all leaves: a leaf that is 0 in exact arithmetic (a bias the loss ignores) is
    rounding noise on both sides, of the size of the values that cancelled there."""
    got_leaves, got_tree = flatten(got)
    want_leaves, want_tree = flatten(want)
    assert got_tree == want_tree, f"structure differs: {got_tree} vs {want_tree}"
    diff_sq = want_sq = 0.0
    eps = 0.0
    for i, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (i, g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype.kind not in "fc":
            np.testing.assert_array_equal(g, w, err_msg=f"leaf {i}")
            continue
        eps = max(eps, float(np.finfo(w.dtype).eps))
        finite = np.isfinite(w)
        np.testing.assert_array_equal(g[~finite], w[~finite], err_msg=f"leaf {i}: NaN or inf elsewhere")
        g64, w64 = g[finite].astype(np.complex128 if w.dtype.kind == "c" else np.float64), w[finite]
        diff_sq += float(np.sum(np.abs(g64 - w64) ** 2))
        want_sq += float(np.sum(np.abs(w64.astype(g64.dtype)) ** 2))
    bound = 2 * terms * eps * np.sqrt(want_sq)
    assert np.sqrt(diff_sq) <= bound, (
        f"||got - want|| = {np.sqrt(diff_sq):.3g} > 2 * {terms} * eps * ||want|| = {bound:.3g}"
    )


def assert_adam_step_close(got, want, lr: float, terms: int, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
    """``got`` and ``want``: (params, opt_state, loss) of a training step that ends in one
    ``graphc.optim.adam`` update, computed two ways. The loss and the moments m (the gradients'
    running mean) and v agree normwise (``assert_normwise_close`` with ``terms``; v holds g * g,
    twice the relative error). The params cannot agree that way: Adam moves a weight by lr * u,
    u = m_hat / (sqrt(v_hat) + eps), and where a gradient is rounding noise around 0, u is anything
    in [-1, 1] on either side. So each side's params must be the update its own moments give:
    (p_got - p_want) + lr * (u_got - u_want) is the update's rounding, at most 8 roundings of
    |p| + lr * |u| on each side (u in float64 from each side's m and v)."""
    (got_p, got_s, got_loss), (want_p, want_s, want_loss) = got, want
    unit = float(np.finfo(np.asarray(want_loss).dtype).eps)
    assert abs(float(got_loss) - float(want_loss)) <= 2 * terms * unit * abs(float(want_loss)), (got_loss, want_loss)
    assert float(got_s["t"]) == float(want_s["t"])
    assert_normwise_close(got_s["m"], want_s["m"], terms)
    assert_normwise_close(got_s["v"], want_s["v"], 2 * terms)
    t = float(want_s["t"])
    c1, c2 = 1.0 - b1**t, 1.0 - b2**t
    leaves = [flatten(x)[0] for x in (got_p, want_p, got_s["m"], want_s["m"], got_s["v"], want_s["v"])]
    for i, (pg, pw, mg, mw, vg, vw) in enumerate(zip(*leaves)):
        pg, pw, mg, mw, vg, vw = (np.asarray(a, np.float64) for a in (pg, pw, mg, mw, vg, vw))
        ug = (mg / c1) / (np.sqrt(vg / c2) + eps)
        uw = (mw / c1) / (np.sqrt(vw / c2) + eps)
        unit = float(np.finfo(np.asarray(flatten(want_p)[0][i]).dtype).eps)
        bound = 16 * unit * (np.abs(pw) + lr * (np.abs(ug) + np.abs(uw)))
        excess = np.abs((pg - pw) + lr * (ug - uw)) - bound
        assert np.all(excess <= 0), f"params leaf {i}: {np.sum(excess > 0)} weights not the step their moments give"


def assert_product_close(got, want, a, b, extra_rel: float = 0.0):
    """``got`` and ``want`` are two computations of ``a @ b`` (in float32 or float64, sums in any
    order): they may differ by the bound of rounding a dot product of length k in either, k * eps *
    (|a| @ |b|) elementwise, plus ``extra_rel`` times that scale for error already in the operands
    (an approximate exp or tanh). A bound from the computation, not from one machine's rounding."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    eps = np.finfo(np.result_type(np.asarray(a).dtype, np.asarray(b).dtype)).eps
    k = np.asarray(a).shape[-1]
    scale = np.abs(np.asarray(a, np.float64)) @ np.abs(np.asarray(b, np.float64))
    bound = (2 * k * eps + extra_rel) * scale
    excess = np.abs(got - want) - bound
    assert np.all(excess <= 0), f"{np.sum(excess > 0)} elements beyond k*eps*(|a|@|b|); worst by {excess.max():.3g}"


def line_of(marker: str, path: str | None = None) -> int:
    """The line number of the first line of the calling test file (or ``path``) containing
    ``marker`` (lines that call line_of itself are skipped)."""
    import sys

    path = path or sys._getframe(1).f_globals["__file__"]
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if marker in line and "line_of(" not in line:
                return i
    raise AssertionError(f"no line with {marker!r} in {path}")


def numeric_grad(f, x, eps=1e-6):
    """Central finite differences of a scalar function, one coordinate at a time."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        d = np.zeros_like(x)
        d[i] = eps
        g[i] = (f(x + d) - f(x - d)) / (2 * eps)
    return g


def quiet(fn, *args):
    """fn(*args) with numpy's floating-point warnings silenced (random graphs divide by zero...)."""
    import warnings

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return fn(*args)


def assert_arrays_close(got, want, rtol: float, atol: float) -> None:
    """Same shapes and dtypes; floats close (NaN where NaN), everything else equal."""
    for a, b in zip(got, want):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        else:
            np.testing.assert_array_equal(a, b)


def pipeline_executable(graph, stages: int, m: int, schedule: str, profile, timeout_s: float = 60.0):
    """Plan ``graph`` as a pipeline of ``stages`` stages on one device each (passes/pipeline.py),
    lower it to every device's tasks and build the runtime that runs them."""
    from graphc.core.mesh import Mesh
    from graphc.passes.options import PlanOptions
    from graphc.passes.pipeline import plan_pipeline
    from graphc.passes.pipeline_lower import lower_pipeline
    from graphc.runtime.pipeline import PipelineExecutable

    options = PlanOptions(microbatches=m, schedule=schedule)
    plan = plan_pipeline(graph, Mesh({"pp": stages}, profile=profile), options)
    return PipelineExecutable(lower_pipeline(graph, plan), timeout_s=timeout_s)


def fuzz_settings(examples: int):
    """Hypothesis settings of a fuzz target (``@pytest.mark.fuzz``): ``examples`` examples in the
    default profile, derandomized so that CI is reproducible (keep every target's share of the
    about 60 s CI budget: tests/fuzz/test_fuzz_inputs.py); under ``--hypothesis-profile long``
    (tests/conftest.py) that profile's settings, at least 10,000 examples with random seeds."""
    from hypothesis import HealthCheck, settings

    # hypothesis names the profile "long-with-verbose-verbosity" when --hypothesis-verbosity is
    # also given: still the long profile, with its verbosity
    current = settings.get_current_profile_name()
    if current == "long" or current.startswith("long-with-"):
        return settings(settings.get_profile(current))
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def mpiexec_path() -> str | None:
    """The mpiexec of the ``mpich`` wheel beside this Python (a venv's bin, on PATH or not), or
    one on PATH; None without MPI."""
    import os
    import shutil
    import sys

    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else shutil.which("mpiexec")


def quick_share(values, every: int = 2, keep=(), several: bool = False):
    """``values`` of a parametrize for the quick profile (``-m "not slow"``): every ``every``-th
    value, and those in ``keep``, run in it; the others are marked ``slow`` and run in the full
    suite only. For families of one check over many ops, models or dtypes, where a share of them
    is enough to tell a developer that the feature still works. ``several``: each value is a
    tuple of the case's arguments (a parametrize of several names)."""
    values = list(values)
    return [
        v if i % every == 0 or any(v is k or (type(v) is type(k) and v == k) for k in keep) else slow_param(v, several)
        for i, v in enumerate(values)
    ]


def slow_param(value, several: bool = False):
    """``value`` as one parametrize case marked ``slow`` (``several``: a tuple of its arguments)."""
    args = value if several else (value,)
    return pytest.param(*args, marks=pytest.mark.slow)


def graphc_cli(*argv: str) -> tuple[int, str, str]:
    """``graphc argv`` in this process: (exit status, stdout, stderr); argparse's exits included."""
    from graphc.cli.main import main  # the CLI only for the tests that call it

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse
            code = exc.code
    return code, out.getvalue(), err.getvalue()
