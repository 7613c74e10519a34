"""``graphc calibrate``: measure this machine for the cost model (graphc/core/mesh.py's
MachineProfile). Planning never measures; it reads the stored profile."""

from __future__ import annotations

import math
import platform
import statistics
import threading
import time
from datetime import datetime

import numpy as np

from graphc.core.mesh import Link, MachineProfile, MeshError
from graphc.runtime.threads import one_blas_thread


def calibrate(quick: bool = False) -> MachineProfile:
    """Measure this machine, one thread per device: about 1 s (``quick``: about 0.2 s) on a 2-core VM.

    flops                 best of a few float32 n x n matmuls (n = 1024; 512 if quick), 2 n^3 flop each
    mem_bandwidth         best np.copyto of 64 MiB (16 MiB if quick), read + write bytes per second
    link.bandwidth        best round trip of two threads each copying a 16 MiB buffer from the
                          other's into its own (np.copyto), message bytes per second
    link.latency_s        median round trip / 2 of a tiny-message ping-pong over threading.Event
    collective_overhead   median threading.Barrier(2).wait()

    BLAS is limited to one thread when threadpoolctl is installed; otherwise numpy's default is used.
    """
    mib = 1 << 20
    with one_blas_thread():
        flops = _matmul_flops(512 if quick else 1024, repeats=3 if quick else 10)
    mem_bandwidth = _copy_bandwidth((16 if quick else 64) * mib, repeats=3 if quick else 10)
    link_bandwidth = _thread_copy_bandwidth(16 * mib, round_trips=4 if quick else 20)
    latency = _thread_latency(round_trips=200 if quick else 2000)
    overhead = _barrier_overhead(waits=200 if quick else 2000)
    source = f"calibrated on {platform.node()} {datetime.now().astimezone().isoformat(timespec='seconds')}"
    return MachineProfile(flops, mem_bandwidth, Link(latency, link_bandwidth), overhead, source)


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
