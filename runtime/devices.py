"""The multi-device runtime: one thread per device, each running its program.

``ParallelExecutable(program)`` takes a ``graphc.programs.ParallelProgram`` (lowered and compiled
by graphc/passes/partition.py; this module never plans or lowers) and builds one single-device
executable per device whose collectives go to that device's communicator (runtime/comm.py;
threads in shared memory now, MPI processes later). BLAS is limited to one thread while devices
run, so devices do not fight over the cores.

``run_flat(arrays)`` shards the inputs by the plan's input specs, runs all devices, and
reassembles the outputs. An exception on one device aborts the others (their collectives raise
promptly) and is re-raised as the same exception type with the device id and the user's source
line; a collective that cannot complete raises a CommError naming it within the timeout.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from graphc.core.errors import GraphcError
from graphc.core.mesh import Mesh
from graphc.core.pytree import ArraySpec
from graphc.core.spec import Spec, format_spec, shard, unshard
from graphc.programs import ParallelProgram
from graphc.runtime.comm import CommAborted, ThreadWorld
from graphc.runtime.executor import Executable
from graphc.runtime.threads import one_blas_thread


class _CommProxy:
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
        self.proxies = {p.device: _CommProxy() for p in program.devices}
        self.executables = {p.device: Executable(p.graph, self.proxies[p.device]) for p in program.devices}
        self.stats["build_s"] = time.perf_counter() - start
        self.last_profile: dict[int, dict] | None = None

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
            whole = np.asarray(a)
            for p in devices:
                pieces[p.device].append(shard(whole, spec, shape, p.coord))
        return pieces

    def run_flat(self, arrays: list, profile: bool = False, keep_sharded: frozenset = frozenset()) -> list:
        """Run on whole inputs (or ShardedArrays); outputs are whole arrays, except the positions in
        ``keep_sharded``, which stay on the devices as ShardedArrays."""
        outs = self.run_sharded(self.shard(arrays), profile)
        shape = tuple(self.mesh.shape)
        devices = self.program.devices
        result: list[np.ndarray | ShardedArray] = []
        for k, (t, spec) in enumerate(zip(self.program.out_types, self.program.out_specs)):
            by_device = {p.device: outs[p.device][k] for p in devices}
            if k in keep_sharded:
                result.append(ShardedArray(by_device, spec, self.mesh, t.shape, t.dtype))
                continue
            pieces = {p.coord: by_device[p.device] for p in devices}
            result.append(unshard(pieces, spec, shape, t.shape).astype(t.dtype, copy=False))
        return result

    def run_sharded(self, pieces: dict[int, list[np.ndarray]], profile: bool = False) -> dict[int, list[np.ndarray]]:
        """Run every device on its pieces; returns every device's output pieces."""
        world = ThreadWorld(self.mesh.size, timeout_s=self.timeout_s)
        for d, proxy in self.proxies.items():
            proxy.current = comm = world.comm(d)
            comm.alloc = self.executables[d].pool.get  # collective results reuse the device's dead buffers
        profiles: dict[int, dict] = {d: {} for d in self.executables} if profile else {}
        t0 = time.perf_counter()
        try:
            return run_on_devices(
                list(self.executables),
                world,
                self.mesh,
                self.timeout_s,
                lambda d: self.executables[d].run_flat(pieces[d], profiles.get(d)),
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
    source line; devices that do not finish within the timeout are named."""
    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}

    def device(d: int) -> None:
        try:
            results[d] = body(d)
        except BaseException as exc:  # noqa: BLE001 - every failure stops the other devices
            errors[d] = exc
            world.abort(d, exc)

    threads = [threading.Thread(target=device, args=(d,), name=f"graphc-device-{d}", daemon=True) for d in devices]
    with one_blas_thread():
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout_s + 5.0
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
    if errors:
        root = {d: e for d, e in errors.items() if not isinstance(e, CommAborted)} or errors
        d = min(root)
        raise _on_device(root[d], d, mesh)
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:
        raise GraphcError(f"devices did not finish within {timeout_s + 5:.0f} s: {', '.join(stuck)}")
    return results


def _on_device(exc: BaseException, device: int, mesh) -> BaseException:
    """The same kind of exception, saying which device raised it and at which line of the model."""
    where = next((n[len("graphc: ") :] for n in getattr(exc, "__notes__", []) if n.startswith("graphc: in ")), None)
    msg = f"device {device} (mesh {dict(zip(mesh.axis_names, mesh.coord(device)))}): {exc}"
    if where:
        msg += f" ({where})"
    try:
        new = type(exc)(msg)
    except Exception:  # an exception type that takes other arguments
        new = GraphcError(f"{type(exc).__name__}: {msg}")
    new.__cause__ = exc
    return new


class ShardedArray(ArraySpec):
    """An array that lives on the devices of a mesh, one piece per device in ``spec``: what a
    parallelized step returns for state it is given back next step (``sharded_state=True``), so a
    training loop does not gather and re-split its parameters every step. Passing it back with the
    same spec uses the pieces as they are; ``np.asarray`` gathers it into one array."""

    pieces: dict[int, np.ndarray]  # device -> its piece
    spec: Spec
    mesh: Mesh

    def __init__(self, pieces: dict[int, np.ndarray], spec: Spec, mesh: Mesh, shape: tuple[int, ...], dtype):
        super().__init__(shape, dtype)
        object.__setattr__(self, "pieces", pieces)
        object.__setattr__(self, "spec", tuple(spec))
        object.__setattr__(self, "mesh", mesh)

    def __array__(self, dtype=None, copy=None):
        whole = unshard(
            {self.mesh.coord(d): p for d, p in self.pieces.items()}, self.spec, tuple(self.mesh.shape), self.shape
        ).astype(self.dtype, copy=False)
        return whole if dtype is None else whole.astype(dtype)

    def __repr__(self) -> str:
        return f"ShardedArray({np.dtype(self.dtype).name}{list(self.shape)}, spec={format_spec(self.spec)}, mesh={self.mesh!r})"

    __eq__ = object.__eq__
    __hash__ = object.__hash__
