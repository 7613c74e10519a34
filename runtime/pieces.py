"""The layout of a dim split over the ranks of a collective, and the fast numpy views of it that the
threaded (runtime/comm.py) and MPI (runtime/mpi.py) communicators share.

A dim of ``size`` split over ``n`` ranks in ``blocks`` blocks: rank r holds its 1/n share of
every block, concatenated (graphc.core.spec.piece_index). With blocks=1 the split may be uneven:
numpy's array_split layout (piece_bounds). ``graphc.ops.comm.reference`` gives the semantics the
collectives below must reproduce; these helpers only make them fast (views, no index arrays).
"""

from __future__ import annotations

import numpy as np

from graphc.core.dtypes import LOW_FLOATS
from graphc.core.spec import piece_bounds
from graphc.ops.precision import COMPUTE


def check_split(size: int, n: int, blocks: int, what: str) -> None:
    """ValueError unless a dim of ``size`` splits over ``n`` ranks in ``blocks`` equal blocks."""
    if not isinstance(blocks, int) or blocks < 1:
        raise ValueError(f"{what}: blocks must be a positive int, got {blocks!r}")
    if blocks > 1 and size % (blocks * n):
        raise ValueError(f"{what}: a dim of size {size} does not split into {n} pieces of {blocks} blocks")


def piece_len(size: int, n: int, r: int, blocks: int) -> int:
    """The length of rank ``r``'s piece of a dim of ``size`` split over ``n`` ranks."""
    lo, hi = piece_bounds(size, n, r)
    return hi - lo if blocks == 1 else size // n


def piece_view(a: np.ndarray, pick: dict | None = None, local: dict | None = None) -> np.ndarray:
    """``a`` with some dims cut into pieces: a view when ``a`` is C-contiguous (every array written
    through it is one we allocated), possibly a copy otherwise (fine for reading).

    ``pick = {dim: (n, r, blocks)}``: ``a`` holds the whole dim; take rank r's piece of it.
    ``local = {dim: blocks}``: ``a`` holds one rank's piece of the dim.
    Both give the piece as ``[..., blocks, step, ...]`` when blocks > 1 (``[..., length, ...]``
    when blocks == 1), so a picked piece of a whole and a local piece have the same shape and
    copy into each other with one numpy call.
    """
    pick = pick or {}
    local = local or {}
    shape: list[int] = []
    index: list = []
    for d, size in enumerate(a.shape):
        if d in pick:
            n, r, blocks = pick[d]
            if blocks == 1:
                shape.append(size)
                index.append(slice(*piece_bounds(size, n, r)))
            else:
                shape += [blocks, n, size // (blocks * n)]
                index += [slice(None), r, slice(None)]
        elif local.get(d, 1) > 1:
            shape += [local[d], size // local[d]]
            index += [slice(None), slice(None)]
        else:
            shape.append(size)
            index.append(slice(None))
    return a.reshape(shape)[tuple(index)]


def with_dim(shape: tuple[int, ...], dim: int, size: int) -> tuple[int, ...]:
    """``shape`` with dim ``dim`` of length ``size``."""
    return shape[:dim] + (size,) + shape[dim + 1 :]


def sum_in_rank_order(dst: np.ndarray, parts: list[np.ndarray], own: int | None = None) -> None:
    """``dst = ((parts[0] + parts[1]) + parts[2]) + ...``, operands in this order (fixed bits);
    16-bit floats are added in float32 and rounded once.

    ``own``: the index of the part ``dst`` is (in place), or None when ``dst`` is separate.
    """
    n = len(parts)
    if n == 1:
        if own is None:
            np.copyto(dst, parts[0])
        return
    if dst.dtype in LOW_FLOATS:  # bfloat16, float16: added in float32, rounded once (ops/precision.py)
        total = parts[0].astype(COMPUTE)
        for p in parts[1:]:
            np.add(total, p, out=total)
        np.copyto(dst, total, casting="same_kind")
        return
    if own is None or own <= 1:
        np.add(parts[0], parts[1], out=dst)  # dst may be parts[0] or parts[1]: elementwise, read before write
        rest = 2
    else:
        partial = parts[0] + parts[1]  # dst is parts[own]: it must not be overwritten before it is added
        for p in parts[2:own]:
            partial += p
        np.add(partial, parts[own], out=dst)
        rest = own + 1
    for p in parts[rest:]:
        dst += p


def normalize_dim(dim: int, ndim: int) -> int:
    """``dim`` as a non-negative dim of an ``ndim``-d array (ValueError when out of range)."""
    if not -ndim <= dim < ndim:
        raise ValueError(f"dim {dim} is out of range for a {ndim}-d array")
    return dim % ndim


def chunk_bounds(size: int, n: int, r: int, itemsize: int) -> tuple[int, int]:
    """[lo, hi) of chunk r of a flat buffer: n near-equal chunks whose inner boundaries are
    multiples of 64 bytes (on an aligned buffer, two ranks never write the same cache line)."""
    align = max(1, 64 // itemsize)

    def edge(k: int) -> int:
        return min(size, -(-(size * k // n) // align) * align)

    return edge(r), edge(r + 1)


def join_pieces(pieces: list[np.ndarray], dim: int, blocks: int, alloc=np.empty) -> np.ndarray:
    """The ranks' pieces of ``dim`` (rank order) joined into a new whole from ``alloc``."""
    n = len(pieces)
    p0 = pieces[0]
    out = alloc(with_dim(p0.shape, dim, sum(p.shape[dim] for p in pieces)), p0.dtype)
    if blocks == 1:
        return np.concatenate(pieces, axis=dim, out=out)
    for r, p in enumerate(pieces):
        np.copyto(piece_view(out, pick={dim: (n, r, blocks)}), piece_view(p, local={dim: blocks}))
    return out
