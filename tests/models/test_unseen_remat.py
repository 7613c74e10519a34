"""Issue 30's memory limits checked on a model its tests do not use (tests/passes/
test_recompute_segments.py uses gpt.py's step): models/llama.py's training step (RMSNorm, rotary
embeddings, grouped-query attention, SwiGLU, no biases, separate q/k/v projections) at the issue's
transformer shapes (4 layers, d=128, 4 heads, batch 4, sequence 256), and GPT and LLaMA steps with
size-1 dims (batch 1, one head).

For each limit: the solver finds a plan; its results equal the unlimited plan's (bit for bit on one
device, where the recomputed copies run the same kernels on the same operands); the measured peak
of the first run after compiling is within 10% of the plan's held peak, and between 85% of the
limit and the limit plus the documented slack (docs/remat.md)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.interpreter import bind_arguments
from graphc.models import gpt, llama

SLACK = 0.05  # docs/remat.md: the measured peak may exceed the plan's held peak by 5%

CASES = {  # (step, example arguments, static names)
    "llama-issue": (
        llama.train_step,
        lambda: llama.example_train_args(batch=4, seq=256, d=128, n_layer=4, n_head=4, n_kv_head=2, ffn=256),
        ("n_head", "n_kv_head"),
    ),
    "llama-b1-h1": (
        llama.train_step,
        lambda: llama.example_train_args(batch=1, seq=256, d=64, n_layer=2, n_head=1, n_kv_head=1, ffn=128),
        ("n_head", "n_kv_head"),
    ),
    "gpt-b1-h1": (
        gpt.train_step,
        lambda: gpt.example_train_args(batch=1, seq=256, d=64, n_layer=2, n_head=1),
        ("n_head",),
    ),
}


def _compiled(case: str, mesh: dict, limit: int | None):
    fn, args_of, static = CASES[case]
    args, kw = args_of()
    pf = graphc.parallelize(fn, mesh=mesh, memory_limit=limit, static_argnames=static, cache=False, time_limit=900)
    return pf, pf.compile(*args, **kw)


def _first_run(case: str, pf, compiled):
    """The results and the largest device peak of the first run after compiling."""
    args, kw = CASES[case][1]()
    dyn, dkw, _ = pf.split_static(args, kw)
    outs = compiled.executable.run_flat(bind_arguments(compiled.graph, dyn, dkw), profile=True)
    return outs, max(p["peak_bytes"] for p in compiled.executable.last_profile.values())


def _check(case: str, mesh: dict, fractions: list[float], rtol: float) -> None:
    pf0, free = _compiled(case, mesh, None)
    want, free_measured = _first_run(case, pf0, free)
    unlimited = free.plan.memory.peak_bytes[0]
    for fraction in fractions:
        limit = int(fraction * unlimited)
        pf, c = _compiled(case, mesh, limit)
        held = c.plan.memory.held[0]
        assert c.plan.memory.peak_bytes[0] <= held <= limit
        assert any(n.recompute for n in c.plan.nodes)
        got, measured = _first_run(case, pf, c)
        assert 0.9 * held <= measured <= 1.1 * held, (fraction, measured, held)
        assert 0.85 * limit <= measured <= (1 + SLACK) * limit, (fraction, measured, limit)
        assert measured < free_measured
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=rtol)


@pytest.mark.long  # 9 s loaded; the GPT cases above run in the full run
def test_llama_fits_60_and_40_percent_of_its_peak_on_one_device():
    _check("llama-issue", {"dp": 1}, [0.6, 0.4], rtol=0.0)


@pytest.mark.long
@pytest.mark.slow
def test_llama_fits_half_its_peak_on_tp2():
    # a weight gradient sums batch x sequence products, split differently by a recomputed copy
    _check("llama-issue", {"tp": 2}, [0.5], rtol=4 * 256 * float(np.finfo(np.float32).eps))


@pytest.mark.parametrize(
    "case, fraction",
    # the memory model holds constants all run, as the executor does (passes/sharding/memory.py):
    # the [T, T] causal mask and the rotary tables are 7% of these steps. LLaMA's smallest plan
    # needs 61% of its unlimited peak; before, both measured 6.2-7.2% over their limits
    [("llama-b1-h1", 0.62), pytest.param("gpt-b1-h1", 0.6, marks=pytest.mark.slow)],
)
def test_size_1_batch_and_heads_fit_under_the_limit_within_the_slack(case, fraction):
    _check(case, {"dp": 1}, [fraction], rtol=0.0)


MASK = np.tril(np.ones((256, 256), np.float32))


def _masked_products(x, w):
    h = x * MASK  # [256, 256]: the constant's only reader, at the start
    y = h @ w
    z = y @ y.T  # the peak, long after the constant's last reader: y, z, their product, the constant
    return z @ y


def test_a_constant_read_once_is_held_all_run_as_the_model_predicts():
    """The executor holds every constant of its program all run and between runs (Program.
    constants; each device its own contiguous piece, graphc/ops/constant.py's LocalAttrs); the
    memory model counts it so: on one device the measured peak is the predicted one to the byte
    (before, the model freed the mask after its reader and predicted 1.31 MB for 1.57 MB)."""
    x = np.ones((256, 256), np.float32)
    w = np.full((256, 256), 1 / 256, np.float32)
    pf = graphc.parallelize(_masked_products, mesh={"dp": 1}, cache=False)
    compiled = pf.compile(x, w)
    compiled.executable.run_flat([x, w], profile=True)
    measured = max(p["peak_bytes"] for p in compiled.executable.last_profile.values())
    assert measured == compiled.plan.memory.held[0] == 6 * MASK.nbytes
