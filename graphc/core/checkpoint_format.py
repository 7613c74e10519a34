"""The on-disk format of a checkpoint (graphc/api/checkpoint.py writes and reads it): the
manifest, where each shard lies in its array, and the shard files, every field checked on read.

    manifest.json          {"kind": "checkpoint", "version": 1, "mesh": {"axes": {"dp": 2}},
                            "step": 10, "tree": <the pytree's structure>, "leaves": [one per line]}
    device-0/leaf-3.npy    device 0's shard of leaf 3: a plain .npy file (bfloat16 as uint16 bits)

A leaf records its pytree path, global shape, dtype, spec on the saved mesh and its shards; a
shard its file, device and mesh coordinates, its index runs per dim (``[lo, hi)`` ranges of
global indices: one for ``S(d)``, k for ``S(d, blocks=k)``), its size and its SHA-256.

Why SHA-256: hashlib's is in the standard library and runs on the CPU's SHA extensions, faster
here than BLAKE2b; CRC-32 is faster still but cannot stand for the file's content against anyone
who edits it (docs/measurements.md#checkpoint-hash). A manifest's digests commit it to the
bytes of every shard: with a manifest you trust, no shard can be changed unnoticed.

Nothing read is trusted: paths must be relative and stay inside the checkpoint, numbers in range,
index runs ascending and inside the array, and the shards must tile every array exactly once.
A shard is copied from only after its size, SHA-256 and .npy header have been checked.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import math
import mmap
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.core.dtypes import BFLOAT16, SHORT_NAMES
from graphc.core.errors import GraphcError
from graphc.core.files import read_document
from graphc.core.pytree import TreeDef, leaf_paths
from graphc.core.spec import Spec, SpecError, format_spec, parse_spec, piece_index

VERSION = 1
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 256 * 2**20  # about 200 bytes per shard: a million shards
MAX_TREE_DEPTH = 100
MAX_DEVICES = 2**20
MAX_NPY_HEADER = 2**16  # numpy writes 128 bytes for a few dims
_PATH_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # never "." or "..", no separators
_SHA256 = re.compile(r"[0-9a-f]{64}")
DTYPES = {dt.name: dt for dt in SHORT_NAMES}  # "float32", "bfloat16", "bool", ...


class CheckpointError(GraphcError):
    """A checkpoint that cannot be written, or whose files do not hold what its manifest says."""


def dotted(path: tuple) -> str:
    """A leaf's pytree path as text: ``params.layers.0.w``."""
    return ".".join(map(str, path))


def checked_spec(spec: Any, what: str) -> Spec:
    try:
        return parse_spec(spec)
    except SpecError as exc:
        raise CheckpointError(f"{what}: {exc}") from None


# --- what is saved: leaves, shards and the manifest -----------------------------------------------

Runs = tuple[tuple[int, int], ...]  # [lo, hi) runs of global indices along one dim, ascending


@dataclass(frozen=True)
class Shard:
    file: str  # relative to the checkpoint directory, "/"-separated
    device: int
    coord: tuple[int, ...]
    index: tuple[Runs, ...]  # one Runs per dim
    bytes: int = 0
    sha256: str = ""

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(sum(hi - lo for lo, hi in runs) for runs in self.index)


@dataclass(frozen=True)
class Leaf:
    path: tuple[str | int, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    scalar: bool  # saved from a numpy scalar: loaded as one
    spec: Spec
    shards: tuple[Shard, ...]

    @property
    def name(self) -> str:
        return ".".join(map(str, self.path))


@dataclass(frozen=True)
class Manifest:
    axes: dict[str, int]  # the mesh it was saved on ({} for one device)
    tree: TreeDef
    leaves: tuple[Leaf, ...]
    step: int | None


def storage_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype of a shard file: little-endian; bfloat16 as its bits (uint16), which a .npy
    header cannot name."""
    if dtype == BFLOAT16:
        return np.dtype("<u2")
    return dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype


def to_storage(piece: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``piece`` (of ``dtype``'s kind) as the C-ordered array of its file (0-d stays 0-d)."""
    piece = np.asarray(piece, dtype=dtype, order="C")
    if dtype == BFLOAT16:
        piece = piece.view(np.uint16)
    return np.asarray(piece, dtype=storage_dtype(dtype), order="C")


def _from_storage(data: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """What a shard file holds as ``dtype`` (native byte order; bfloat16 from its bits)."""
    if dtype == BFLOAT16:
        return data.astype(np.uint16, copy=False).view(BFLOAT16)
    return data.astype(dtype, copy=False)


# --- geometry: which indices a device holds ---------------------------------------------------------


def coord_of(device: int, mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(c) for c in np.unravel_index(device, mesh_shape)) if mesh_shape else ()


def check_layout(spec: Spec, shape: tuple[int, ...], mesh_shape: tuple[int, ...], what: str, partial: bool) -> None:
    """CheckpointError unless ``spec`` places ``shape`` on the mesh: a dim split over one axis at
    most; ``S(d)`` may be uneven (numpy's array_split layout, as the runtime's collectives),
    ``S(d, blocks=k)`` needs ``k * n`` to divide the dim; ``P`` only where ``partial``."""
    if len(spec) != len(mesh_shape):
        raise CheckpointError(
            f"{what}: spec {format_spec(spec)} has {len(spec)} placement(s), the mesh {len(mesh_shape)} axes"
        )
    used: set[int] = set()
    for p, n in zip(spec, mesh_shape):
        if p.kind == "P" and not partial:
            raise CheckpointError(
                f"{what}: spec {format_spec(spec)} holds partial sums; save the value after its reduction"
            )
        if not p.is_split:
            continue
        if not 0 <= p.dim < len(shape) or p.dim in used:
            raise CheckpointError(f"{what}: spec {format_spec(spec)} does not fit a {len(shape)}-d array {shape}")
        used.add(p.dim)
        if p.blocks < 1 or (p.blocks > 1 and shape[p.dim] % (p.blocks * n)):
            raise CheckpointError(
                f"{what}: dim {p.dim} of size {shape[p.dim]} does not split into {p} over {n} devices"
            )


def piece_indices(shape: tuple[int, ...], spec: Spec, mesh_shape: tuple[int, ...], coord) -> list[np.ndarray]:
    """The global indices, per dim, of the piece the device at ``coord`` holds."""
    index = [np.arange(s) for s in shape]
    for p, n, r in zip(spec, mesh_shape, coord):
        if p.is_split:
            index[p.dim] = piece_index(shape[p.dim], n, r, p.blocks)
    return index


def index_runs(index: np.ndarray) -> Runs:
    """Ascending indices -> their contiguous [lo, hi) runs."""
    if not len(index):
        return ()
    breaks = np.flatnonzero(np.diff(index) != 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(index)]])
    return tuple((int(index[a]), int(index[b - 1]) + 1) for a, b in zip(starts, ends))


def run_indices(runs: Runs) -> np.ndarray:
    return np.concatenate([np.arange(lo, hi) for lo, hi in runs]) if runs else np.zeros(0, np.int64)


def owner_devices(spec: Spec, mesh_shape: tuple[int, ...]) -> list[int]:
    """The devices whose pieces are distinct: coordinate 0 along every axis that does not split."""
    size = math.prod(mesh_shape)
    return [d for d in range(size) if all(c == 0 for c, p in zip(coord_of(d, mesh_shape), spec) if not p.is_split)]


def _overlap(target: np.ndarray, saved: np.ndarray) -> list[tuple[int, int, int]]:
    """Where two ascending index sets meet: (position in target, position in saved, length) runs."""
    common, ti, si = np.intersect1d(target, saved, assume_unique=True, return_indices=True)
    if not len(common):
        return []
    breaks = np.flatnonzero((np.diff(ti) != 1) | (np.diff(si) != 1)) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [len(ti)]])
    return [(int(ti[a]), int(si[a]), int(b - a)) for a, b in zip(starts, ends)]


# --- the pytree's structure as JSON ------------------------------------------------------------------


def tree_json(t: TreeDef, where: str) -> Any:
    if t.kind == "leaf":
        return "leaf"
    if t.kind == "static":
        return {"static": t.value}
    if t.kind == "dict":
        for k in t.keys:
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise CheckpointError(f"{where}: dict key {k!r} is not a str or int; a checkpoint's keys must be")
        return {"dict": [[k, tree_json(c, f"{where}[{k!r}]")] for k, c in zip(t.keys, t.children)]}
    return {t.kind: [tree_json(c, f"{where}[{i}]") for i, c in enumerate(t.children)]}


def _tree_from_json(x: Any, where: str, depth: int = 0) -> TreeDef:
    if depth > MAX_TREE_DEPTH:
        raise CheckpointError(f"{where}: the tree is nested more than {MAX_TREE_DEPTH} deep")
    if x == "leaf":
        return TreeDef("leaf")
    if not isinstance(x, dict) or len(x) != 1:
        raise CheckpointError(f'{where}: expected "leaf" or an object with one of static, dict, list, tuple')
    ((kind, body),) = x.items()
    if kind == "static":
        if body is not None and not isinstance(body, (bool, int, float, str)):
            raise CheckpointError(f"{where}: a static value must be null, a bool, a number or a string")
        return TreeDef("static", value=body)
    if kind not in ("dict", "list", "tuple") or not isinstance(body, list):
        raise CheckpointError(f"{where}: unknown tree node {kind!r}")
    if kind != "dict":
        return TreeDef(kind, tuple(_tree_from_json(c, f"{where}[{i}]", depth + 1) for i, c in enumerate(body)))
    keys, children = [], []
    for item in body:
        ok = isinstance(item, list) and len(item) == 2 and isinstance(item[0], (str, int))
        if not ok or isinstance(item[0], bool) or item[0] in keys:
            raise CheckpointError(f"{where}: a dict entry must be a [key, tree] pair with a new str or int key")
        keys.append(item[0])
        children.append(_tree_from_json(item[1], f"{where}[{item[0]!r}]", depth + 1))
    return TreeDef("dict", tuple(children), tuple(keys))


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: str, chunks: Sequence[Any]) -> None:
    """A new file (never over an existing one) with the user's umask, on disk when this returns."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    with os.fdopen(fd, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def write_npy(path: str, data: np.ndarray) -> tuple[int, str]:
    """``data`` as a .npy file; returns (bytes, SHA-256 of the file), hashed from memory."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, np.lib.format.header_data_from_array_1_0(data))
    header = out.getvalue()
    body = np.ascontiguousarray(data).reshape(-1).view(np.uint8).data  # the bytes, not a copy
    digest = hashlib.sha256(header)
    digest.update(body)
    write_file(path, [header, body])
    return len(header) + body.nbytes, digest.hexdigest()


def leaf_json(leaf: Leaf, records: dict[str, tuple[int, str]]) -> dict:
    shards = []
    for s in leaf.shards:
        size, digest = records[s.file]
        index = [[list(run) for run in runs] for runs in s.index]
        shards.append(
            {
                "file": s.file,
                "device": s.device,
                "coord": list(s.coord),
                "index": index,
                "bytes": size,
                "sha256": digest,
            }
        )
    return {
        "path": list(leaf.path),
        "shape": list(leaf.shape),
        "dtype": leaf.dtype.name,
        "scalar": leaf.scalar,
        "spec": format_spec(leaf.spec),
        "shards": shards,
    }


# --- reading the manifest: every field checked ----------------------------------------------------


def _int(x: Any, where: str, low: int = 0, high: int | None = None) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < low or (high is not None and x > high):
        bound = f"in {low}..{high}" if high is not None else f">= {low}"
        raise CheckpointError(f"{where}: expected an integer {bound}, got {x!r}")
    return x


def _list(x: Any, where: str, length: int | None = None) -> list:
    if not isinstance(x, list) or (length is not None and len(x) != length):
        raise CheckpointError(
            f"{where}: expected a list" + (f" of {length}" if length is not None else "") + f", got {x!r}"[:200]
        )
    return x


def _obj(x: Any, where: str, keys: tuple[str, ...]) -> dict:
    if not isinstance(x, dict):
        raise CheckpointError(f"{where}: expected an object, got {type(x).__name__}")
    missing = [k for k in keys if k not in x]
    if missing:
        raise CheckpointError(f"{where}: missing {', '.join(missing)}")
    return x


def _relative_file(x: Any, where: str) -> str:
    """A shard's file: a relative path inside the checkpoint (no "..", no absolute path)."""
    parts = x.split("/") if isinstance(x, str) and len(x) < 1024 else []
    if not parts or not all(_PATH_PART.fullmatch(p) for p in parts):
        raise CheckpointError(f"{where}: file {x!r} is not a relative path inside the checkpoint")
    return x


def _shard_from_json(x: Any, where: str, shape: tuple[int, ...], dtype: np.dtype, mesh_shape: tuple[int, ...]) -> Shard:
    s = _obj(x, where, ("file", "device", "coord", "index", "bytes", "sha256"))
    device = _int(s["device"], f"{where}.device", 0, math.prod(mesh_shape) - 1)
    if s["coord"] != list(coord_of(device, mesh_shape)):
        raise CheckpointError(
            f"{where}: coord {s['coord']!r} is not device {device}'s {list(coord_of(device, mesh_shape))}"
        )
    index = []
    for d, runs in enumerate(_list(s["index"], f"{where}.index", len(shape))):
        end, out = 0, []
        for run in _list(runs, f"{where}.index[{d}]"):
            lo, hi = _list(run, f"{where}.index[{d}]", 2)
            _int(lo, f"{where}.index[{d}]", end)
            _int(hi, f"{where}.index[{d}]", lo + 1, shape[d])
            out.append((lo, hi))
            end = hi
        if not out:
            raise CheckpointError(f"{where}.index[{d}]: a shard holds at least one index of each dim")
        index.append(tuple(out))
    if not isinstance(s["sha256"], str) or not _SHA256.fullmatch(s["sha256"]):
        raise CheckpointError(f"{where}.sha256: expected 64 lowercase hex digits")
    file = _relative_file(s["file"], f"{where}.file")
    shard = Shard(file, device, tuple(s["coord"]), tuple(index), _int(s["bytes"], f"{where}.bytes", 1), s["sha256"])
    data = math.prod(shard.shape) * storage_dtype(dtype).itemsize
    if not data < shard.bytes <= data + MAX_NPY_HEADER:  # so a file's size bounds what loading it allocates
        raise CheckpointError(f"{where}.bytes: {shard.bytes} bytes cannot be a .npy file of {dtype}{list(shard.shape)}")
    return shard


def _leaf_from_json(x: Any, where: str, path: tuple, mesh_shape: tuple[int, ...]) -> Leaf:
    e = _obj(x, where, ("path", "shape", "dtype", "scalar", "spec", "shards"))
    if e["path"] != list(path):
        raise CheckpointError(f"{where}: path {e['path']!r} is not the tree's {list(path)!r}")
    where = f"{where} ({dotted(path)})"
    shape = tuple(_int(n, f"{where}.shape") for n in _list(e["shape"], f"{where}.shape"))
    if len(shape) > 32:
        raise CheckpointError(f"{where}.shape: {len(shape)} dims (at most 32)")
    dtype = DTYPES.get(e["dtype"]) if isinstance(e["dtype"], str) else None
    if dtype is None:
        raise CheckpointError(f"{where}.dtype: {e['dtype']!r} is not one of {', '.join(DTYPES)}")
    if not isinstance(e["scalar"], bool) or (e["scalar"] and shape):
        raise CheckpointError(f"{where}.scalar: expected false, or true for a 0-d array")
    if not isinstance(e["spec"], str):
        raise CheckpointError(f'{where}.spec: expected a spec such as "[S(0), R]"')
    spec = checked_spec(e["spec"], f"{where}.spec")
    check_layout(spec, shape, mesh_shape, where, partial=False)
    shards = tuple(
        _shard_from_json(s, f"{where}.shards[{i}]", shape, dtype, mesh_shape)
        for i, s in enumerate(_list(e["shards"], f"{where}.shards"))
    )
    leaf = Leaf(path, shape, dtype, e["scalar"], spec, shards)
    _check_tiling(leaf, where)
    return leaf


def _check_tiling(leaf: Leaf, where: str) -> None:
    """The shards hold every element of the array exactly once: along each dim their index sets
    tile [0, size), and the shards are every cell of that grid, each once."""
    if math.prod(leaf.shape) == 0:
        if leaf.shards:
            raise CheckpointError(
                f"{where}: an array of shape {leaf.shape} holds no data, but {len(leaf.shards)} shard(s) are listed"
            )
        return
    cells = 1
    for d, size in enumerate(leaf.shape):
        sets = {s.index[d] for s in leaf.shards}
        end = 0
        for lo, hi in sorted(run for runs in sets for run in runs):
            if lo != end:
                problem = "overlap" if lo < end else "leave a gap"
                raise CheckpointError(f"{where}: the shards {problem} at index {min(lo, end)} of dim {d}")
            end = hi
        if end != size:
            raise CheckpointError(f"{where}: the shards leave a gap at index {end} of dim {d} (size {size})")
        cells *= len(sets)
    if len({s.index for s in leaf.shards}) != len(leaf.shards) or len(leaf.shards) != cells:
        raise CheckpointError(f"{where}: the {len(leaf.shards)} shards do not cover the array exactly once")


def _manifest_from_doc(doc: dict, source: str) -> Manifest:
    mesh = _obj(doc.get("mesh"), f"{source}: mesh", ("axes",))
    if not isinstance(mesh["axes"], dict):
        raise CheckpointError(f"{source}: mesh.axes: expected an object {{axis name: size}}")
    axes = {str(k): _int(v, f"{source}: mesh.axes[{k!r}]", 1, MAX_DEVICES) for k, v in mesh["axes"].items()}
    mesh_shape = tuple(axes.values())
    if math.prod(mesh_shape) > MAX_DEVICES:
        raise CheckpointError(f"{source}: mesh {axes} has more than {MAX_DEVICES} devices")
    step = doc.get("step")
    if step is not None:
        _int(step, f"{source}: step")
    tree = _tree_from_json(doc.get("tree"), f"{source}: tree")
    paths = leaf_paths(tree)
    entries = _list(doc.get("leaves"), f"{source}: leaves", len(paths))
    leaves = tuple(
        _leaf_from_json(e, f"{source}: leaves[{i}]", p, mesh_shape) for i, (e, p) in enumerate(zip(entries, paths))
    )
    files = [s.file for leaf in leaves for s in leaf.shards]
    if len(set(files)) != len(files):
        raise CheckpointError(f"{source}: a shard file is listed twice")
    return Manifest(axes, tree, leaves, step)


def read_manifest(directory: str) -> Manifest:
    """The manifest of the checkpoint in ``directory``, every field checked (not the shards' data)."""
    source = os.path.join(directory, MANIFEST)
    try:
        info = os.lstat(source)
    except OSError:
        raise CheckpointError(f"{source}: missing: {directory} is not a complete graphc checkpoint") from None
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_MANIFEST_BYTES:
        raise CheckpointError(f"{source}: not a regular file of at most {MAX_MANIFEST_BYTES} bytes")
    try:
        with open(source, "rb") as f:
            text = f.read(MAX_MANIFEST_BYTES + 1).decode("utf-8")
        doc = read_document(text, source, "checkpoint manifest", VERSION, kind="checkpoint", error=CheckpointError)
        return _manifest_from_doc(doc, source)
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{source}: cannot read it ({exc})") from None
    except RecursionError:
        raise CheckpointError(f"{source}: nested too deep") from None


def _shard_path(directory: str, shard: Shard) -> str:
    return os.path.join(directory, *shard.file.split("/"))


def check_files(directory: str, manifest: Manifest) -> None:
    """Every shard file is there, a regular file inside the checkpoint, of the manifest's size."""
    root = os.path.realpath(directory)
    for leaf in manifest.leaves:
        for shard in leaf.shards:
            full = _shard_path(directory, shard)
            if not os.path.realpath(full).startswith(root + os.sep):
                raise CheckpointError(f"{full}: leads outside the checkpoint {directory} (a symbolic link)")
            try:
                info = os.lstat(full)
            except OSError:
                raise CheckpointError(f"{full}: missing (device {shard.device}'s shard of {leaf.name!r})") from None
            if not stat.S_ISREG(info.st_mode):
                raise CheckpointError(f"{full}: not a regular file (device {shard.device}'s shard of {leaf.name!r})")
            if info.st_size != shard.bytes:
                raise CheckpointError(f"{full}: {info.st_size} bytes, the manifest says {shard.bytes}")


def _npy_offset(mm: mmap.mmap, full: str, shape: tuple[int, ...], storage: np.dtype) -> int:
    """The data offset of a .npy file holding ``storage`` of ``shape`` in C order, or CheckpointError."""
    try:
        mm.seek(0)
        version = np.lib.format.read_magic(mm)
        if version == (1, 0):
            got, fortran, dtype = np.lib.format.read_array_header_1_0(mm)
        elif version == (2, 0):
            got, fortran, dtype = np.lib.format.read_array_header_2_0(mm)
        else:
            raise ValueError(f"version {version}")
    except (ValueError, SyntaxError, TypeError) as exc:  # numpy's header parser on bad bytes
        raise CheckpointError(f"{full}: not a .npy file this checkpoint can hold ({exc})") from None
    if fortran or dtype != storage or tuple(got) != shape:
        raise CheckpointError(f"{full}: holds {dtype}{tuple(got)}, expected {storage}{shape} in C order")
    offset = mm.tell()
    if offset + math.prod(shape) * storage.itemsize != len(mm):
        raise CheckpointError(f"{full}: {len(mm)} bytes, expected {offset} of header and {storage}{list(shape)}")
    return offset


@dataclass
class Target:
    """One array being filled: a whole leaf, or one device's piece of it."""

    array: np.ndarray
    index: list[np.ndarray]  # the global indices it holds, per dim


def copy_shard(directory: str, leaf: Leaf, shard: Shard, targets: list[Target]) -> None:
    """Verify one shard file (size, SHA-256, header) and copy its overlap into each target."""
    saved = [run_indices(runs) for runs in shard.index]
    plans = []
    for t in targets:
        runs = [_overlap(ti, si) for ti, si in zip(t.index, saved)]
        if all(runs):
            plans.append((t.array, runs))
    if not plans:
        return
    full = _shard_path(directory, shard)
    storage = storage_dtype(leaf.dtype)
    try:
        f = open(full, "rb")
    except OSError as exc:
        raise CheckpointError(f"{full}: cannot read it ({exc.strerror})") from None
    try:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:  # ValueError: an empty file
        f.close()
        raise CheckpointError(f"{full}: cannot map it ({exc})") from None
    with f, mm:
        if len(mm) != shard.bytes:
            raise CheckpointError(f"{full}: {len(mm)} bytes, the manifest says {shard.bytes}")
        digest = hashlib.sha256(mm).hexdigest()
        if digest != shard.sha256:
            raise CheckpointError(
                f"{full}: SHA-256 {digest[:16]}... does not match the manifest's {shard.sha256[:16]}... "
                f"(device {shard.device}'s shard of {leaf.name!r} is corrupt or was changed)"
            )
        offset = _npy_offset(mm, full, shard.shape, storage)
        data = np.frombuffer(mm, dtype=storage, count=math.prod(shard.shape), offset=offset).reshape(shard.shape)
        try:
            for array, runs in plans:
                for combo in itertools.product(*runs):
                    dst = tuple(slice(t, t + n) for t, _s, n in combo)
                    src = tuple(slice(s, s + n) for _t, s, n in combo)
                    array[dst] = _from_storage(data[src], leaf.dtype)
        finally:
            del data  # the mapping closes only once no array views it
