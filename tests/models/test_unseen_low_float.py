"""Issue 31's 16-bit float semantics checked on models its tests do not use (tests/runtime/
test_low_float.py uses the MLP): a LLaMA block (RMSNorm, rotary embeddings, grouped-query
attention, SwiGLU), the CNN (im2col convolutions, max pooling) and the LSTM, in bfloat16 and
float16, under jit value_and_grad, on dp=2,tp=2 threads and under ``mpiexec -n 4``.

The oracle is test_low_float's: the graph's float32 twin run op by op by the ops' reference
implementations, each 16-bit value rounded where the graph types it 16-bit. The interpreter must
equal it bit for bit; a compiled run within the bound its matmuls and sums added in another order
allow (test_low_float ``rounded_float32_run_with_bounds``: one ulp of a rounded result is not
enough where a sum cancels, as a tied-embedding GPT's gradient shows); a mesh's executor equals the simulation of its own device programs within one ulp, and
one device normwise within the 16-bit rounding of the sums split over the mesh."""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

import graphc
from graphc.bench.bounds import ulp_at
from graphc.core.pytree import flatten
from graphc.models import gpt, rnn
from graphc.programs import simulate
from tests.helpers import cache_of_its_own
from tests.models.unseen_mpi_jobs import LOW, cast, loss_case
from tests.runtime.test_low_float import (
    assert_each_leaf_off_by_2_percent_fails,
    assert_normwise_close_low,
    assert_same_bits,
    assert_within_bounds,
    assert_within_ulps,
    rounded_float32_run_with_bounds,
)
from tests.runtime.test_mpi import MPIEXEC, ROOT, mpirun, needs_mpi

JOBS = os.path.join(ROOT, "tests", "models", "unseen_mpi_jobs.py")
DTYPES = [pytest.param("bf16", id="bf16"), pytest.param("f16", id="f16")]


def _case(model: str, dtype: str):
    if model == "lstm":  # 4 steps of batch 1: a size-1 batch through every gate
        (p, xs, ys), kw = rnn.example_lstm_args(steps=4, batch=1, n_in=5, hidden=6, n_out=3)
        return rnn.lstm_loss, (cast(p, LOW[dtype]), xs.astype(LOW[dtype]), ys.astype(LOW[dtype])), kw
    return loss_case(model, LOW[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("model", ["llama", "cnn", "lstm"])
def test_value_and_grad_under_jit_equal_the_rounded_float32_graph(model, dtype):
    loss, args, kw = _case(model, dtype)
    vg = graphc.value_and_grad(loss)
    got = [np.asarray(a) for a in flatten(graphc.jit(vg, static_argnames=tuple(kw))(*args, **kw))[0]]
    assert all(a.dtype == LOW[dtype] for a in got[1:])  # every gradient is 16-bit, as its parameter
    graph = graphc.trace(vg, *args, **kw)
    want, bounds = rounded_float32_run_with_bounds(graph, [np.asarray(a) for a in flatten(args)[0]])
    assert_same_bits(flatten(graphc.evaluate(graph, *args, **kw))[0], want)
    assert_within_bounds(got, want, bounds)


def test_a_bfloat16_gpt_gradient_that_cancels_is_within_its_bound_not_one_ulp():
    """The tied embedding's gradient (the token lookup's scatter-add plus the LM head's matmul)
    of a bfloat16 GPT with batch 1 and one head cancels to -2.6e-8 from terms around 1e-3 in one
    element: the two float32 summation orders are several bfloat16 ulps apart there (6 measured),
    within 2 gamma_K of the terms' magnitudes. A result 2% off still fails the bound in the
    embedding's gradient and in the last layers' ones (the bounds of the attention's and first
    layer norm's gradients are loose: a forward value within the reordering of a rounding
    boundary may round either way, and the bound carries that through every later sum)."""
    (p, tokens, targets), kw = gpt.example_loss_args(batch=1, seq=8, d=16, n_layer=1, n_head=1)
    args = (cast(p, LOW["bf16"]), tokens, targets)
    vg = graphc.value_and_grad(gpt.lm_loss)
    got = [np.asarray(a) for a in flatten(graphc.jit(vg, static_argnames=tuple(kw))(*args, **kw))[0]]
    graph = graphc.trace(vg, *args, **kw)
    want, bounds = rounded_float32_run_with_bounds(graph, [np.asarray(a) for a in flatten(args)[0]])
    wte = [i for i, v in enumerate(graph.inputs) if v.name and v.name.endswith("wte")]
    assert len(wte) == 1, [v.name for v in graph.inputs]
    leaf = wte[0] + 1  # after the loss
    # one ulp is not the bound: the reordering alone may move the embedding's gradient further
    w, b = want[leaf], bounds[leaf]
    assert (b > 2 * ulp_at(np.abs(w.astype(np.float64)), w.dtype)).any()
    assert_within_bounds(got, want, bounds)
    assert_each_leaf_off_by_2_percent_fails(want, bounds, leaves=[leaf, len(want) - 1, len(want) - 2])


# models/llama.py's causal mask, -1e9 in the model's dtype, is -inf in float16, and 0 * -inf is NaN
# (numpy's own run of the model too): its float16 gradients are NaN, so no normwise comparison
MESH_CASES = [("llama", "bf16"), ("cnn", "bf16"), ("cnn", "f16")]


@pytest.mark.parametrize("model, dtype", MESH_CASES, ids=["-".join(c) for c in MESH_CASES])
def test_value_and_grad_on_dp2_tp2_threads(model, dtype):
    loss, args, kw = _case(model, dtype)
    vg = graphc.value_and_grad(loss)
    pf = graphc.parallelize(vg, mesh="dp=2,tp=2", static_argnames=tuple(kw), cache=False)
    got = [np.asarray(a) for a in flatten(pf(*args, **kw))[0]]
    program = pf.compile(*args, **kw).partitioned.lowered
    dyn, dkw, _ = pf.split_static(args, kw)
    inputs = program.shard_inputs([np.asarray(a) for a in flatten((dyn, dkw))[0]])
    assert_within_ulps(got, program.gather_outputs(simulate(program, inputs)), 1)
    single = flatten(graphc.jit(vg, static_argnames=tuple(kw))(*args, **kw))[0]
    # the longest sums split over the mesh: a weight gradient over the batch's rows (the CNN's
    # first convolution: 4 images x 28 x 28 positions), rounded once per partial sum
    terms = 4 * 28 * 28 if model == "cnn" else 4 * 8
    assert_normwise_close_low(got, single, terms=terms, dtype=LOW[dtype])


@needs_mpi
@pytest.mark.slow
@pytest.mark.parametrize(
    "model, dtype",
    # 7-22 s loaded each: the CNN in bfloat16 runs in the full run, and float16 under mpiexec in
    # tests/runtime/test_low_float.py (the MLP)
    [
        pytest.param("llama", "f16", marks=pytest.mark.long),
        pytest.param("llama", "bf16", marks=pytest.mark.long),
        pytest.param("cnn", "f16", marks=pytest.mark.long),
        ("cnn", "bf16"),
    ],
)
def test_value_and_grad_under_mpiexec_n_4_gives_the_threaded_bits(tmp_path, monkeypatch, model, dtype):
    env = dict(
        os.environ, GRAPHC_CACHE_DIR=cache_of_its_own(tmp_path / "cache"), GRAPHC_PROFILE=str(tmp_path / "none.json")
    )
    monkeypatch.setenv("GRAPHC_CACHE_DIR", env["GRAPHC_CACHE_DIR"])  # the ranks load the threaded run's plan
    monkeypatch.setenv("GRAPHC_PROFILE", env["GRAPHC_PROFILE"])
    loss, args, kw = _case(model, dtype)
    pf = graphc.parallelize(graphc.value_and_grad(loss), mesh="dp=2,tp=2", static_argnames=tuple(kw))
    threaded = [np.asarray(a) for a in flatten(pf(*args, **kw))[0]]
    out = tmp_path / "out.npz"
    assert MPIEXEC is not None
    res = mpirun(4, sys.executable, JOBS, "low_float", model, dtype, "dp=2,tp=2", str(out), env=env, timeout=300)
    assert res.returncode == 0, res.stderr
    assert sorted(int(r) for r in re.findall(r"ok (\d+)", res.stdout)) == [0, 1, 2, 3], res.stdout
    got = np.load(out)
    assert len(got.files) == len(threaded)
    for i, want in enumerate(threaded):
        assert got[f"leaf_{i}"].tobytes() == want.tobytes(), f"leaf {i}: other bits than threads"
