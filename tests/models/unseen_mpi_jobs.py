"""Jobs tests/models/test_unseen_runtime.py runs under ``mpiexec -n N python
tests/models/unseen_mpi_jobs.py JOB ...`` (not a test module: every rank runs it), on models and
shapes the issue-31 tests do not use. Each job prints ``ok <rank>`` on every rank that finished,
and rank 0 writes the gathered results to OUT (``.npz``).

    low_float MODEL DTYPE MESH OUT   MODEL's value_and_grad (llama, cnn) on 16-bit floats
    train MODEL MESH M STEPS OUT     STEPS training steps of MODEL (llama, cnn) on a pipeline
                                     MESH with M micro-batches, each fed the state the last returned
    reshard MODEL ZERO OUT           MODEL's dp=2 step's new state (ZeRO stage ZERO) fed to its
                                     tp=2 step
"""

from __future__ import annotations

import sys

import numpy as np

import graphc
from graphc.core.pytree import flatten, unflatten
from graphc.models import cnn, llama

LOW = {"bf16": np.dtype(graphc.bfloat16), "f16": np.dtype(np.float16)}


def cast(tree, dtype):
    """``tree`` with its float32 leaves in ``dtype``."""
    leaves, treedef = flatten(tree)
    return unflatten(treedef, [a.astype(dtype) if np.asarray(a).dtype == np.float32 else a for a in leaves])


def loss_case(model: str, dtype=np.float32):
    """(loss function, arguments, static keyword arguments) of a small ``model`` in ``dtype``."""
    if model == "llama":  # one key/value head shared by two query heads; batch 4 splits over dp=2
        (p, tokens, targets), kw = llama.example_loss_args(
            batch=4, seq=8, d=32, n_layer=1, n_head=2, n_kv_head=1, ffn=48, n_vocab=64
        )
        return llama.loss, (cast(p, dtype), tokens, targets), kw
    (p, images, labels), kw = cnn.example_loss_args(batch=4)
    return cnn.loss, (cast(p, dtype), images.astype(dtype), labels), kw


def train_case(model: str):
    """(train step, arguments, keyword arguments, static names) of a small ``model``."""
    if model == "llama":
        args, kw = llama.example_train_args(batch=8, seq=8, d=32, n_layer=2, n_head=2, n_kv_head=1, ffn=48, n_vocab=64)
        return llama.train_step, args, kw, ("n_head", "n_kv_head", "lr")
    args, kw = cnn.example_train_args(batch=8)
    return cnn.train_step, args, kw, ("lr",)


def _save(world, out: str, arrays: dict) -> None:
    if world.rank == 0:
        np.savez(out, **arrays)
    print(f"ok {world.rank}", flush=True)


def low_float(model: str, dtype: str, mesh: str, out: str) -> None:
    loss, args, kw = loss_case(model, LOW[dtype])
    pf = graphc.parallelize(graphc.value_and_grad(loss), mesh=mesh, static_argnames=tuple(kw), backend="mpi")
    whole = [a.gather(0) for a in flatten(pf(*args, **kw))[0]]  # None on the other ranks
    _save(pf.world, out, {f"leaf_{i}": _bits(a) for i, a in enumerate(whole)})


def _bits(a):
    """A 16-bit float array as its bits (np.savez keeps no ml_dtypes type); others as they are."""
    return a.view(np.uint16) if a is not None and a.dtype in LOW.values() else a


def train(model: str, mesh: str, microbatches: int, steps: int, out: str) -> None:
    fn, (params, state, *data), kw, static = train_case(model)
    pf = graphc.parallelize(fn, mesh=mesh, static_argnames=static, microbatches=microbatches, backend="mpi")
    arrays = {}
    for s in range(steps):
        params, state, loss = pf(params, state, *data, **kw)
        for i, x in enumerate(flatten((params, state, loss))[0]):
            arrays[f"step{s}_{i}"] = x.gather(0)
    _save(pf.world, out, arrays)


def reshard(model: str, zero: int, out: str) -> None:
    fn, (params, state, *data), kw, static = train_case(model)
    dp = graphc.parallelize(fn, mesh="dp=2", static_argnames=static, backend="mpi", zero=zero)
    tp = graphc.parallelize(fn, mesh="tp=2", static_argnames=static, backend="mpi")
    params, state, _ = dp(params, state, *data, **kw)
    result = tp(params, state, *data, **kw)
    _save(tp.world, out, {f"r{i}": a.gather(0) for i, a in enumerate(flatten(result)[0])})


if __name__ == "__main__":
    job, *rest = sys.argv[1:]
    if job == "low_float":
        low_float(*rest)
    elif job == "train":
        train(rest[0], rest[1], int(rest[2]), int(rest[3]), rest[4])
    elif job == "reshard":
        reshard(rest[0], int(rest[1]), rest[2])
    else:
        raise SystemExit(f"unknown job {job!r}")
