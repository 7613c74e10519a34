"""Issue 31's 16-bit float semantics checked on models its tests do not use (tests/runtime/
test_low_float.py uses the MLP): a LLaMA block (RMSNorm, rotary embeddings, grouped-query
attention, SwiGLU), the CNN (im2col convolutions, max pooling) and the LSTM, in bfloat16 and
float16, under jit value_and_grad, on dp=2,tp=2 threads and under ``mpiexec -n 4``.

The oracle is test_low_float's: the graph's float32 twin run op by op by the ops' reference
implementations, each 16-bit value rounded where the graph types it 16-bit. The interpreter must
equal it bit for bit; a compiled run within one 16-bit ulp (a matmul or sum BLAS adds in its own
order); a mesh's executor equals the simulation of its own device programs within one ulp, and
one device normwise within the 16-bit rounding of the sums split over the mesh."""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

import graphc
from graphc.core.pytree import flatten
from graphc.models import rnn
from graphc.programs import simulate
from tests.models.unseen_mpi_jobs import LOW, cast, loss_case
from tests.runtime.test_low_float import (
    assert_normwise_close_low,
    assert_same_bits,
    assert_within_ulps,
    rounded_float32_run,
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
    want = rounded_float32_run(graph, [np.asarray(a) for a in flatten(args)[0]])
    assert_same_bits(flatten(graphc.evaluate(graph, *args, **kw))[0], want)
    assert_within_ulps(got, want, 1)


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
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("model", ["llama", "cnn"])
def test_value_and_grad_under_mpiexec_n_4_gives_the_threaded_bits(tmp_path, monkeypatch, model, dtype):
    env = dict(os.environ, GRAPHC_CACHE_DIR=str(tmp_path / "cache"), GRAPHC_PROFILE=str(tmp_path / "none.json"))
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
