"""``graphc bench runtime``: the runtime's figures, each against its ceiling or peer, in one table.

Every row times graphc and its peer in the same run, interleaved round by round (so a busy
moment of the machine hits both), and prints the medians, the spread and the ratio against the
target. The rows:

- **data parallel** (MLP and GPT training steps, and their forward passes alone: the loss, on
  ``dp=2``): the ceiling is the single-device jit on half the batch in two threads at once (one
  BLAS thread each), what two devices could do with no runtime at all; also 1 device on 1 core
  and 1 device on both cores;
- **tensor parallel**: the GPT training step on ``tp=2`` against 1 device on 1 core;
- **per-call overhead**: 10 small ops on 8x8 arrays against the same numpy calls; a jitted
  function that is one fused kernel against a direct call of that Numba kernel;
- **small-op code**: an Elman RNN and an LSTM (models/rnn.py: hidden 32, 20 steps, batch 8),
  forward and with ``value_and_grad``, against numpy (the backward written out by hand);
- **kernels**: ``graphc.jit`` of GELU (on a 1-d array), softmax and layer norm, each call with
  the fresh result it returns, against a copy of the same bytes into a fresh array split over two
  threads (the caller drops each result, and graphc's next call writes into its buffer:
  runtime/lending.py; one more GELU row keeps its results, so that every call pays new pages); then each fused kernel alone, writing into a reused buffer, against a two-thread copy
  into a reused one (``graphc bench kernels`` has the full table);
- **einsum**: a two-operand einsum under jit (256x256 float32, a plain and a batched form)
  against numpy's ``einsum(..., optimize=True)``, which calls BLAS (graphc/runtime/einsum.py);
- **training step**: the GPT loss with gradients (batch 8, seq 128, d=512, 2 layers) against a
  hand-written numpy forward plus backward (graphc/bench/handgrad.py), and the peak memory of
  both (tracemalloc, which sees numpy's and therefore the kernels' buffers);
- **JAX** (when installed, ``pip install 'graphc[bench]'``): the GPT forward and Adam step
  against ``jax.jit`` of the same source (graphc/bench/jaxpeer.py).
"""

from __future__ import annotations

import functools
import statistics
import threading
import tracemalloc
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.api.jit import jit
from graphc.api.parallel import parallelize
from graphc.autodiff import value_and_grad
from graphc.bench import jaxpeer
from graphc.bench.handgrad import gpt_loss_and_grads_numpy
from graphc.bench.kernels import bench_kernels, fresh_copy_two_threads, gelu, layer_norm, max_rel_error, softmax
from graphc.bench.timing import interleaved, per_call
from graphc.core.ir import walk
from graphc.core.traits import Fused
from graphc.models import gpt, mlp, rnn
from graphc.runtime.codegen import CompiledKernel
from graphc.runtime.threads import one_blas_thread

# An untimed pause before each call of the rows that time a two-thread BLAS call next to the others:
# OpenBLAS's workers keep spinning for a while after it returns, and the next contender shares the
# cores with them (a GPT forward on dp=2 measured 0.80x of its ceiling when it followed one, 1.01x
# with 0.1 s between; docs/performance.md).
BLAS_SETTLE_S = 0.1


@dataclass
class Row:
    figure: str
    graphc_s: list[float]
    peer: str
    peer_s: list[float]
    target: float  # peer time / graphc time must be at least this (a speed ratio)
    note: str = ""

    @property
    def ratio(self) -> float:
        return statistics.median(self.peer_s) / statistics.median(self.graphc_s)


def _halves(args: tuple, batch_args: tuple[int, ...]) -> tuple[tuple, tuple]:
    """The arguments with the batch (dim 0 of the arguments at ``batch_args``) cut in two."""
    a, b = list(args), list(args)
    for i in batch_args:
        h = args[i].shape[0] // 2
        a[i], b[i] = args[i][:h], args[i][h:]
    return tuple(a), tuple(b)


def data_parallel_rows(label: str, fn, args: tuple, kwargs: dict, static, batch_args, rounds: int) -> list[Row]:
    one = jit(fn, static_argnames=static)
    dp2 = parallelize(fn, mesh="dp=2", static_argnames=static).compile(*args, **kwargs)
    first, second = _halves(args, batch_args)
    pool = ThreadPoolExecutor(2, thread_name_prefix="graphc-bench")

    def ceiling():
        with one_blas_thread():
            futures = [pool.submit(one, *first, **kwargs), pool.submit(one, *second, **kwargs)]
            for f in futures:
                f.result()

    def one_core():
        with one_blas_thread():
            one(*args, **kwargs)

    try:
        t = interleaved(
            {
                "dp2": lambda: dp2(*args, **kwargs),
                "ceiling": ceiling,
                "one_core": one_core,
                "two_cores": lambda: one(*args, **kwargs),
            },
            rounds,
            settle_s=BLAS_SETTLE_S,
        )
    finally:
        pool.shutdown()
    return [
        Row(f"{label}, dp=2", t["dp2"], "two-thread ceiling", t["ceiling"], 0.9),
        Row(f"{label}, dp=2", t["dp2"], "1 device, 1 core", t["one_core"], 1.6),
        Row(f"{label}, dp=2", t["dp2"], "1 device, 2 cores", t["two_cores"], 1.0),
    ]


def tensor_parallel_row(fn, args, kwargs, static, rounds: int) -> Row:
    one = jit(fn, static_argnames=static)
    tp2 = parallelize(fn, mesh="tp=2", static_argnames=static).compile(*args, **kwargs)

    def one_core():
        with one_blas_thread():
            one(*args, **kwargs)

    t = interleaved({"tp2": lambda: tp2(*args, **kwargs), "one_core": one_core}, rounds, settle_s=BLAS_SETTLE_S)
    return Row("GPT train step, tp=2", t["tp2"], "1 device, 1 core", t["one_core"], 1.2)


def ten_small_ops(x, y):
    a = x * y
    b = a + x
    c = np.tanh(b)
    d = c @ y
    e = d - x
    g = np.exp(e * 0.1)
    h = g / (1.0 + g)
    i = h.T @ x
    return i.sum(axis=0)


def one_kernel(x, y):
    return np.tanh(x * y + x)


def overhead_rows(rounds: int) -> list[Row]:
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal((8, 8)).astype(np.float32) for _ in range(2))
    calls = 2000
    small = jit(ten_small_ops)
    t = interleaved(
        {"jit": per_call(lambda: small(x, y), calls), "numpy": per_call(lambda: ten_small_ops(x, y), calls)}, rounds
    )
    rows = [Row("10 small ops, 8x8", _each(t["jit"], calls), "numpy", _each(t["numpy"], calls), 1 / 3)]
    kernel_fn = jit(one_kernel)
    compiled = kernel_fn.compile(x, y)
    (node,) = [n for n in walk(compiled.graph.nodes) if n.op.has(Fused)]
    kernel = CompiledKernel(node, [x.shape, y.shape])
    out = np.empty(kernel.rows * kernel.n, np.float32).reshape(kernel.rows, kernel.n)
    ops = [a.reshape(kernel.rows, kernel.n) for a in (x, y)]
    direct = functools.partial(kernel.func, *ops, out, 0, kernel.rows, kernel.n)
    t = interleaved(
        {"jit": per_call(lambda: kernel_fn(x, y), calls), "direct": per_call(direct, calls)},
        rounds,
    )
    jit_s, direct_s = statistics.median(t["jit"]) / calls, statistics.median(t["direct"]) / calls
    rows.append(
        Row(
            "one fused kernel, 8x8",
            _each(t["jit"], calls),
            "its Numba function",
            _each(t["direct"], calls),
            0.0,
            note=f"jit call costs {(jit_s - direct_s) * 1e6:.1f} us over the kernel (target < 3 us)",
        )
    )
    return rows


def _each(times: list[float], calls: int) -> list[float]:
    return [t / calls for t in times]


def rnn_rows(rounds: int) -> list[Row]:
    rows = []
    calls = 20
    for label, loss, hand, example in (
        ("Elman RNN", rnn.elman_loss, rnn.elman_loss_and_grads_numpy, rnn.example_args),
        ("LSTM", rnn.lstm_loss, rnn.lstm_loss_and_grads_numpy, rnn.example_lstm_args),
    ):
        (params, xs, ys), _ = example()
        fwd, grad = jit(loss), jit(value_and_grad(loss))
        contenders = {"fwd": fwd, "np_fwd": loss, "grad": grad, "np_grad": hand}
        t = interleaved(
            {k: per_call(functools.partial(f, params, xs, ys), calls) for k, f in contenders.items()}, rounds
        )
        rows.append(Row(f"{label} forward", _each(t["fwd"], calls), "numpy", _each(t["np_fwd"], calls), 1.0))
        rows.append(
            Row(
                f"{label} value_and_grad",
                _each(t["grad"], calls),
                "numpy, backward by hand",
                _each(t["np_grad"], calls),
                1.0,
            )
        )
    return rows


def jit_call_rows(rounds: int, size: int = 16 << 20, width: int = 1024) -> list[Row]:
    """``graphc.jit`` calls that return a fresh result, as a user calls them (GELU on a 1-d array,
    softmax and layer norm over rows of 1,024), against a copy of the same bytes into a new array
    split over two threads. Each call's result is dropped before the next call, so graphc writes
    into the buffer of a result the caller dropped (runtime/lending.py) where the copy pays the new
    array's first-touch page faults; the last row keeps the last two GELU results alive, so every
    call pays them too. The notes give each call's largest error against numpy (bench/kernels.py
    max_rel_error), for the kept row over the results still held after the last round."""
    rng = np.random.default_rng(0)
    flat = (rng.standard_normal(size) * 2).astype(np.float32)
    x = flat.reshape(size // width, width)
    g, b = rng.standard_normal(width).astype(np.float32), rng.standard_normal(width).astype(np.float32)
    rows = _count(size // width)
    calls: dict[
        str, tuple[Callable[..., Any], tuple, str, float]
    ] = {  # name -> (numpy function, arguments, figure, target)
        "gelu": (gelu, (flat,), f"jit(gelu), {_count(size)} float32, 1-d", 0.8),
        "softmax": (softmax, (x,), f"jit(softmax), {rows} rows of {width:,}", 0.7),
        "layer_norm": (layer_norm, (x, g, b), f"jit(layer norm), {rows} rows", 0.7),
        "gelu_kept": (gelu, (flat,), "  the same, last 2 results kept", 0.0),
    }
    jitted = {name: jit(fn) for name, (fn, _, _, _) in calls.items()}
    contenders: dict[str, Callable[[], Any]] = {"copy": fresh_copy_two_threads(flat)}
    for name, (_, args, _, _) in calls.items():
        contenders[name] = functools.partial(jitted[name], *args)
    kept: deque = deque(maxlen=2)  # the caller holds the last two results: none can be written again
    contenders["gelu_kept"] = lambda: kept.append(jitted["gelu_kept"](flat))
    t = interleaved(contenders, max(15, rounds))
    nbytes = 2 * flat.nbytes
    out = []
    for name, (fn, args, figure, target) in calls.items():
        want = fn(*args)
        got = list(kept) if name == "gelu_kept" else [jitted[name](*args)]
        err = max(max_rel_error(r, want) for r in got)
        out.append(
            Row(
                figure,
                t[name],
                "2-thread copy, new array",
                t["copy"],
                target,
                note=f"{nbytes / statistics.median(t[name]) / 1e9:.1f} GB/s, max err {err:.1e}"
                + (", a new result each call" if name == "gelu_kept" else ""),
            )
        )
    return out


def _count(n: int) -> str:
    """16M, 16K, 300: a count as the table prints it."""
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


def kernel_rows(rounds: int) -> list[Row]:
    rows = jit_call_rows(rounds)
    for r in bench_kernels(sizes=(16 << 20,), repeat=max(15, rounds)):  # a round is ~5-10 ms
        rows.append(
            Row(
                f"fused {r['kernel']}, 16M float32",
                r["kernel_times"],
                "np.copyto on 2 threads",
                r["copy2_times"],
                0.8,
                note=f"{r['bandwidth_GBps']:.1f} GB/s",
            )
        )
    return rows


def train_step_rows(rounds: int) -> list[Row]:
    (params, tokens, targets), kw = gpt.example_loss_args(batch=8, seq=128, n_vocab=1024, d=512, n_layer=2, n_head=8)
    n_head = kw["n_head"]
    step = jit(value_and_grad(gpt.lm_loss), static_argnames=("n_head",))
    t = interleaved(
        {
            "jit": lambda: step(params, tokens, targets, n_head=n_head),
            "numpy": lambda: gpt_loss_and_grads_numpy(params, tokens, targets, n_head),
        },
        rounds,
    )
    rows = [Row("GPT loss + grads (B8, T128, d512, 2L)", t["jit"], "numpy, backward by hand", t["numpy"], 1.0)]
    pool = step.compile(params, tokens, targets, n_head=n_head).executable.pool
    # the executor keeps its free buffers between calls (allocated before tracemalloc starts): count them
    jit_peak = _peak_bytes(
        lambda: step(params, tokens, targets, n_head=n_head), held=lambda: pool.free_bytes + pool.lent_bytes
    )
    np_peak = _peak_bytes(lambda: gpt_loss_and_grads_numpy(params, tokens, targets, n_head))
    rows.append(
        Row(
            "  its peak memory (tracemalloc)",
            [float(jit_peak)],
            "numpy, backward by hand",
            [float(np_peak)],
            1.0,
            note=f"{jit_peak / 2**20:.0f} MiB vs {np_peak / 2**20:.0f} MiB",
        )
    )
    return rows


def _peak_bytes(fn: Callable[[], Any], held: Callable[[], int] = lambda: 0) -> int:
    """The most bytes allocated at once during a warm call of ``fn``, plus ``held()``: what the
    callee keeps allocated between calls (the executor's free pool buffers and the results it
    lent, runtime/lending.py). numpy reports its
    data buffers to tracemalloc, so the kernels' outputs count too."""
    fn()
    kept = held()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        result = fn()
        peak = tracemalloc.get_traced_memory()[1] - base
        del result
    finally:
        tracemalloc.stop()
    return peak + kept


def jax_rows(rounds: int) -> list[Row]:
    if not jaxpeer.jax_available():
        return []
    (params, tokens), kw = gpt.example_args_bench()
    n_head = kw["n_head"]
    fwd = jit(gpt.gpt, static_argnames=("n_head",))
    jfwd = jaxpeer.jax_gpt_forward(n_head)
    jparams, jtokens = jaxpeer.to_jax(params), jaxpeer.to_jax(tokens)
    t = interleaved(
        {
            "graphc": lambda: fwd(params, tokens, n_head=n_head),
            "jax": lambda: jaxpeer.block(jfwd(jparams, jtokens)),
        },
        rounds,
    )
    rows = [Row("GPT forward (B8, T256, d512)", t["graphc"], "jax.jit", t["jax"], 1.0)]
    (params, state, tokens, targets), kw = gpt.example_train_args_bench()
    step = jit(gpt.train_step, static_argnames=("n_head", "lr"))
    jstep = jaxpeer.jax_train_step(kw["n_head"], kw["lr"])
    jargs = jaxpeer.to_jax((params, state, tokens, targets))
    t = interleaved(
        {
            "graphc": lambda: step(params, state, tokens, targets, **kw),
            "jax": lambda: jaxpeer.block(jstep(*jargs)),
        },
        rounds,
    )
    rows.append(Row("GPT Adam train step (B8, T256, d512)", t["graphc"], "jax.jit", t["jax"], 1.0))
    return rows


EINSUMS = (("ij,jk->ik", (256, 256), (256, 256)), ("bij,bkj->bik", (8, 256, 64), (8, 256, 64)))


def einsum_rows(rounds: int) -> list[Row]:
    rng = np.random.default_rng(0)
    rows = []
    calls = 10  # a call is ~0.3-2 ms
    for equation, sa, sb in EINSUMS:
        a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
        f = jit(lambda a, b, equation=equation: np.einsum(equation, a, b))
        t = interleaved(
            {
                "jit": per_call(functools.partial(f, a, b), calls),
                "numpy": per_call(functools.partial(np.einsum, equation, a, b, optimize=True), calls),
            },
            max(15, rounds),
        )
        shapes = " x ".join("x".join(map(str, s)) for s in (sa, sb))
        rows.append(
            Row(
                f"einsum {equation}, {shapes}",
                _each(t["jit"], calls),
                "np.einsum optimize=True",
                _each(t["numpy"], calls),
                0.8,
            )
        )
    return rows


def _ms(times: list[float]) -> str:
    """The median and half the spread (a single figure is already a median: no spread shown)."""
    med = statistics.median(times)
    spread = (max(times) - min(times)) / 2
    if med < 1e-3:
        return f"{med * 1e6:8.1f} us " + (f"±{spread * 1e6:5.1f}" if len(times) > 1 else " " * 6)
    return f"{med * 1e3:8.2f} ms " + (f"±{spread * 1e3:5.2f}" if len(times) > 1 else " " * 6)


def print_table(rows: list[Row]) -> None:
    print(f"{'figure':<40} {'graphc':>18}  {'peer':<26} {'peer time':>18} {'speed':>7} {'target':>7}  met")
    for r in rows:
        memory = r.figure.strip().startswith("its peak memory")
        g = f"{r.graphc_s[0] / 2**20:15.0f} MiB" if memory else _ms(r.graphc_s)
        p = f"{r.peer_s[0] / 2**20:15.0f} MiB" if memory else _ms(r.peer_s)
        met = "yes" if r.ratio >= r.target else "NO"
        target = f">= {r.target:.2f}" if r.target else ""
        if r.target == 0.0:
            met = ""
        print(f"{r.figure:<40} {g:>18}  {r.peer:<26} {p:>18} {r.ratio:6.2f}x {target:>7}  {met}")
        if r.note:
            print(f"{'':<40} {r.note}")


SECTIONS = ("dp", "tp", "overhead", "rnn", "kernels", "einsum", "train", "jax")


def main(rounds: int = 7, sections: tuple[str, ...] = SECTIONS) -> list[Row]:
    print(
        f"graphc bench runtime: medians of {rounds} interleaved rounds, ± half the spread; "
        "speed = peer time / graphc time (for memory: peer bytes / graphc bytes)"
    )
    rows: list[Row] = []
    if "dp" in sections:
        (args, kw) = mlp.example_train_args_bench()
        rows += data_parallel_rows("MLP train step", mlp.train_step, args, kw, ("lr",), (1, 2), rounds)
        (args, kw) = gpt.example_train_args_bench()
        rows += data_parallel_rows("GPT train step", gpt.train_step, args, kw, ("n_head", "lr"), (2, 3), rounds)
        (args, kw) = mlp.example_loss_args_bench()  # the forward alone (the loss): the plan's all-reduce is a scalar
        rows += data_parallel_rows("MLP forward (loss)", mlp.loss, args, kw, (), (1, 2), rounds)
        (args, kw) = gpt.example_loss_args_bench()
        rows += data_parallel_rows("GPT forward (loss)", gpt.lm_loss, args, kw, ("n_head",), (1, 2), rounds)
    if "tp" in sections:
        (args, kw) = gpt.example_train_args_bench()
        rows.append(tensor_parallel_row(gpt.train_step, args, kw, ("n_head", "lr"), rounds))
    if "overhead" in sections:
        rows += overhead_rows(rounds)
    if "rnn" in sections:
        rows += rnn_rows(rounds)
    if "kernels" in sections:
        rows += kernel_rows(rounds)
    if "einsum" in sections:
        rows += einsum_rows(rounds)
    if "train" in sections:
        rows += train_step_rows(rounds)
    if "jax" in sections:
        rows += jax_rows(rounds)
    print_table(rows)
    print(f"({threading.active_count()} threads alive at the end)")
    return rows
