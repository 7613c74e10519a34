"""Numba kernels for ``fused`` nodes: compiling the source runtime/kernelsource.py generates for a
region, and calling it on arrays.

A kernel works on R rows of n elements (runtime/kernelsource.py explains the loops). Its operands
arrive as 2-d (R, n) views, per-row vectors (R,), rows repeated with a period (P, n) (a (T, T) mask
broadcast over batch and heads), vectors (n,) or scalars; anything else is materialized here. A
kernel over at least ``PARALLEL_MIN_ELEMENTS`` elements runs in pieces over the threads
runtime/threads.py allows, each thread taking the next piece until none is left: ranges of rows,
or for elementwise work in few rows (a 1-d array is one row) segments of rows. Each thread so
also takes the first-touch page faults of the parts of a fresh result it writes. Kernels are compiled with ``nogil=True`` and cached on disk in the
kernel cache folder (``<cache>/kernels``, see graphc/core/files.py ``cache_dir``): another process
that needs the same kernel loads its machine code from a sealed entry (runtime/kernel_cache.py)
instead of compiling it. Only the source generated here is run; a copy of it is written next to
the entries for people to read, and a file found there is never imported.
"""

from __future__ import annotations

import hashlib
import linecache
import os
import stat
import sys
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphc.core.cache import private_dir, unsafe_reason, warn_cache
from graphc.core.dtypes import BFLOAT16
from graphc.core.files import atomic_write, cache_dir
from graphc.core.ir import Node, Region
from graphc.core.traits import Reduction
from graphc.runtime.kernel_cache import attach_disk_cache
from graphc.runtime.kernelsource import KernelSpec, OperandKind
from graphc.runtime.lowkernel import low_float_source
from graphc.runtime.threads import kernel_pool, kernel_threads


def kernel_cache_dir() -> str | None:
    """The kernel cache folder, created 0700; None (after a CacheWarning) when it is not the user's alone."""
    return private_dir(cache_dir("kernels"))


def _operand_shape(kind: OperandKind, space: tuple[int, ...], rows: int, n: int):
    """(the shape the kernel reads an operand of this kind in, a view when the operand is
    C-contiguous; the shape a "full" operand is broadcast to first, or None)."""
    if kind.kind == "scalar":
        return (1,), None
    if kind.kind == "row":
        return (rows,), None
    if kind.kind == "vec":
        return (n,), None
    if kind.kind == "periodic":
        return (kind.period, n), None
    return (rows, n), tuple(space)


class CompiledKernel:
    """A compiled fused node for one set of operand shapes."""

    def __init__(self, node: Node, operand_shapes: list[tuple[int, ...]], alloc=np.empty):
        (region,) = node.regions
        space = _space_of(region)
        self.space = space
        self.rows = int(np.prod(space[:-1], dtype=np.int64)) if space else 1
        self.n = space[-1] if space else 1
        self.spec = KernelSpec(region, space)
        self.kinds = self.spec.operand_kinds()
        # bfloat16 values: one elementwise loop, on their uint16 bits (runtime/lowkernel.py)
        self._bits = [v.dtype == BFLOAT16 for v in region.inputs], [v.dtype == BFLOAT16 for v in region.outputs]
        low = (
            any(self._bits[0])
            or any(self._bits[1])
            or any(o.dtype == BFLOAT16 for n in region.nodes for o in n.outputs)
        )
        self.source = low_float_source(self.spec, self.kinds) if low else self.spec.source(self.kinds)
        # (operand, result) pairs whose buffer the result may take over
        self.in_place: list[tuple[int, int]] = [] if low else self.spec.in_place_pairs(self.kinds)
        self.func = load_kernel(self.source)
        self._aliased: dict[frozenset[tuple[int, int]], Callable] = {}  # variants for in-place calls
        self.out_types = [v.type for v in region.outputs]
        self.out_levels = [self.spec.level[v] for v in region.outputs]
        self.alloc = alloc
        # the call's per-operand and per-result work, decided once: a call of a small kernel
        # costs its numba dispatch plus a reshape per array (docs/measurements.md#kernel-call)
        self._operand_shapes = [_operand_shape(k, space, self.rows, self.n) for k in self.kinds]
        self._out_shapes = [
            (t.shape, t.dtype, (self.rows, self.n) if level == "elem" else (self.rows,))
            for t, level in zip(self.out_types, self.out_levels)
        ]
        # elementwise work (no row reduction, no per-row result) may also be cut inside a row: a
        # 1-d array is one row, and split by rows it would never leave the caller's thread
        self._elementwise = not any(n.op.has(Reduction) for n in region.nodes) and all(
            level == "elem" for level in self.out_levels
        )
        self._may_split = (self.rows >= 2 or self._elementwise) and self.rows * self.n >= PARALLEL_MIN_ELEMENTS
        # a kernel run in one call on the caller's thread is called through Python specialized to
        # its shapes (the executor calls ``call``); larger ones through ``__call__``, which splits them
        self.call: Callable[..., tuple[np.ndarray, ...]] = (
            self if self._may_split else self._straight_call([v.type.shape for v in region.inputs])
        )

    def _aliased_func(self, pairs: frozenset[tuple[int, int]]) -> Callable:
        """The kernel compiled for results written over their operands (KernelSpec.source's ``aliased``)."""
        func = self._aliased.get(pairs)
        if func is None:
            func = self._aliased[pairs] = load_kernel(self.spec.source(self.kinds, pairs))
        return func

    def _straight_call(self, shapes: list[tuple[int, ...]]) -> Callable[..., tuple[np.ndarray, ...]]:
        """``__call__`` for operands of these (the region's) shapes as generated Python: the views
        and copies each operand needs are decided here, so a small kernel's call is its dispatch
        plus an allocation, a fraction of the general path's overhead over the Numba call
        (docs/measurements.md#kernel-call)."""
        env: dict[str, Any] = {
            "asc": np.ascontiguousarray,
            "bcast": np.broadcast_to,
            "func": self.func,
            "u16": np.uint16,
        }
        ins = [f"a{k}" for k in range(len(shapes))]
        lines = [f"def call({', '.join(ins)}):"]
        for k, (given, (shape, full)) in enumerate(zip(shapes, self._operand_shapes)):
            a = ins[k]
            if given != shape and full is not None and given != full:
                lines.append(f"    {a} = asc(bcast({a}, {full!r})).reshape({shape!r})")
                continue
            lines.append(f"    if not {a}.flags.c_contiguous: {a} = asc({a})")
            if given != shape:
                lines.append(f"    {a} = {a}.reshape({shape!r})")
        for k, bits in enumerate(self._bits[0]):
            if bits:
                lines.append(f"    {ins[k]} = {ins[k]}.view(u16)")
        outs, views = [], []
        for k, (shape, dtype, view) in enumerate(self._out_shapes):
            env[f"d{k}"] = dtype
            lines.append(f"    o{k} = alloc({shape!r}, d{k})")
            outs.append(f"o{k}")
            view_text = f"o{k}" if shape == view else f"o{k}.reshape({view!r})"
            views.append(f"{view_text}.view(u16)" if self._bits[1][k] else view_text)
        lines.append(f"    func({', '.join(ins + views)}, 0, {self.rows}, {self.n})")
        lines.append(f"    return ({', '.join(outs)},)")
        env["alloc"] = self.alloc
        exec(compile("\n".join(lines) + "\n", "<graphc kernel call>", "exec"), env)
        return env["call"]

    def __call__(self, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        return self.call_into(arrays, {})

    def call_into(self, arrays: Sequence[np.ndarray], given: dict[int, np.ndarray]) -> tuple[np.ndarray, ...]:
        """``__call__`` with result ``k`` written into ``given[k]`` (a C-contiguous array of its
        shape and dtype; for the pairs in ``in_place``, the very operand it may overwrite)."""
        func = self.func
        if given:
            aliased = frozenset((i, k) for i, k in self.in_place if given.get(k) is arrays[i])
            if aliased:
                func = self._aliased_func(aliased)
        operands: list[np.ndarray] = []
        for a, (shape, full) in zip(arrays, self._operand_shapes):
            if a.shape != shape:  # (an operand already in the kernel's shape needs no view)
                if full is not None and a.shape != full:
                    a = np.broadcast_to(a, full)  # materialized by ascontiguousarray below
                if not a.flags.c_contiguous:
                    a = np.ascontiguousarray(a)
                a = a.reshape(shape)
            elif not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
            operands.append(a.view(np.uint16) if self._bits[0][len(operands)] else a)
        outs = []
        views = []
        for k, (shape, dtype, view) in enumerate(self._out_shapes):
            buf = given[k] if k in given else self.alloc(shape, dtype)
            outs.append(buf)
            v = buf if shape == view else buf.reshape(view)
            views.append(v.view(np.uint16) if self._bits[1][k] else v)
        threads = kernel_threads() if self._may_split else 1
        if threads == 1:
            func(*operands, *views, 0, self.rows, self.n)
        else:
            run_pieces(func, self._pieces(operands, views, threads), threads)
        return tuple(outs)

    def _pieces(self, operands: list[np.ndarray], views: list[np.ndarray], threads: int) -> list[tuple]:
        """The kernel's arguments for each piece of its work: ranges of whole rows (a row
        reduction's work is its row), or, for elementwise work in fewer rows than pieces, segments
        of rows, each passed as a one-row kernel call on views of that row's elements."""
        count = min(threads * PIECES_PER_THREAD, max(2, self.rows * self.n // PIECE_MIN_ELEMENTS))
        if self.rows >= count or not self._elementwise:
            bounds = _bounds(self.rows, min(count, self.rows))
            return [(*operands, *views, lo, hi, self.n) for lo, hi in zip(bounds, bounds[1:])]
        cuts = _bounds(self.n, -(-count // self.rows), align=PIECE_ALIGN)
        return [
            (
                *[_segment(a, kind, r, lo, hi) for a, kind in zip(operands, self.kinds)],
                *[v[r, lo:hi].reshape(1, hi - lo) for v in views],
                0,
                1,
                hi - lo,
            )
            for r in range(self.rows)
            for lo, hi in zip(cuts, cuts[1:])
        ]


def _segment(a: np.ndarray, kind: OperandKind, r: int, lo: int, hi: int) -> np.ndarray:
    """Operand ``a`` (of ``kind``, in the kernel's shape) as a one-row kernel call on elements
    [lo, hi) of row ``r`` reads it."""
    if kind.kind == "full":
        return a[r, lo:hi].reshape(1, hi - lo)
    if kind.kind == "periodic":
        return a[r % kind.period, lo:hi].reshape(1, hi - lo)
    if kind.kind == "vec":
        return a[lo:hi]
    if kind.kind == "row":
        return a[r : r + 1]
    return a  # a scalar


# A kernel over at least this many elements splits its work over the threads runtime/threads.py allows.
PARALLEL_MIN_ELEMENTS = 1 << 18
# ... in pieces of about this many elements or more, up to PIECES_PER_THREAD per thread: a thread
# that finishes its piece takes the next one, so a thread slowed by another process (the other core
# busy) holds up the call by one piece, not by half the work; a piece costs one Numba dispatch.
PIECE_MIN_ELEMENTS = 1 << 16
PIECES_PER_THREAD = 4
# segments of a row start at multiples of this many elements (whole cache lines of the output)
PIECE_ALIGN = 1024


def _bounds(count: int, pieces: int, align: int = 1) -> list[int]:
    """The bounds of ``pieces`` about equal ranges of ``count`` items, inner bounds at multiples of
    ``align`` (fewer pieces where ranges would be empty)."""
    inner = {(count * i // pieces) // align * align for i in range(1, pieces)}
    return sorted({0, count} | {b for b in inner if 0 < b < count})


def run_pieces(func: Callable, pieces: list[tuple], threads: int) -> None:
    """``func(*args)`` for every ``args`` in ``pieces``: the caller and ``threads - 1`` pool threads
    each take the next piece not yet taken until none is left (the kernels release the GIL)."""
    todo = iter(pieces)  # (a list iterator's next is atomic under the GIL)

    def work() -> None:
        for args in todo:
            func(*args)

    futures = [kernel_pool(threads - 1).submit(work) for _ in range(min(threads, len(pieces)) - 1)]
    try:
        work()
    finally:
        for f in futures:
            f.result()
        # a pool thread drops its task (whose closure reaches the pieces) only after the future
        # is done: the pieces' views must not keep the results' buffers from the executor's pool
        pieces.clear()


def _space_of(region: Region) -> tuple[int, ...]:
    """The iteration space: the largest elementwise shape in the region (or a reduction's input)."""
    shapes: list[tuple[int, ...]] = [()] + [o.shape for n in region.nodes for o in n.outputs]
    shapes += [n.inputs[0].shape for n in region.nodes if n.op.has(Reduction)]
    return max(shapes, key=lambda s: (int(np.prod(s, dtype=np.int64)), len(s)))


_loaded: dict[str, Any] = {}
_lock = threading.Lock()


def load_kernel(source: str):
    """Compile the kernel in ``source``, its machine code loaded from the disk cache when a sealed
    entry for it is there. Only ``source`` itself is run: the copy written to the cache folder is
    for people (and tracebacks) and is never imported."""
    source_hash = hashlib.sha256(source.encode()).hexdigest()
    digest = source_hash[:20]
    with _lock:
        hit = _loaded.get(digest)
        if hit is not None:
            return hit
        folder = kernel_cache_dir()
        stem = f"k_{digest}"
        filename = os.path.join(folder, f"{stem}.py") if folder else f"<graphc kernel {stem}>"
        if folder:
            _write_readable_copy(filename, source)
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks
        name = f"graphc_kernel_{digest}"
        module = types.ModuleType(name)
        module.__file__ = filename
        sys.modules[name] = module  # Numba finds a cached kernel's globals by its module's name
        exec(compile(source, filename, "exec"), module.__dict__)
        if folder:
            attach_disk_cache(module.kernel, folder, stem, source_hash)
        _loaded[digest] = module.kernel
        return module.kernel


def _write_readable_copy(path: str, source: str) -> None:
    """Keep ``path`` holding ``source``: written when missing; replaced, with a warning, when it holds
    anything else (it is never run, so a planted file is only replaced)."""
    why = _copy_problem(path, source.encode())
    if why is None:
        return
    if why != "missing":
        warn_cache(path, f"kernel source copy {why}", "it was not run; rewritten")
        try:
            os.unlink(path)
        except OSError:
            pass
    try:
        atomic_write(path, source, mode=0o600)
    except OSError:
        pass  # the copy is for people; writing the compiled entry reports a folder that cannot be written


def _copy_problem(path: str, expected: bytes) -> str | None:
    """Why the file at ``path`` is not an intact copy of ``expected`` ("missing" when there is none)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return "is not a regular file"
        unsafe = unsafe_reason(st)
        if unsafe is not None:
            return unsafe
        if f.read() != expected:
            return "does not hold the kernel source it is named for"
    return None
