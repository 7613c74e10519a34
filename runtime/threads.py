"""How many threads the runtime may use: BLAS threads and the threads of one fused kernel.

A single-device run has the machine to itself: a fused kernel over at least
``codegen.PARALLEL_MIN_ELEMENTS`` elements runs in pieces over one thread per core. Device threads
of a multi-device run (and anything under ``one_blas_thread``) keep each kernel, and BLAS, on
their own thread: the cores are theirs.
"""

from __future__ import annotations

import contextlib
import os
import threading

import numpy  # noqa: F401 - numpy's BLAS is loaded before the controller looks for it
from threadpoolctl import ThreadpoolController

_threads_local = threading.local()
_pool_lock = threading.Lock()
_pool_obj = None


def _cores() -> int:
    """The cores this process may run on (its CPU affinity, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity API (macOS, Windows)
        return os.cpu_count() or 1


# read once: kernel_threads() is asked before every kernel, and asking the OS each time would add
# to small kernels (docs/measurements.md#cpu-count)
CORES = _cores()


def kernel_threads() -> int:
    """Threads a kernel called from this thread may use."""
    n = getattr(_threads_local, "threads", None)
    if n is not None:
        return n
    return 1 if _single_threaded_depth else CORES


_single_threaded_depth = 0


class single_threaded:
    """Context: kernels run on the calling thread only (process-wide while any is active)."""

    def __enter__(self):
        global _single_threaded_depth
        with _pool_lock:
            _single_threaded_depth += 1
        return self

    def __exit__(self, *exc):
        global _single_threaded_depth
        with _pool_lock:
            _single_threaded_depth -= 1
        return False


def kernel_pool(workers: int):
    global _pool_obj
    with _pool_lock:
        if _pool_obj is None or _pool_obj._max_workers < workers:
            from concurrent.futures import ThreadPoolExecutor

            _pool_obj = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="graphc-kernel")
        return _pool_obj


_controller = None


def _blas_controller():
    """threadpoolctl's view of the loaded BLAS libraries, found once: ``threadpool_limits()``
    searches the process's libraries on every call, which costs more than a small step
    (docs/measurements.md#blas-limits)."""
    global _controller
    with _pool_lock:
        if _controller is None:
            _controller = ThreadpoolController()
        return _controller


@contextlib.contextmanager
def one_blas_thread():
    """Inside the ``with``, BLAS uses one thread and fused kernels run on their caller's thread
    (process-wide): one device's share of the machine."""
    with single_threaded():
        with _blas_controller().limit(limits=1, user_api="blas"):
            yield
