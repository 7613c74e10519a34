"""Timings for issue 32 items 7 and 8, printed as ratios to numpy measured in the same run:

    PYTHONPATH=. .venv/bin/python -m tests.models.bench_generation_and_windows

1. KV-cache generation on ``tp=2`` (threads), 8 tokens, greedy:
   (a) kv_cache_masked.py, a full-length cache under a mask, on a model large enough that a
       token is real work (d=512, 4 layers); per decode token after the first two calls, against
       numpy's per-token time on the same model (the faster of its default BLAS threads and one);
   (b) kv_cache.py (llama3.np's growing ``cache[:, :pos + n]``) on the test model of
       tests/models/test_generation_and_windows.py: per token after the first two (each one a new
       specialization: trace, reuse of the plan's choices, lowering, build, run).
   The solver calls and specializations are counted too.
2. The CNN from loops over windows (numpy_cnn.forward, a 16 x 16 image, 4 filters) under
   ``graphc.jit`` against numpy: best of 5 rounds of 20 calls each.
"""

from __future__ import annotations

import time
import warnings

import numpy as np
from threadpoolctl import threadpool_limits

import graphc
from graphc.passes import partition
from tests.models.real_models import kv_cache, kv_cache_masked, numpy_cnn

BIG = {
    "dim": 512,
    "n_layers": 4,
    "n_heads": 8,
    "n_kv_heads": 4,
    "vocab_size": 2000,
    "ffn_dim": 1536,
    "norm_eps": 1e-5,
    "max_batch_size": 2,
    "max_seq_len": 64,
}
PROMPT = np.array([[1, 5, 7], [2, 3, 9]])
TOKENS = 8


def _count_solver() -> list[int]:
    calls = [0]
    solve = partition.solve_problem

    def counted(*args, **kwargs):
        calls[0] += 1
        return solve(*args, **kwargs)

    partition.solve_problem = counted  # this process only: a benchmark, not a library call
    return calls


def _per_token(module, args, forward_of) -> tuple[np.ndarray, np.ndarray]:
    """(the tokens, seconds of each call) of one greedy generation."""
    model = module.Llama(kv_cache.make_weights(args), args)
    forward = forward_of(model)
    stamps = [time.perf_counter()]

    def timed(ids, pos):
        out = forward(ids, pos)
        stamps.append(time.perf_counter())
        return out

    tokens = model.generate(PROMPT, TOKENS, forward=timed)
    return tokens, np.diff(stamps)


def generation(calls: list[int]) -> None:
    for label, module, args in (
        ("(a) full-length cache under a mask, d=512", kv_cache_masked, BIG),
        ("(b) llama3.np's growing cache slice, test model", kv_cache, kv_cache.ARGS),
    ):
        # numpy at its best here: its default BLAS threads, or one (the devices' setting: on a
        # loaded machine OpenBLAS's spinning threads can make a decode step ten times slower)
        want, numpy_s = _per_token(module, args, lambda m: m.forward)
        with threadpool_limits(limits=1, user_api="blas"):
            _, numpy_one = _per_token(module, args, lambda m: m.forward)
        numpy_tok = float(min(np.median(numpy_s[2:]), np.median(numpy_one[2:])))
        before = calls[0]
        holder: dict = {}

        def parallel(m, holder=holder):
            holder["pf"] = graphc.parallelize(m.forward, mesh={"tp": 2}, cache=False)
            return holder["pf"]

        got, ours = _per_token(module, args, parallel)
        assert np.array_equal(got, want), "the tokens differ from numpy's"
        ours_tok = float(np.median(ours[2:]))
        print(
            f"{label}: tp=2 {ours_tok * 1e3:.2f} ms a token after the first two (median of {len(ours) - 2}), "
            f"numpy {numpy_tok * 1e3:.2f} ms: {ours_tok / numpy_tok:.2f}x numpy's time; "
            f"solver calls {calls[0] - before}, specializations {len(holder['pf']._compiled)}; "
            f"first two calls {ours[0]:.2f} s, {ours[1]:.2f} s"
        )


def windows() -> None:
    params = numpy_cnn.make_params()
    image = np.random.default_rng(1).standard_normal((1, 16, 16))
    jitted = graphc.jit(numpy_cnn.forward)
    np.testing.assert_allclose(jitted(image, params), numpy_cnn.forward(image, params), rtol=1e-12, atol=1e-15)
    stats = jitted.compile(image, params).stats()

    def best(fn) -> float:
        rounds = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(20):
                fn(image, params)
            rounds.append((time.perf_counter() - start) / 20)
        return min(rounds)

    ours, theirs = best(jitted), best(numpy_cnn.forward)
    print(
        f"CNN from windows ({stats['nodes_traced']} nodes traced, {stats['nodes_optimized']} after the passes): "
        f"jit {ours * 1e3:.2f} ms, numpy {theirs * 1e3:.2f} ms: jit runs at {theirs / ours:.2f}x numpy's speed"
    )


def main() -> None:
    warnings.simplefilter("ignore")
    calls = _count_solver()
    generation(calls)
    windows()


if __name__ == "__main__":
    main()
