"""Under MPI, a ShardedArray passed to a step that wants it in another spec is redistributed
between the calls, each rank moving only its own piece.

The steps are the plan's own (passes/sharding/redistribute.py: reduce-scatter, all-reduce,
all-to-all, all-gather, local slices and zeroing), lowered as between a plan's choices
(passes/lower.py ``redistribution_program``) and run by this rank's device (runtime/ranks.py
``RankExecutable``: bounded waits, a failure on one rank stops the others). A value placed on
another mesh of the job's ranks moves the same way when the meshes have the same shape (a device
has the same coordinates on both: ``dp=2`` to ``tp=2``); else it is made whole on every rank on its
own mesh first (all-reduces and all-gathers), then cut on the step's (local slices). The program
of each (type, spec and mesh before, spec and mesh after) is made once.
"""

from __future__ import annotations

import numpy as np

from graphc.core.errors import GraphcError
from graphc.core.ir import TensorType
from graphc.core.mesh import Mesh
from graphc.core.spec import R, Spec, format_spec
from graphc.passes.lower import redistribution_program
from graphc.runtime.devices import ShardedArray
from graphc.runtime.mpi_world import MpiWorld
from graphc.runtime.ranks import RankExecutable


class Resharder:
    """Redistributes this rank's pieces of ShardedArrays to the specs a step wants (module doc)."""

    def __init__(self, world: MpiWorld, timeout_s: float) -> None:
        self.world = world
        self.timeout_s = timeout_s
        self._programs: dict[tuple, RankExecutable] = {}
        self.moved = 0  # values redistributed so far (by a program; not those only relabelled)

    def arrange(self, arrays: list, specs: tuple[Spec, ...], mesh: Mesh) -> list:
        """``arrays`` with every ShardedArray in ``specs[k]`` on ``mesh`` (others as they are)."""
        return [
            self.to(a, specs[k], mesh, k) if isinstance(a, ShardedArray) and (a.spec, a.mesh) != (specs[k], mesh) else a
            for k, a in enumerate(arrays)
        ]

    def to(self, a: ShardedArray, spec: Spec, mesh: Mesh, position: int = 0) -> ShardedArray:
        """``a`` placed by ``spec`` on ``mesh`` (collective: every rank calls it with its piece)."""
        spec = tuple(spec)
        everyone = tuple(range(self.world.size))
        if a.world is None or a.mesh.size != self.world.size or (a.ranks is not None and a.ranks != everyone):
            raise GraphcError(
                f"input {position} is {a!r}, held by ranks {a.holders()}, and the step wants it in spec "
                f"{format_spec(spec)} on {mesh} over all {self.world.size} ranks: a value held by a part of the job "
                "(a pipeline stage) is not redistributed; pass the whole array (.gather on every rank) instead"
            )
        piece = a.pieces[self.world.rank]
        if tuple(a.mesh.shape) != tuple(mesh.shape):  # whole on every rank on its mesh, then cut on the step's
            whole = (R,) * len(a.mesh.shape)
            piece = self._run(a, a.spec, whole, a.mesh, piece)
            src, src_mesh = (R,) * len(mesh.shape), mesh
        else:  # the same coordinates on both meshes: the spec reads the same on the step's mesh
            src, src_mesh = a.spec, mesh
        if src != spec:
            piece = self._run(a, src, spec, src_mesh, piece)
        return ShardedArray({self.world.rank: piece}, spec, mesh, a.shape, a.dtype, world=self.world)

    def _run(self, a: ShardedArray, src: Spec, dst: Spec, mesh: Mesh, piece: np.ndarray) -> np.ndarray:
        key = (a.shape, np.dtype(a.dtype).str, src, dst, mesh)
        ex = self._programs.get(key)
        if ex is None:
            program = redistribution_program(TensorType(a.shape, np.dtype(a.dtype)), src, dst, mesh)
            ex = self._programs[key] = RankExecutable(program, self.world, self.timeout_s)
        self.moved += 1
        (out,) = ex.run_local([piece])
        return out


__all__ = ["Resharder"]
