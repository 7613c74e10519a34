"""One device per process: the device and pipeline runtimes on the MPI backend.

Every rank of ``mpiexec -n N`` holds the same compiled program (each compiled it or loaded it from
its own cache) and runs only its own device's part: device ``d`` is rank ``d``.

    setup    the ranks compare the program's fingerprint (one all-gather of a hash) before any
             collective: ranks that compiled different plans stop with MpiSetupError on every
             rank. Then the sub-communicators of every group are made (runtime/mpi_world.py),
             and this device's program alone is built (its kernels compiled or loaded).
    run      the inputs are cut to this device's pieces (a ShardedInput builds them, a
             memory-mapped array is sliced: nothing else is read), the program runs with an
             MpiComm, and every result comes back as a ShardedArray holding this rank's piece.

A failure on a rank tells the others (``MpiWorld.fail``) and is re-raised with the device id and
the user's line, as on threads. The first run checks every collective's call against the other
members' (``MpiComm.check_calls``); later runs trust the program, which does not change.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from typing import Any

import numpy as np

from graphc.core.errors import GraphcError
from graphc.core.mesh import Mesh
from graphc.core.spec import R
from graphc.programs import ParallelProgram, PipelineProgram, collective_sequence
from graphc.runtime.comm import CommAborted
from graphc.runtime.devices import ShardedArray, local_piece, on_device_error
from graphc.runtime.executor import Executable
from graphc.runtime.mpi import MpiComm
from graphc.runtime.mpi_world import MpiSetupError, MpiWorld
from graphc.runtime.pipeline import PipelineExecutable
from graphc.runtime.threads import one_blas_thread

_LOC = re.compile(r' loc\("(?:[^"\\]|\\.)*":\d+\)')
# the fingerprint check waits for the slowest rank's compile (planning, kernels): longer than a
# collective may wait, but bounded
SETUP_TIMEOUT_S = 600.0


def program_fingerprint(program: ParallelProgram | PipelineProgram) -> str:
    """A hash of what every rank must agree on: the device programs (text IR without source
    locations, which name files by the paths each machine sees), their specs and the mesh."""
    if isinstance(program, ParallelProgram):
        text = program.to_json()
    else:
        p = program
        parts = [
            repr((p.mesh.to_json(), p.pp_axis, p.m, p.schedule, p.stage_devices, p.sub_shape, p.order)),
            repr((sorted(p.n_segments.items()), p.n_inputs, sorted(p.batch), p.out_ids)),
            repr((sorted(p.meetings.items()), [str(t) for t in p.in_types], [str(t) for t in p.out_types])),
            repr((p.in_specs, p.out_specs)),
        ]
        for key, task in sorted(p.tasks.items()):
            parts.append(repr((key, task.in_ids, task.out_ids, sorted(task.sends.items()))))
            parts.append(str(task.graph))
        text = "\n".join(parts)
    return hashlib.sha256(_LOC.sub("", text).encode()).hexdigest()[:32]


def _check_size(mesh: Mesh, world: MpiWorld) -> None:
    if mesh.size != world.size:
        raise MpiSetupError(
            f"the mesh {mesh} has {mesh.size} devices but this MPI job has {world.size} processes: "
            f"launch it with mpiexec -n {mesh.size}"
        )


class _RankDevice:
    """What both rank executables start with: this rank is device ``world.rank`` of the program's
    mesh; the job has as many ranks as the mesh has devices, and every rank compiled the same
    program (one hash compared before any collective)."""

    def __init__(self, program, world: MpiWorld, timeout_s: float, what: str):
        self.program = program
        self.mesh: Mesh = program.mesh
        self.world = world
        self.device: int = world.rank
        self.timeout_s = timeout_s
        _check_size(self.mesh, world)
        self.fingerprint = program_fingerprint(program)
        world.check_same(self.fingerprint.encode(), f"plan hash ({what})", SETUP_TIMEOUT_S)


def _checked(world: MpiWorld, device: int, mesh: Mesh, exc: BaseException) -> BaseException:
    """The exception to raise for a failure on this rank (after telling the others)."""
    err = exc if isinstance(exc, (CommAborted, KeyboardInterrupt)) else on_device_error(exc, device, mesh)
    world.fail(err)
    return err


class RankExecutable(_RankDevice):
    """This rank's device of a ParallelProgram (module doc)."""

    def __init__(self, program: ParallelProgram, world: MpiWorld, timeout_s: float):
        start = time.perf_counter()
        super().__init__(program, world, timeout_s, "the device programs they compiled")
        self.program: ParallelProgram = program
        world.setup({e[1] for p in program.devices for e in collective_sequence(p.graph)}, timeout_s)
        self.mine = program.devices[self.device]
        self.comm = MpiComm(world, self.device, timeout_s)
        self.executable = Executable(self.mine.graph, self.comm)
        self.comm.alloc = self.executable.pool.get  # collective results reuse the device's dead buffers
        self.comm.static_calls = True
        self.runs = 0
        self.last_profile: dict[int, dict] | None = None
        self.stats: dict[str, Any] = {"build_s": time.perf_counter() - start}

    def local_pieces(self, arrays: list) -> list[np.ndarray]:
        """This device's piece of every input (nothing else is built or read)."""
        shape = tuple(self.mesh.shape)
        pieces = []
        for k, a in enumerate(arrays):
            spec = self.program.in_specs[k]
            if isinstance(a, ShardedArray):
                if a.spec != spec or a.mesh != self.mesh or self.device not in a.pieces:
                    raise GraphcError(
                        f"input {k} is a ShardedArray in spec {a.spec} on mesh {a.mesh}, but the plan wants "
                        f"{spec} on {self.mesh}: a rank's program runs pieces in its own specs "
                        "(graphc.parallelize redistributes a ShardedArray first: graphc/api/reshard.py)"
                    )
                pieces.append(a.pieces[self.device])
                continue
            pieces.append(local_piece(a, spec, shape, self.mine.coord))
        return pieces

    def run_local(self, pieces: list[np.ndarray], profile: bool = False) -> list[np.ndarray]:
        """Run this device's program on its pieces; its output pieces."""
        comm = self.comm
        comm.begin_run()
        comm.check_calls = self.runs == 0 or os.environ.get("GRAPHC_MPI_CHECK", "") not in ("", "0")
        prof: dict | None = {} if profile else None
        t0 = time.perf_counter()
        try:
            with one_blas_thread():
                outs = self.executable.run_flat(pieces, prof)
        except BaseException as exc:
            raise _checked(self.world, self.device, self.mesh, exc) from exc
        self.runs += 1
        if prof is not None:
            prof["t0"] = t0
            prof["comm_log"] = list(comm.log)
            self.last_profile = {self.device: prof}
        comm.log.clear()
        return outs

    def run_flat(self, arrays: list, profile: bool = False, keep_sharded: Any = None) -> list[ShardedArray]:
        """Run on whole inputs, ShardedInputs or ShardedArrays; every output is a ShardedArray of
        this rank's piece (``keep_sharded`` is ignored: nothing is gathered under MPI)."""
        try:
            pieces = self.local_pieces(arrays)
        except BaseException as exc:
            raise _checked(self.world, self.device, self.mesh, exc) from exc
        outs = self.run_local(pieces, profile)
        return [
            ShardedArray({self.device: o}, spec, self.mesh, t.shape, t.dtype, world=self.world)
            for o, t, spec in zip(outs, self.program.out_types, self.program.out_specs)
        ]


def _stage_mesh(program: PipelineProgram) -> Mesh:
    """The mesh of one stage (the program's without its pp axis), as passes/pipeline.py makes it."""
    mesh = program.mesh
    rest = {n: k for i, (n, k) in enumerate(zip(mesh.axis_names, mesh.shape)) if i != program.pp_axis}
    return Mesh(rest or {"stage": 1}, profile=mesh.profile)


class RankPipelineExecutable(_RankDevice):
    """This rank's device of a PipelineProgram: its tasks in the schedule's order, values to and
    from other stages by Isend/Irecv (module doc)."""

    def __init__(self, program: PipelineProgram, world: MpiWorld, timeout_s: float):
        start = time.perf_counter()
        super().__init__(program, world, timeout_s, "the pipeline they compiled")
        self.program: PipelineProgram = program
        groups = set()
        for task in program.tasks.values():
            stage = program.stage_devices[program.stage_of(task.device)]
            groups |= {tuple(stage[i] for i in e[1]) for e in collective_sequence(task.graph)}
        world.setup(groups, timeout_s)
        self.pipe = PipelineExecutable(program, timeout_s, devices=(self.device,))
        self.comm = MpiComm(world, self.device, timeout_s)
        self.comm.static_calls = True
        self.stage_mesh = _stage_mesh(program)
        self.runs = 0
        self.last_profile: dict[int, dict] | None = None
        self.stats: dict[str, Any] = {"build_s": time.perf_counter() - start}

    def stage_of(self, device: int) -> int:
        return self.program.stage_of(device)

    def run_local(self, arrays: list, profile: bool = False) -> dict[int, np.ndarray]:
        """One step of this device; the step's outputs it holds (value id -> piece)."""
        comm = self.comm
        comm.begin_run()
        comm.check_calls = self.runs == 0 or os.environ.get("GRAPHC_MPI_CHECK", "") not in ("", "0")
        prof: dict | None = {"events": [], "peak_bytes": 0} if profile else None
        t0 = time.perf_counter()
        try:
            arrays = self.pipe.move_held_inputs(arrays, self.device, comm)
            pieces = self.pipe._split_inputs(arrays, only=self.device)[self.device]
            with one_blas_thread():
                owned = self.pipe.run_device(self.device, comm, pieces, prof)
            comm.flush_sends()
        except BaseException as exc:
            raise _checked(self.world, self.device, self.mesh, exc) from exc
        self.runs += 1
        if prof is not None:
            prof["t0"] = t0
            self.last_profile = {self.device: prof}
        comm.log.clear()
        return owned

    def run_flat(self, arrays: list, profile: bool = False) -> list:
        """One step; every output is a ShardedArray over the stage that holds it (this rank's
        piece if it is in that stage, none otherwise), or an input passed through as given."""
        p = self.program
        owned = self.run_local(arrays, profile)
        results: list = []
        for k, vid in enumerate(p.out_ids):
            if vid < p.n_inputs:  # an input passed through: the caller's array is not handed back
                a = arrays[vid]
                results.append(np.array(a, copy=True) if isinstance(a, np.ndarray) else a)
                continue
            t = p.out_types[k]
            stage = p.stage_devices[p.owner(vid)]
            spec = p.out_specs[k] if p.out_specs is not None else (R,) * len(self.stage_mesh.shape)
            pieces = {stage.index(self.device): owned[vid]} if self.device in stage else {}
            results.append(ShardedArray(pieces, spec, self.stage_mesh, t.shape, t.dtype, ranks=stage, world=self.world))
        return results


__all__ = ["RankExecutable", "RankPipelineExecutable", "program_fingerprint"]
