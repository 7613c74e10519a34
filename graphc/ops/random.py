"""``philox``: counter-based random bits, Philox4x64-10 exactly as numpy's ``np.random.Philox``
computes them, so a traced draw equals numpy's stream and every element's bits depend only on the
key and that element's position in the stream.

``philox(key u64[2], counter u64[4]) {shape, offset, dist, runs}`` draws the array of ``shape``
that starts ``offset`` words after the stream position ``counter``:

* The stream is numpy's: a 256-bit block counter ``c`` (little-endian words) is enciphered with the
  128-bit key into four 64-bit words. numpy's ``Philox`` holds ``(counter, buffer, buffer_pos)``
  and increments the counter *before* it enciphers, so from a fresh state its first four
  ``next_uint64`` words are block 1, then block 2, ...; ``Generator.random`` takes one word per
  element. The op's ``counter`` operand is the *word position* ``W`` (words consumed so far, a
  256-bit number): the word at position ``w`` is lane ``w % 4`` of block ``w // 4 + 1``. numpy's
  state ``(counter=C, buffer_pos=b)`` is ``W = 4*C`` when ``b == 4`` (the buffer is used up, as
  in a fresh state) and ``4*(C-1) + b`` otherwise (graphc/frontend/random.py converts). The
  position is taken modulo 2**256, so numpy counters from 2**254 on (3/4 of numpy's counter
  space, never reached by drawing from 0) are not representable.
* Element ``i`` of the result (row-major index in ``shape``) is the word at ``W + offset + i``:
  ``offset`` is the number of words the trace drew before this call from the same state.
* ``dist``: ``"bits"`` gives the uint64 words; ``"uniform"`` numpy's ``next_double``,
  ``(word >> 11) * 2**-53``, a float64 in [0, 1). Other distributions are graphs built on these
  (frontend/random.py).
* ``runs`` (None: the whole array) makes the op compute one device's piece of the array: per dim,
  the ``(start, stop)`` runs of global indices it holds, as lowering cuts them (``local_attrs``, the op's LocalAttrs trait
  below). The piece's elements keep their global positions, so a sharded draw holds exactly the
  bits of the unsharded one.

Rules: no gradient (the bits do not depend differentiably on the state); sharding: any dim of the
result may be split, the state operands are replicated (16 + 32 bytes), no communication; cost:
10 rounds of two 64-bit multiplies per four words.
"""

from __future__ import annotations

import math

import numpy as np

from graphc.core.errors import ShapeError
from graphc.core.ir import Graph, OpDef, TensorType
from graphc.core.spec import piece_index
from graphc.core.traits import FreshResult, LocalAttrs, Random
from graphc.ops.dims import DimRule
from graphc.ops.registry import check_shape, register

# Philox4x64 constants (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011;
# Random123's philox.h, which numpy's bit generator uses)
PHILOX_M0 = np.uint64(0xD2E7470EE14C6C93)  # round multipliers
PHILOX_M1 = np.uint64(0xCA5A826395121157)
PHILOX_W0 = np.uint64(0x9E3779B97F4A7C15)  # key schedule (Weyl) increments: golden ratio, sqrt(3) - 1
PHILOX_W1 = np.uint64(0xBB67AE8584CAA73B)
ROUNDS = 10

DISTS = ("bits", "uniform")
_LOW32 = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)


def mulhilo64(a: np.uint64, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(high, low) 64-bit halves of the 128-bit products ``a * b`` (numpy has no mulhi: the high
    half is assembled from the four 32x32-bit partial products, none of which overflows)."""
    lo = a * b  # uint64 arithmetic wraps: the low half
    a_lo, a_hi = a & _LOW32, a >> _32
    b_lo, b_hi = b & _LOW32, b >> _32
    ll, lh, hl, hh = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi
    middle = (ll >> _32) + (lh & _LOW32) + (hl & _LOW32)  # < 3 * 2**32
    hi = hh + (lh >> _32) + (hl >> _32) + (middle >> _32)
    return hi, lo


def philox4x64(counters: np.ndarray, key: np.ndarray, rounds: int = ROUNDS) -> np.ndarray:
    """Philox4x64-``rounds`` of each row of ``counters`` (u64[n, 4]) under ``key`` (u64[2]):
    u64[n, 4]. Random123's ``philox4x64_R``: round, then bump the key, ``rounds`` times."""
    c = [counters[:, j].copy() for j in range(4)]
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    with np.errstate(over="ignore"):
        for r in range(rounds):
            if r:
                k0, k1 = k0 + PHILOX_W0, k1 + PHILOX_W1
            hi0, lo0 = mulhilo64(PHILOX_M0, c[0])
            hi1, lo1 = mulhilo64(PHILOX_M1, c[2])
            c = [hi1 ^ c[1] ^ k0, lo1, hi0 ^ c[3] ^ k1, lo0]
    return np.stack(c, axis=1) if counters.shape[0] else np.zeros((0, 4), np.uint64)


def words_to_int(words: np.ndarray) -> int:
    """A 256-bit counter (u64[4], little-endian words) as a Python int."""
    return sum(int(w) << (64 * j) for j, w in enumerate(np.asarray(words, np.uint64)))


def int_to_words(value: int) -> np.ndarray:
    """A Python int modulo 2**256 as u64[4], little-endian words."""
    value %= 1 << 256
    return np.array([(value >> (64 * j)) & 0xFFFFFFFFFFFFFFFF for j in range(4)], dtype=np.uint64)


def _block_counters(first: int, steps: np.ndarray) -> np.ndarray:
    """u64[n, 4]: the 256-bit counters ``first + steps`` (``steps`` small non-negative ints),
    carrying across words like numpy's counter increment."""
    base = int_to_words(first)
    out = np.empty((steps.size, 4), np.uint64)
    carry = steps.astype(np.uint64)
    with np.errstate(over="ignore"):
        for j in range(4):
            out[:, j] = base[j] + carry
            carry = (out[:, j] < carry).astype(np.uint64)  # wrapped: carry one into the next word
    return out


def element_indices(shape: tuple[int, ...], runs) -> np.ndarray:
    """Row-major global indices (int64) of the elements of the piece ``runs`` of ``shape``."""
    if runs is None:
        return np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    axes = [_indices_of(dim) for dim in runs]
    if not axes:
        return np.zeros(1, np.int64)
    grid = np.ix_(*axes)
    strides = [int(np.prod(shape[d + 1 :], dtype=np.int64)) for d in range(len(shape))]
    flat = sum(g.astype(np.int64) * s for g, s in zip(grid, strides))
    return np.asarray(flat, np.int64).reshape(-1)


def stream_words(key: np.ndarray, position: int, indices: np.ndarray) -> np.ndarray:
    """The stream's words at ``position + indices`` (u64, the shape of ``indices``): the word at
    ``w`` is lane ``w % 4`` of block ``w // 4 + 1``. Each block is enciphered once."""
    lane0, first_block = position % 4, position // 4 + 1
    rel = indices + lane0  # word offsets from the start of ``first_block``
    if rel.size == 0:
        return np.zeros(indices.shape, np.uint64)
    step = rel // 4
    lo, hi = int(step.min()), int(step.max())
    if hi - lo + 1 <= 2 * step.size:  # a contiguous stretch: encipher every block in it
        blocks = philox4x64(_block_counters(first_block, np.arange(lo, hi + 1, dtype=np.int64)), key)
        return blocks[step - lo, rel % 4]
    needed, where = np.unique(step, return_inverse=True)  # a sparse piece: only the blocks it uses
    blocks = philox4x64(_block_counters(first_block, needed), key)
    return blocks[where.reshape(step.shape), rel % 4]


def _check_runs(shape: tuple[int, ...], runs) -> tuple[int, ...]:
    if runs is None:
        return shape
    if not isinstance(runs, tuple) or len(runs) != len(shape):
        raise ShapeError(f"philox: runs must give one tuple of (start, stop) runs per dim of {shape}, got {runs!r}")
    local = []
    for n, dim in zip(shape, runs):
        if not isinstance(dim, tuple) or not all(
            isinstance(r, tuple) and len(r) == 2 and all(isinstance(v, int) for v in r) and 0 <= r[0] <= r[1] <= n
            for r in dim
        ):
            raise ShapeError(f"philox: runs {dim!r} are not (start, stop) pairs within a dim of size {n}")
        local.append(sum(b - a for a, b in dim))
    return tuple(local)


def _philox_infer(in_types, shape, offset, dist, runs):
    key, counter = in_types
    if key != TensorType((2,), np.dtype(np.uint64)) or counter != TensorType((4,), np.dtype(np.uint64)):
        raise ShapeError(f"philox: operands must be the key u64[2] and the counter u64[4], got {key} and {counter}")
    check_shape(shape)
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise ShapeError(f"philox: offset must be a non-negative int, got {offset!r}")
    if dist not in DISTS:
        raise ShapeError(f"philox: dist must be one of {', '.join(DISTS)}, got {dist!r}")
    local = _check_runs(shape, runs)
    return (TensorType(local, np.dtype(np.float64 if dist == "uniform" else np.uint64)),)


def _philox_impl(key, counter, shape, offset, dist, runs):
    local = _check_runs(shape, runs)
    words = stream_words(key, words_to_int(counter) + offset, element_indices(shape, runs)).reshape(local)
    if dist == "bits":
        return words
    return (words >> np.uint64(11)).astype(np.float64) * 2.0**-53  # numpy's next_double


philox = register(
    OpDef(
        "philox",
        "constant",
        _philox_infer,
        _philox_impl,
        attrs=("shape", "offset", "dist", "runs"),
        num_inputs=2,
        doc="Philox4x64-10 words (or numpy's doubles) of numpy's stream at counter + offset, per element",
    )
)

philox.vjp = lambda ad, g: [None, None]  # the state is integer bits: no gradient
philox.jvp = lambda ad, tk, tc: None


def _philox_dim_rule(in_types, out_types, shape, offset, dist, runs):
    """Each dim of the result may be split on its own (each device draws its own elements' bits);
    the key and counter are read whole."""
    return DimRule((((None,), (None,))), (tuple(f"e{d}" for d in range(len(shape))),))


def _philox_cost(in_types, out_types, shape, offset, dist, runs):
    n = out_types[0].size
    return (float(n) * ROUNDS * 12 / 4, out_types[0].nbytes + 48)  # per block: 2 mulhilo (~8 ops) + 4 xor/adds


def local_attrs(attrs: dict, out_spec, mesh_shape: tuple[int, ...], coord: tuple[int, ...]) -> dict:
    """The attributes of the device at ``coord``'s piece when the result is placed ``out_spec``:
    the runs of global indices it holds per dim, cut as ``core/spec.py: shard`` cuts an array."""
    if not any(p.is_split for p in out_spec):
        return attrs
    shape, runs = attrs["shape"], attrs["runs"]
    index = [np.arange(n) for n in shape] if runs is None else [_indices_of(dim) for dim in runs]
    for p, n, r in zip(out_spec, mesh_shape, coord):
        if p.is_split:
            index[p.dim] = index[p.dim][piece_index(index[p.dim].size, n, r, p.blocks)]
    return {**attrs, "runs": tuple(_runs_of(ix) for ix in index)}


def _indices_of(runs: tuple[tuple[int, int], ...]) -> np.ndarray:
    return np.concatenate([np.arange(a, b) for a, b in runs] or [np.zeros(0, np.int64)]).astype(np.int64)


def _runs_of(index: np.ndarray) -> tuple[tuple[int, int], ...]:
    """Sorted indices as maximal (start, stop) runs."""
    if index.size == 0:
        return ()
    breaks = np.flatnonzero(np.diff(index) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [index.size]])
    return tuple((int(index[a]), int(index[b - 1]) + 1) for a, b in zip(starts, stops))


def state_inputs(graph: Graph) -> dict[int, int]:
    """Graph input index -> the words the graph's ``philox`` nodes draw from it, for the inputs
    that are a generator's state (read through ``slice`` as key and position): the end of the
    furthest draw, ``offset`` + its size. Such an input is never split (micro-batches, devices):
    every piece needs the whole state."""
    index = {v: i for i, v in enumerate(graph.inputs)}
    out: dict[int, int] = {}
    for node in graph.nodes:
        if node.op is not philox:
            continue
        for source in node.inputs:
            while source.producer is not None and source.producer.op.name == "slice":
                source = source.producer.inputs[0]
            k = index.get(source)
            if k is not None:
                out[k] = max(out.get(k, 0), node.attrs["offset"] + math.prod(node.attrs["shape"]))
    return out


philox.dim_rule = _philox_dim_rule
philox.cost = _philox_cost
philox.traits = (
    Random(stream_position=("offset",)),  # _philox_dim_rule and _philox_cost ignore it
    FreshResult(),
    LocalAttrs(lambda node, ins, outs, specs, mesh_shape, coord: local_attrs(node.attrs, specs[0], mesh_shape, coord)),
)
