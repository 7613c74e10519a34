"""Benchmark of the communicators: bus bandwidth of every collective, threads against MPI.

Bus bandwidth as nccl-tests defines it, for a collective of ``bytes`` over ``n`` ranks taking
``time`` (``algbw = bytes / time``): all_reduce ``busbw = algbw * 2(n-1)/n`` (``bytes`` per rank),
all_gather and reduce_scatter ``algbw * (n-1)/n`` (``bytes`` the whole gathered / scattered array),
all_to_all ``algbw * (n-1)/n`` (``bytes`` per rank); a ring moving every byte at link speed scores
the link bandwidth whatever ``n``. Here all ranks share the cores and one memory system, so the
yardstick is what ``np.copyto`` reaches with two threads (``B``, bytes read plus bytes written per
second). The thread all_reduce reads every input once and writes every output once: 2n·bytes of
traffic, so ``busbw <= B (n-1)/n²`` (25% of B at 2 ranks, 19% at 4, 11% at 8) unless the buffers
stay in the 32 MiB L3, as 2 x 16 MiB partly do.

    graphc bench comm                      threads: memcpy, every collective at 1 KiB..64 MiB, n = 2 and 4
    graphc bench comm --backend mpi        the same on MPI processes next to threads, and the step
                                           time of one dp=2 plan on both backends

``--backend mpi`` launches itself: ``mpiexec -n 2`` and ``-n 4`` of ``python -m graphc.bench.comm
--worker`` (the mpiexec next to this Python, the mpich wheel's), alternating with the threaded
measurements in ``repeat`` interleaved rounds, so that both see the same machine load. Each
repetition starts after a barrier; its time is the slowest rank's; a cell is the median over
rounds and repetitions, ± half the spread of the rounds' medians.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

from graphc.api.parallel import parallelize
from graphc.core.errors import GraphcError
from graphc.models import mlp
from graphc.runtime.comm import ThreadWorld
from graphc.runtime.mpi import MpiComm
from graphc.runtime.mpi_world import MpiWorld

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


KiB = 1 << 10
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
SIZES = (1 * KiB, 8 * KiB, 64 * KiB, 512 * KiB, 4 * MiB, 16 * MiB, 64 * MiB)
RANKS = (2, 4)
STEP_TARGET = "models/mlp.py:train_step"  # the dp=2 plan timed on both backends (its example_train_args_bench)
STEP_EXAMPLE = "example_train_args_bench"


def bus_factor(kind: str, n: int) -> float:
    """busbw / algbw of a collective over n ranks (module doc)."""
    return 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n


def _repeats(nbytes: int) -> int:
    return 30 if nbytes <= 64 * KiB else 10 if nbytes <= 4 * MiB else 3


def _operand(kind: str, n: int, nbytes: int) -> np.ndarray:
    """What each rank passes for a collective of ``nbytes`` (as nccl-tests counts them)."""
    per_rank = nbytes // n if kind == "all_gather" else nbytes
    return np.zeros(max(n, per_rank // 4 // n * n), np.float32)  # zeros: sums stay finite


def _call(comm, kind: str, x: np.ndarray, group: tuple[int, ...]):
    if kind == "all_reduce":
        return comm.all_reduce(x, group, inplace=True)
    if kind == "all_to_all":
        return comm.all_to_all(x.reshape(len(group), -1), group, 0, 1)
    return getattr(comm, kind)(x, group, 0)


def _device_times(comm, kind: str, n: int, nbytes: int, warmup: int = 2) -> list[float]:
    """One device's seconds of each repetition (``warmup`` untimed first, a barrier before each)."""
    group = tuple(range(n))
    x = _operand(kind, n, nbytes)
    times = []
    for i in range(warmup + _repeats(nbytes)):
        comm.barrier(group)
        start = time.perf_counter()
        _call(comm, kind, x, group)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def _warm_up(comm, n: int) -> None:
    """Every kind a few times before anything is timed: the first calls of a fresh world or MPI job
    (connections, buffers) took up to 1 ms each at 1 KiB."""
    for kind in KINDS:
        _device_times(comm, kind, n, 8 * KiB, warmup=20)


def threads_collectives(n: int, sizes=SIZES, kinds=KINDS) -> dict:
    """{kind: {nbytes: [seconds of each repetition, the slowest device's]}} on n device threads."""
    out: dict = {}
    warm = ThreadWorld(n, timeout_s=120.0)
    _run_threads(n, lambda d: _warm_up(warm.comm(d), n))
    for nbytes in sizes:  # small sizes first: after a 64 MiB run the kernel reclaims memory for a while
        for kind in kinds:
            world = ThreadWorld(n, timeout_s=120.0)
            per_device = _run_threads(
                n, lambda d, w=world, kind=kind, nbytes=nbytes: _device_times(w.comm(d), kind, n, nbytes)
            )
            out.setdefault(kind, {})[nbytes] = [max(ts) for ts in zip(*per_device)]
    return out


def threads_step(repeat: int) -> list[float]:
    """Seconds of ``repeat`` steps of the dp=2 plan on threads (the state kept on the devices)."""
    args, kwargs = mlp.example_train_args_bench()
    pf = parallelize(mlp.train_step, mesh="dp=2", static_argnames=("lr",), sharded_state=True)
    state = pf(*args, **kwargs)  # warm: compiled, kernels loaded
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        state = pf(state[0], *args[1:], **kwargs)
        times.append(time.perf_counter() - start)
    return times


# --- under mpiexec --------------------------------------------------------------------------------


def worker(step_repeat: int, sizes=SIZES, kinds=KINDS) -> None:
    """Runs on every rank of ``mpiexec -n N python -m graphc.bench.comm --worker``; rank 0 prints
    one JSON document: the collectives' times and, with 2 ranks and ``step_repeat``, the step's."""
    world = MpiWorld.get()
    n = world.size
    world.setup([tuple(range(n))])
    comm = MpiComm(world, timeout_s=120.0)
    _warm_up(comm, n)
    doc: dict = {"n": n, "collectives": {}}
    for nbytes in sizes:  # small sizes first (as threads_collectives)
        for kind in kinds:
            mine = _device_times(comm, kind, n, nbytes)
            every = world.gather_floats(mine)
            if every is not None:
                doc["collectives"].setdefault(kind, {})[str(nbytes)] = list(every.max(axis=0))
    if n == 2 and step_repeat:
        doc["step"] = _mpi_step(world, step_repeat)
    if world.rank == 0:
        print(json.dumps(doc), flush=True)


def _mpi_step(world, repeat: int) -> list[float] | None:
    args, kwargs = mlp.example_train_args_bench()
    pf = parallelize(mlp.train_step, mesh="dp=2", static_argnames=("lr",), backend="mpi")
    state = pf(*args, **kwargs)
    mine = []
    for _ in range(repeat):
        world.barrier(idle=True)
        start = time.perf_counter()
        state = pf(state[0], *args[1:], **kwargs)
        mine.append(time.perf_counter() - start)
    every = world.gather_floats(mine)
    return None if every is None else list(every.max(axis=0))


def mpiexec() -> str:
    """The mpiexec of this Python's environment (the mpich wheel puts it beside python), else PATH's."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = here if os.path.exists(here) else shutil.which("mpiexec")
    if found is None:
        raise GraphcError("graphc bench comm --backend mpi needs mpiexec: pip install 'graphc[mpi]'")
    return found


def run_mpi_worker(n: int, step_repeat: int, timeout_s: float = 900.0) -> dict:
    """Launch the worker on n ranks; its JSON document."""
    cmd = [
        mpiexec(),
        "-n",
        str(n),
        sys.executable,
        "-m",
        "graphc.bench.comm",
        "--worker",
        "--step-repeat",
        str(step_repeat),
    ]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise GraphcError(f"{' '.join(cmd)}: no result within {timeout_s:g} s") from None
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not lines:
        raise GraphcError(f"{' '.join(cmd)} failed (exit {res.returncode}):\n{res.stderr[-2000:]}")
    return json.loads(lines[-1])


# --- the report -----------------------------------------------------------------------------------


def _size(nbytes: int) -> str:
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // KiB} KiB"


def _cell(kind: str, n: int, nbytes: int, rounds: list[list[float]]) -> str:
    """busbw (GB/s) and time of the median repetition, ± half the spread of the rounds' medians."""
    if not rounds:
        return f"{'-':>22}"
    med = statistics.median(t for r in rounds for t in r)
    per_round = [bus_factor(kind, n) * nbytes / statistics.median(r) / 1e9 for r in rounds]
    spread = (max(per_round) - min(per_round)) / 2
    return f"{bus_factor(kind, n) * nbytes / med / 1e9:6.2f} ±{spread:5.2f} {_fmt_t(med):>9}"


def _fmt_t(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us" if seconds < 1e-3 else f"{seconds * 1e3:.1f} ms"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="graphc bench comm")
    ap.add_argument("--backend", choices=("threads", "mpi"), default="threads")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--step-repeat", type=int, default=5, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.step_repeat)
        return
    rounds = max(1, args.repeat)
    mpi = args.backend == "mpi"
    print_memcpy()
    results: dict = {}  # (backend, n) -> kind -> nbytes -> [rounds' times]
    steps: dict[str, list[list[float]]] = {"threads": [], "mpi": []}
    for r in range(rounds):
        print(f"round {r + 1}/{rounds} ...", file=sys.stderr, flush=True)
        for n in RANKS:
            if mpi:
                doc = run_mpi_worker(n, args.step_repeat)
                for kind, by_size in doc["collectives"].items():
                    for nbytes, times in by_size.items():
                        results.setdefault(("mpi", n), {}).setdefault(kind, {}).setdefault(int(nbytes), []).append(
                            times
                        )
                if doc.get("step"):
                    steps["mpi"].append(doc["step"])
            for kind, by_size in threads_collectives(n).items():
                for nbytes, times in by_size.items():
                    results.setdefault(("threads", n), {}).setdefault(kind, {}).setdefault(nbytes, []).append(times)
        if mpi:
            steps["threads"].append(threads_step(args.step_repeat))
    print_table(results, mpi, rounds)
    if mpi:
        print_steps(steps)


def print_memcpy() -> None:
    print("memcpy (np.copyto, each thread its own arrays; read + write bytes, summed over threads)")
    for n_threads in (1, 2):
        for nbytes in (MiB, 16 * MiB):
            m = bench_memcpy(n_threads, nbytes, repeat=20)
            print(
                f"  {n_threads} thread{'s' if n_threads > 1 else ' '}  {nbytes // MiB:3d} MiB  "
                f"{m['bandwidth'] / 1e9:7.1f} GB/s"
            )
    print()


def print_table(results: dict, mpi: bool, rounds: int) -> None:
    backends = ("threads", "mpi") if mpi else ("threads",)
    columns = [(b, n) for n in RANKS for b in backends]
    print(
        "bus bandwidth in GB/s (nccl-tests' busbw) ± half the spread of the rounds, and the median time; "
        f"{rounds} interleaved rounds, slowest rank of each repetition"
    )
    print(f"  {'collective':<15}{'size':>7}  " + "  ".join(f"{f'n={n} {b}':>22}" for b, n in columns))
    for kind in KINDS:
        for nbytes in SIZES:
            cells = [_cell(kind, n, nbytes, results.get((b, n), {}).get(kind, {}).get(nbytes, [])) for b, n in columns]
            print(f"  {kind:<15}{_size(nbytes):>7}  " + "  ".join(cells))
    print()


def print_steps(steps: dict[str, list[list[float]]]) -> None:
    print(f"step of the dp=2 plan of {STEP_TARGET} ({STEP_EXAMPLE}), parameters kept on the devices:")
    for backend, rounds in steps.items():
        flat = [t for r in rounds for t in r]
        if not flat:
            continue
        med = statistics.median(flat)
        spread = (max(flat) - min(flat)) / 2
        print(f"  {backend:<8} {med * 1e3:9.1f} ms ± {spread * 1e3:6.1f}  (n={len(flat)})")


if __name__ == "__main__":
    main()
