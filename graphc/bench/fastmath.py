"""Benchmark of runtime/fastmath.py: fused float32 kernels (and the plain function maps) against
memory bandwidth and against numpy, single thread.

    graphc bench fastmath [--sizes 4M,16M] [--n 1024] [--repeat 9]

For each size N (float32 elements; softmax / layer norm see N/n rows of n):

* ``np.copyto`` of N float32 into a warm buffer: reads 4N + writes 4N bytes, the reference bandwidth;
* each kernel into a warm ``out``: median of ``repeat`` warm runs, timed in rounds interleaved with
  the copy's; effective bandwidth = (bytes read + bytes written) / time, and that as a fraction of
  the copy's bandwidth from the same rounds;
* numpy's time for the same expression (median of fewer runs: GELU with ``x**3`` is slow);
* the error vs numpy's float32 result, and numpy-float32's own error vs a float64 evaluation as a
  yardstick. Error = max |a - b| / max(|b|, floor): floor 1 for GELU and layer norm (outputs of order
  1; below that the error is absolute, as GELU's 1 + tanh cancels for x < 0 in any float32
  evaluation), floor 0 (pure relative) for softmax and the function maps.

Timings move by 20-50% from run to run on a shared VM; compare rows of the same run.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import numpy as np

from graphc.bench.timing import interleaved
from graphc.runtime import fastmath as fm
from graphc.runtime import rowkernels as rk

GELU_C = math.sqrt(2.0 / math.pi)


def median_time(fn, repeat: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def max_err(a: np.ndarray, b: np.ndarray, floor: float) -> float:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    fin = np.isfinite(b) & (np.abs(b) >= np.finfo(np.float32).tiny)
    if not fin.any():
        return 0.0
    return float(np.max(np.abs(a[fin] - b[fin]) / np.maximum(np.abs(b[fin]), floor)))


def np_gelu(x, cube=True):
    x3 = x**3 if cube else x * x * x
    return 0.5 * x * (1.0 + np.tanh(GELU_C * (x + 0.044715 * x3)))


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_layernorm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + eps) * g + b


def parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20}.get(text[-1], 1)
    return int(float(text.rstrip("KM")) * mult)


def bench_size(size: int, n: int, repeat: int, np_repeat: int, seed: int = 0) -> list[dict]:
    rows = size // n
    size = rows * n
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, n)).astype(np.float32)
    xpos = (np.abs(x) + np.float32(0.01)).astype(np.float32)  # log input
    g = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    b = (0.1 * rng.standard_normal(n)).astype(np.float32)
    eps = 1e-5
    out = np.zeros_like(x)  # touched: no page faults inside the timings
    dst = np.zeros_like(x)
    flat, flat_pos, flat_out = x.reshape(-1), xpos.reshape(-1), out.reshape(-1)

    x64 = x.astype(np.float64)
    cases = [
        # name, ours, numpy, bytes, err floor, float64 reference
        ("gelu", lambda: rk.gelu_f32(x, out), lambda: np_gelu(x), 8 * size, 1.0, lambda: np_gelu(x64)),
        (
            "softmax",
            lambda: rk.softmax_lastaxis_f32(x, out),
            lambda: np_softmax(x),
            8 * size,
            0.0,
            lambda: np_softmax(x64),
        ),
        (
            "layernorm",
            lambda: rk.layernorm_lastaxis_f32(x, g, b, out, eps),
            lambda: np_layernorm(x, g, b, eps),
            8 * size + 8 * n,
            1.0,
            lambda: np_layernorm(x64, g.astype(np.float64), b.astype(np.float64), eps),
        ),
        (
            "exp map",
            lambda: fm.apply("exp", flat, flat_out),
            lambda: np.exp(flat),
            8 * size,
            0.0,
            lambda: np.exp(x64.reshape(-1)),
        ),
        (
            "tanh map",
            lambda: fm.apply("tanh", flat, flat_out),
            lambda: np.tanh(flat),
            8 * size,
            0.0,
            lambda: np.tanh(x64.reshape(-1)),
        ),
        (
            "log map",
            lambda: fm.apply("log", flat_pos, flat_out),
            lambda: np.log(flat_pos),
            8 * size,
            0.0,
            lambda: np.log(flat_pos.astype(np.float64)),
        ),
    ]
    # the copy and our kernels are timed in interleaved rounds (copy, gelu, softmax, ..., copy, gelu, ...)
    # so that a slow phase of a shared machine hits all of them alike
    fns = [lambda: np.copyto(dst, x)] + [case[1] for case in cases]
    by_index = interleaved(dict(enumerate(fns)), repeat, rotate=False)
    times = [by_index[k] for k in range(len(fns))]
    t_copy = statistics.median(times[0])
    copy_bw = 8 * size / t_copy
    results = [dict(name="copy", size=size, t=t_copy, gbs=copy_bw / 1e9, frac=1.0)]
    for (name, ours, ref, nbytes, floor, ref64), ts in zip(cases, times[1:]):
        t = statistics.median(ts)
        ours()
        mine = out.copy()
        t_np = median_time(ref, np_repeat)
        want = ref()
        exact = ref64()
        results.append(
            dict(
                name=name,
                size=size,
                t=t,
                gbs=nbytes / t / 1e9,
                frac=(nbytes / t) / copy_bw,
                t_numpy=t_np,
                err=max_err(mine.reshape(want.shape), want, floor),
                numpy_err=max_err(want, exact, floor),
            )
        )
        if name == "gelu":
            results[-1]["t_numpy_xxx"] = median_time(lambda: np_gelu(x, cube=False), np_repeat)
    return results


def report(results: list[dict], n: int, repeat: int) -> str:
    lines = []
    size = results[0]["size"]
    lines.append(
        f"N = {size:,} float32 ({size * 4 / 2**20:.0f} MiB per array); softmax/layernorm rows of n={n}; "
        f"median of {repeat} warm runs, 1 thread"
    )
    c = results[0]
    lines.append(f"  np.copyto: {c['t'] * 1e3:8.2f} ms  {c['gbs']:6.2f} GB/s")
    lines.append(
        f"  {'kernel':10s} {'ours ms':>9s} {'GB/s':>7s} {'of copy':>8s} {'numpy ms':>9s} {'speedup':>8s}"
        f" {'err vs np32':>12s} {'np32 vs f64':>12s}"
    )
    for r in results[1:]:
        lines.append(
            f"  {r['name']:10s} {r['t'] * 1e3:9.2f} {r['gbs']:7.2f} {r['frac']:8.2f} {r['t_numpy'] * 1e3:9.2f}"
            f" {r['t_numpy'] / r['t']:7.1f}x {r['err']:12.2e} {r['numpy_err']:12.2e}"
        )
        if "t_numpy_xxx" in r:
            lines.append(
                f"  {'':10s} {'':9s} {'':7s} {'':8s} {r['t_numpy_xxx'] * 1e3:9.2f}"
                f" {r['t_numpy_xxx'] / r['t']:7.1f}x   (numpy GELU with x*x*x instead of x**3)"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4M,16M", help="comma-separated element counts (K/M suffixes)")
    ap.add_argument("--n", type=int, default=1024, help="row length for softmax / layer norm")
    ap.add_argument("--repeat", type=int, default=9, help="warm runs per kernel (median)")
    ap.add_argument("--numpy-repeat", type=int, default=3, help="runs per numpy expression (median)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    warm = np.zeros((2, args.n), np.float32)  # compile (or load from the cache) before any timing
    rk.gelu_f32(warm, warm.copy())
    rk.softmax_lastaxis_f32(warm, warm.copy())
    rk.layernorm_lastaxis_f32(warm, warm[0], warm[0], warm.copy(), 1e-5)
    for name in ("exp", "tanh", "log"):
        fm.apply(name, warm.reshape(-1))
    print(f"fastmath kernels ready in {time.perf_counter() - t0:.2f} s (numba compile or cache load)")
    print(
        "err = max |a-b| / max(|b|, floor), floor 1 for gelu/layernorm, 0 for softmax and maps; "
        "'np32 vs f64' is numpy float32's own error by the same measure"
    )
    everything = []
    for text in args.sizes.split(","):
        results = bench_size(parse_size(text), args.n, args.repeat, args.numpy_repeat)
        print(report(results, args.n, args.repeat), flush=True)
        everything.extend(results)
    return everything


if __name__ == "__main__":
    main()
