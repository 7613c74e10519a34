"""Collectives between processes: the MPI backend of runtime/comm.py's ``Communicator``.

``MpiComm`` has the same methods and semantics as ``ThreadComm`` (block layouts, in-place
all_reduce, tagged FIFO send/recv), so a device program runs unchanged on either backend. Device
``d`` is rank ``d`` of the world; runtime/mpi_world.py holds the world (sub-communicators, bounded
waits, faults).

Data path. Only the buffer-based, non-blocking calls (``Ialltoallv``, ``Iallgather(v)``,
``Igather(v)``, ``Iscatterv``, ``Ibcast``, ``Ibarrier``, ``Isend``, ``Irecv``) on raw bytes: nothing
is pickled, and any dtype numpy has (bfloat16 included) travels, because MPI never does
arithmetic here. Sums are our own: MPI_SUM's order of addition is unspecified, while the threaded
backend adds the ranks' inputs in rank order 0..n-1. So all_reduce is an all-to-all of chunks
(rank r receives chunk r of every input), a rank-ordered sum of its chunk, and an all-gather of
the sums: the traffic of a ring all-reduce, and the same bits as the threaded backend on every
rank. For small inputs (``SMALL_ALL_REDUCE_BYTES``) it is one all-gather of the whole inputs and a
local sum (one latency rather than two). reduce_scatter and reduce sum the same way. A gradient bucket (one flat
all_reduce) is one call. Scratch buffers are kept between calls (fresh large ones cost page
faults every call): a rank keeps about as many bytes as its largest collective moves.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.core.dtypes import BY_SHORT_NAME, SHORT_NAMES
from graphc.runtime.comm import CommError, Communicator, all_to_all_args
from graphc.runtime.mpi_world import DEFAULT_TIMEOUT_S, MpiWorld
from graphc.runtime.pieces import (
    check_split,
    chunk_bounds,
    normalize_dim,
    piece_len,
    piece_view,
    sum_in_rank_order,
    with_dim,
)

# all_reduce while (n-1) x its bytes stay under this: one all-gather of the inputs and a local sum
# (one latency, (n-1) x the bytes per rank); above, all-to-all + all-gather of chunks (two latencies,
# 2(n-1)/n x the bytes: a ring's traffic). At 2 ranks the all-gather form was the faster up to
# 256 KiB and the slower at 1 MiB (docs/measurements.md#mpi-small-all-reduce).
SMALL_ALL_REDUCE_BYTES = 256 << 10
_HEADER_BYTES = 128  # send/recv: "dtype|d0,d1,..." in front of the data
_CHECK_BYTES = 512  # a call's description, exchanged when calls are checked


@dataclass(slots=True)
class _Call:
    """One rank's part in one collective."""

    kind: str
    group: tuple[int, ...]
    seq: int
    rank: int
    n: int
    comm: Any  # the group's sub-communicator (None for a group of one)
    start: float

    def __str__(self) -> str:
        return f"{self.kind} #{self.seq} on group {self.group}"


def _bytes(a: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array, as a flat uint8 view."""
    return a.reshape(-1).view(np.uint8)


def _leading(shape: tuple[int, ...], dim: int) -> bool:
    """Whether pieces of ``dim`` are contiguous runs of a C-contiguous array (no dim before it is > 1)."""
    return all(s == 1 for s in shape[:dim])


def _offsets(counts: list[int]) -> list[int]:
    out, total = [], 0
    for c in counts:
        out.append(total)
        total += c
    return out


def _dtype_name(dtype: np.dtype) -> str:
    return SHORT_NAMES.get(np.dtype(dtype), np.dtype(dtype).str)


def _dtype_of(name: str) -> np.dtype:
    return BY_SHORT_NAME.get(name) or np.dtype(name)


class MpiComm(Communicator):
    """Device ``device``'s communicator: rank ``device`` of the world (module doc).

    ``check_calls``: before each collective, the members exchange a description of their call
    (kind, attributes, dtype, shape) and raise ``CommError`` naming what each called when they
    differ, as the threaded backend always does; one small all-gather per collective, so the
    runtime checks a program's first run and trusts the rest (set ``GRAPHC_MPI_CHECK=1`` to check
    every call). ``static_calls``: the program's calls are the same every run, so the piece
    lengths an all_gather exchanges are remembered by (group, sequence number, shape)."""

    def __init__(self, world: MpiWorld, device: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.world = world
        self.MPI = world.MPI
        self.device = world.rank if device is None else device
        if self.device != world.rank:
            raise ValueError(f"device {self.device} runs on rank {self.device}, not on rank {world.rank}")
        self.timeout_s = float(timeout_s)
        self.log: list[dict] = []
        self.alloc: Callable[[tuple[int, ...], np.dtype], np.ndarray] = np.empty
        self.check_calls = os.environ.get("GRAPHC_MPI_CHECK", "") not in ("", "0")
        self.static_calls = False
        self._seq: dict[tuple[int, ...], int] = {}
        self._ranks: dict[tuple[int, ...], int] = {}
        self._lengths: dict[tuple, list[int]] = {}
        self._scratch_bufs: dict[str, np.ndarray] = {}
        self._sends: list[tuple[Any, np.ndarray]] = []

    def begin_run(self) -> None:
        """A new run of the same program: sequence numbers start again from 0 (as a fresh ThreadWorld's)."""
        self._seq.clear()

    # --- bookkeeping -----------------------------------------------------------------------------

    def _rank(self, group: tuple[int, ...]) -> int:
        rank = self._ranks.get(group) if isinstance(group, tuple) else None
        if rank is not None:
            return rank
        n = self.world.n_devices
        if not (
            isinstance(group, tuple)
            and group
            and len(set(group)) == len(group)
            and all(isinstance(d, int) and 0 <= d < n for d in group)
        ):
            raise ValueError(f"group must be a non-empty tuple of distinct device ids below {n}, got {group!r}")
        if self.device not in group:
            raise ValueError(f"device {self.device} called a collective on group {group} it is not a member of")
        self._ranks[group] = rank = group.index(self.device)
        return rank

    def _check_root(self, group: tuple[int, ...], root: int) -> None:
        self._rank(group)
        if not (isinstance(root, int) and 0 <= root < len(group)):
            raise ValueError(f"root must be a rank of group {group} (0..{len(group) - 1}), got {root!r}")

    def _begin(self, kind: str, group, attrs: tuple, x: np.ndarray | None, free_dim: int | None = None) -> _Call:
        rank = self._rank(group)
        seq = self._seq.get(group, 0)
        self._seq[group] = seq + 1
        comm = self.world.sub(group) if len(group) > 1 else None
        call = _Call(kind, group, seq, rank, len(group), comm, time.perf_counter())
        if self.world.failed is not None:
            raise self.world.aborted(str(call), self.device)
        if self.check_calls and comm is not None:
            self._check(call, attrs, x, free_dim)
        return call

    def _check(self, call: _Call, attrs: tuple, x: np.ndarray | None, free_dim: int | None) -> None:
        """The members' calls agree (kind, attrs, dtype and shape but along ``free_dim``), or CommError."""
        args = ", ".join(f"{k}={v}" for k, v in attrs)
        compared = shown = f"{call.kind}({args})"
        data = ""  # members that pass no data (off the root) are not compared on it
        if x is not None:
            masked = list(x.shape) if free_dim is None else [*x.shape[:free_dim], -1, *x.shape[free_dim + 1 :]]
            data = f"{x.dtype}{masked}"
            shown += f" on {x.dtype}{list(x.shape)}"
        text = "\n".join((compared, data, shown)).encode()[:_CHECK_BYTES]
        mine = np.zeros(_CHECK_BYTES, np.uint8)
        mine[: len(text)] = np.frombuffer(text, np.uint8)
        every = self._scratch("check", call.n * _CHECK_BYTES)
        self._wait(call.comm.Iallgather([mine, self.MPI.BYTE], [every, self.MPI.BYTE]), f"checking {call}")
        texts = [bytes(every[r * _CHECK_BYTES : (r + 1) * _CHECK_BYTES]).rstrip(b"\0").decode() for r in range(call.n)]
        lines = [t.split("\n") for t in texts]
        if len({ln[0] for ln in lines}) == 1 and len({ln[1] for ln in lines if ln[1]}) <= 1:
            return
        by_call: dict[str, list[int]] = {}
        for device, t in zip(call.group, texts):
            by_call.setdefault(t.split("\n")[2], []).append(device)
        what = "; ".join(
            f"device{'s' if len(ds) > 1 else ''} {', '.join(map(str, ds))} called {desc}"
            for desc, ds in by_call.items()
        )
        raise CommError(f"collective #{call.seq} on group {call.group}: members called different collectives: {what}")

    def _wait(self, req: Any, what: str) -> None:
        self.world.wait(req, what, self.timeout_s, self.device)

    def _scratch(self, name: str, nbytes: int) -> np.ndarray:
        """A reused byte buffer (fresh large buffers cost page faults every call)."""
        buf = self._scratch_bufs.get(name)
        if buf is None or buf.size < nbytes:
            buf = self._scratch_bufs[name] = np.empty(max(nbytes, 64), np.uint8)
        return buf[:nbytes]

    def _end(self, call: _Call, nbytes: int) -> None:
        self._record(call.kind, call.group, nbytes, call.start, seq=call.seq)

    # --- collectives -----------------------------------------------------------------------------

    def all_reduce(self, x, group, inplace=False):
        x, src, out = self._reduce_buffers(x, inplace)
        call = self._begin("all_reduce", group, (), x)
        n, rank = call.n, call.rank
        flat_src, flat_out = src.reshape(-1), out.reshape(-1)
        own = rank if inplace else None
        if n == 1:
            if not inplace:
                np.copyto(out, src)
        elif x.nbytes * (n - 1) <= SMALL_ALL_REDUCE_BYTES:
            every = self._scratch("recv", n * x.nbytes)
            self._wait(call.comm.Iallgather([_bytes(src), self.MPI.BYTE], [every, self.MPI.BYTE]), str(call))
            parts = [every[r * x.nbytes : (r + 1) * x.nbytes].view(x.dtype) for r in range(n)]
            parts[rank] = flat_src
            sum_in_rank_order(flat_out, parts, own)
        else:
            self._all_reduce_chunks(call, flat_src, flat_out, own)
        self._end(call, x.nbytes)
        return out

    def _all_reduce_chunks(self, call: _Call, flat_src: np.ndarray, flat_out: np.ndarray, own: int | None) -> None:
        """Rank r sums chunk r of every input in rank order, then every rank gets every sum."""
        n, rank, itemsize = call.n, call.rank, flat_src.itemsize
        bounds = [chunk_bounds(flat_src.size, n, r, itemsize) for r in range(n)]
        lo, hi = bounds[rank]
        mine = (hi - lo) * itemsize
        counts = [(b - a) * itemsize for a, b in bounds]
        displs = [a * itemsize for a, _ in bounds]
        send_counts = [0 if r == rank else c for r, c in enumerate(counts)]  # our own chunk is read in place
        recv_counts = [0 if r == rank else mine for r in range(n)]
        recv = self._scratch("recv", n * mine)
        req = call.comm.Ialltoallv(
            [_bytes(flat_src), (send_counts, displs), self.MPI.BYTE],
            [recv, (recv_counts, [r * mine for r in range(n)]), self.MPI.BYTE],
        )
        self._wait(req, str(call))
        parts = [recv[r * mine : (r + 1) * mine].view(flat_src.dtype) for r in range(n)]
        parts[rank] = flat_src[lo:hi]
        sum_in_rank_order(flat_out[lo:hi], parts, own)
        req = call.comm.Iallgatherv(self.MPI.IN_PLACE, [_bytes(flat_out), (counts, displs), self.MPI.BYTE])
        self._wait(req, str(call))

    def reduce_scatter(self, x, group, dim, blocks=1):
        x = np.asarray(x)
        n = len(group)
        d = normalize_dim(dim, x.ndim)
        check_split(x.shape[d], n, blocks, "reduce_scatter")
        call = self._begin("reduce_scatter", group, (("dim", dim), ("blocks", blocks)), x)
        rank = call.rank
        out = self.alloc(with_dim(x.shape, d, piece_len(x.shape[d], n, rank, blocks)), x.dtype)
        own = piece_view(x, pick={d: (n, rank, blocks)})
        if n == 1:
            np.copyto(piece_view(out, local={d: blocks}), own)
        else:
            packed, counts, displs = self._pack(x, d, blocks, n, rank)
            mine = out.nbytes
            recv = self._scratch("recv", n * mine)
            recv_counts = [0 if r == rank else mine for r in range(n)]
            req = call.comm.Ialltoallv(
                [packed, (counts, displs), self.MPI.BYTE],
                [recv, (recv_counts, [r * mine for r in range(n)]), self.MPI.BYTE],
            )
            self._wait(req, str(call))
            parts = [
                own
                if r == rank
                else piece_view(recv[r * mine : (r + 1) * mine].view(x.dtype).reshape(out.shape), local={d: blocks})
                for r in range(n)
            ]
            sum_in_rank_order(piece_view(out, local={d: blocks}), parts)
        self._end(call, x.nbytes)
        return out

    def _pack(self, x: np.ndarray, d: int, blocks: int, n: int, skip: int) -> tuple[np.ndarray, list[int], list[int]]:
        """Piece j of ``x``'s dim ``d`` for every rank j (none for rank ``skip``): (bytes, byte
        counts, byte displacements). ``x`` itself when its pieces are contiguous runs of it, else
        the pieces copied back to back into a scratch buffer."""
        row = x.itemsize * (x.size // x.shape[d] if x.shape[d] else 0)
        whole = [piece_len(x.shape[d], n, j, blocks) * row for j in range(n)]
        counts = [0 if j == skip else c for j, c in enumerate(whole)]
        if blocks == 1 and _leading(x.shape, d) and x.flags.c_contiguous:
            return _bytes(x), counts, _offsets(whole)
        packed = self._scratch("send", sum(counts))
        at = 0
        for j in range(n):
            if j == skip:
                continue
            shape = with_dim(x.shape, d, piece_len(x.shape[d], n, j, blocks))
            dst = packed[at : at + counts[j]].view(x.dtype).reshape(shape)
            np.copyto(piece_view(dst, local={d: blocks}), piece_view(x, pick={d: (n, j, blocks)}))
            at += counts[j]
        return packed, counts, _offsets(counts)

    def all_gather(self, x, group, dim, blocks=1):
        x = np.asarray(x)
        n = len(group)
        d = normalize_dim(dim, x.ndim)
        check_split(x.shape[d] * n, n, blocks, "all_gather")
        call = self._begin("all_gather", group, (("dim", dim), ("blocks", blocks)), x, d if blocks == 1 else None)
        lengths = self._piece_lengths(call, x, d) if blocks == 1 else [x.shape[d]] * n
        out = self.alloc(with_dim(x.shape, d, sum(lengths)), x.dtype)
        if n == 1:
            np.copyto(out, x)
        else:
            self._gather_into(call, np.ascontiguousarray(x), d, blocks, lengths, out, None)
        self._end(call, out.nbytes)
        return out

    def _piece_lengths(self, call: _Call, x: np.ndarray, d: int) -> list[int]:
        """Every member's length along ``d`` (pieces may be uneven: one small all-gather)."""
        if call.n == 1:
            return [x.shape[d]]
        key = (call.group, call.seq, x.shape, d)
        hit = self._lengths.get(key) if self.static_calls else None
        if hit is not None:
            return hit
        mine = np.array([x.shape[d]], np.int64)
        every = np.empty(call.n, np.int64)
        self._wait(call.comm.Iallgather([mine, self.MPI.INT64_T], [every, self.MPI.INT64_T]), f"{call} (piece sizes)")
        lengths = [int(v) for v in every]
        if self.static_calls:
            self._lengths[key] = lengths
        return lengths

    def _gather_into(
        self,
        call: _Call,
        x: np.ndarray,
        d: int,
        blocks: int,
        lengths: list[int],
        out: np.ndarray | None,
        root: int | None,
    ) -> None:
        """Every member's piece of ``d`` joined into ``out`` (on every rank, or on ``root`` only)."""
        n = call.n
        row = x.itemsize * (x.size // x.shape[d] if x.shape[d] else 0)
        counts = [length * row for length in lengths]
        displs = _offsets(counts)
        receiving = root is None or call.rank == root
        direct = blocks == 1 and _leading(x.shape, d)  # the pieces are contiguous runs of out
        if not receiving:
            recv = None
        elif direct:
            assert out is not None
            recv = [_bytes(out), (counts, displs), self.MPI.BYTE]
        else:
            recv = [self._scratch("recv", sum(counts)), (counts, displs), self.MPI.BYTE]
        if root is None:
            req = call.comm.Iallgatherv([_bytes(x), self.MPI.BYTE], recv)
        else:
            req = call.comm.Igatherv([_bytes(x), self.MPI.BYTE], recv, root=root)
        self._wait(req, str(call))
        if not receiving or direct:
            return
        assert out is not None and recv is not None
        staged = recv[0]
        at = 0
        for r in range(n):
            piece = staged[displs[r] : displs[r] + counts[r]].view(x.dtype).reshape(with_dim(x.shape, d, lengths[r]))
            if blocks == 1:
                index = [slice(None)] * x.ndim
                index[d] = slice(at, at + lengths[r])
                np.copyto(out[tuple(index)], piece)
                at += lengths[r]
            else:
                np.copyto(piece_view(out, pick={d: (n, r, blocks)}), piece_view(piece, local={d: blocks}))

    def gather(self, x, group, root, dim, blocks=1):
        x = np.asarray(x)
        n = len(group)
        d = normalize_dim(dim, x.ndim)
        check_split(x.shape[d] * n, n, blocks, "gather")
        self._check_root(group, root)
        attrs = (("root", root), ("dim", dim), ("blocks", blocks))
        call = self._begin("gather", group, attrs, x, d if blocks == 1 else None)
        lengths = self._piece_lengths(call, x, d) if blocks == 1 else [x.shape[d]] * n
        whole = with_dim(x.shape, d, sum(lengths))
        out = self.alloc(whole, x.dtype) if call.rank == root else None
        if n == 1:
            assert out is not None
            np.copyto(out, x)
        else:
            self._gather_into(call, np.ascontiguousarray(x), d, blocks, lengths, out, root)
        self._end(call, int(np.prod(whole, dtype=np.int64)) * x.itemsize)
        return out

    def reduce(self, x, group, root):
        x = np.ascontiguousarray(np.asarray(x))
        self._check_root(group, root)
        call = self._begin("reduce", group, (("root", root),), x)
        out = None
        if call.n == 1:
            out = self.alloc(x.shape, x.dtype)
            np.copyto(out, x)
        else:
            every = self._scratch("recv", call.n * x.nbytes) if call.rank == root else None
            recv = [every, self.MPI.BYTE] if every is not None else None
            self._wait(call.comm.Igather([_bytes(x), self.MPI.BYTE], recv, root=root), str(call))
            if every is not None:
                out = self.alloc(x.shape, x.dtype)
                parts = [every[r * x.nbytes : (r + 1) * x.nbytes].view(x.dtype).reshape(x.shape) for r in range(call.n)]
                parts[root] = x
                sum_in_rank_order(out, parts)
        self._end(call, x.nbytes)
        return out

    def _header(self, call: _Call, x: np.ndarray | None, root: int) -> tuple[np.dtype, tuple[int, ...]]:
        """The root's dtype and shape on every member (one small broadcast)."""
        buf = np.zeros(_HEADER_BYTES, np.uint8)
        if call.rank == root:
            assert x is not None
            _write_header(buf, x)
        self._wait(call.comm.Ibcast([buf, self.MPI.BYTE], root=root), f"{call} (header)")
        return _read_header(buf)

    def broadcast(self, x, group, root):
        self._check_root(group, root)
        mine = self._rank(group) == root
        x = np.ascontiguousarray(np.asarray(x)) if mine else None
        call = self._begin("broadcast", group, (("root", root),), x)
        if call.n == 1:
            assert x is not None
            out = self.alloc(x.shape, x.dtype)
            np.copyto(out, x)
        else:
            dtype, shape = self._header(call, x, root)
            out = self.alloc(shape, dtype)
            if x is not None:
                np.copyto(out, x)
            self._wait(call.comm.Ibcast([_bytes(out), self.MPI.BYTE], root=root), str(call))
        self._end(call, out.nbytes)
        return out

    def scatter(self, x, group, root, dim, blocks=1):
        self._check_root(group, root)
        n = len(group)
        mine = self._rank(group) == root
        x = np.asarray(x) if mine else None
        call = self._begin("scatter", group, (("root", root), ("dim", dim), ("blocks", blocks)), x)
        if n > 1:
            dtype, shape = self._header(call, x, root)  # the root's; the root writes it
        else:
            assert x is not None
            dtype, shape = x.dtype, x.shape
        d = normalize_dim(dim, len(shape))
        check_split(shape[d], n, blocks, "scatter")
        out = self.alloc(with_dim(shape, d, piece_len(shape[d], n, call.rank, blocks)), dtype)
        if n == 1:
            assert x is not None
            np.copyto(piece_view(out, local={d: blocks}), piece_view(x, pick={d: (n, 0, blocks)}))
        else:
            send = None
            if x is not None:
                packed, counts, displs = self._pack(np.ascontiguousarray(x), d, blocks, n, -1)
                send = [packed, (counts, displs), self.MPI.BYTE]
            staged = self._scratch("recv", out.nbytes)
            self._wait(call.comm.Iscatterv(send, [staged, self.MPI.BYTE], root=root), str(call))
            np.copyto(out, staged.view(dtype).reshape(out.shape))
        self._end(call, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
        return out

    def all_to_all(self, x, group, split_dim, concat_dim, split_blocks=1, concat_blocks=1):
        x, n, sd, cd, attrs = all_to_all_args(x, group, split_dim, concat_dim, split_blocks, concat_blocks)
        call = self._begin("all_to_all", group, attrs, x)
        rank = call.rank
        shape = with_dim(x.shape, sd, piece_len(x.shape[sd], n, rank, split_blocks))
        out = self.alloc(with_dim(shape, cd, x.shape[cd] * n), x.dtype)

        def piece_of(j: int) -> np.ndarray:  # what this rank sends to rank j
            return piece_view(x, pick={sd: (n, j, split_blocks)}, local={cd: concat_blocks})

        def place_of(r: int) -> np.ndarray:  # where rank r's piece goes
            return piece_view(out, pick={cd: (n, r, concat_blocks)}, local={sd: split_blocks})

        np.copyto(place_of(rank), piece_of(rank))
        if n > 1:
            counts = [0 if j == rank else piece_of(j).size * x.itemsize for j in range(n)]
            packed = self._scratch("send", sum(counts))
            at = 0
            for j in range(n):
                if j != rank:
                    p = piece_of(j)
                    np.copyto(packed[at : at + counts[j]].view(x.dtype).reshape(p.shape), p)
                    at += counts[j]
            recv_shape = piece_of(rank).shape
            mine = piece_of(rank).size * x.itemsize
            recv_counts = [0 if r == rank else mine for r in range(n)]
            recv = self._scratch("recv", n * mine)
            req = call.comm.Ialltoallv(
                [packed, (counts, _offsets(counts)), self.MPI.BYTE],
                [recv, (recv_counts, [r * mine for r in range(n)]), self.MPI.BYTE],
            )
            self._wait(req, str(call))
            for r in range(n):
                if r != rank:
                    np.copyto(place_of(r), recv[r * mine : (r + 1) * mine].view(x.dtype).reshape(recv_shape))
        self._end(call, x.nbytes)
        return out

    def barrier(self, group):
        call = self._begin("barrier", group, (), None)
        if call.n > 1:
            self._wait(call.comm.Ibarrier(), str(call))
        self._end(call, 0)

    # --- point to point --------------------------------------------------------------------------

    def send(self, x, dst, tag=0):
        n = self.world.n_devices
        if not 0 <= dst < n:
            raise ValueError(f"send to device {dst}: not in a world of {n}")
        if not 0 <= tag <= self.world.tag_ub:
            raise ValueError(f"send tag {tag} is outside MPI's range 0..{self.world.tag_ub}")
        start = time.perf_counter()
        if self.world.failed is not None:
            raise self.world.aborted(f"send to device {dst} (tag {tag})", self.device)
        x = np.asarray(x)
        message = np.empty(_HEADER_BYTES + x.nbytes, np.uint8)  # a copy: the caller may reuse x at once
        _write_header(message[:_HEADER_BYTES], x)
        np.copyto(message[_HEADER_BYTES:].view(x.dtype).reshape(x.shape), x)
        self._sends = [(r, m) for r, m in self._sends if not r.Test()]
        self._sends.append((self.world.p2p(self.timeout_s).Isend([message, self.MPI.BYTE], dest=dst, tag=tag), message))
        self._record("send", (self.device, dst), x.nbytes, start, tag=tag)

    def flush_sends(self) -> None:
        """Wait until every message sent so far has been received (bounded by the timeout)."""
        for req, _message in self._sends:
            self._wait(req, f"a send from device {self.device} being received")
        self._sends.clear()

    def recv(self, src, tag=0):
        n = self.world.n_devices
        if not 0 <= src < n:
            raise ValueError(f"recv from device {src}: not in a world of {n}")
        start = time.perf_counter()
        what = f"recv from device {src} (tag {tag}) on device {self.device}"
        comm = self.world.p2p(self.timeout_s)
        status = self.MPI.Status()
        msg = self.world.poll(lambda: comm.Improbe(src, tag, status), what, self.timeout_s, self.device)
        buf = np.empty(status.Get_count(self.MPI.BYTE), np.uint8)
        self._wait(msg.Irecv([buf, self.MPI.BYTE]), what)
        dtype, shape = _read_header(buf[:_HEADER_BYTES])
        x = buf[_HEADER_BYTES:].view(dtype).reshape(shape)
        self._record("recv", (src, self.device), x.nbytes, start, tag=tag)
        return x


def _write_header(buf: np.ndarray, x: np.ndarray) -> None:
    text = f"{_dtype_name(x.dtype)}|{','.join(map(str, x.shape))}".encode()
    if len(text) > _HEADER_BYTES:
        raise ValueError(f"an array of {x.ndim} dims is too many for a message header")
    buf[:] = 0
    buf[: len(text)] = np.frombuffer(text, np.uint8)


def _read_header(buf: np.ndarray) -> tuple[np.dtype, tuple[int, ...]]:
    name, _, dims = bytes(buf).rstrip(b"\0").decode().partition("|")
    return _dtype_of(name), tuple(int(s) for s in dims.split(",") if s)


__all__ = ["SMALL_ALL_REDUCE_BYTES", "MpiComm"]
