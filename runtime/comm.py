"""Collectives between devices: the communication layer of the multi-device runtime.

``Communicator`` is the interface a device program talks to; ``ThreadWorld`` / ``ThreadComm``
implement it for devices that are Python threads of one process (shared memory). An MPI backend
(one process per device) will implement the same methods.

Groups and matching. Every collective names its ``group``: device ids in rank order (rank =
``group.index(device)``). Within a group, the k-th collective call of each member is the same
collective; different groups (the rows and the columns of a mesh) proceed independently. When all
members have arrived, their calls are compared (kind, attributes, dtype, shapes) and a mismatch
raises ``CommError`` in every member instead of deadlocking or producing garbage.

Rendezvous (threads). The k-th call on a group meets the other members in a *slot* of the world,
keyed ``(group, k)``, with its own condition variable. Each member deposits references to its
buffers (no copy) and meets the others twice; a meeting completes when every member has reached it:

    arrive   every member's buffers are visible; the calls are checked against each other
    done     every member has finished with the others' buffers; each may now return

Between the two, each member reads (and for all_reduce writes) the others' buffers directly with
numpy, which releases the GIL on large arrays, so members copy and add in parallel. all_reduce
is a reduce-scatter and an all-gather in one step: rank r alone sums chunk r of every input, in
rank order 0..n-1 (identical bits on every rank and in every run), into its own output, and
copies that sum into chunk r of every other member's output; no other rank touches chunk r, so
no meeting is needed between the two halves. (So members must pass distinct arrays.)

Every wait is bounded: a member missing for ``timeout_s`` raises ``CommError`` naming the
collective, its sequence number on the group (counted from 0), the group and the missing
devices; ``world.abort(device, exc)`` wakes every waiting member at once and makes every wait,
pending or future, raise ``CommAborted`` naming the failed device.

A world serves one run: create a new ``ThreadWorld`` per run (an aborted world stays aborted).
"""

from __future__ import annotations

import abc
import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graphc.core.errors import GraphcError
from graphc.runtime.pieces import (
    check_split,
    chunk_bounds,
    join_pieces,
    normalize_dim,
    piece_len,
    piece_view,
    sum_in_rank_order,
    with_dim,
)


class CommError(GraphcError):
    """A collective that cannot complete: a member is missing, or members called different collectives."""


class CommAborted(CommError):
    """Another device failed; the collective this device was waiting in was abandoned."""


# --- the interface --------------------------------------------------------------------------------


def all_to_all_args(x, group, split_dim, concat_dim, split_blocks: int, concat_blocks: int):
    """An all_to_all's checked arguments, as every backend takes them: (x as an array, group
    size, split dim, concat dim, the attributes members compare)."""
    x = np.asarray(x)
    n = len(group)
    sd, cd = normalize_dim(split_dim, x.ndim), normalize_dim(concat_dim, x.ndim)
    if sd == cd:
        raise ValueError(f"all_to_all: split_dim and concat_dim must differ, both are {sd}")
    check_split(x.shape[sd], n, split_blocks, "all_to_all split")
    check_split(x.shape[cd] * n, n, concat_blocks, "all_to_all concat")
    attrs = (
        ("split_dim", split_dim),
        ("concat_dim", concat_dim),
        ("split_blocks", split_blocks),
        ("concat_blocks", concat_blocks),
    )
    return x, n, sd, cd, attrs


class Communicator(abc.ABC):
    """What one device uses to talk to the others (backend-neutral).

    ``group``: device ids in rank order; the caller must be a member. ``root``: a rank of the
    group (a position in it, as in MPI), not a device id. ``dim`` may be negative; members must
    pass the same attributes. Collectives return new arrays (``inplace=True`` on all_reduce
    writes into ``x`` instead) and never modify their inputs otherwise.

    ``log`` records one dict per call: kind, group (send/recv: (source, destination)), seq (the
    call's number on its group; send/recv have a tag instead), bytes, start (time.perf_counter())
    and seconds; a thread collective also ``waited``: its seconds spent waiting for the last member
    of the group to arrive (the rest is the exchange itself and its end meeting). bytes is the whole tensor as nccl-tests counts it: the input of all_reduce,
    reduce_scatter, reduce, broadcast and scatter (the root's), the output of all_gather and
    gather, each rank's buffer for all_to_all.
    """

    device: int
    log: list[dict]
    alloc: Callable[[tuple[int, ...], np.dtype], np.ndarray]

    def _record(self, kind: str, group: tuple[int, ...], nbytes: int, start: float, **key) -> None:
        """One entry of ``log`` (``key``: the call's seq, or a send/recv's tag)."""
        self.log.append(
            {
                "kind": kind,
                "group": group,
                **key,
                "bytes": int(nbytes),
                "start": start,
                "seconds": time.perf_counter() - start,
            }
        )

    def _reduce_buffers(self, x, inplace: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x as an array, the contiguous source, the output) of an all_reduce."""
        x = np.asarray(x)
        if inplace:
            if not (x.flags.c_contiguous and x.flags.writeable):
                raise ValueError("all_reduce(inplace=True) needs a writeable C-contiguous array")
            return x, x, x
        return x, np.ascontiguousarray(x), self.alloc(x.shape, x.dtype)

    @abc.abstractmethod
    def all_reduce(self, x: np.ndarray, group: tuple[int, ...], inplace: bool = False) -> np.ndarray:
        """Sum over the group, added in rank order (the same bits on every rank). ``inplace``:
        write the sum into ``x`` (writeable, C-contiguous, not shared with another member)."""

    @abc.abstractmethod
    def reduce_scatter(self, x: np.ndarray, group: tuple[int, ...], dim: int, blocks: int = 1) -> np.ndarray:
        """Sum over the group; rank r keeps its piece of ``dim``."""

    @abc.abstractmethod
    def all_gather(self, x: np.ndarray, group: tuple[int, ...], dim: int, blocks: int = 1) -> np.ndarray:
        """The ranks' pieces of ``dim`` joined into the whole dim."""

    @abc.abstractmethod
    def all_to_all(
        self,
        x: np.ndarray,
        group: tuple[int, ...],
        split_dim: int,
        concat_dim: int,
        split_blocks: int = 1,
        concat_blocks: int = 1,
    ) -> np.ndarray:
        """Piece j of ``split_dim`` goes to rank j; received pieces are joined along ``concat_dim``."""

    @abc.abstractmethod
    def broadcast(self, x: np.ndarray | None, group: tuple[int, ...], root: int) -> np.ndarray:
        """The root's ``x`` on every rank (``x`` is ignored off the root)."""

    @abc.abstractmethod
    def scatter(self, x: np.ndarray | None, group: tuple[int, ...], root: int, dim: int, blocks: int = 1) -> np.ndarray:
        """Rank r's piece of the root's ``x`` (``x`` is ignored off the root)."""

    @abc.abstractmethod
    def gather(self, x: np.ndarray, group: tuple[int, ...], root: int, dim: int, blocks: int = 1) -> np.ndarray | None:
        """The pieces joined on the root; None elsewhere."""

    @abc.abstractmethod
    def reduce(self, x: np.ndarray, group: tuple[int, ...], root: int) -> np.ndarray | None:
        """The sum (in rank order) on the root; None elsewhere."""

    @abc.abstractmethod
    def send(self, x: np.ndarray, dst: int, tag: int = 0) -> None:
        """Buffered: returns without waiting for the receiver. FIFO per (source, destination, tag)."""

    @abc.abstractmethod
    def recv(self, src: int, tag: int = 0) -> np.ndarray:
        """The oldest array ``src`` sent here with ``tag``; waits for it (bounded by the timeout)."""

    @abc.abstractmethod
    def barrier(self, group: tuple[int, ...]) -> None:
        """Returns once every member has called it."""


# --- threads in one process -----------------------------------------------------------------------

_POLL_S = 0.1  # longest single wait: abort also notifies, this only bounds a missed wakeup
# all_reduce sums and copies out its chunk in pieces of this size, which stay in the 2 MiB L2:
# at 4 ranks faster than whole chunks, at 2 and 8 as fast (docs/measurements.md#all-reduce-pieces)
_PIECE_BYTES = 1 << 20


class _Slot:
    """The meeting place of the k-th collective on one group."""

    def __init__(self, key: tuple, n: int):
        self.key = key
        self.cond = threading.Condition(threading.Lock())
        self.arrived: dict[str, set[int]] = {}  # phase -> ranks that reached it
        self.calls: list = [None] * n  # rank -> (kind, attrs, compared dtype/shape, (dtype, shape))
        self.inputs: list = [None] * n  # rank -> what the rank shares (buffers, shapes)
        self.error: str | None = None  # the members' calls disagree
        self.broken: str | None = None  # a member gave up waiting (timeout)
        self.all_arrived = 0.0  # time.perf_counter() when the last member arrived


class _Mailbox:
    """Point-to-point messages from one device to another with one tag, oldest first."""

    def __init__(self):
        self.cond = threading.Condition(threading.Lock())
        self.queue: collections.deque = collections.deque()


@dataclass(slots=True)
class _Call:
    """One member's part in one collective."""

    kind: str
    group: tuple[int, ...]
    seq: int  # the how-manyth collective on this group (from 0)
    rank: int
    n: int
    slot: _Slot
    start: float  # time.perf_counter() at the call

    def __str__(self) -> str:
        return f"{self.kind} #{self.seq} on group {self.group}"


class ThreadWorld:
    """The shared state of ``n_devices`` device threads. One world per run."""

    def __init__(self, n_devices: int, timeout_s: float = 60.0):
        if n_devices < 1:
            raise ValueError(f"a world needs at least one device, got {n_devices}")
        self.n_devices = n_devices
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._slots: dict[tuple, _Slot] = {}
        self._mailboxes: dict[tuple, _Mailbox] = {}
        self._comms: dict[int, ThreadComm] = {}
        self._failed: tuple[int, BaseException] | None = None

    def comm(self, device: int) -> ThreadComm:
        """The handle device thread ``device`` uses (the same one on every call)."""
        if not 0 <= device < self.n_devices:
            raise ValueError(f"device {device} is not in a world of {self.n_devices}")
        with self._lock:
            if device not in self._comms:
                self._comms[device] = ThreadComm(self, device)
            return self._comms[device]

    @property
    def failed(self) -> tuple[int, BaseException] | None:
        """(device, exception) of the first abort, or None."""
        return self._failed

    def abort(self, device: int, exc: BaseException) -> None:
        """Device ``device`` failed with ``exc``: every wait in every thread raises CommAborted."""
        with self._lock:
            if self._failed is None:
                self._failed = (device, exc)
            waiting = list(self._slots.values()) + list(self._mailboxes.values())
        for w in waiting:  # outside self._lock: a member may hold a slot's lock and want ours
            with w.cond:
                w.cond.notify_all()

    def _slot(self, group: tuple[int, ...], seq: int) -> _Slot:
        with self._lock:
            slot = self._slots.get((group, seq))
            if slot is None:
                slot = self._slots[(group, seq)] = _Slot((group, seq), len(group))
            return slot

    def _drop(self, slot: _Slot) -> None:
        with self._lock:
            self._slots.pop(slot.key, None)

    def _mailbox(self, src: int, dst: int, tag: int) -> _Mailbox:
        with self._lock:
            box = self._mailboxes.get((src, dst, tag))
            if box is None:
                box = self._mailboxes[(src, dst, tag)] = _Mailbox()
            return box


def _describe(kind: str, attrs: tuple, data: tuple | None) -> str:
    args = ", ".join(f"{k}={v}" for k, v in attrs)
    if data is None:
        return f"{kind}({args})"
    dtype, shape = data
    return f"{kind}({args}) on {dtype}{list(shape)}"


def _disagreement(slot: _Slot, group: tuple[int, ...], seq: int) -> str | None:
    """Why the members' calls in ``slot`` are not the same collective, or None."""
    calls = slot.calls
    data = {c[2] for c in calls if c[2] is not None}
    if len({(c[0], c[1]) for c in calls}) == 1 and len(data) <= 1:
        return None
    by_call: dict[str, list[int]] = {}
    for device, c in zip(group, calls):
        by_call.setdefault(_describe(c[0], c[1], c[3]), []).append(device)
    what = "; ".join(
        f"device{'s' if len(ds) > 1 else ''} {', '.join(map(str, ds))} called {desc}" for desc, ds in by_call.items()
    )
    return f"collective #{seq} on group {group}: members called different collectives: {what}"


class ThreadComm(Communicator):
    """One device thread's communicator in a ThreadWorld (get it with ``world.comm(device)``)."""

    def __init__(self, world: ThreadWorld, device: int):
        self.world = world
        self.device = device
        self.log: list[dict] = []
        # where results are allocated: the executor plugs in its buffer pool, so a collective's
        # result reuses a dead buffer instead of paying page faults for a fresh one
        self.alloc: Callable[[tuple[int, ...], np.dtype], np.ndarray] = np.empty
        self._seq: dict[tuple[int, ...], int] = {}
        self._ranks: dict[tuple[int, ...], int] = {}

    # --- rendezvous ---

    def _rank(self, group: tuple[int, ...]) -> int:
        rank = self._ranks.get(group) if isinstance(group, tuple) else None
        if rank is not None:
            return rank
        if not (
            isinstance(group, tuple)
            and group
            and len(set(group)) == len(group)
            and all(isinstance(d, int) and 0 <= d < self.world.n_devices for d in group)
        ):
            raise ValueError(
                f"group must be a non-empty tuple of distinct device ids below {self.world.n_devices}, got {group!r}"
            )
        if self.device not in group:
            raise ValueError(f"device {self.device} called a collective on group {group} it is not a member of")
        self._ranks[group] = rank = group.index(self.device)
        return rank

    def _check_root(self, group: tuple[int, ...], root: int) -> bool:
        """Validate ``root`` (a rank in ``group``, as in MPI); True on the root."""
        rank = self._rank(group)
        if not (isinstance(root, int) and 0 <= root < len(group)):
            raise ValueError(f"root must be a rank of group {group} (0..{len(group) - 1}), got {root!r}")
        return rank == root

    def _aborted(self, what: str) -> CommAborted:
        failed = self.world.failed
        assert failed is not None  # called once the world has failed
        device, exc = failed
        return CommAborted(
            f"device {device} failed ({type(exc).__name__}: {exc}); device {self.device} abandoned {what}"
        )

    def _begin(
        self, kind: str, group: tuple[int, ...], attrs: tuple, x: np.ndarray | None, shared, free_dim: int | None = None
    ) -> _Call:
        """Enter the next collective on ``group``: share ``shared``, wait for every member, check the calls.

        Members must agree on kind, attrs, and the dtype and shape of ``x`` (None: not compared),
        except along ``free_dim`` (gathered pieces of uneven sizes)."""
        rank = self._rank(group)
        seq = self._seq.get(group, 0)
        self._seq[group] = seq + 1
        call = _Call(kind, group, seq, rank, len(group), self.world._slot(group, seq), time.perf_counter())
        data = None
        if x is not None:
            data = (x.dtype.str, x.shape if free_dim is None else with_dim(x.shape, free_dim, -1))
        call.slot.calls[rank] = (kind, attrs, data, None if x is None else (x.dtype, x.shape))
        call.slot.inputs[rank] = shared
        self._meet(call, "arrive", final=kind == "barrier")
        return call

    def _meet(self, call: _Call, phase: str, final: bool = False) -> None:
        """Wait until every member of the call's group has reached ``phase``."""
        slot = call.slot
        completed = False
        with slot.cond:
            if self.world.failed:
                raise self._aborted(str(call))
            if slot.broken:
                raise CommError(f"{slot.broken}; device {self.device} arrived after that")
            here = slot.arrived.setdefault(phase, set())
            here.add(call.rank)
            if len(here) == call.n:
                completed = True
                if phase == "arrive":
                    slot.all_arrived = time.perf_counter()
                    slot.error = _disagreement(slot, call.group, call.seq)
                slot.cond.notify_all()
            else:
                deadline = time.monotonic() + self.world.timeout_s
                while len(here) < call.n:
                    if self.world.failed:
                        raise self._aborted(str(call))
                    if slot.broken:
                        raise CommError(slot.broken)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        missing = tuple(d for r, d in enumerate(call.group) if r not in here)
                        verb = "arrive" if phase == "arrive" else f"reach phase {phase!r}"
                        slot.broken = (
                            f"{call}: devices {missing} did not {verb} within "
                            f"{self.world.timeout_s:g} s (device {self.device} waiting)"
                        )
                        slot.cond.notify_all()
                        raise CommError(slot.broken)
                    slot.cond.wait(min(remaining, _POLL_S))
            error = slot.error
        if completed and (final or error):
            self.world._drop(slot)
        if error:
            raise CommError(error)

    def _end(self, call: _Call, nbytes: int) -> None:
        """Wait until every member is done with the others' buffers; record the call."""
        if call.kind != "barrier":
            self._meet(call, "done", final=True)
        waited = max(0.0, call.slot.all_arrived - call.start)  # for the last member to arrive
        self._record(call.kind, call.group, nbytes, call.start, seq=call.seq, waited=waited)

    # --- collectives ---

    def all_reduce(self, x, group, inplace=False):
        x, src, out = self._reduce_buffers(x, inplace)
        flat_src, flat_out = src.reshape(-1), out.reshape(-1)
        call = self._begin("all_reduce", group, (), x, (flat_src, flat_out))
        n, rank, shared = call.n, call.rank, call.slot.inputs
        # rank r alone reads chunk r of the inputs and writes chunk r of the outputs, so it can sum
        # it (reduce-scatter) and push the sum into every output (all-gather) without another meeting
        # piece by piece, so the sum is still in cache when it is copied out
        lo, hi = chunk_bounds(flat_src.size, n, rank, x.itemsize)
        step = max(1, _PIECE_BYTES // x.itemsize)
        for a in range(lo, hi, step):
            b = min(a + step, hi)
            mine = flat_out[a:b]
            sum_in_rank_order(mine, [s[a:b] for s, _ in shared], rank if inplace else None)
            for r, (_, other_out) in enumerate(shared):
                if r != rank:
                    np.copyto(other_out[a:b], mine)
        self._end(call, x.nbytes)
        return out

    def reduce(self, x, group, root):
        x = np.asarray(x)
        self._check_root(group, root)
        call = self._begin("reduce", group, (("root", root),), x, x)
        out = None
        if call.rank == root:
            out = self.alloc(x.shape, x.dtype)
            sum_in_rank_order(out, list(call.slot.inputs))
        self._end(call, x.nbytes)
        return out

    def reduce_scatter(self, x, group, dim, blocks=1):
        x = np.asarray(x)
        n = len(group)
        d = normalize_dim(dim, x.ndim)
        check_split(x.shape[d], n, blocks, "reduce_scatter")
        call = self._begin("reduce_scatter", group, (("dim", dim), ("blocks", blocks)), x, x)
        out = self.alloc(with_dim(x.shape, d, piece_len(x.shape[d], n, call.rank, blocks)), x.dtype)
        parts = [piece_view(other, pick={d: (n, call.rank, blocks)}) for other in call.slot.inputs]
        sum_in_rank_order(piece_view(out, local={d: blocks}), parts)
        self._end(call, x.nbytes)
        return out

    def all_gather(self, x, group, dim, blocks=1):
        x = np.asarray(x)
        d = normalize_dim(dim, x.ndim)
        check_split(x.shape[d] * len(group), len(group), blocks, "all_gather")
        free = d if blocks == 1 else None
        call = self._begin("all_gather", group, (("dim", dim), ("blocks", blocks)), x, x, free)
        out = join_pieces(list(call.slot.inputs), d, blocks, self.alloc)
        self._end(call, out.nbytes)
        return out

    def gather(self, x, group, root, dim, blocks=1):
        x = np.asarray(x)
        d = normalize_dim(dim, x.ndim)
        check_split(x.shape[d] * len(group), len(group), blocks, "gather")
        attrs = (("root", root), ("dim", dim), ("blocks", blocks))
        self._check_root(group, root)
        call = self._begin("gather", group, attrs, x, x, d if blocks == 1 else None)
        pieces = list(call.slot.inputs)
        out = join_pieces(pieces, d, blocks, self.alloc) if call.rank == root else None
        self._end(call, sum(p.nbytes for p in pieces))
        return out

    def broadcast(self, x, group, root):
        mine = self._check_root(group, root)
        x = np.asarray(x) if mine else None
        call = self._begin("broadcast", group, (("root", root),), x, x)
        whole = call.slot.inputs[root]
        out = self.alloc(whole.shape, whole.dtype)
        np.copyto(out, whole)
        self._end(call, whole.nbytes)
        return out

    def scatter(self, x, group, root, dim, blocks=1):
        mine = self._check_root(group, root)
        x = np.asarray(x) if mine else None
        call = self._begin("scatter", group, (("root", root), ("dim", dim), ("blocks", blocks)), x, x)
        whole = call.slot.inputs[root]
        n = call.n
        d = normalize_dim(dim, whole.ndim)
        check_split(whole.shape[d], n, blocks, "scatter")  # every member raises the same error
        out = self.alloc(with_dim(whole.shape, d, piece_len(whole.shape[d], n, call.rank, blocks)), whole.dtype)
        np.copyto(piece_view(out, local={d: blocks}), piece_view(whole, pick={d: (n, call.rank, blocks)}))
        self._end(call, whole.nbytes)
        return out

    def all_to_all(self, x, group, split_dim, concat_dim, split_blocks=1, concat_blocks=1):
        x, n, sd, cd, attrs = all_to_all_args(x, group, split_dim, concat_dim, split_blocks, concat_blocks)
        call = self._begin("all_to_all", group, attrs, x, x)
        shape = with_dim(x.shape, sd, piece_len(x.shape[sd], n, call.rank, split_blocks))
        out = self.alloc(with_dim(shape, cd, x.shape[cd] * n), x.dtype)
        for r, other in enumerate(call.slot.inputs):
            dst = piece_view(out, pick={cd: (n, r, concat_blocks)}, local={sd: split_blocks})
            np.copyto(dst, piece_view(other, pick={sd: (n, call.rank, split_blocks)}, local={cd: concat_blocks}))
        self._end(call, x.nbytes)
        return out

    def barrier(self, group):
        call = self._begin("barrier", group, (), None, None)
        self._end(call, 0)

    # --- point to point ---

    def send(self, x, dst, tag=0):
        if not 0 <= dst < self.world.n_devices:
            raise ValueError(f"send to device {dst}: not in a world of {self.world.n_devices}")
        start = time.perf_counter()
        what = f"send to device {dst} (tag {tag})"
        if self.world.failed:
            raise self._aborted(what)
        message = np.array(x, copy=True, order="C")
        box = self.world._mailbox(self.device, dst, tag)
        with box.cond:
            box.queue.append(message)
            box.cond.notify_all()
        self._record("send", (self.device, dst), message.nbytes, start, tag=tag)

    def recv(self, src, tag=0):
        if not 0 <= src < self.world.n_devices:
            raise ValueError(f"recv from device {src}: not in a world of {self.world.n_devices}")
        start = time.perf_counter()
        what = f"recv from device {src} (tag {tag}) on device {self.device}"
        box = self.world._mailbox(src, self.device, tag)
        deadline = time.monotonic() + self.world.timeout_s
        with box.cond:
            while not box.queue:
                if self.world.failed:
                    raise self._aborted(what)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CommError(f"{what}: nothing arrived within {self.world.timeout_s:g} s")
                box.cond.wait(min(remaining, _POLL_S))
            message = box.queue.popleft()
        self._record("recv", (src, self.device), message.nbytes, start, tag=tag)
        return message


# --- helpers of the collectives -------------------------------------------------------------------
