"""The MPI job as one process sees it: loading mpi4py, the rank and its sub-communicators, waits
that stay bounded and interruptible, and what happens when a rank fails.

One process per device (``mpiexec -n N``): device ``d`` is rank ``d`` of ``MPI.COMM_WORLD``. mpi4py
is imported on first use (``load_mpi``); without it the error says how to install it. runtime/mpi.py
is the communicator on top of this.

Sub-communicators. A collective on ``group`` (device ids in rank order) runs on a communicator of
exactly those ranks, in that order, made once with ``MPI_Comm_create_group`` and cached by the group
tuple. Executables create all of theirs up front, in one sorted order on every rank
(``MpiWorld.setup``); a group first met later is created on first use.

Waiting. Every operation is started non-blocking and completed by ``MpiWorld.wait``, a loop that
tests the request, so that waits are bounded (``timeout_s`` raises ``CommError`` naming the
operation), the failure of another rank stops it (``CommAborted``), and Ctrl-C works (a blocking
MPI call cannot be interrupted). With more ranks than cores on the node the loop yields the core
between tests: a rank spinning on a core another rank needs made 4 ranks on 2 cores far slower
for small messages (docs/measurements.md#mpi-spin).

Faults. When a rank fails (an exception escaping graphc's calls, or any uncaught exception: the
world wraps ``sys.excepthook``) it sends a short notice to every other rank. Each rank's watchdog
thread receives notices: it prints one line naming the failed rank, acknowledges, and makes every
wait of its rank raise ``CommAborted``. At exit a world that saw a failure calls ``MPI_Abort``
(the failed rank once its peers acknowledged, at most ``grace_s`` later; the others after
``grace_s``), so the whole job ends and no rank stays in a collective; a rank still computing is
aborted by its watchdog after ``3 * grace_s``. A rank killed outright (``kill -9``, the OOM
killer) sends no notice: the watchdog of every rank on the same machine watches the others'
processes (``_PeerWatch``: a pidfd per process, readable the moment it ends), prints a line naming
the lost rank at once, makes every wait raise ``CommAborted``, and ends its rank with status 1
``_LOST_LINGER_S`` later. Hydra (MPICH's mpiexec) would SIGKILL the other ranks within a
millisecond of a rank killed by a signal, before they can print: under hydra every rank runs under
graphc's rank guard, which ``import graphc`` starts (runtime/guarding.py).
"""

from __future__ import annotations

import atexit
import os
import select
import socket
import sys
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.core.errors import GraphcError
from graphc.core.spec import local_shape, unshard
from graphc.runtime.comm import CommAborted, CommError
from graphc.runtime.guarding import tell_guard

INSTALL_HINT = "pip install 'graphc[mpi]' (in a checkout: pip install -e '.[mpi]')"
DEFAULT_TIMEOUT_S = 30.0
# two tags of COMM_WORLD are graphc's (a user's receive with MPI.ANY_TAG on COMM_WORLD could take them)
_NOTICE_TAG = 32001  # a rank's failure notice (its text)
_ACK_TAG = 32002  # a peer printed the notice
_NOTICE_BYTES = 2048
_WATCH_S = 0.02  # how often the watchdog looks for notices
_LINGER_S = 0.3
_WATCH_FINISH_S = 2.0  # at exit, the longest wait for the (host, pid) exchange to complete
_LOST_LINGER_S = 0.5  # a survivor of a lost rank ends this long after it noticed: the others print their line
_yield_core = getattr(
    os, "sched_yield", lambda: time.sleep(0)
)  # Linux and macOS have it  # a failed rank's wait, once the others acknowledged, before it aborts the job


class MpiUnavailable(GraphcError):
    """mpi4py (or the MPI library) is not installed."""


class MpiSetupError(GraphcError):
    """An error every rank raises alike before any collective (rank count, plan hash)."""


def load_mpi() -> Any:
    """mpi4py's ``MPI`` module; importing it initializes MPI (thread level MULTIPLE)."""
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:
        raise MpiUnavailable(f"the MPI backend needs mpi4py and an MPI library: {INSTALL_HINT} ({exc})") from None
    return MPI


def join_world(n_devices: int, launch_hint: str = "python train.py") -> MpiWorld:
    """This process's MPI world, checked to have one rank per device of the mesh."""
    MPI = load_mpi()
    size = MPI.COMM_WORLD.Get_size()
    if size != n_devices:
        rank = MPI.COMM_WORLD.Get_rank()
        raise MpiSetupError(
            f"the mesh has {n_devices} devices but this MPI job has {size} process{'es' if size != 1 else ''} "
            f"(this is rank {rank}): launch one process per device, mpiexec -n {n_devices} {launch_hint}"
        )
    return MpiWorld.get()


def current_world() -> MpiWorld | None:
    """The world of this process, if one was joined."""
    return MpiWorld._instance


def note_exit_code(code: int) -> None:
    """The exit status to abort with if the job ends through a failure (the CLI's 2 for errors)."""
    world = MpiWorld._instance
    if world is not None and code:
        world.exit_code = code


def _survive_sigusr1() -> None:
    """``mpiexec -disable-auto-cleanup`` (hydra) tells the survivors of a rank that ended by a
    signal with SIGUSR1, whose default action ends the process before it can say anything: ignore
    it (the watchdog sees the lost rank itself). Only from the main thread, and only over the
    default action."""
    import signal

    usr1 = getattr(signal, "SIGUSR1", None)
    if usr1 is None or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(usr1) == signal.SIG_DFL:
        signal.signal(usr1, signal.SIG_IGN)


class _PeerWatch:
    """The processes of the other ranks on this machine, so that one that ends without a word
    (killed by a signal) is noticed at once. Every rank's (host, pid) is exchanged once, by a
    non-blocking all-gather the watchdog completes; a rank on this host is then watched through a
    pidfd (Linux 5.3+), which becomes readable when its process ends. Ranks on other machines,
    and systems without pidfds, are left to MPI and the launcher."""

    def __init__(self, comm: Any, MPI: Any, rank: int, size: int):
        self.rank = rank
        self._mine = np.array([zlib.crc32(socket.gethostname().encode()), os.getpid()], np.int64)
        self._every = np.zeros((size, 2), np.int64)
        self._req: Any = comm.Iallgather([self._mine, MPI.INT64_T], [self._every, MPI.INT64_T])
        self.fds: dict[int, int] = {}  # pidfd -> the rank whose process it watches
        self.gone: int | None = None  # a rank whose process ended before it could be watched
        self.watching = False  # the other ranks' processes here are watched, and this rank's guard told

    def start(self) -> None:
        """Once every rank's (host, pid) is known: a pidfd for each other rank on this machine."""
        if self._req is None or not self._req.Test():
            return
        self._req = None
        pidfd_open = getattr(os, "pidfd_open", None)
        for r, (host, pid) in enumerate(self._every.tolist()):
            if r == self.rank or host != self._mine[0] or pidfd_open is None:
                continue
            try:
                self.fds[pidfd_open(pid)] = r
            except ProcessLookupError:
                self.gone = r if self.gone is None else self.gone
            except OSError:  # no pidfds here (an old kernel, a sandbox): left to MPI and the launcher
                return
        local = [pid for r, (host, pid) in enumerate(self._every.tolist()) if r != self.rank and host == self._mine[0]]
        tell_guard(local)  # a failed rank's guard waits for these before hydra can kill them
        self.watching = True

    def wait(self, timeout_s: float) -> int | None:
        """Wait up to ``timeout_s`` for a watched process to end: its rank, or None."""
        self.start()
        if self.gone is not None:
            return self.gone
        if not self.fds:
            time.sleep(timeout_s)
            return None
        readable, _, _ = select.select(list(self.fds), [], [], timeout_s)
        return self.fds[readable[0]] if readable else None

    def finish(self) -> None:
        """At exit: the all-gather completed (every rank posted it when it joined the world; at
        most ``_WATCH_FINISH_S`` for one that has not yet), the pidfds closed."""
        deadline = time.monotonic() + _WATCH_FINISH_S
        while self._req is not None and not self._req.Test() and time.monotonic() < deadline:
            time.sleep(0.001)
        self._req = None
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


class MpiWorld:
    """The MPI job as this process sees it: its rank, the sub-communicators, and fault handling.
    One per process (``MpiWorld.get()``)."""

    _instance: MpiWorld | None = None
    _instance_lock = threading.Lock()

    @classmethod
    def get(cls) -> MpiWorld:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = MpiWorld(load_mpi())
            return cls._instance

    def __init__(self, MPI: Any, grace_s: float = 2.0):
        self.MPI = MPI
        self.world = MPI.COMM_WORLD
        self.rank: int = self.world.Get_rank()
        self.size: int = self.world.Get_size()
        self.n_devices = self.size
        self.grace_s = grace_s
        self.exit_code = 1
        self.tag_ub: int = self.world.Get_attr(MPI.TAG_UB)
        # hydra (MPICH's mpiexec) says how many ranks share this node; no collective is needed
        self.ranks_on_node = int(os.environ.get("MPI_LOCALNRANKS", self.size))
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.oversubscribed = self.ranks_on_node > cores  # waits yield the core (module doc)
        self._subs: dict[tuple[int, ...], Any] = {}
        self._p2p: Any = None
        self._lock = threading.Lock()
        self.failed: tuple[int, str] | None = None  # (rank, "Type: message") of the first failure seen
        self._failed_here = False
        self._failed_at = 0.0
        self._pending: list = []  # notices and acks in flight
        self._threaded = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self._notice_buf = np.empty(_NOTICE_BYTES, np.uint8)
        self._notice_status = MPI.Status()
        self._notice_req = self._post_notice_recv()
        self._stop = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._lost = False  # the failure is a rank whose process ended without a notice
        self._peers = _PeerWatch(self.world, MPI, self.rank, self.size) if self._threaded else None
        if self._threaded:
            self._watchdog = threading.Thread(target=self._watch, name="graphc-mpi-watchdog", daemon=True)
            self._watchdog.start()
        previous = sys.excepthook

        def excepthook(tp, value, tb):
            previous(tp, value, tb)
            self.fail(value)

        sys.excepthook = excepthook
        atexit.register(self._at_exit)
        _survive_sigusr1()

    def watching_peers(self) -> bool:
        """Whether this rank's watchdog watches the other ranks' processes on its machine (module
        doc, Faults); False until every rank joined, and without a watchdog or pidfds."""
        return self._peers is not None and self._peers.watching

    # --- communicators ---------------------------------------------------------------------------

    def sub(self, group: tuple[int, ...]) -> Any:
        """The communicator of ``group`` (its ranks in the group's order), made on first use:
        collective over the group's members."""
        comm = self._subs.get(group)
        if comm is None:
            grp = self.world.Get_group().Incl(list(group))
            comm = self._subs[group] = self.world.Create_group(grp, zlib.crc32(repr(group).encode()) % 32767)
            grp.Free()
        return comm

    def setup(self, groups, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Collective over the whole world: make the point-to-point communicator and the
        sub-communicators of ``groups`` this rank is in, in one sorted order on every rank."""
        self.p2p(timeout_s)
        for g in sorted(set(groups)):
            if self.rank in g and len(g) > 1:
                self.sub(g)

    def p2p(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> Any:
        """A duplicate of COMM_WORLD for graphc's send/recv and gathers (collective on first use)."""
        if self._p2p is None:
            comm, req = self.world.Idup()
            self.wait(req, "creating graphc's communicator (MPI_Comm_idup)", timeout_s, idle=True)
            self._p2p = comm
        return self._p2p

    # --- waiting ---------------------------------------------------------------------------------

    def wait(self, req: Any, what: str, timeout_s: float, device: int | None = None, idle: bool = False) -> None:
        """Complete ``req``, bounded by ``timeout_s``; CommAborted as soon as another rank failed.
        ``idle``: a wait that moves no data (for the slowest rank's compile, a report): sleep
        between tests instead of taking a core from the ranks still working."""
        if req.Test():
            return
        self.poll(lambda: True if req.Test() else None, what, timeout_s, device, idle)

    def poll(
        self, test: Callable[[], Any], what: str, timeout_s: float, device: int | None = None, idle: bool = False
    ) -> Any:
        """Call ``test()`` until it returns something other than None (module doc, Waiting)."""
        deadline = time.monotonic() + timeout_s
        spins = 0
        yield_cpu = self.oversubscribed
        while True:
            got = test()
            if got is not None:
                return got
            spins += 1
            if self.failed is not None:
                raise self.aborted(what, device)
            if idle:
                time.sleep(0.001)
            elif yield_cpu or spins > 2000:
                _yield_core()
            if spins & 127 == 0:
                if not self._threaded:
                    self._check_notice()
                if time.monotonic() > deadline:
                    raise CommError(
                        f"{what}: not complete after {timeout_s:g} s on rank {self.rank}: a member is missing, "
                        "stuck, or called a different collective"
                    )

    def aborted(self, what: str, device: int | None = None) -> CommAborted:
        assert self.failed is not None
        rank, text = self.failed
        me = self.rank if device is None else device
        return CommAborted(f"device {rank} failed ({text}); device {me} abandoned {what}")

    def check_same(self, value: bytes, what: str, timeout_s: float) -> None:
        """Every rank holds the same ``value`` (at most 64 bytes), or MpiSetupError on every rank."""
        mine = np.zeros(64, np.uint8)
        mine[: len(value)] = np.frombuffer(value[:64], np.uint8)
        every = np.empty((self.size, 64), np.uint8)
        req = self.world.Iallgather([mine, self.MPI.BYTE], [every, self.MPI.BYTE])
        self.wait(req, f"comparing the {what} of every rank", timeout_s, idle=True)
        if (every == mine).all():
            return
        by_value: dict[str, list[int]] = {}
        for r in range(self.size):
            by_value.setdefault(bytes(every[r]).rstrip(b"\0").decode(errors="replace"), []).append(r)
        listing = "; ".join(
            f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {v}" for v, rs in by_value.items()
        )
        raise MpiSetupError(f"the ranks do not agree on the {what}: {listing}")

    # --- faults ----------------------------------------------------------------------------------

    def fail(self, exc: BaseException) -> None:
        """This rank failed with ``exc``: tell every other rank (once). No-op for the consequences
        of another rank's failure and for errors every rank raises alike. A rank whose process
        has ended is the failure (a launcher's Ctrl-C after it is a consequence)."""
        if isinstance(exc, MpiSetupError) or (isinstance(exc, CommAborted) and self.failed is not None):
            return
        lost = self._peers.wait(0.0) if self._peers is not None and self.failed is None else None
        if lost is not None:
            self._lose(lost)
            return
        with self._lock:
            if self.failed is not None:  # failed already, or a peer did first and this is a consequence
                return
            self._failed_here = True
            self.failed = (self.rank, f"{type(exc).__name__}: {exc}")
            self._failed_at = time.monotonic()
            if isinstance(exc, KeyboardInterrupt):
                self.exit_code = 130
        text = self.failed[1].encode(errors="replace")[:_NOTICE_BYTES]
        payload = np.frombuffer(text, np.uint8).copy()
        for r in range(self.size):
            if r != self.rank:
                self._pending.append((self.world.Isend([payload, self.MPI.BYTE], dest=r, tag=_NOTICE_TAG), payload))

    def _post_notice_recv(self) -> Any:
        return self.world.Irecv([self._notice_buf, self.MPI.BYTE], source=self.MPI.ANY_SOURCE, tag=_NOTICE_TAG)

    def _check_notice(self) -> None:
        if self._notice_req is None or not self._notice_req.Test(self._notice_status):
            return
        src = self._notice_status.Get_source()
        n = self._notice_status.Get_count(self.MPI.BYTE)
        text = bytes(self._notice_buf[:n]).decode(errors="replace")
        self._notice_req = self._post_notice_recv()
        with self._lock:
            first = self.failed is None
            if first:
                self.failed = (src, text)
                self._failed_at = time.monotonic()
        if first:
            print(f"graphc: rank {self.rank}: stopping: rank {src} failed: {text}", file=sys.stderr, flush=True)
        ack = np.zeros(1, np.uint8)
        self._pending.append((self.world.Isend([ack, self.MPI.BYTE], dest=src, tag=_ACK_TAG), ack))

    def _watch(self) -> None:
        """The watchdog thread: receives notices and watches the other ranks' processes; ends this
        rank ``_LOST_LINGER_S`` after a rank was lost, aborts it ``3 * grace_s`` after a notice if
        it does not stop by itself."""
        assert self._peers is not None
        while not self._stop.is_set():
            self._check_notice()
            if self.failed is None:
                lost = self._peers.wait(_WATCH_S)
                if lost is not None:
                    self._lose(lost)
            else:
                self._stop.wait(_WATCH_S)
            if self._lost and time.monotonic() - self._failed_at > _LOST_LINGER_S:
                self._end_lost()
            if self.failed is not None and time.monotonic() - self._failed_at > 3 * self.grace_s:
                print(
                    f"graphc: rank {self.rank}: still running {3 * self.grace_s:g} s after rank {self.failed[0]} "
                    "failed: aborting the job",
                    file=sys.stderr,
                    flush=True,
                )
                self._abort()

    def _end_lost(self) -> None:
        """End this survivor of a lost rank ``_LOST_LINGER_S`` after it noticed (the other survivors
        print their line meanwhile; its own program stops at its next wait), with its exit status
        and without MPI: MPI_Abort and MPI_Finalize may wait for the lost process."""
        try:
            time.sleep(max(0.0, _LOST_LINGER_S - (time.monotonic() - self._failed_at)))
            sys.stdout.flush()
            sys.stderr.flush()
        finally:  # (a launcher's Ctrl-C during the wait ends it early, not the exit)
            os._exit(self.exit_code)

    def _lose(self, rank: int) -> None:
        """Rank ``rank``'s process ended without a notice (module doc, Faults)."""
        text = "its process ended without reporting an error (killed by a signal?)"
        with self._lock:
            if self.failed is not None:
                return
            self.failed = (rank, f"lost: {text}")
            self._failed_at = time.monotonic()
            self._lost = True
        print(f"graphc: rank {self.rank}: stopping: rank {rank} was lost: {text}", file=sys.stderr, flush=True)

    def _at_exit(self) -> None:
        if self._lost:  # first: a launcher's Ctrl-C must not leave this rank in MPI_Finalize
            self._end_lost()
        self._stop.set()
        if self._watchdog is not None:
            self._watchdog.join(1.0)
        if self._lost:  # (seen while the watchdog stopped)
            self._end_lost()
        if self.failed is None:
            if self._notice_req is not None:
                self._notice_req.Cancel()
                self._notice_req.Wait()
                self._notice_req = None
            if self._peers is not None:
                self._peers.finish()
            return
        if self._failed_here:  # let the others print what happened before the job ends
            if self._await_acks():
                time.sleep(_LINGER_S)  # and finish the lines they are printing
        else:  # the failed rank ends the job once we acknowledged; if it cannot, we do
            while time.monotonic() - self._failed_at < self.grace_s:
                self._check_notice()
                time.sleep(_WATCH_S)
        self._abort()

    def _await_acks(self) -> bool:
        """Wait (at most grace_s) until every other rank acknowledged the notice; whether all did."""
        status = self.MPI.Status()
        buf = np.empty(1, np.uint8)
        acked: set[int] = set()
        deadline = time.monotonic() + self.grace_s
        while len(acked) < self.size - 1 and time.monotonic() < deadline:
            if self.world.Iprobe(source=self.MPI.ANY_SOURCE, tag=_ACK_TAG, status=status):
                src = status.Get_source()
                self.world.Recv([buf, self.MPI.BYTE], source=src, tag=_ACK_TAG)
                acked.add(src)
                continue
            self._check_notice()
            time.sleep(0.005)
        return len(acked) == self.size - 1

    def _abort(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.world.Abort(self.exit_code)

    # --- gathering what a rank holds ---------------------------------------------------------------

    def gather_sharded(self, sharded: Any, root: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> np.ndarray | None:
        """The whole value of a ShardedArray on rank ``root`` (None elsewhere). Collective: every
        rank calls it. Only one copy of each distinct piece travels."""
        mesh, spec = sharded.mesh, sharded.spec
        ranks = sharded.ranks or tuple(range(mesh.size))
        piece_shape = local_shape(sharded.shape, spec, tuple(mesh.shape))
        itemsize = np.dtype(sharded.dtype).itemsize
        piece_bytes = int(np.prod(piece_shape, dtype=np.int64)) * itemsize
        needed = [d for d in mesh.devices() if not any(mesh.coord(d)[a] for a, p in enumerate(spec) if p.kind == "R")]
        counts = [0] * self.size
        for d in needed:
            counts[ranks[d]] = piece_bytes
        displs = [int(x) for x in np.cumsum([0] + counts[:-1])]
        mine = np.empty(0, np.uint8)
        for d, p in sharded.pieces.items():
            if d in needed:
                mine = np.ascontiguousarray(p, dtype=sharded.dtype).reshape(-1).view(np.uint8)
        out = np.empty(sum(counts), np.uint8) if self.rank == root else None
        comm = self.p2p(timeout_s)
        recv = [out, (counts, displs), self.MPI.BYTE] if out is not None else None
        req = comm.Igatherv([mine, self.MPI.BYTE], recv, root=root)
        self.wait(req, f"gathering a sharded {np.dtype(sharded.dtype).name}{list(sharded.shape)}", timeout_s)
        if out is None:
            return None
        pieces = {
            mesh.coord(d): out[displs[ranks[d]] : displs[ranks[d]] + piece_bytes]
            .view(sharded.dtype)
            .reshape(piece_shape)
            for d in needed
        }
        return unshard(pieces, spec, tuple(mesh.shape), sharded.shape).astype(sharded.dtype, copy=False)

    def gather_floats(
        self, values: list[float], root: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> np.ndarray | None:
        """Every rank's ``values`` (the same count on every rank) as a [ranks, count] array on ``root``."""
        mine = np.asarray(values, np.float64)
        out = np.empty((self.size, mine.size), np.float64) if self.rank == root else None
        req = self.p2p(timeout_s).Igather(
            [mine, self.MPI.DOUBLE], [out, self.MPI.DOUBLE] if out is not None else None, root=root
        )
        self.wait(req, "gathering timings", timeout_s, idle=True)
        return out

    def gather_bytes(self, data: bytes, root: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[bytes] | None:
        """Every rank's ``data`` (any length) on ``root``, in rank order."""
        comm = self.p2p(timeout_s)
        n = np.array([len(data)], np.int64)
        sizes = np.empty(self.size, np.int64) if self.rank == root else None
        self.wait(
            comm.Igather([n, self.MPI.INT64_T], [sizes, self.MPI.INT64_T] if sizes is not None else None, root=root),
            "gathering sizes",
            timeout_s,
            idle=True,
        )
        mine = np.frombuffer(data, np.uint8) if data else np.empty(0, np.uint8)
        if sizes is None:
            self.wait(comm.Igatherv([mine, self.MPI.BYTE], None, root=root), "gathering reports", timeout_s, idle=True)
            return None
        counts = [int(s) for s in sizes]
        displs = [int(x) for x in np.cumsum([0] + counts[:-1])]
        out = np.empty(sum(counts), np.uint8)
        self.wait(
            comm.Igatherv([mine, self.MPI.BYTE], [out, (counts, displs), self.MPI.BYTE], root=root),
            "gathering reports",
            timeout_s,
            idle=True,
        )
        return [bytes(out[d : d + c]) for d, c in zip(displs, counts)]

    def broadcast_int(self, value: int, root: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
        buf = np.array([value], np.int64)
        self.wait(
            self.p2p(timeout_s).Ibcast([buf, self.MPI.INT64_T], root=root),
            "broadcasting a result",
            timeout_s,
            idle=True,
        )
        return int(buf[0])

    def barrier(self, timeout_s: float = DEFAULT_TIMEOUT_S, idle: bool = False) -> None:
        self.wait(self.p2p(timeout_s).Ibarrier(), "barrier of all ranks", timeout_s, idle=idle)


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "INSTALL_HINT",
    "MpiSetupError",
    "MpiUnavailable",
    "MpiWorld",
    "current_world",
    "join_world",
    "load_mpi",
    "note_exit_code",
]
