"""``graphc bench kernels``: the fused GELU, softmax and layer-norm kernels against the memory
bandwidth of a copy of the same bytes, measured in the same run."""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.api.jit import jit
from graphc.bench.timing import interleaved, timed
from graphc.core.ir import walk
from graphc.core.traits import Fused
from graphc.runtime.codegen import CompiledKernel
from graphc.runtime.threads import kernel_pool, kernel_threads

# --- the fused-kernel benchmark: GELU, softmax and layer norm against memory bandwidth ---------


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layer_norm(x, g, b):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return g * (x - mean) / np.sqrt(var + 1e-5) + b


def max_rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max(|want|, 1): relative where |want| >= 1, absolute below (near zero,
    GELU's 1 + tanh and layer norm's g * x + b cancel, and numpy's own result has no relative
    accuracy there)."""
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    return float(np.max(np.abs(got64 - want64) / np.maximum(np.abs(want64), 1.0)))


def bench_kernels(sizes=(4 << 20, 16 << 20), repeat: int = 5, width: int = 1024) -> list[dict[str, Any]]:
    """Per size: each kernel writing into a reused buffer (as inside a compiled graph), timed in
    ``repeat`` rounds interleaved with a one-thread and a two-thread ``np.copyto`` of the same bytes
    (so a busy moment of the machine hits them alike); also the jit call and numpy, for the table."""
    rows_out = []
    rng = np.random.default_rng(0)
    for size in sizes:
        x = (rng.standard_normal((size // width, width)) * 2).astype(np.float32)
        g = rng.standard_normal(width).astype(np.float32)
        b = rng.standard_normal(width).astype(np.float32)
        dst = np.empty_like(x)
        nbytes = 2 * x.nbytes  # read the input once, write the output once
        cases: list[tuple[str, Callable, tuple]] = [
            ("gelu", gelu, (x,)),
            ("softmax", softmax, (x,)),
            ("layer_norm", layer_norm, (x, g, b)),
        ]
        contenders: dict[str, Callable[[], Any]] = {
            "copy": functools.partial(np.copyto, dst, x),
            "copy2": _copy_two_threads(x, dst),
        }
        compiled = {}
        for name, fn, args in cases:
            jitted = jit(fn)
            start = time.perf_counter()
            compiled[name] = (jitted.compile(*args), time.perf_counter() - start)
            contenders[name] = _fused_kernel(compiled[name][0], args)
        t = interleaved(contenders, repeat)
        copy_s, copy2_s = statistics.median(t["copy"]), statistics.median(t["copy2"])
        for name, fn, args in cases:
            c, compile_s = compiled[name]
            t_np, want = timed(functools.partial(fn, *args), max(2, repeat // 2))
            t_call, got = timed(functools.partial(c, *args), repeat)
            got_k = contenders[name]()
            kernel_s = statistics.median(t[name])
            rows_out.append(
                {
                    "kernel": name,
                    "elements": size,
                    "kernel_times": t[name],
                    "copy2_times": t["copy2"],
                    "kernel_ms": kernel_s * 1e3,
                    "call_ms": statistics.median(t_call) * 1e3,
                    "numpy_ms": statistics.median(t_np) * 1e3,
                    "copy_ms": copy_s * 1e3,
                    "copy2_ms": copy2_s * 1e3,
                    "bandwidth_GBps": nbytes / kernel_s / 1e9,
                    "copy_GBps": nbytes / copy_s / 1e9,
                    "fraction_of_copy": copy_s / kernel_s,
                    "fraction_of_copy2": copy2_s / kernel_s,
                    "max_rel_error": max(max_rel_error(got, want), max_rel_error(got_k[0], want)),
                    "fused_kernels": c.stats()["fused_kernels"],
                    "compile_s": compile_s,
                    "threads": kernel_threads(),
                }
            )
    return rows_out


def _fused_kernel(compiled, args):
    """The compiled graph's one fused kernel, writing into a buffer reused from call to call (as
    inside a compiled graph, where outputs come from the executor's pool)."""
    (node,) = [n for n in walk(compiled.graph.nodes) if n.op.has(Fused)]
    buffers: dict = {}

    def reuse(shape, dtype):
        key = (tuple(shape), np.dtype(dtype).str)
        if key not in buffers:
            buffers[key] = np.empty(shape, dtype)
        return buffers[key]

    ins = {v: a for v, a in zip(compiled.graph.inputs, args)}
    operands = [ins[v] for v in node.inputs]
    k = CompiledKernel(node, [np.shape(a) for a in operands], alloc=reuse)
    return lambda *_args: k(*operands)


def _copy_two_threads(x: np.ndarray, dst: np.ndarray) -> Callable[[], None]:
    """np.copyto of the same bytes split over two threads (each half the rows), the second one
    from the pool that runs the kernels' other rows (runtime/threads.py)."""
    h = x.shape[0] // 2
    pool = kernel_pool(1)

    def both():
        other = pool.submit(np.copyto, dst[h:], x[h:])
        np.copyto(dst[:h], x[:h])
        other.result()

    return both


def fresh_copy_two_threads(x: np.ndarray) -> Callable[[], np.ndarray]:
    """A copy of ``x`` into a new array, each half copied by its own thread (the second from the
    kernels' pool): the ceiling of a call that reads ``x`` and returns a fresh result, first-touch
    page faults of the new array included."""
    flat = x.reshape(-1)
    h = flat.size // 2
    pool = kernel_pool(1)

    def copy() -> np.ndarray:
        dst = np.empty_like(flat)
        other = pool.submit(np.copyto, dst[h:], flat[h:])
        np.copyto(dst[:h], flat[:h])
        other.result()
        return dst.reshape(x.shape)

    return copy


def print_kernel_table(rows: list[dict[str, Any]]) -> None:
    """'kernel' writes into a reused buffer (as inside a compiled graph); 'call' is graphc.jit's
    call, which returns a new array (a fresh 64 MiB result pays ~10-20 ms of page faults here).
    'of copy' is np.copyto's time over the kernel's (1.0 = the kernel moves its bytes as fast as a
    one-thread copy); 'of 2-thread copy' the same against a copy split over two threads; 'max err'
    is relative to numpy where |numpy| >= 1 and absolute below."""
    threads = rows[0]["threads"] if rows else 1
    print(f"(kernels on {threads} thread{'s' if threads > 1 else ''})")
    print(
        f"{'kernel':<11} {'elements':>9} {'kernel ms':>10} {'call ms':>8} {'numpy ms':>9} {'copy ms':>8} "
        f"{'GB/s':>6} {'of copy':>8} {'of 2-thread copy':>17} {'max err':>10}"
    )
    for r in rows:
        print(
            f"{r['kernel']:<11} {r['elements'] // (1 << 20):>8}M {r['kernel_ms']:>10.2f} {r['call_ms']:>8.2f} "
            f"{r['numpy_ms']:>9.1f} {r['copy_ms']:>8.2f} {r['bandwidth_GBps']:>6.1f} {r['fraction_of_copy']:>7.0%} "
            f"{r['fraction_of_copy2']:>17.0%} {r['max_rel_error']:>10.2e}"
        )
