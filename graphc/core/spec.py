"""Sharding specs: one placement per mesh axis.

* ``S(d)``: tensor dim ``d`` is split over the axis into equal contiguous pieces, one per device;
  ``S(d, blocks=k)``: dim ``d`` is ``k`` equal blocks and each block is split so (each device holds
  its piece of every block: the layout of a fused QKV weight split by heads);
* ``R``: replicated, every device along the axis holds the whole tensor;
* ``P``: partial sums, the tensor is the sum over the axis of what the devices hold.

A spec is written ``[S(0), R]`` (mesh axes in the mesh's order). A dim is split over at most one
axis, and only evenly: a dim of size ``s`` can be ``S(d, blocks=k)`` over ``n`` devices only when
``s % (k * n) == 0``; uneven splits are not in the strategy space (never silently wrong).

``shard`` and ``unshard`` give the reference meaning of a spec on numpy arrays: tests and the
lowering check themselves against them.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.core.errors import GraphcError


class SpecError(GraphcError, ValueError):
    """A malformed or impossible sharding spec."""


@dataclass(frozen=True, order=True)
class Placement:
    kind: str  # "S", "R" or "P"
    dim: int = -1
    blocks: int = 1

    def __str__(self) -> str:
        if self.kind != "S":
            return self.kind
        return f"S({self.dim})" if self.blocks == 1 else f"S({self.dim}, blocks={self.blocks})"

    __repr__ = __str__

    def __hash__(self) -> int:
        # computed once: specs (tuples of placements) key the planner's tables, a million lookups
        # at 12 layers of the GPT-3 175B slice
        try:
            return self._hash  # type: ignore[attr-defined]
        except AttributeError:
            h = hash((self.kind, self.dim, self.blocks))
            object.__setattr__(self, "_hash", h)
            return h

    def __getstate__(self) -> dict:
        return {"kind": self.kind, "dim": self.dim, "blocks": self.blocks}  # a hash is recomputed in each process

    @property
    def is_split(self) -> bool:
        return self.kind == "S"


R = Placement("R")
P = Placement("P")


_SPLITS: dict[tuple[int, int], Placement] = {}  # one object per split: specs compare by identity first


def S(dim: int, blocks: int = 1) -> Placement:  # noqa: N802 (the notation of the field)
    key = (int(dim), int(blocks))
    got = _SPLITS.get(key)
    if got is None:
        got = _SPLITS[key] = Placement("S", *key)
    return got


_PLACEMENT = re.compile(r"\s*(?:(R)|(P)|S\(\s*(-?\d+)\s*(?:,\s*(?:blocks\s*=\s*)?(\d+)\s*)?\))\s*$")


def parse_placement(text) -> Placement:
    if isinstance(text, Placement):
        return text
    m = _PLACEMENT.match(str(text))
    if not m:
        raise SpecError(f"bad placement {text!r}: expected R, P, S(d) or S(d, blocks=k)")
    if m.group(1):
        return R
    if m.group(2):
        return P
    return S(int(m.group(3)), int(m.group(4) or 1))


Spec = tuple  # tuple[Placement, ...], one per mesh axis


def parse_spec(spec, n_axes: int | None = None) -> tuple[Placement, ...]:
    """``"[S(0), R]"``, ``"S(0),R"``, ``["S(0)", "R"]`` or placements -> a tuple of placements."""
    if isinstance(spec, str):
        out = _parse_spec_text(spec)
    else:
        out = tuple(parse_placement(p) for p in spec)
    if n_axes is not None and len(out) != n_axes:
        raise SpecError(f"spec {format_spec(out)} has {len(out)} placement(s), the mesh has {n_axes} axes")
    return out


@functools.lru_cache(maxsize=4096)
def _parse_spec_text(spec: str) -> tuple[Placement, ...]:
    """A spec's text: a plan file repeats a few dozen of them tens of thousands of times."""
    body = spec.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    parts = [p for p in re.split(r",(?![^()]*\))", body) if p.strip()] if body.strip() else []
    return tuple(parse_placement(p) for p in parts)


def format_spec(spec) -> str:
    """``[S(0), R]``: remembered per spec, as a plan repeats a few dozen specs tens of thousands of times."""
    try:
        return _format_spec(tuple(spec))
    except TypeError:  # a placement that does not hash (a list inside): format it as it is
        return "[" + ", ".join(str(p) for p in spec) + "]"


@functools.lru_cache(maxsize=4096)
def _format_spec(spec: tuple) -> str:
    return "[" + ", ".join(str(p) for p in spec) + "]"


def check_spec(spec, shape: tuple[int, ...], mesh_shape: tuple[int, ...], what: str = "tensor") -> None:
    """Raise SpecError unless ``spec`` is a valid, even placement of ``shape`` on the mesh."""
    if len(spec) != len(mesh_shape):
        raise SpecError(
            f"{what}: spec {format_spec(spec)} has {len(spec)} placement(s), the mesh has {len(mesh_shape)} axes"
        )
    used = set()
    for p, n in zip(spec, mesh_shape):
        if not p.is_split:
            continue
        if not 0 <= p.dim < len(shape):
            raise SpecError(f"{what}: {p} names dim {p.dim} of a {len(shape)}-d tensor {shape}")
        if p.dim in used:
            raise SpecError(f"{what}: dim {p.dim} is split over two mesh axes in {format_spec(spec)}")
        used.add(p.dim)
        if p.blocks < 1 or shape[p.dim] % (p.blocks * n):
            raise SpecError(
                f"{what}: dim {p.dim} of size {shape[p.dim]} does not split evenly into "
                f"{p.blocks} block(s) over {n} devices ({p})"
            )


def local_shape(shape: tuple[int, ...], spec, mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
    out = list(shape)
    for p, n in zip(spec, mesh_shape):
        if p.is_split:
            out[p.dim] //= n
    return tuple(out)


def split_factor(spec, mesh_shape) -> int:
    """How many pieces the tensor is cut into (its local size is 1/split_factor of the whole)."""
    f = 1
    for p, n in zip(spec, mesh_shape):
        if p.is_split:
            f *= n
    return f


# --- the layout of a split dim: the one definition every part of graphc uses --------------------


def piece_bounds(size: int, n: int, r: int) -> tuple[int, int]:
    """[lo, hi) of rank ``r``'s piece of a dim of ``size`` cut into ``n`` contiguous pieces, in
    numpy's array_split layout (the first ``size % n`` pieces one longer; plans only make even
    splits, the runtime's collectives accept uneven ones)."""
    base, extra = divmod(size, n)
    lo = r * base + min(r, extra)
    return lo, lo + base + (r < extra)


def piece_index(size: int, n: int, r: int, blocks: int = 1) -> np.ndarray:
    """Indices along a dim of ``size`` that rank ``r`` of ``n`` holds under ``S(d, blocks)``: its
    1/n share of each of ``blocks`` equal blocks, concatenated (blocks > 1 needs
    ``size % (blocks * n) == 0``)."""
    if blocks == 1:
        return np.arange(*piece_bounds(size, n, r))
    if blocks < 1 or size % (blocks * n):
        raise SpecError(f"a dim of size {size} does not split into {n} pieces of {blocks} blocks")
    b = size // blocks
    c = b // n
    return (np.arange(blocks)[:, None] * b + r * c + np.arange(c)[None, :]).reshape(-1)


def shard(x: np.ndarray, spec, mesh_shape: tuple[int, ...], coord: tuple[int, ...]) -> np.ndarray:
    """The local piece of ``x`` held by the device at mesh coordinate ``coord`` (P: the device
    at coordinate 0 along that axis holds the value, the others zeros)."""
    x = np.asarray(x)
    check_spec(spec, x.shape, mesh_shape)
    out = x
    zero = False
    for p, n, r in zip(spec, mesh_shape, coord):
        if p.is_split:
            out = np.take(out, piece_index(x.shape[p.dim], n, r, p.blocks), axis=p.dim)
        elif p.kind == "P" and r != 0:
            zero = True
    out = np.array(out, copy=True)
    if zero:
        out[...] = 0
    return out


def unshard(pieces: dict, spec, mesh_shape: tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    """Rebuild the logical tensor from ``{coord: local array}`` (sums over P axes). A replicated
    value is its coordinate-0 piece itself, not a copy; contiguous splits are written by slices."""
    replicated = [a for a, p in enumerate(spec) if p.kind == "R"]
    # a replicated axis repeats the same piece: count it once (the coord-0 copy along it)
    held = [(coord, np.asarray(piece)) for coord, piece in pieces.items() if not any(coord[a] for a in replicated)]
    partial = any(p.kind == "P" for p in spec)
    if len(held) == 1 and not partial and held[0][1].shape == tuple(shape):
        piece = held[0][1]
        return piece if piece.flags.writeable else piece.copy()  # (a constant is read-only)
    out = (np.zeros if partial else np.empty)(shape, dtype=held[0][1].dtype)
    for coord, piece in held:
        index: list[Any] = [slice(None)] * len(shape)
        for p, n, r in zip(spec, mesh_shape, coord):
            if p.is_split:
                index[p.dim] = slice(*piece_bounds(shape[p.dim], n, r)) if p.blocks == 1 else None
        if any(i is None for i in index):  # blocked splits: their indices, by np.ix_
            for p, n, r in zip(spec, mesh_shape, coord):
                if p.is_split:
                    index[p.dim] = piece_index(shape[p.dim], n, r, p.blocks)
            sel: Any = np.ix_(*[np.arange(s) if isinstance(i, slice) else i for s, i in zip(shape, index)])
        else:
            sel = tuple(index)
        if partial:
            out[sel] += piece
        else:
            out[sel] = piece
    return out
