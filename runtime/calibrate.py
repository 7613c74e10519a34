"""``graphc calibrate``: measure this machine for the cost model (graphc/core/profile.py:
MachineProfile). Planning never measures; it reads the stored profile."""

from __future__ import annotations

import functools
import math
import os
import platform
import statistics
import threading
import time
from datetime import datetime

import numpy as np

from graphc.builder import GraphBuilder
from graphc.core.errors import MeshError
from graphc.core.ir import TensorType
from graphc.core.profile import Link, MachineProfile
from graphc.runtime.executor import Executable
from graphc.runtime.threads import one_blas_thread


def calibrate(quick: bool = False) -> MachineProfile:
    """Measure this machine, one thread per device: a few seconds, ``quick`` about one
    (docs/measurements.md#calibrate).

    flops                 best of a few float32 n x n matmuls (n = 1024; 512 if quick), 2 n^3 flop each
    matmul_flops          the same in float64
    matmul_table          float32 and float64 matmuls of each size class (``SIZE_CLASSES``), one
                          product and a batch of them (``_matmul_table``)
    mem_bandwidth         best np.copyto of 64 MiB (16 MiB if quick), read + write bytes per second
    shared_mem_bandwidth  the same with one thread per core, each copying its own buffers, all at once
    link.bandwidth        best round trip of two threads each copying a 16 MiB buffer from the
                          other's into its own (np.copyto), message bytes per second
    link.latency_s        median round trip / 2 of a tiny-message ping-pong over threading.Event
    collective_overhead   median threading.Barrier(2).wait()
    cores                 the cores this process may run on (``os.sched_getaffinity``)
    dispatch_s            per op of ``_op_graph`` on 8 x 16 floats (almost no work: the executor's
                          and the ops' own overhead), one thread
    concurrent_dispatch_s that, plus what an op of a small program (``_op_graph``: matmuls, row
                          reductions, elementwise ops, views on 64 x 128 floats) run by the executor
                          takes longer per op and thread when two threads run it at once than when
                          one does (interpreter lock handoffs)
    oversubscribed_dispatch_s  twice ``dispatch_s`` plus what an op of that program takes longer
                          on each of twice as many threads as cores than twice its time alone

    BLAS is limited to one thread when threadpoolctl is installed; otherwise numpy's default is used.
    """
    mib = 1 << 20
    with one_blas_thread():
        table = _matmul_table(quick)
    flops = table["float32"]["large"]
    mem_bandwidth = _copy_bandwidth((16 if quick else 64) * mib, repeats=3 if quick else 10)
    cores = _cores()
    shared = _shared_copy_bandwidth(cores, (8 if quick else 32) * mib, repeats=3 if quick else 10)
    link_bandwidth = _thread_copy_bandwidth(16 * mib, round_trips=4 if quick else 20)
    latency = _thread_latency(round_trips=200 if quick else 2000)
    overhead = _barrier_overhead(waits=200 if quick else 2000)
    dispatch = _op_graph_time(1, 20 if quick else 200, rows=8, d=16)
    # several device threads: what each op of a device program waits for the others (numpy
    # releases the interpreter lock while it computes; getting it back waits for the thread
    # holding it), beyond what sharing the cores costs (the cost model prices that apart)
    rounds = 5 if quick else 60
    alone = _op_graph_time(1, rounds)
    concurrent = dispatch + max(0.0, _op_graph_time(2, rounds) - alone * max(1.0, 2 / cores))
    oversubscribed = 2 * dispatch + max(0.0, _op_graph_time(2 * cores, rounds) - 2 * alone)
    source = f"calibrated on {platform.node()} {datetime.now().astimezone().isoformat(timespec='seconds')}"
    return MachineProfile(
        flops,
        mem_bandwidth,
        Link(latency, link_bandwidth),
        overhead,
        source,
        matmul_flops={dtype: rates["large"] for dtype, rates in table.items()},
        matmul_table=table,
        cores=cores,
        dispatch_s=dispatch,
        concurrent_dispatch_s=concurrent,
        oversubscribed_dispatch_s=oversubscribed,
        shared_mem_bandwidth=max(shared, mem_bandwidth),
    )


def _cores() -> int:
    """The cores this process may run on: its CPU affinity where the OS has one, else the count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS and Windows have no sched_getaffinity
        return max(1, os.cpu_count() or 1)


# The products each size class is measured on (SIZE_CLASSES: cube roots below 96, below 384,
# above): an n x n x n product, and a batch of them with about the work of a 256^3 product.
CLASS_SIZES = {"small": 48, "medium": 192, "large": 1024}


def _matmul_table(quick: bool) -> dict[str, dict[str, float]]:
    """{dtype: {size class (batched): flop/s}} of float32 and float64 matmuls (``CLASS_SIZES``;
    the large class at n = 512 if quick), as the executor calls them (a new result each call)."""
    rng = np.random.default_rng(0)
    table: dict[str, dict[str, float]] = {}
    for dtype in (np.float32, np.float64):
        rates = {}
        for name, n in CLASS_SIZES.items():
            n = 512 if quick and name == "large" else n
            flops = 2.0 * n**3
            budget = 0.02 if quick else 0.08  # seconds of measuring per entry, about
            for batch in (1, max(2, 256**3 // n**3)):
                a = rng.standard_normal((batch, n, n)).astype(dtype)
                b = rng.standard_normal((batch, n, n)).astype(dtype)
                x, y = (a[0], b[0]) if batch == 1 else (a, b)
                repeats = int(min(500, max(3, budget * 50e9 / (flops * batch))))
                seconds = _best_time(functools.partial(np.matmul, x, y), repeats)
                rates[name + (" batched" if batch > 1 else "")] = flops * batch / seconds
        table[np.dtype(dtype).name] = rates
    return table


def _best_time(fn, repeats: int) -> float:
    fn()  # warm up: page faults, BLAS buffers
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _matmul_flops(n: int, repeats: int) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), np.float32)
    return 2 * n**3 / _best_time(lambda: np.matmul(a, b, out=out), repeats)


def _copy_bandwidth(nbytes: int, repeats: int) -> float:
    src = np.ones(nbytes // 4, np.float32)
    dst = np.zeros_like(src)
    return 2 * nbytes / _best_time(lambda: np.copyto(dst, src), repeats)


def _run_threads(n: int, body) -> None:
    """``body(i)`` on ``n`` threads at once; re-raises the first error."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            body(i)
        except BaseException as exc:  # re-raised below, on the calling thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,), name=f"graphc-calibrate-{i}", daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    if errors:
        raise errors[0]


def _shared_copy_bandwidth(threads: int, nbytes: int, repeats: int) -> float:
    """Read + write bytes per second of ``threads`` threads each copying its own ``nbytes``, all
    starting together: the best round's total bytes over its slowest thread's time."""
    srcs = [np.ones(nbytes // 4, np.float32) for _ in range(threads)]
    dsts = [np.zeros_like(s) for s in srcs]
    barrier = threading.Barrier(threads, timeout=10)
    ends = [[0.0] * (repeats + 1) for _ in range(threads)]
    starts = [0.0] * (repeats + 1)

    def body(i: int) -> None:
        for r in range(repeats + 1):  # round 0 warms up
            barrier.wait()
            if i == 0:
                starts[r] = time.perf_counter()
            np.copyto(dsts[i], srcs[i])
            ends[i][r] = time.perf_counter()
            barrier.wait()

    _run_threads(threads, body)
    best = min(max(ends[i][r] for i in range(threads)) - starts[r] for r in range(1, repeats + 1))
    return threads * 2 * nbytes / best


def _op_graph(rows: int = 64, d: int = 128):
    """A small program of the ops a device program runs (matmuls, softmax-like row reductions,
    elementwise ops, transposes and reshapes) on ``rows`` x ``d`` float32, as a Graph."""
    b = GraphBuilder("calibrate")
    x = b.input(TensorType((rows, d), np.dtype(np.float32)))
    w = b.input(TensorType((d, d), np.dtype(np.float32)))
    h = x
    for _ in range(4):
        y = b.op("matmul", h, w)
        e = b.op("exp", b.op("sub", y, b.op("reduce_max", y, axes=(1,), keepdims=True)))
        p = b.op("div", e, b.op("reduce_sum", e, axes=(1,), keepdims=True))
        t = b.op("transpose", b.op("transpose", p, perm=(1, 0)), perm=(1, 0))
        r = b.op("reshape", b.op("reshape", t, shape=(rows * d,)), shape=(rows, d))
        h = b.op("add", b.op("mul", r, x), x)
    return b.build([h])


def _op_graph_time(threads: int, rounds: int, rows: int = 64, d: int = 128) -> float:
    """Seconds per op (median over the threads) of ``_op_graph(rows, d)`` run by the executor on
    each of ``threads`` threads at once, one BLAS thread each."""
    graph = _op_graph(rows, d)
    rng = np.random.default_rng(0)
    runs = []
    for _ in range(threads):
        x = rng.standard_normal(graph.inputs[0].type.shape).astype(np.float32)
        w = (rng.standard_normal(graph.inputs[1].type.shape) * 0.01).astype(np.float32)
        runs.append(functools.partial(Executable(graph).run_flat, [x, w]))
    per_op: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads, timeout=10)

    blocks = max(1, rounds // 5)  # the median of blocks of 5 runs: the interpreter's switches make single runs noisy

    def body(i: int) -> None:
        runs[i]()
        barrier.wait()
        for _ in range(blocks):
            start = time.perf_counter()
            for _ in range(5):
                runs[i]()
            with lock:
                per_op.append((time.perf_counter() - start) / (5 * len(graph.nodes)))

    with one_blas_thread():
        _run_threads(threads, body)
    return statistics.median(per_op)


def _run_pair(worker, main):
    """Run ``worker()`` on a second thread while this one runs ``main()``; return main's result."""
    errors: list[BaseException] = []

    def guarded():
        try:
            worker()
        except BaseException as exc:  # re-raised below, on the calling thread
            errors.append(exc)

    thread = threading.Thread(target=guarded, name="graphc-calibrate", daemon=True)
    thread.start()
    try:
        result = main()
    finally:
        thread.join(timeout=10)
    if errors:
        raise errors[0]
    return result


def _wait(event: threading.Event) -> None:
    if not event.wait(timeout=10):
        raise MeshError("calibration: the other thread did not answer within 10 s")
    event.clear()


def _thread_copy_bandwidth(nbytes: int, round_trips: int) -> float:
    """Two threads hand a buffer back and forth; each receiver copies it into its own buffer."""
    mine = np.ones(nbytes // 4, np.float32)
    theirs = np.zeros_like(mine)
    to_worker, to_main = threading.Event(), threading.Event()
    total = round_trips + 1  # the first one warms up

    def worker():
        for _ in range(total):
            _wait(to_worker)
            np.copyto(theirs, mine)  # receive main's buffer
            to_main.set()

    def main():
        best = math.inf
        for i in range(total):
            start = time.perf_counter()
            to_worker.set()
            _wait(to_main)
            np.copyto(mine, theirs)  # receive the worker's buffer
            if i > 0:
                best = min(best, time.perf_counter() - start)
        return 2 * nbytes / best

    return _run_pair(worker, main)


def _thread_latency(round_trips: int) -> float:
    """Median round trip / 2 of a ping-pong of an 8-byte message over threading.Event."""
    ping, pong = np.zeros(1, np.float64), np.zeros(1, np.float64)
    to_worker, to_main = threading.Event(), threading.Event()
    warmup = 10

    def worker():
        for _ in range(warmup + round_trips):
            _wait(to_worker)
            np.copyto(pong, ping)
            to_main.set()

    def main():
        times = []
        for i in range(warmup + round_trips):
            start = time.perf_counter()
            ping[0] = i
            to_worker.set()
            _wait(to_main)
            if i >= warmup:
                times.append(time.perf_counter() - start)
        return statistics.median(times) / 2

    return _run_pair(worker, main)


def _barrier_overhead(waits: int) -> float:
    """Median time of one threading.Barrier wait across 2 threads."""
    barrier = threading.Barrier(2, timeout=10)
    warmup = 10

    def worker():
        for _ in range(warmup + waits):
            barrier.wait()

    def main():
        times = []
        for i in range(warmup + waits):
            start = time.perf_counter()
            barrier.wait()
            if i >= warmup:
                times.append(time.perf_counter() - start)
        return statistics.median(times)

    return _run_pair(worker, main)


# --- the mesh ---------------------------------------------------------------------------------
