"""Checkpoints: save a pytree of (sharded) arrays, one file per shard of each device, and load
it back on any mesh and plan, re-slicing the shards (resharding, as PyTorch DCP and Orbax do).

    graphc.save_checkpoint("ckpt", {"params": params, "opt_state": opt}, compiled, step=10)
    state = graphc.load_checkpoint("ckpt", other_compiled)   # the latest step, as ShardedArrays
    state = graphc.load_checkpoint("ckpt")                   # whole numpy arrays

``ckpt/step_00000010/`` holds ``manifest.json`` and ``device-D/leaf-L.npy`` (the format:
graphc/core/checkpoint_format.py). Each distinct shard is written once, by the first device that
holds it: a replicated leaf is one file.

Atomic, as Orbax's steps are: everything is written into a hidden sibling
``.step_00000010.tmp-<random>`` and fsynced, the manifest last, then the directory is renamed to
its name. A crash before that rename leaves no directory under that name and the earlier steps
as they were; ``load_checkpoint("ckpt")`` takes the latest ``step_N``. ``overwrite=True``
replaces a checkpoint: the old one is renamed aside, the new one in (the old one back if that
fails), then the old one is deleted; a crash between those two renames leaves the old one whole
as ``.NAME.old-<random>``.

Under MPI, ``comm`` is an mpi4py communicator (anything with its ``Get_rank``, ``Get_size``,
``bcast``, ``gather`` and ``allgather``; saving takes the MPI backend's from the state's
ShardedArrays). Device ``d`` belongs to rank ``d % size``, or to the rank its ShardedArray's
``ranks`` names. Each rank writes only its devices' shards, rank 0 writes the manifest once every
rank has succeeded and renames, and all ranks return or raise together. Loading, each rank builds
only its devices' pieces and reads only the shard files that overlap them.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from graphc.api.compiled import ParallelCompiled, PipelineCompiled
from graphc.core.checkpoint_format import (
    DTYPES,
    MANIFEST,
    VERSION,
    CheckpointError,
    Leaf,
    Shard,
    Target,
    check_files,
    check_layout,
    checked_spec,
    coord_of,
    copy_shard,
    dotted,
    fsync_dir,
    index_runs,
    leaf_json,
    owner_devices,
    piece_indices,
    read_manifest,
    run_indices,
    to_storage,
    tree_json,
    write_file,
    write_npy,
)
from graphc.core.errors import GraphcError
from graphc.core.files import dump_document
from graphc.core.ir import TensorType
from graphc.core.mesh import Mesh, as_mesh
from graphc.core.pytree import TreeDef, flatten, leaf_paths, unflatten
from graphc.core.spec import Placement, Spec, format_spec
from graphc.passes.pipeline import PipelinePlan
from graphc.passes.sharding.plan import ShardingPlan
from graphc.runtime.devices import ShardedArray
from graphc.runtime.mpi_world import current_world

STEP_NAME = "step_{:08d}"
_STEP_DIR = re.compile(r"step_(\d+)")
_NAME_OK = re.compile(r"[^A-Za-z0-9_.]")  # graph input names, as Graph.value_names sanitizes them


class Comm(Protocol):
    """What checkpoints need of an MPI communicator (mpi4py's ``Comm`` has it)."""

    def Get_rank(self) -> int: ...  # noqa: N802 (mpi4py's names)

    def Get_size(self) -> int: ...  # noqa: N802

    def bcast(self, obj: Any, root: int = 0) -> Any: ...

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None: ...

    def allgather(self, obj: Any) -> list[Any]: ...


class _OneProcess:
    """The communicator of a process that holds every device (the threaded runtime)."""

    def Get_rank(self) -> int:  # noqa: N802
        return 0

    def Get_size(self) -> int:  # noqa: N802
        return 1

    def bcast(self, obj: Any, root: int = 0) -> Any:
        return obj

    def gather(self, obj: Any, root: int = 0) -> list[Any]:
        return [obj]

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]


# --- which spec each leaf gets -------------------------------------------------------------------


def _is_spec(x: Any) -> bool:
    return isinstance(x, str) or (isinstance(x, tuple) and all(isinstance(p, Placement) for p in x))


def _plan_of(plan: Any) -> ShardingPlan | None:
    if isinstance(plan, (PipelineCompiled, PipelinePlan)):
        raise CheckpointError("pipeline plans give no single spec per array: pass a pytree of specs and mesh=")
    if isinstance(plan, ParallelCompiled):
        return plan.plan
    return plan if isinstance(plan, ShardingPlan) else None


def specs_for(
    plan: Any, mesh: Any, paths: list[tuple], types: list[TensorType]
) -> tuple[Mesh | None, list[Spec | None]]:
    """(mesh, one spec or None per leaf) from ``plan``: a ShardingPlan or the compiled object
    (leaves matched to its inputs by name: the step's argument name, then the keys), one spec for
    every leaf, a pytree of specs (None: a whole array), or None."""
    if plan is None:
        return (as_mesh(mesh) if mesh is not None else None), [None] * len(paths)
    sharding = _plan_of(plan)
    if sharding is not None:
        return sharding.mesh, _match_plan_inputs(sharding, paths, types)
    if mesh is None:
        raise CheckpointError("a checkpoint's specs need the mesh they are for: pass mesh=")
    if _is_spec(plan):
        return as_mesh(mesh), [checked_spec(plan, "spec")] * len(paths)
    try:
        leaves, tree = flatten(plan, is_leaf=lambda v: v is None or _is_spec(v))
    except TypeError as exc:
        raise CheckpointError(f"specs: {exc}") from None
    if leaf_paths(tree) != paths:
        raise CheckpointError(
            f"the specs' pytree has leaves {[dotted(p) for p in leaf_paths(tree)][:8]}, the state {[dotted(p) for p in paths][:8]}"
        )
    return as_mesh(mesh), [None if s is None else checked_spec(s, dotted(p)) for s, p in zip(leaves, paths)]


def _match_plan_inputs(plan: ShardingPlan, paths: list[tuple], types: list[TensorType]) -> list[Spec | None]:
    by_name = {x.name.lstrip("%"): x for x in plan.inputs}
    out: list[Spec | None] = []
    for path, t in zip(paths, types):
        name = _NAME_OK.sub("_", dotted(path))
        choice = by_name.get(name)
        if choice is None:
            known = ", ".join(sorted(by_name)[:6])
            raise CheckpointError(
                f"state leaf {dotted(path)!r} is not an input of plan @{plan.graph_name} (inputs: {known}, ...); "
                "key the state by the step's argument names, e.g. {'params': params, 'opt_state': opt_state}"
            )
        if choice.type != str(t):
            raise CheckpointError(
                f"state leaf {dotted(path)!r} is {t}, the plan's input {choice.name} is {choice.type}"
            )
        out.append(choice.spec)
    return out


def _tensor_type(shape: tuple[int, ...], dtype: np.dtype, what: str) -> TensorType:
    """The type of a leaf being saved, its dtype in native byte order; one graphc supports."""
    canonical = DTYPES.get(dtype.name)
    if canonical is None or canonical.kind != dtype.kind:
        raise CheckpointError(f"{what}: dtype {dtype} cannot be checkpointed (supported: {', '.join(DTYPES)})")
    return TensorType(shape, canonical)


# --- saving ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Saving:
    """A leaf being saved: its manifest entry (without sizes and checksums yet) and its value."""

    leaf: Leaf
    value: Any  # a numpy array or a ShardedArray


def _leaves_to_save(state: Any, plan: Any, mesh: Any) -> tuple[dict[str, int], TreeDef, list[_Saving]]:
    """The mesh's axes, the state's tree and every leaf with the shards to write (the same on every
    rank: it depends only on the arguments)."""
    try:
        values, tree = flatten(state)
    except TypeError as exc:
        raise CheckpointError(f"state: {exc}") from None
    tree_json(tree, "state")  # keys a manifest can hold
    paths = leaf_paths(tree)
    arrays = [v if isinstance(v, ShardedArray) else np.asarray(v) for v in values]
    types = [
        _tensor_type(tuple(a.shape), np.dtype(a.dtype), f"state leaf {dotted(p)!r}") for a, p in zip(arrays, paths)
    ]
    target, specs = specs_for(plan, mesh, paths, types)
    if target is None:
        target = next((a.mesh for a in arrays if isinstance(a, ShardedArray)), None)
    axes = dict(zip(target.axis_names, target.shape)) if target is not None else {}
    mesh_shape = tuple(axes.values())
    out = []
    for k, (path, value, t, spec) in enumerate(zip(paths, arrays, types, specs)):
        what = f"state leaf {dotted(path)!r}"
        if isinstance(value, ShardedArray):
            if dict(zip(value.mesh.axis_names, value.mesh.shape)) != axes:
                raise CheckpointError(f"{what} is on mesh {value.mesh}, the checkpoint's mesh is {axes}")
            if spec is not None and tuple(spec) != value.spec:
                raise CheckpointError(
                    f"{what} is held as {format_spec(value.spec)}, the plan gives {format_spec(spec)}"
                )
            spec = value.spec
        spec = tuple(spec) if spec is not None else tuple(Placement("R") for _ in mesh_shape)
        check_layout(spec, t.shape, mesh_shape, what, partial=False)
        shards = []
        for d in owner_devices(spec, mesh_shape):
            coord = coord_of(d, mesh_shape)
            index = tuple(index_runs(ix) for ix in piece_indices(t.shape, spec, mesh_shape, coord))
            if all(index):  # an empty piece holds no data: no file
                shards.append(Shard(f"device-{d}/leaf-{k}.npy", d, coord, index))
        leaf = Leaf(path, t.shape, t.dtype, isinstance(values[k], np.generic), spec, tuple(shards))
        out.append(_Saving(leaf, value))
    return axes, tree, out


def _piece_to_write(saving: _Saving, shard: Shard) -> np.ndarray:
    """The data of ``shard``: the device's piece of a ShardedArray, or a slice of a whole array."""
    value, name = saving.value, saving.leaf.name
    if isinstance(value, ShardedArray):
        piece = value.pieces.get(shard.device)
        if piece is None:
            raise CheckpointError(
                f"state leaf {name!r}: this process holds the pieces of devices {sorted(value.pieces)}, not device "
                f"{shard.device}'s (under MPI, pass comm=)"
            )
        piece = np.asarray(piece)
        if piece.shape != shard.shape:
            raise CheckpointError(
                f"state leaf {name!r}: device {shard.device}'s piece is {piece.shape}, expected {shard.shape}"
            )
        return piece
    if all(len(runs) == 1 for runs in shard.index):
        return value[tuple(slice(*runs[0]) for runs in shard.index)]
    return value[np.ix_(*[run_indices(runs) for runs in shard.index])]


def _writer(saving: _Saving, device: int, size: int) -> int:
    """The rank that writes ``device``'s shard: the one holding it (a ShardedArray of the MPI
    backend on a pipeline stage's sub-mesh knows its ranks), else rank ``device % size``."""
    ranks = getattr(saving.value, "ranks", None)
    return ranks[device] if ranks is not None else device % size


def _local_shards(savings: list[_Saving], rank: int, size: int):
    for saving in savings:
        for shard in saving.leaf.shards:
            if _writer(saving, shard.device, size) == rank:
                yield saving, shard


def _mpi_comm_of(savings: list[_Saving]) -> Comm | None:
    """The MPI communicator the state's ShardedArrays live in (the MPI backend's), if any."""
    worlds = (getattr(sv.value, "world", None) for sv in savings if isinstance(sv.value, ShardedArray))
    return next((w.world for w in worlds if w is not None and hasattr(w, "world")), None)


def _check_local_pieces(savings: list[_Saving], rank: int, size: int) -> None:
    for saving, shard in _local_shards(savings, rank, size):
        if isinstance(saving.value, ShardedArray):
            _piece_to_write(saving, shard)


def _write_local(tmp: str, savings: list[_Saving], rank: int, size: int) -> dict[str, tuple[int, str]]:
    """Write this process's shards into ``tmp``: {file: (bytes, sha256)}."""
    records: dict[str, tuple[int, str]] = {}
    folders: set[str] = set()
    for saving, shard in _local_shards(savings, rank, size):
        folder = os.path.join(tmp, os.path.dirname(shard.file))
        if folder not in folders:
            os.makedirs(folder, exist_ok=True)
            folders.add(folder)
        data = to_storage(_piece_to_write(saving, shard), saving.leaf.dtype)
        records[shard.file] = write_npy(os.path.join(tmp, shard.file), data)
    for folder in folders:
        fsync_dir(folder)
    return records


def _is_checkpoint(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path) and os.path.isfile(os.path.join(path, MANIFEST))


def _is_empty_dir(path: str) -> bool:
    """An empty directory, which a rename replaces in one step (a folder made for the checkpoint)."""
    return os.path.isdir(path) and not os.path.islink(path) and not os.listdir(path)


def _prepare(final: str, stepped: bool, overwrite: bool) -> str:
    """Check where the checkpoint goes and make its temporary sibling; returns the sibling."""
    parent = os.path.dirname(os.path.abspath(final))
    if stepped and not os.path.isdir(parent) and os.path.isdir(os.path.dirname(parent)):
        try:
            os.makedirs(parent, exist_ok=True)  # the folder of the steps; its own folder must exist
        except OSError as exc:
            raise CheckpointError(f"cannot create {parent}: {exc.strerror}") from None
    if not os.path.isdir(parent):
        raise CheckpointError(f"cannot write checkpoint {final}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CheckpointError(f"cannot write checkpoint {final}: folder {parent} is not writable")
    if os.path.lexists(final) and not _is_empty_dir(final):
        if not _is_checkpoint(final):
            raise CheckpointError(f"{final} exists and is not a graphc checkpoint; refusing to replace it")
        if not overwrite:
            raise CheckpointError(f"checkpoint {final} exists; pass overwrite=True to replace it, or another step")
    tmp = os.path.join(parent, f".{os.path.basename(final)}.tmp-{secrets.token_hex(6)}")
    try:
        os.mkdir(tmp)
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint {final}: {exc.strerror}") from None
    return tmp


def _commit(tmp: str, final: str) -> None:
    """Rename the finished ``tmp`` to ``final``. An existing checkpoint is renamed aside first and
    put back if the second rename fails; it is deleted only once the new one is in place."""
    parent = os.path.dirname(os.path.abspath(final))
    fsync_dir(tmp)
    if not os.path.lexists(final) or _is_empty_dir(final):
        os.rename(tmp, final)
        fsync_dir(parent)
        return
    old = os.path.join(parent, f".{os.path.basename(final)}.old-{secrets.token_hex(6)}")
    os.rename(final, old)
    try:
        os.rename(tmp, final)
    except BaseException:
        os.rename(old, final)
        raise
    fsync_dir(parent)
    shutil.rmtree(old, ignore_errors=True)


def _finish(tmp: str, final: str, doc: dict, savings: list[_Saving], gathered: list) -> str | None:
    """Rank 0: the manifest, once every rank has written its shards, then the rename. Returns
    an error message (and removes ``tmp``), or None."""
    errors = [f"rank {r}: {err}" for r, (_rec, err) in enumerate(gathered) if err]
    if errors:
        shutil.rmtree(tmp, ignore_errors=True)
        return f"checkpoint {final} not written: " + "; ".join(errors)
    records = {k: v for rec, _err in gathered for k, v in rec.items()}
    missing = [s.file for sv in savings for s in sv.leaf.shards if s.file not in records]
    if missing:
        shutil.rmtree(tmp, ignore_errors=True)
        return f"checkpoint {final} not written: no rank wrote {', '.join(missing[:4])}"
    doc["leaves"] = [leaf_json(sv.leaf, records) for sv in savings]
    write_file(os.path.join(tmp, MANIFEST), [dump_document(doc).encode()])
    _commit(tmp, final)
    return None


def _agree(group: Comm, fn):
    """``fn()`` on every rank; if it raises a GraphcError (or OSError) on any, every rank raises."""
    try:
        result, mine = fn(), None
    except GraphcError as exc:
        result, mine = None, exc
    except OSError as exc:
        result, mine = None, CheckpointError(f"{exc.filename or 'checkpoint'}: {exc.strerror or exc}")
    errors = group.allgather(None if mine is None else str(mine))
    if mine is not None:
        raise mine
    first = next(((r, e) for r, e in enumerate(errors) if e), None)
    if first is not None:
        raise CheckpointError(f"rank {first[0]}: {first[1]}")
    return result


def _on_root(group: Comm, fn):
    """``fn()`` on rank 0, its result (or its GraphcError) on every rank."""
    result, error = None, None
    if group.Get_rank() == 0:
        try:
            result = fn()
        except GraphcError as exc:
            error = exc
    result, message = group.bcast((result, None if error is None else str(error)), root=0)
    if error is not None:
        raise error
    if message is not None:
        raise CheckpointError(f"rank 0: {message}")
    return result


def step_path(path: str | os.PathLike, step: int | None) -> str:
    """The directory of a checkpoint: ``path`` itself, or its ``step_NNNNNNNN`` subdirectory."""
    if step is None:
        return os.fspath(path)
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise CheckpointError(f"step must be a non-negative int, got {step!r}")
    return os.path.join(os.fspath(path), STEP_NAME.format(int(step)))


def save_checkpoint(
    path: str | os.PathLike,
    state: Any,
    plan: Any = None,
    *,
    mesh: Any = None,
    step: int | None = None,
    overwrite: bool = False,
    comm: Comm | None = None,
) -> str:
    """Write ``state`` (a pytree of numpy arrays, numpy scalars and ShardedArrays; static leaves
    are kept in the manifest) as a checkpoint; returns its directory.

    ``plan`` gives each leaf's spec on its mesh: a ShardingPlan or the compiled step
    (``pf.compile(...)``; leaves matched to the step's inputs by name, so key the state by the
    step's argument names: ``{"params": ..., "opt_state": ...}``), one spec for every leaf, or a
    pytree of specs with ``mesh=``. A ShardedArray is saved as it is held; without a plan other
    leaves are replicated (written once). ``step=N`` writes ``path/step_0000000N`` (the loader
    picks the latest). An existing checkpoint is replaced only with ``overwrite=True``.

    ``comm`` (MPI; default: the world of the state's ShardedArrays under the MPI backend): each
    rank writes the shards of the devices it holds (device ``d`` on rank ``d % size`` unless the
    ShardedArray says otherwise); rank 0 writes the manifest once all have succeeded."""
    final = step_path(path, step)
    axes, tree, savings = _leaves_to_save(state, plan, mesh)
    group: Comm = comm if comm is not None else (_mpi_comm_of(savings) or _OneProcess())
    rank, size = group.Get_rank(), group.Get_size()
    _agree(group, lambda: _check_local_pieces(savings, rank, size))
    tmp = _on_root(group, lambda: _prepare(final, step is not None, overwrite))
    doc = {
        "kind": "checkpoint",
        "version": VERSION,
        "mesh": {"axes": axes},
        "step": None if step is None else int(step),
        "tree": tree_json(tree, "state"),
    }
    failure: BaseException | None = None
    try:
        try:
            records, error = _write_local(tmp, savings, rank, size), None
        except (Exception, KeyboardInterrupt) as exc:  # reported to rank 0, which removes tmp
            records, error, failure = {}, f"{type(exc).__name__}: {exc}", exc
        gathered = group.gather((records, error), root=0)
        outcome = None
        if rank == 0:
            try:
                outcome = _finish(tmp, final, doc, savings, gathered or [])
            except Exception as exc:
                shutil.rmtree(tmp, ignore_errors=True)
                outcome, failure = f"checkpoint {final} not written: {type(exc).__name__}: {exc}", exc
        outcome = group.bcast(outcome, root=0)
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if isinstance(failure, KeyboardInterrupt):
        raise failure
    if outcome is not None:
        raise CheckpointError(outcome) from failure
    return final


# --- loading -------------------------------------------------------------------------------------


def checkpoint_steps(path: str | os.PathLike) -> dict[int, str]:
    """{step: directory} of the ``step_N`` checkpoints in ``path`` (each is whole: a step's
    directory gets its name only once it is complete)."""
    try:
        names = os.listdir(path)
    except OSError:
        return {}
    steps = {}
    for name in sorted(names):
        m = _STEP_DIR.fullmatch(name)
        if m and os.path.isdir(os.path.join(path, name)):
            steps[int(m.group(1))] = os.path.join(os.fspath(path), name)
    return steps


def find_checkpoint(path: str | os.PathLike, step: int | None = None) -> str:
    """The checkpoint directory: ``path`` if it holds a manifest, else its step ``step`` (default:
    the latest)."""
    path = os.fspath(path)
    steps = checkpoint_steps(path)
    if step is not None:
        step_path(path, step)  # checks the value
        if int(step) not in steps:
            raise CheckpointError(f"{path}: no checkpoint of step {step} (steps: {sorted(steps) or 'none'})")
        return steps[int(step)]
    if os.path.lexists(os.path.join(path, MANIFEST)) or not steps:
        return path
    return steps[max(steps)]


def _load_leaf(directory: str, leaf: Leaf, spec: Spec | None, mesh: Mesh | None, devices: list[int], world) -> Any:
    """A whole array (``spec`` None) or a ShardedArray with the pieces of ``devices`` (under MPI,
    of the MPI backend's ``world``, whose ``gather`` assembles it)."""
    if spec is None or mesh is None:
        whole = Target(np.empty(leaf.shape, leaf.dtype), [np.arange(n) for n in leaf.shape])
        for shard in leaf.shards:
            copy_shard(directory, leaf, shard, [whole])
        return whole.array[()] if leaf.scalar else whole.array
    mesh_shape = tuple(mesh.shape)
    pieces: dict[int, np.ndarray] = {}
    targets = []
    for d in devices:
        coord = mesh.coord(d)
        index = piece_indices(leaf.shape, spec, mesh_shape, coord)
        pieces[d] = np.zeros(tuple(len(i) for i in index), leaf.dtype)
        if not any(p.kind == "P" and c != 0 for p, c in zip(spec, coord)):  # P: coordinate 0 holds the value
            targets.append(Target(pieces[d], index))
    for shard in leaf.shards:
        copy_shard(directory, leaf, shard, targets)
    return ShardedArray(pieces, spec, mesh, leaf.shape, leaf.dtype, world=world)


def _load(path, plan, mesh, step, devices, group: Comm) -> Any:
    directory = find_checkpoint(path, step)
    manifest = read_manifest(directory)
    check_files(directory, manifest)
    types = [TensorType(leaf.shape, leaf.dtype) for leaf in manifest.leaves]
    target, specs = specs_for(plan, mesh, [leaf.path for leaf in manifest.leaves], types)
    if target is not None:
        for leaf, spec in zip(manifest.leaves, specs):
            if spec is not None:
                check_layout(spec, leaf.shape, tuple(target.shape), f"loading {leaf.name!r}", partial=True)
    size, rank = group.Get_size(), group.Get_rank()
    everywhere = range(target.size) if target is not None else range(1)
    devices = [d for d in everywhere if d % size == rank] if devices is None else list(devices)
    wrong = [d for d in devices if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d not in everywhere]
    if wrong:
        raise CheckpointError(f"devices: {wrong[:4]} are not devices of the mesh (0..{len(everywhere) - 1})")
    world = current_world() if size > 1 else None
    values = [_load_leaf(directory, leaf, spec, target, devices, world) for leaf, spec in zip(manifest.leaves, specs)]
    return unflatten(manifest.tree, values)


def load_checkpoint(
    path: str | os.PathLike,
    plan: Any = None,
    *,
    mesh: Any = None,
    step: int | None = None,
    devices: Sequence[int] | None = None,
    comm: Comm | None = None,
) -> Any:
    """Restore the pytree saved in ``path`` (a checkpoint directory, or a folder of ``step_N``
    checkpoints: ``step``, default the latest).

    ``plan=None``: every leaf as a whole numpy array. Otherwise ``plan`` gives the target layout,
    as for ``save_checkpoint`` (a ShardingPlan, the compiled step, a spec, or a pytree of specs
    with ``mesh=``; None leaves whole): such leaves come back as ShardedArrays on that mesh, with
    the pieces of ``devices`` (default every device; under MPI, ``comm``'s rank's), re-sliced from
    the saved shards whatever mesh and specs they were saved with.

    Everything is checked before anything is returned; a problem is a CheckpointError naming the
    file. Under MPI every rank raises if any rank finds one."""
    group: Comm = comm if comm is not None else _OneProcess()
    return _agree(group, lambda: _load(path, plan, mesh, step, devices, group))


__all__ = ["CheckpointError", "checkpoint_steps", "find_checkpoint", "load_checkpoint", "save_checkpoint"]
