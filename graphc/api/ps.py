"""``graphc.ps``: a parameter server on threads, with synchronous, asynchronous and stale-synchronous
(SSP) training.

    params, stats = graphc.ps.train(grad_fn, params, batches, workers=4, servers=2, mode="ssp", staleness=2)

The pieces::

    worker w (N threads)                         server m (M threads)
      wait until min_clock >= clock - s   <-- ack --  applies each push to the slices it owns
      pull: copy every server's slices     <--------  (under the server's lock)
      g = grad_fn(params, batches[i])
      push: each server its slices of g    -------->  inbox (a queue): p[slice] -= lr * g[slice]

* **Dealing.** Batch ``i`` goes to worker ``i % N``; worker ``w``'s ``k``-th step (its clock ``k``)
  uses batch ``k * N + w``.
* **Sharding.** The parameters, flattened leaf by leaf and laid end to end, are cut into M
  contiguous ranges of equal bytes (to the element); server ``m`` owns range ``m``, which may
  cover the end of one leaf and the start of the next (``shard_slices``). A server applies
  ``p -= lr * g`` to its slices only, so the servers never touch the same element.
* **Clocks.** A worker's clock is the number of steps it has pushed. A push counts as *applied*
  once every server has applied its slices of it; ``min_clock`` is the smallest number of applied
  pushes over the workers. Before pulling at clock ``c`` a worker waits until
  ``min_clock >= c - s``: then it sees every update of every worker's first ``c - s`` steps (and
  perhaps newer ones). Its staleness at that pull is ``c - min_clock`` (0 <= staleness <= s), and
  the pull is logged as ``(worker, c, min_clock)``. In every mode a worker also waits for its own
  pushes to be applied (it reads its own writes): a server that falls behind holds back the
  workers instead of letting them all compute on the same old parameters. Without this wait the
  server threads, short of the GIL, fell up to ~80 pushes behind, and 4 of 40 async runs of
  tests/api/test_ps.py ended at 1.7-3.3x sync's loss; with it, 40 of 40 are within 3% of it.
* **Modes.** ``"ssp"``: the wait above with ``staleness=s``, and each push applied on arrival.
  ``"async"``: the same with ``s`` infinite (no wait). ``"sync"``: ``s = 0``, and the servers apply
  one update per round: the pushes of round ``r`` (batches ``r*N .. r*N + N - 1``) summed in worker
  order, divided by the number of workers in the round (fewer in a last, partial round), so the
  result is bit-equal to data-parallel SGD on the same batches.

``grad_fn`` is compiled once with ``graphc.jit`` (unless ``jit=False``, or it is already a jitted
function) and that one compiled function is shared by all workers. That is safe: the trace context
is thread-local, compiling is done under the function's lock, a run keeps its values in a list of
its own, and the executor's buffer pool is locked (runtime/executor.py); the workers run inside
``one_blas_thread`` (runtime/threads.py) as device threads do, so BLAS and fused kernels stay on
the worker's thread. tests/api/test_ps.py checks that concurrent calls give the bits of serial ones.

The threads share one interpreter: numpy (BLAS, the fused kernels) and sleeps release the GIL,
Python code does not. So the modes differ in what waits for what (a straggler, a slow server),
not in how many cores Python runs on.

Not done: servers as MPI ranks. The servers here are threads of one process (the MPI backend,
runtime/mpi_world.py, runs device programs, not a parameter server).

Nothing hangs: every wait has a timeout and looks at a stop flag; an exception in a worker or a
server stops all threads and is re-raised in the caller, of the same type, naming the worker; on
Ctrl-C the caller stops and joins every thread before the KeyboardInterrupt goes on; when ``train``
returns, its threads have ended.
"""

from __future__ import annotations

import math
import numbers
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphc.api.jit import Jitted
from graphc.api.jit import jit as jit_function
from graphc.core.errors import relabel
from graphc.core.pytree import TreeDef, flatten, flatten_as, unflatten
from graphc.runtime.threads import one_blas_thread

MODES = ("sync", "async", "ssp")
POLL_S = 0.05  # how often a waiting thread looks at the stop flag (waits are woken sooner by notify)
JOIN_S = 30.0  # how long an ending run waits for a thread still inside grad_fn before giving up on it


def train(
    grad_fn: Callable[[Any, Any], Any],
    params: Any,
    batches: Sequence[Any],
    *,
    workers: int = 1,
    servers: int = 1,
    mode: str = "sync",
    staleness: int | None = None,
    lr: float = 0.1,
    jit: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """Train ``params`` (a pytree of float arrays) with SGD on a parameter server of ``servers``
    threads fed by ``workers`` threads; returns (the trained params, stats). The given params are
    not changed.

    ``grad_fn(params, batch)`` returns only the gradients, of the structure, shapes and dtypes of
    params: ``graphc.grad(loss)`` for a ``loss(params, batch)``, not ``value_and_grad`` (whose
    result also holds the loss: a ValueError says so).
    ``batches[i]`` is read by worker ``i % workers`` on its thread. ``mode``: "sync", "async" or
    "ssp" (``staleness``: how many steps the fastest worker may be ahead of the slowest; only for
    "ssp"). ``jit=False`` calls ``grad_fn`` as it is (already compiled, or eager on purpose: a
    wrapper that delays one worker, for instance).

    stats: ``steps`` (per worker), ``max_staleness`` (the largest ``clock - min_clock`` at a pull),
    ``seconds`` (wall time), ``worker_seconds`` (each worker's time from start to its last push),
    ``wait_seconds`` (each worker's time blocked before its pulls: the staleness bound, its own
    pushes not yet applied), ``log`` (every pull as
    ``(worker, clock, min_clock)``, in the order they happened), ``updates`` (SGD steps applied
    by each server), ``shard_bytes`` (bytes owned by each server).
    """
    bound = _check_arguments(grad_fn, batches, workers, servers, mode, staleness, lr)
    leaves, treedef = _parameter_leaves(params)
    paths = leaf_paths(treedef)
    if not (isinstance(grad_fn, Jitted) or not jit):
        grad_fn = jit_function(grad_fn)
    flat = [np.array(leaf, copy=True, order="C").reshape(-1) for leaf in leaves]  # the servers' storage
    slices = shard_slices([leaf.nbytes for leaf in flat], [leaf.itemsize for leaf in flat], servers)
    state = _State(workers, servers, bound)
    shared = _Shared(grad_fn, batches, treedef, paths, [np.shape(x) for x in leaves], flat, workers, lr, mode == "sync")
    server_list = [_Server(m, slices[m], shared, state) for m in range(servers)]
    shared.servers = server_list
    start = time.perf_counter()
    with one_blas_thread():
        threads = [
            threading.Thread(target=s.loop, name=f"graphc-ps-server-{s.index}", daemon=True) for s in server_list
        ] + [
            threading.Thread(target=_worker, args=(w, shared, state), name=f"graphc-ps-worker-{w}", daemon=True)
            for w in range(workers)
        ]
        try:
            for t in threads:
                t.start()
            _wait_for_workers(threads[servers:], state)
            for s in server_list:
                s.inbox.put(None)  # after every push: the servers apply all of them, then end
            _join(threads[:servers], state, None)
        finally:  # also on Ctrl-C in the caller: every thread is stopped and joined first
            state.stop()
            _join(threads, state, JOIN_S)
    seconds = time.perf_counter() - start
    if state.failure is not None:
        raise state.failure
    trained = unflatten(treedef, [leaf.reshape(shape) for leaf, shape in zip(flat, shared.shapes)])
    stats = {
        "mode": mode,
        "staleness": staleness,
        "steps": list(state.clock),
        "max_staleness": max((c - low for _, c, low in state.log), default=0),
        "seconds": seconds,
        "worker_seconds": list(state.worker_seconds),
        "wait_seconds": list(state.wait_seconds),
        "log": list(state.log),
        "updates": [s.updates for s in server_list],
        "shard_bytes": [sum((b - a) * flat[j].itemsize for j, a, b in slices[m]) for m in range(servers)],
    }
    return trained, stats


def _check_arguments(grad_fn, batches, workers, servers, mode, staleness, lr) -> float:
    """The staleness bound of the run (0 for sync, infinite for async); ValueError / TypeError
    naming the argument that is wrong."""
    if not callable(grad_fn):
        raise TypeError(f"grad_fn must be callable, got {type(grad_fn).__name__}")
    if not (hasattr(batches, "__len__") and hasattr(batches, "__getitem__")):
        raise TypeError(f"batches must be a sequence (len and indexing), got {type(batches).__name__}")
    for name, value in (("workers", workers), ("servers", servers)):
        if not isinstance(value, int | np.integer) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    if not isinstance(lr, numbers.Real) or isinstance(lr, bool):
        raise TypeError(f"lr must be a real number, got {type(lr).__name__}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
    if staleness is not None:
        if not isinstance(staleness, int | np.integer) or isinstance(staleness, bool):
            raise TypeError(f"staleness must be an int, got {type(staleness).__name__}")
        if staleness < 0:
            raise ValueError(f"staleness must be at least 0, got {staleness}")
    if mode == "ssp":
        if staleness is None:
            raise ValueError("staleness: mode='ssp' needs a bound (how many steps a worker may run ahead)")
        return float(staleness)
    if staleness is not None:
        raise ValueError(
            f"staleness is only for mode='ssp' (mode={mode!r} runs with staleness "
            f"{'0' if mode == 'sync' else 'unbounded'}), got {staleness}"
        )
    return 0.0 if mode == "sync" else math.inf


def _parameter_leaves(params: Any) -> tuple[list[np.ndarray], TreeDef]:
    try:
        leaves, treedef = flatten(params, path="params")
    except TypeError as exc:
        raise TypeError(str(exc)) from None
    for path, leaf in zip(leaf_paths(treedef), leaves):
        if np.result_type(leaf).kind not in "fc":
            raise TypeError(f"{path} is {np.result_type(leaf)}: SGD trains float arrays only")
    return [np.asarray(leaf) for leaf in leaves], treedef


def leaf_paths(treedef: TreeDef, prefix: str = "params") -> list[str]:
    """The path of each dynamic leaf, in flatten's order: ``params['w']``, ``params[0]``."""
    if treedef.kind == "leaf":
        return [prefix]
    if treedef.kind == "static":
        return []
    keys = treedef.keys if treedef.kind == "dict" else range(len(treedef.children))
    paths = []
    for key, child in zip(keys, treedef.children):
        paths += leaf_paths(child, f"{prefix}[{key!r}]")
    return paths


def shard_slices(nbytes: list[int], itemsizes: list[int], servers: int) -> list[list[tuple[int, int, int]]]:
    """Each server's slices ``(leaf, start, stop)`` (element indices into the flattened leaf): the
    leaves laid end to end, cut into ``servers`` contiguous ranges of equal bytes, each cut moved
    to the nearest element boundary. The slices of all servers cover every element once."""
    total = sum(nbytes)
    cuts = [total * m // servers for m in range(servers + 1)]
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(servers)]
    offset = 0  # bytes before this leaf
    for j, (size, item) in enumerate(zip(nbytes, itemsizes)):
        n = size // item
        # each cut as an element index of this leaf (rounded to the nearest, clipped to the leaf)
        at = [min(n, max(0, (cut - offset + item // 2) // item)) for cut in cuts]
        for m in range(servers):
            if at[m + 1] > at[m]:
                out[m].append((j, at[m], at[m + 1]))
        offset += size
    return out


class _State:
    """What the threads share about progress, under one condition variable: each worker's clock,
    the pushes each server applied, the pull log, and the first failure (which stops the run)."""

    def __init__(self, workers: int, servers: int, bound: float):
        self.cond = threading.Condition()
        self.bound = bound
        self.clock = [0] * workers  # steps pushed
        self.applied = [[0] * workers for _ in range(servers)]  # [server][worker]: pushes applied
        self.done = [0] * workers  # pushes of each worker applied by every server
        self.log: list[tuple[int, int, int]] = []
        self.worker_seconds = [0.0] * workers
        self.wait_seconds = [0.0] * workers
        self.stopped = False
        self.failure: BaseException | None = None

    def stop(self, failure: BaseException | None = None) -> None:
        with self.cond:
            if failure is not None and self.failure is None:
                self.failure = failure
            self.stopped = True
            self.cond.notify_all()

    def wait_to_pull(self, worker: int, clock: int) -> bool:
        """Block until the slowest worker is at most ``bound`` steps behind ``clock`` and the
        worker's own pushes are applied; log the pull. False when the run was stopped."""
        start = time.perf_counter()
        with self.cond:
            while not self.stopped and (min(self.done) < clock - self.bound or self.done[worker] < clock):
                self.cond.wait(POLL_S)
            if self.stopped:
                return False
            self.log.append((worker, clock, min(self.done)))
        self.wait_seconds[worker] += time.perf_counter() - start
        return True

    def pushed(self, worker: int) -> None:
        with self.cond:
            self.clock[worker] += 1

    def applied_by(self, server: int, workers: list[int]) -> None:
        with self.cond:
            for w in workers:
                self.applied[server][w] += 1
                self.done[w] = min(row[w] for row in self.applied)
            self.cond.notify_all()


@dataclass
class _Shared:
    """What every worker and server reads: the function, the data and the parameter storage."""

    grad_fn: Callable
    batches: Sequence[Any]
    treedef: TreeDef
    paths: list[str]
    shapes: list[tuple[int, ...]]
    flat: list[np.ndarray]  # each leaf flattened; server m writes only its slices
    workers: int
    lr: float
    sync: bool
    servers: list[_Server] = field(default_factory=list)


def _worker(w: int, shared: _Shared, state: _State) -> None:
    start = time.perf_counter()
    batch_index = w
    try:
        for clock, batch_index in enumerate(range(w, len(shared.batches), shared.workers)):
            if not state.wait_to_pull(w, clock):
                return
            fresh = [np.empty(leaf.shape, leaf.dtype) for leaf in shared.flat]  # never reused: grad_fn may keep them
            for s in shared.servers:
                s.pull_into(fresh)
            params = unflatten(shared.treedef, [x.reshape(shape) for x, shape in zip(fresh, shared.shapes)])
            grads = _gradient_leaves(shared.grad_fn(params, shared.batches[batch_index]), shared)
            for s in shared.servers:
                s.inbox.put((w, clock, [grads[j][a:b] for j, a, b in s.slices]))
            state.pushed(w)
        state.worker_seconds[w] = time.perf_counter() - start
    except BaseException as exc:  # noqa: BLE001 - any failure stops the run and reaches the caller
        state.stop(_in_thread(exc, f"parameter server worker {w} (batch {batch_index})"))


def _gradient_leaves(grads: Any, shared: _Shared) -> list[np.ndarray]:
    """The gradient's leaves, flattened, after checking they match the parameters."""
    try:
        leaves = flatten_as(grads, shared.treedef, path="grad_fn's result")
    except ValueError as exc:
        raise ValueError(
            f"{exc}. grad_fn(params, batch) must return only the gradients, a pytree shaped like params "
            "(graphc.grad(loss), not graphc.value_and_grad(loss), which returns (loss, gradients))"
        ) from None
    out = []
    for path, g, p, shape in zip(shared.paths, leaves, shared.flat, shared.shapes):
        g = np.asarray(g)
        if g.shape != shape or g.dtype != p.dtype:
            raise ValueError(
                f"grad_fn's gradient of {path} is {g.dtype}{list(g.shape)}, the parameter is {p.dtype}{list(shape)}"
            )
        out.append(g.reshape(-1))
    return out


def _in_thread(exc: BaseException, where: str) -> BaseException:
    """The same kind of exception, saying which thread raised it (a worker and its batch, a server)."""
    if not isinstance(exc, Exception):  # SystemExit and the like: as they are
        return exc
    return relabel(exc, f"{where}: {exc}")


class _Server:
    """One server thread: applies the pushes in its inbox to the slices it owns. In sync mode it
    holds a round's pushes until every worker of the round has pushed, then applies their mean."""

    def __init__(self, index: int, slices: list[tuple[int, int, int]], shared: _Shared, state: _State):
        self.index = index
        self.slices = slices
        self.shared = shared
        self.state = state
        self.inbox: queue.Queue = queue.Queue()
        self.lock = threading.Lock()  # pulls never see a slice half updated
        self.updates = 0
        self._round: dict[int, list[np.ndarray]] = {}  # sync: worker -> its pieces, this round

    def pull_into(self, fresh: list[np.ndarray]) -> None:
        flat = self.shared.flat
        with self.lock:
            for j, a, b in self.slices:
                fresh[j][a:b] = flat[j][a:b]

    def loop(self) -> None:
        try:
            while True:
                try:
                    message = self.inbox.get(timeout=POLL_S)
                except queue.Empty:
                    if self.state.stopped:
                        return
                    continue
                if message is None or self.state.stopped:
                    return
                worker, clock, pieces = message
                if self.shared.sync:
                    self._add_to_round(worker, clock, pieces)
                else:
                    self._apply(pieces)
                    self.state.applied_by(self.index, [worker])
        except BaseException as exc:  # noqa: BLE001 - stops the run; the caller re-raises it
            self.state.stop(_in_thread(exc, f"parameter server {self.index}"))

    def _add_to_round(self, worker: int, clock: int, pieces: list[np.ndarray]) -> None:
        self._round[worker] = pieces
        n = self.shared.workers
        expected = min(n, len(self.shared.batches) - clock * n)  # a last round may be partial
        if len(self._round) < expected:
            return
        order = sorted(self._round)  # worker order: the sum's bits do not depend on arrival
        total = list(self._round[order[0]])
        for w in order[1:]:
            total = [t + g for t, g in zip(total, self._round[w])]
        self._apply([t / expected for t in total])
        self._round = {}
        self.state.applied_by(self.index, order)

    def _apply(self, pieces: list[np.ndarray]) -> None:
        flat, lr = self.shared.flat, self.shared.lr
        with self.lock:
            for (j, a, b), g in zip(self.slices, pieces):
                flat[j][a:b] -= lr * g
            self.updates += 1


def _wait_for_workers(workers: list[threading.Thread], state: _State) -> None:
    """Join the workers, waking every POLL_S (so Ctrl-C reaches the caller), until all ended or
    one failed."""
    for t in workers:
        while t.is_alive():
            t.join(POLL_S)
            if state.failure is not None:
                return


def _join(threads: list[threading.Thread], state: _State, limit: float | None) -> None:
    """Join ``threads``, waking every POLL_S; with a ``limit``, give up after that many seconds
    (a thread still inside grad_fn: it is a daemon and ends when its call returns)."""
    deadline = None if limit is None else time.monotonic() + limit
    for t in threads:
        # a thread whose start() a Ctrl-C cut short is not alive yet but is listed (in threading's
        # limbo): it is waited for too, or it would outlive the run
        while t.is_alive() or t in threading.enumerate():
            if state.failure is not None and deadline is None:
                return
            if deadline is not None and time.monotonic() > deadline:
                return
            if t.is_alive():
                t.join(POLL_S)
            else:
                time.sleep(0.001)  # starting: join() would refuse a thread not yet started


__all__ = ["MODES", "leaf_paths", "shard_slices", "train"]
