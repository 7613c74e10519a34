"""Benchmark of the thread communicator: all_reduce bus bandwidth against memory-copy bandwidth.

Bus bandwidth as nccl-tests defines it: ``busbw = bytes * 2(n-1)/n / time`` for an all_reduce
of ``bytes`` per rank over ``n`` ranks (``algbw = bytes / time``); a ring moving every byte at
link speed scores the link bandwidth whatever ``n``. Here all ranks share the cores and one
memory system, so the yardstick is what ``np.copyto`` reaches with two threads (``B``, bytes read
plus bytes written per second). The thread all_reduce reads every input once and writes every
output once: 2n·bytes of traffic, so ``busbw <= B (n-1)/n²`` (25% of B at 2 ranks, 19% at 4,
11% at 8) unless the buffers stay in the 32 MiB L3, as 2 x 16 MiB partly do.

    graphc bench comm
"""

from __future__ import annotations

import statistics
import threading
import time

import numpy as np

from graphc.runtime.comm import ThreadWorld

MiB = 1 << 20


def _run_threads(n: int, body) -> list:
    """``body(i)`` on ``n`` threads; returns their results (re-raises the first failure)."""
    results: list = [None] * n
    errors: list = []

    def run(i: int) -> None:
        try:
            results[i] = body(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def bench_all_reduce(n_devices: int, nbytes: int, repeat: int = 10, warmup: int = 2) -> dict:
    """In-place float32 all_reduce of ``nbytes`` per device on ``n_devices`` threads.

    Each repetition starts with a barrier; its time is the slowest device's. Returns the median
    seconds, algbw and busbw (bytes/s)."""
    world = ThreadWorld(n_devices, timeout_s=60.0)
    group = tuple(range(n_devices))

    def device(d: int) -> list[float]:
        comm = world.comm(d)
        x = np.zeros(nbytes // 4, np.float32)  # zeros: the sums stay finite over any number of repeats
        times = []
        for i in range(warmup + repeat):
            comm.barrier(group)
            start = time.perf_counter()
            comm.all_reduce(x, group, inplace=True)
            if i >= warmup:
                times.append(time.perf_counter() - start)
        return times

    per_device = _run_threads(n_devices, device)
    seconds = statistics.median(max(ts) for ts in zip(*per_device))
    algbw = nbytes / seconds
    return {
        "n_devices": n_devices,
        "nbytes": nbytes,
        "seconds": seconds,
        "algbw": algbw,
        "busbw": algbw * 2 * (n_devices - 1) / n_devices,
    }


def bench_memcpy(n_threads: int, nbytes: int, repeat: int = 10, warmup: int = 2) -> dict:
    """Each thread ``np.copyto`` between its own two arrays of ``nbytes``, all at the same time.

    ``bandwidth``: bytes read plus bytes written per second, summed over the threads."""
    start_line = threading.Barrier(n_threads)

    def thread(_: int) -> float:
        src = np.ones(nbytes // 4, np.float32)
        dst = np.empty_like(src)
        times = []
        for i in range(warmup + repeat):
            start_line.wait()
            start = time.perf_counter()
            np.copyto(dst, src)
            if i >= warmup:
                times.append(time.perf_counter() - start)
        return statistics.median(times)

    seconds = _run_threads(n_threads, thread)
    return {
        "n_threads": n_threads,
        "nbytes": nbytes,
        "seconds": statistics.median(seconds),
        "bandwidth": sum(2 * nbytes / s for s in seconds),
    }


def main() -> None:
    sizes = (1 * MiB, 16 * MiB)
    print("memcpy (np.copyto, each thread its own arrays; read + write bytes, summed over threads)")
    memcpy2 = {}
    for n_threads in (1, 2):
        for nbytes in sizes:
            m = bench_memcpy(n_threads, nbytes, repeat=20)
            if n_threads == 2:
                memcpy2[nbytes] = m["bandwidth"]
            print(
                f"  {n_threads} thread{'s' if n_threads > 1 else ' '}  {nbytes // MiB:3d} MiB  "
                f"{m['bandwidth'] / 1e9:7.1f} GB/s"
            )
    print()
    print("all_reduce float32 in place (ThreadWorld, one thread per device)")
    print(
        f"  {'devices':>7}  {'size':>7}  {'time':>9}  {'algbw':>10}  {'busbw':>10}  "
        f"busbw / 2-thread memcpy (traffic bound)"
    )
    for n in (2, 4, 8):
        for nbytes in sizes:
            r = bench_all_reduce(n, nbytes, repeat=10 if nbytes >= 16 * MiB else 30)
            print(
                f"  {n:7d}  {nbytes // MiB:3d} MiB  {r['seconds'] * 1e3:6.2f} ms  {r['algbw'] / 1e9:5.2f} GB/s  "
                f"{r['busbw'] / 1e9:5.2f} GB/s  {r['busbw'] / memcpy2[nbytes]:6.1%} ({(n - 1) / n**2:.0%})"
            )


if __name__ == "__main__":
    main()
