"""The multi-device runtime: one thread per device, each running its program.

``ParallelExecutable(program)`` takes a ``graphc.programs.ParallelProgram`` (lowered and compiled
by graphc/passes/partition.py; this module never plans or lowers) and builds one single-device
executable per device whose collectives go to that device's communicator (runtime/comm.py,
threads in shared memory; runtime/ranks.py runs one device per MPI process instead). BLAS is
limited to one thread while devices run, so devices do not fight over the cores.

``ShardedArray`` (a value held as pieces on the devices, the MPI backend's result) and
``ShardedInput`` (an input each device builds its own piece of) are shared by both backends, as
are ``shard_index`` and ``local_piece``, which say where a device's piece lies and make it.

``run_flat(arrays)`` shards the inputs by the plan's input specs, runs all devices, and
reassembles the outputs. An exception on one device aborts the others (their collectives raise
promptly) and is re-raised as the same exception type with the device id and the user's source
line; a collective that cannot complete raises a CommError naming it within the timeout.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.core.errors import GraphcError, relabel
from graphc.core.mesh import Mesh
from graphc.core.pytree import ArraySpec
from graphc.core.spec import Spec, check_spec, format_spec, local_shape, piece_bounds, piece_index, unshard
from graphc.programs import ParallelProgram
from graphc.runtime.comm import CommAborted, ThreadWorld
from graphc.runtime.executor import Executable
from graphc.runtime.threads import one_blas_thread


class CommProxy:
    """Stands for a device's communicator in its compiled program; each run plugs in a fresh one."""

    def __init__(self):
        self.current = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.current, name)


class ParallelExecutable:
    def __init__(self, program: ParallelProgram, timeout_s: float = 60.0):
        self.program = program
        self.mesh = program.mesh
        self.timeout_s = timeout_s
        self.stats: dict[str, Any] = {}
        start = time.perf_counter()
        self.proxies = {p.device: CommProxy() for p in program.devices}
        self.executables = {p.device: Executable(p.graph, self.proxies[p.device]) for p in program.devices}
        self.stats["build_s"] = time.perf_counter() - start
        self.last_profile: dict[int, dict] | None = None
        # outputs split in contiguous pieces (ZeRO's sharded optimizer state): every device thread
        # writes its piece into the whole array itself, so the copies (and the new array's page
        # faults) happen on all devices at once instead of after the run on one thread
        self._placed: dict[int, dict[int, tuple | None]] = {}  # output -> device -> its slices
        shape = tuple(self.mesh.shape)
        for k, (t, spec) in enumerate(zip(program.out_types, program.out_specs)):
            if any(p.kind == "P" for p in spec) or not any(p.is_split for p in spec):
                continue
            if any(p.is_split and p.blocks != 1 for p in spec):
                continue
            where: dict[int, tuple | None] = {}
            for p in program.devices:
                index: list[slice] = [slice(None)] * len(t.shape)
                for q, n, r in zip(spec, shape, p.coord):
                    if q.is_split:
                        index[q.dim] = slice(*piece_bounds(t.shape[q.dim], n, r))
                duplicate = any(p.coord[a] for a, q in enumerate(spec) if q.kind == "R")
                where[p.device] = None if duplicate else tuple(index)
            self._placed[k] = where

    def device_ir(self) -> dict[int, str]:
        """The text IR of every device program."""
        return {p.device: str(p.graph) for p in self.program.devices}

    def shard(self, arrays: list) -> dict[int, list[np.ndarray]]:
        """Every device's pieces of the inputs; a ShardedArray already in the input's spec on this
        mesh is used as it is."""
        shape = tuple(self.mesh.shape)
        devices = self.program.devices
        pieces: dict[int, list[np.ndarray]] = {p.device: [] for p in devices}
        for k, a in enumerate(arrays):
            spec = self.program.in_specs[k]
            if isinstance(a, ShardedArray) and a.spec == spec and a.mesh == self.mesh:
                for p in devices:
                    pieces[p.device].append(a.pieces[p.device])
                continue
            whole = a if isinstance(a, ShardedInput) else np.asarray(a)  # a memmap stays one
            for p in devices:
                pieces[p.device].append(local_piece(whole, spec, shape, p.coord))
        return pieces

    def run_flat(self, arrays: list, profile: bool = False, keep_sharded: frozenset = frozenset()) -> list:
        """Run on whole inputs (or ShardedArrays); outputs are whole arrays, except the positions in
        ``keep_sharded``, which stay on the devices as ShardedArrays."""
        types = self.program.out_types
        wholes = {k: np.empty(types[k].shape, types[k].dtype) for k in self._placed if k not in keep_sharded}
        pieces_in = self.shard(arrays)
        outs = self.run_sharded(pieces_in, profile, wholes)
        shape = tuple(self.mesh.shape)
        devices = self.program.devices
        # a replicated result is device 0's piece itself (unshard) unless that piece also lives on
        # elsewhere: as an input's piece, or in a result kept on the devices
        elsewhere = {id(a) for piece_list in pieces_in.values() for a in piece_list}
        elsewhere |= {id(outs[p.device][k]) for k in keep_sharded for p in devices}
        result: list[np.ndarray | ShardedArray] = []
        for k, (t, spec) in enumerate(zip(types, self.program.out_specs)):
            if k in wholes:  # the devices wrote their pieces into it
                result.append(wholes[k])
                continue
            by_device = {p.device: outs[p.device][k] for p in devices}
            if k in keep_sharded:
                result.append(ShardedArray(by_device, spec, self.mesh, t.shape, t.dtype))
                continue
            pieces = {p.coord: by_device[p.device] for p in devices}
            whole = unshard(pieces, spec, shape, t.shape)
            if id(whole) in elsewhere:
                whole = whole.copy()
            result.append(whole.astype(t.dtype, copy=False))
        return result

    def run_sharded(
        self, pieces: dict[int, list[np.ndarray]], profile: bool = False, wholes: dict[int, np.ndarray] | None = None
    ) -> dict[int, list[np.ndarray]]:
        """Run every device on its pieces; returns every device's output pieces. ``wholes``: whole
        arrays of outputs in ``_placed``, each device thread copies its pieces into them."""
        wholes = wholes or {}

        def device(d: int) -> list[np.ndarray]:
            outs = self.executables[d].run_flat(pieces[d], profiles.get(d))
            for k, whole in wholes.items():
                where = self._placed[k][d]
                if where is not None:
                    whole[where] = outs[k]
            return outs

        world = ThreadWorld(self.mesh.size, timeout_s=self.timeout_s)
        for d, proxy in self.proxies.items():
            proxy.current = comm = world.comm(d)
            # collective results reuse the device's dead buffers (a straight-line program pools nothing)
            ex = self.executables[d]
            comm.alloc = ex.pool.get if ex.program._straight is None else np.empty
        profiles: dict[int, dict] = {d: {} for d in self.executables} if profile else {}
        t0 = time.perf_counter()
        try:
            return run_on_devices(
                list(self.executables),
                world,
                self.mesh,
                self.timeout_s,
                device,
            )
        finally:
            if profile:
                for d, prof in profiles.items():
                    prof["t0"] = t0
                    prof["comm_log"] = list(getattr(self.proxies[d].current, "log", []))
                self.last_profile = profiles


def run_on_devices(devices: list[int], world, mesh, timeout_s: float, body) -> dict[int, Any]:
    """``body(d)`` on one thread per device (BLAS and fused kernels one thread each); returns
    {device: result}. An exception on any device aborts the others (their collectives raise
    promptly) and is re-raised as the same exception type with the device id and the user's
    source line; devices that do not finish within the timeout are named. The threads are a
    ``_Crew`` kept between runs: starting threads every call cost more than a small step."""
    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}

    def device(d: int) -> None:
        try:
            results[d] = body(d)
        except BaseException as exc:  # noqa: BLE001 - every failure stops the other devices
            errors[d] = exc
            world.abort(d, exc)

    crew = _Crew.acquire(len(devices))
    finished = False
    try:
        with one_blas_thread():
            finished = crew.run(device, devices, time.monotonic() + timeout_s + 5.0)
    except BaseException as exc:  # Ctrl-C while waiting: stop the devices, leave the crew
        world.abort(-1, exc)
        raise
    finally:
        crew.release()
    if errors:
        root = {d: e for d, e in errors.items() if not isinstance(e, CommAborted)} or errors
        d = min(root)
        raise on_device_error(root[d], d, mesh)
    if not finished:
        stuck = [f"graphc-device-{d}" for d in devices if d not in results]
        raise GraphcError(f"devices did not finish within {timeout_s + 5:.0f} s: {', '.join(stuck)}")
    return results


class _Crew:
    """Threads that run one job per device and park between jobs (a condition variable each
    waits on), reused by every run with as many devices. A crew whose job did not finish (a
    timeout, Ctrl-C) is never reused: its threads are left to end on their own (daemons)."""

    _idle: dict[int, list[_Crew]] = {}
    _lock = threading.Lock()
    KEEP = 2  # idle crews kept per size (concurrent runs from several user threads each get one)

    def __init__(self, n: int):
        self.n = n
        self._cv = threading.Condition()
        self._generation = 0
        self._job: tuple[Callable, list[int]] | None = None
        self._left = 0
        self.broken = False
        for i in range(n):
            threading.Thread(target=self._loop, args=(i,), name=f"graphc-device-slot-{i}", daemon=True).start()

    @classmethod
    def acquire(cls, n: int) -> _Crew:
        with cls._lock:
            idle = cls._idle.get(n)
            if idle:
                return idle.pop()
        return cls(n)

    def release(self) -> None:
        if self.broken:
            return
        with self._lock:
            idle = self._idle.setdefault(self.n, [])
            if len(idle) < self.KEEP:
                idle.append(self)
                return
        self.stop()

    def stop(self) -> None:
        """End the threads (after the current job, if any)."""
        with self._cv:
            self._job = None
            self._generation += 1
            self._cv.notify_all()

    def run(self, fn: Callable[[int], None], devices: list[int], deadline: float) -> bool:
        """``fn(devices[i])`` on thread i; True when all returned before ``deadline``."""
        with self._cv:
            self._job = (fn, devices)
            self._left = self.n
            self._generation += 1
            self._cv.notify_all()
            try:
                while self._left:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        self.broken = True
                        return False
                    self._cv.wait(min(remaining, 0.25))  # a Ctrl-C is raised between waits
            except BaseException:
                self.broken = True
                raise
        return True

    def _loop(self, i: int) -> None:
        seen = 0
        while True:
            with self._cv:
                while self._generation == seen:
                    self._cv.wait()
                seen = self._generation
                job = self._job
            if job is None:
                return
            fn, devices = job
            try:
                fn(devices[i])
            finally:
                with self._cv:
                    self._left -= 1
                    if not self._left:
                        self._cv.notify_all()


@atexit.register
def _stop_crews() -> None:
    with _Crew._lock:
        crews = [c for idle in _Crew._idle.values() for c in idle]
        _Crew._idle.clear()
    for c in crews:
        c.stop()


def on_device_error(exc: BaseException, device: int, mesh) -> BaseException:
    """The same kind of exception, saying which device raised it and at which line of the model."""
    where = next((n[len("graphc: ") :] for n in getattr(exc, "__notes__", []) if n.startswith("graphc: in ")), None)
    msg = f"device {device} (mesh {dict(zip(mesh.axis_names, mesh.coord(device)))}): {exc}"
    if where:
        msg += f" ({where})"
    return relabel(exc, msg)


class ShardedArray(ArraySpec):
    """An array that lives on the devices of a mesh, one piece per device in ``spec``: what a
    parallelized step returns for state it is given back next step (``sharded_state=True``), so a
    training loop does not gather and re-split its parameters every step, and every result under
    the MPI backend, where each rank holds only its own device's piece. Passing it back with the
    same spec uses the pieces as they are.

    ``pieces``: device -> its piece, for the devices this process holds (all of them on threads,
    one per rank under MPI). ``ranks``: the MPI rank of each device of ``mesh`` when the mesh is a
    part of the job's (a pipeline stage's sub-mesh), else None. ``world``: the MPI world the pieces
    live in, None on threads. ``gather(root)`` assembles the whole value (collective under MPI);
    ``np.asarray`` does when this process holds it all (threads, or a replicated value)."""

    pieces: dict[int, np.ndarray]  # device -> its piece
    spec: Spec
    mesh: Mesh
    ranks: tuple[int, ...] | None
    world: Any

    def __init__(
        self,
        pieces: dict[int, np.ndarray],
        spec: Spec,
        mesh: Mesh,
        shape: tuple[int, ...],
        dtype,
        ranks: tuple[int, ...] | None = None,
        world: Any = None,
    ):
        super().__init__(shape, dtype)
        object.__setattr__(self, "pieces", pieces)
        object.__setattr__(self, "spec", tuple(spec))
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "ranks", None if ranks is None else tuple(ranks))
        object.__setattr__(self, "world", world)

    def index(self, device: int) -> tuple:
        """Where ``device``'s piece sits in the whole value (``shard_index``)."""
        return shard_index(self.shape, self.spec, tuple(self.mesh.shape), self.mesh.coord(device))

    @property
    def local(self) -> np.ndarray:
        """This process's piece (under MPI: its device's; on threads: device 0's)."""
        if not self.pieces:
            raise GraphcError(f"{self!r}: this rank holds no piece of it (it lives on ranks {self.holders()})")
        return self.pieces[min(self.pieces)]

    def holders(self) -> tuple[int, ...]:
        """The MPI ranks (or, on threads, the devices) that hold the pieces."""
        return self.ranks if self.ranks is not None else tuple(range(self.mesh.size))

    def _whole_here(self) -> np.ndarray | None:
        """The whole value when the pieces held here make it up, else None: an array of its own,
        never a piece (writing into it must not change the value on the devices)."""
        if self.world is None:
            whole = unshard(
                {self.mesh.coord(d): p for d, p in self.pieces.items()}, self.spec, tuple(self.mesh.shape), self.shape
            )
            if any(whole is p for p in self.pieces.values()):  # a replicated value: its piece
                whole = whole.copy()
            return whole.astype(self.dtype, copy=False)
        if self.pieces and all(p.kind == "R" for p in self.spec):
            return np.array(self.local, dtype=self.dtype)
        return None

    def gather(self, root: int = 0) -> np.ndarray | None:
        """The whole value on rank ``root``, None on the other ranks (MPI: every rank must call
        it). On threads, the whole value."""
        if self.world is None:
            return self._whole_here()
        return self.world.gather_sharded(self, root)

    def __array__(self, dtype=None, copy=None):
        whole = self._whole_here()
        if whole is None and not self.pieces:
            raise GraphcError(
                f"{self!r} lives on MPI ranks {self.holders()} and this rank holds no piece of it: "
                ".gather(root=0) on every rank gives the whole value"
            )
        if whole is None:
            raise GraphcError(
                f"{self!r} is split over MPI ranks and this rank holds one piece: use .local for it, or "
                ".gather(root=0) on every rank for the whole value"
            )
        return whole if dtype is None else whole.astype(dtype)

    def __repr__(self) -> str:
        return f"ShardedArray({np.dtype(self.dtype).name}{list(self.shape)}, spec={format_spec(self.spec)}, mesh={self.mesh!r})"

    __eq__ = object.__eq__
    __hash__ = object.__hash__


class ShardedInput(ArraySpec):
    """An input built piece by piece: ``fn(index)`` returns the piece of the whole value at
    ``index`` (as ``jax.make_array_from_callback``'s callback). Each device (each rank under MPI)
    calls it for its own piece only, so no process ever holds the whole value. Make one with
    ``graphc.sharded_input(shape, dtype, fn)``.

    ``index`` has one entry per dim: a ``slice`` of the whole dim, or, when the spec splits the
    dim in blocks (``S(1, blocks=3)``), an int array of the indices held. ``whole[index]`` is the
    piece (use ``np.ix_`` if two entries are arrays). A device that holds zeros (a ``P`` spec off
    coordinate 0) is not asked."""

    fn: Callable[[tuple], Any]

    def __init__(self, shape: tuple[int, ...], dtype, fn: Callable[[tuple], Any]):
        super().__init__(shape, dtype)
        if not callable(fn):
            raise GraphcError(f"sharded_input: fn must be callable with an index, got {fn!r}")
        object.__setattr__(self, "fn", fn)

    def piece(self, index: tuple) -> np.ndarray:
        """``fn(index)``, checked against the shape and dtype ``index`` selects."""
        want = tuple(len(range(*i.indices(n))) if isinstance(i, slice) else len(i) for i, n in zip(index, self.shape))
        got = np.asarray(self.fn(index))
        if got.shape != want:
            raise GraphcError(
                f"sharded_input {np.dtype(self.dtype).name}{list(self.shape)}: fn({_show(index)}) returned shape "
                f"{list(got.shape)}, expected {list(want)}"
            )
        return np.ascontiguousarray(got, dtype=self.dtype)

    def __array__(self, dtype=None, copy=None):
        whole = self.piece(tuple(slice(0, n) for n in self.shape))  # the whole value: what callers asked for
        return whole if dtype is None else whole.astype(dtype)

    def __repr__(self) -> str:
        return (
            f"ShardedInput({np.dtype(self.dtype).name}{list(self.shape)}, fn={getattr(self.fn, '__name__', self.fn)})"
        )

    __eq__ = object.__eq__
    __hash__ = object.__hash__


def sharded_input(shape, dtype, fn: Callable[[tuple], Any]) -> ShardedInput:
    """An input whose pieces ``fn(index)`` builds on the devices that hold them (``ShardedInput``)."""
    return ShardedInput(tuple(shape), dtype, fn)


def _show(index: tuple) -> str:
    def one(i) -> str:
        if isinstance(i, slice):
            return f"{i.start}:{i.stop}"
        return f"[{', '.join(map(str, i[:4]))}{', ...' if len(i) > 4 else ''}]"

    return "(" + ", ".join(one(i) for i in index) + ")"


def shard_index(shape: tuple[int, ...], spec, mesh_shape: tuple[int, ...], coord: tuple[int, ...], first=()) -> tuple:
    """Where the device at ``coord`` holds its piece of a value of ``shape`` in ``spec``: one entry
    per dim, a ``slice`` when the indices are a contiguous run, else an int array (blocked splits).
    ``first``: splits ``(dim, n, r)`` applied before the spec's (a pipeline's micro-batch)."""
    index: list = [np.arange(n) for n in shape]
    for dim, n, r in first:
        index[dim] = index[dim][slice(*piece_bounds(len(index[dim]), n, r))]
    for p, n, r in zip(spec, mesh_shape, coord):
        if p.is_split:
            index[p.dim] = index[p.dim][piece_index(len(index[p.dim]), n, r, p.blocks)]
    return tuple(_as_slice(i) for i in index)


def _as_slice(i: np.ndarray):
    if len(i) == 0:
        return slice(0, 0)
    if i[-1] - i[0] + 1 == len(i) and (len(i) < 2 or bool(np.all(np.diff(i) == 1))):
        return slice(int(i[0]), int(i[-1]) + 1)
    return i


def zero_piece(spec, coord: tuple[int, ...]) -> bool:
    """Whether a device holds zeros for a value in ``spec`` (a P axis off coordinate 0)."""
    return any(p.kind == "P" and r != 0 for p, r in zip(spec, coord))


def local_piece(x, spec, mesh_shape: tuple[int, ...], coord: tuple[int, ...], first=()) -> np.ndarray:
    """The device's piece of an input: a ShardedInput builds it, an array (a memory-mapped .npy
    too) is sliced, so only the piece is read."""
    if isinstance(x, ShardedInput):
        shape = local_shape_of(x.shape, spec, mesh_shape, first)
        if zero_piece(spec, coord):
            return np.zeros(shape, x.dtype)
        return x.piece(shard_index(x.shape, spec, mesh_shape, coord, first))
    mapped = isinstance(x, np.memmap)
    x = np.asarray(x)
    for dim, n, r in first:
        lo, hi = piece_bounds(x.shape[dim], n, r)
        x = x[(slice(None),) * dim + (slice(lo, hi),)]
    piece = _piece_view(x, spec, mesh_shape, coord)
    if mapped or not piece.flags.c_contiguous:
        return np.array(piece, copy=True)  # read once from the file; kernels read it contiguous
    return piece


def _piece_view(x: np.ndarray, spec, mesh_shape: tuple[int, ...], coord: tuple[int, ...]) -> np.ndarray:
    """``spec.shard``'s piece without its copy where a view will do: a replicated input is shared
    by every device, a contiguous split is a slice (device programs never write their inputs:
    results and collectives write buffers of their own). A blocked split gathers (a copy), a
    partial's zero pieces are zeros."""
    check_spec(spec, x.shape, mesh_shape)
    if zero_piece(spec, coord):
        return np.zeros(local_shape(x.shape, spec, mesh_shape), x.dtype)
    out = x
    for p, n, r in zip(spec, mesh_shape, coord):
        if not p.is_split:
            continue
        if p.blocks == 1:
            lo, hi = piece_bounds(x.shape[p.dim], n, r)
            out = out[(slice(None),) * p.dim + (slice(lo, hi),)]
        else:
            out = np.take(out, piece_index(x.shape[p.dim], n, r, p.blocks), axis=p.dim)
    return out


def local_shape_of(shape: tuple[int, ...], spec, mesh_shape: tuple[int, ...], first=()) -> tuple[int, ...]:
    out = list(shape)
    for dim, n, r in first:
        lo, hi = piece_bounds(out[dim], n, r)
        out[dim] = hi - lo
    return local_shape(tuple(out), spec, mesh_shape)
