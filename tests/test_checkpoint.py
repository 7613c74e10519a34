"""Checkpoints (graphc/api/checkpoint.py, graphc/core/checkpoint_format.py), against numpy:

* round trips of nested pytrees and every dtype, bit for bit;
* resharding: saved on one mesh and spec, loaded on others (uneven splits, blocked splits,
  size-0 and size-1 dims), each device's piece equal to an independent numpy slicing, also for
  random shapes, meshes and specs (hypothesis);
* trust nothing on disk: a flipped byte, a missing or truncated shard, a bad manifest, paths
  out of the checkpoint: a CheckpointError naming the file, and nothing returned;
* atomic writes: a failure or a crash in the middle leaves the previous checkpoint whole and no
  directory that looks complete;
* ranks that hold only their own pieces (threads standing in for MPI ranks);
* training: 10 steps on dp=2, a checkpoint, 10 more on tp=2 equal an uninterrupted run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import graphc
from graphc.api import checkpoint
from graphc.core import checkpoint_format
from graphc.core.checkpoint_format import CheckpointError
from graphc.core.mesh import MachineProfile, Mesh
from graphc.core.pytree import flatten
from graphc.core.spec import R, S, parse_spec
from graphc.models import mlp
from graphc.runtime.devices import ShardedArray
from tests.helpers import mpiexec_path

PROFILE = MachineProfile.default()
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mesh(axes) -> Mesh:
    return Mesh(axes, profile=PROFILE)


# --- an independent reference: numpy's array_split, block by block ------------------------------


def ref_indices(size: int, n: int, r: int, blocks: int = 1) -> np.ndarray:
    """Rank r's indices of a dim split over n devices (array_split layout), within each block."""
    return np.concatenate([np.array_split(block, n)[r] for block in np.split(np.arange(size), blocks)])


def ref_piece(x: np.ndarray, spec, axes: dict, coord) -> np.ndarray:
    index = [np.arange(s) for s in x.shape]
    for p, n, r in zip(parse_spec(spec), axes.values(), coord):
        if p.kind == "S":
            index[p.dim] = ref_indices(x.shape[p.dim], n, r, p.blocks)
    return x[np.ix_(*index)] if x.ndim else x


def sharded(x: np.ndarray, spec, axes: dict) -> ShardedArray:
    m = mesh(axes)
    pieces = {d: ref_piece(x, spec, axes, m.coord(d)).copy() for d in m.devices()}
    return ShardedArray(pieces, parse_spec(spec), m, x.shape, x.dtype)


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def check_pieces(got: ShardedArray, x: np.ndarray, spec, axes: dict) -> None:
    assert got.spec == parse_spec(spec) and got.shape == x.shape and got.dtype == x.dtype
    for d, piece in got.pieces.items():
        assert same_bits(piece, ref_piece(x, spec, axes, got.mesh.coord(d))), (d, spec, axes)


def rand(shape, dtype=np.float32, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * 100).astype(dtype)


# --- round trips --------------------------------------------------------------------------------


def test_nested_pytree_and_every_dtype_round_trip_bit_for_bit(tmp_path):
    x = rand((4, 6))
    state = {
        "params": {"w": x, "layers": [x.astype(graphc.bfloat16), x.astype(np.float64)]},
        "ints": (np.arange(6, dtype=np.int8), x.astype(np.int64), (x > 0), x.astype(np.uint16)),
        "half": x.astype(np.float16),
        "scalar": np.float64(2.5),
        "zero_d": np.array(3, np.int32),
        "static": {"step": 10, "name": "run", "none": None, "lr": 0.1},
        7: [],
    }
    state["params"]["w"][0, 0] = np.nan
    path = graphc.save_checkpoint(tmp_path / "ckpt", state)
    assert path == str(tmp_path / "ckpt")
    back = graphc.load_checkpoint(tmp_path / "ckpt")
    assert back["static"] == state["static"] and back[7] == []
    assert isinstance(back["ints"], tuple) and isinstance(back["params"]["layers"], list)
    assert isinstance(back["scalar"], np.float64) and back["scalar"] == 2.5
    assert isinstance(back["zero_d"], np.ndarray) and back["zero_d"].shape == ()
    (got, got_tree), (want, want_tree) = flatten(back), flatten(state)
    assert got_tree == want_tree and len(got) == len(want) == 10
    assert all(same_bits(a, b) for a, b in zip(got, want))


def test_unsupported_leaves_and_keys_are_named(tmp_path):
    with pytest.raises(CheckpointError, match=r"'z'.*complex128 cannot be checkpointed"):
        graphc.save_checkpoint(tmp_path / "a", {"z": np.zeros(2, complex)})
    with pytest.raises(CheckpointError, match=r"dict key \(1, 2\)"):
        graphc.save_checkpoint(tmp_path / "b", {(1, 2): np.zeros(2)})
    with pytest.raises(CheckpointError, match="state"):
        graphc.save_checkpoint(tmp_path / "c", {"f": object()})
    assert not os.listdir(tmp_path)


# --- resharding ---------------------------------------------------------------------------------

CASES = [
    # (shape, saved axes, saved spec, target axes, target spec)
    ((8, 6), {"dp": 2}, "[S(0)]", {"tp": 2}, "[S(1)]"),  # dp=2 -> tp=2
    ((8, 6), {"dp": 2, "tp": 2}, "[S(0), S(1)]", {"x": 1}, "[R]"),  # 2x2 -> 1
    ((8, 6), {"dp": 2, "tp": 2}, "[S(1), S(0)]", {"dp": 2, "tp": 2}, "[S(0), S(1)]"),
    ((5, 3), {"dp": 2}, "[S(0)]", {"tp": 2}, "[S(1)]"),  # uneven both ways
    ((7,), {"dp": 3}, "[S(0)]", {"a": 2, "b": 2}, "[R, S(0)]"),
    ((2, 12), {"tp": 2}, "[S(1, blocks=3)]", {"tp": 3}, "[S(1)]"),  # blocked -> contiguous
    ((2, 12), {"tp": 3}, "[S(1)]", {"tp": 2}, "[S(1, blocks=3)]"),  # contiguous -> blocked
    ((4, 12), {"a": 2, "b": 2}, "[S(0), S(1, blocks=2)]", {"tp": 2}, "[S(1, blocks=3)]"),
    ((1, 6), {"dp": 2}, "[S(0)]", {"tp": 3}, "[S(1)]"),  # a size-1 dim split over 2: one empty piece
    ((0, 4), {"dp": 2}, "[S(0)]", {"tp": 2}, "[S(1)]"),  # size-0 dim
    ((3, 0), {"dp": 2}, "[S(0)]", {"tp": 2}, "[S(0)]"),
    ((), {"dp": 2}, "[R]", {"tp": 2}, "[R]"),
]


@pytest.mark.parametrize("shape, saved_axes, saved_spec, axes, spec", CASES)
@pytest.mark.parametrize("from_sharded", [False, True])
def test_save_on_one_mesh_load_on_another(tmp_path, shape, saved_axes, saved_spec, axes, spec, from_sharded):
    x = rand(shape, seed=len(shape))
    value = sharded(x, saved_spec, saved_axes) if from_sharded else x
    graphc.save_checkpoint(tmp_path, {"x": value}, {"x": saved_spec}, mesh=mesh(saved_axes), overwrite=True)
    got = graphc.load_checkpoint(tmp_path, {"x": spec}, mesh=mesh(axes))["x"]
    check_pieces(got, x, spec, axes)
    assert same_bits(graphc.load_checkpoint(tmp_path)["x"], x)


def test_replicated_shards_are_written_once_and_empty_ones_not_at_all(tmp_path):
    x = rand((4, 6))
    graphc.save_checkpoint(tmp_path / "r", {"x": x}, "[R, R]", mesh=mesh({"a": 2, "b": 2}))
    assert sorted(os.listdir(tmp_path / "r")) == ["device-0", "manifest.json"]
    graphc.save_checkpoint(tmp_path / "s", {"x": x}, "[R, S(1)]", mesh=mesh({"a": 2, "b": 3}))
    assert sorted(os.listdir(tmp_path / "s")) == ["device-0", "device-1", "device-2", "manifest.json"]
    graphc.save_checkpoint(tmp_path / "e", {"x": np.zeros((0, 4))}, "[S(0)]", mesh=mesh({"dp": 2}))
    assert os.listdir(tmp_path / "e") == ["manifest.json"]


def test_partial_target_spec_puts_the_value_on_coordinate_zero(tmp_path):
    x = rand((4, 6))
    graphc.save_checkpoint(tmp_path, {"x": x})
    got = graphc.load_checkpoint(tmp_path, {"x": "[P, S(1)]"}, mesh=mesh({"a": 2, "b": 2}))["x"]
    assert same_bits(got.pieces[0], x[:, :3]) and not got.pieces[2].any()
    assert same_bits(np.asarray(got), x)
    with pytest.raises(CheckpointError, match="partial sums"):
        graphc.save_checkpoint(tmp_path / "p", {"x": x}, "[P]", mesh=mesh({"a": 2}))


def test_a_device_reads_only_the_shard_files_it_overlaps(tmp_path, monkeypatch):
    x = rand((8, 4))
    graphc.save_checkpoint(tmp_path, {"x": x}, "[S(0)]", mesh=mesh({"dp": 4}))
    opened = []
    real_open = open

    def spy(path, *args, **kwargs):
        opened.append(os.path.relpath(path, tmp_path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint_format, "open", spy, raising=False)
    got = graphc.load_checkpoint(tmp_path, {"x": "[S(0)]"}, mesh=mesh({"tp": 2}), devices=[1])["x"]
    assert sorted(p for p in opened if p.endswith(".npy")) == ["device-2/leaf-0.npy", "device-3/leaf-0.npy"]
    assert list(got.pieces) == [1] and same_bits(got.pieces[1], x[4:])
    with pytest.raises(CheckpointError, match=r"devices: \[2\] are not devices of the mesh \(0\.\.1\)"):
        graphc.load_checkpoint(tmp_path, {"x": "[S(0)]"}, mesh=mesh({"tp": 2}), devices=[2])


def _spec_strategy(shape, axes):
    """A random spec: each axis replicates or splits a dim not split yet (in blocks where they fit)."""

    @st.composite
    def draw(data):
        used, spec = set(), []
        for n in axes.values():
            dims = [d for d in range(len(shape)) if d not in used]
            choice = data(st.sampled_from([None, *dims]))
            if choice is None:
                spec.append(R)
                continue
            used.add(choice)
            fits = [k for k in (1, 2, 3) if k == 1 or shape[choice] % (k * n) == 0]
            spec.append(S(choice, data(st.sampled_from(fits))))
        return tuple(spec)

    return draw()


@st.composite
def _layouts(draw):
    shape = tuple(draw(st.lists(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 12]), max_size=3)))
    names = iter("abcd")

    def some_axes():
        sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))
        return {next(names): n for n in sizes}

    saved_axes, axes = some_axes(), some_axes()
    saved_spec = draw(_spec_strategy(shape, saved_axes))
    spec = draw(_spec_strategy(shape, axes))
    dtype = draw(st.sampled_from([np.float32, np.int32, graphc.bfloat16]))
    return shape, dtype, saved_axes, saved_spec, axes, spec, draw(st.booleans())


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_layouts())
def test_random_shapes_meshes_and_specs_reshard_like_numpy(layout):
    shape, dtype, saved_axes, saved_spec, axes, spec, from_sharded = layout
    x = rand(shape, dtype, seed=7)
    value = sharded(x, saved_spec, saved_axes) if from_sharded else x
    with tempfile.TemporaryDirectory() as d:
        graphc.save_checkpoint(d, {"x": value}, {"x": saved_spec}, mesh=mesh(saved_axes), overwrite=True)
        check_pieces(graphc.load_checkpoint(d, {"x": spec}, mesh=mesh(axes))["x"], x, spec, axes)


# --- trust nothing on disk ------------------------------------------------------------------------


@pytest.fixture
def saved(tmp_path):
    """A checkpoint of two leaves over 2x2 devices; returns (directory, state)."""
    state = {"w": rand((4, 6)), "b": np.arange(6, dtype=np.int64)}
    d = graphc.save_checkpoint(
        tmp_path / "ckpt", state, {"w": "[S(0), S(1)]", "b": "[R, S(0)]"}, mesh=mesh({"dp": 2, "tp": 2})
    )
    return d, state


def _manifest(d):
    with open(os.path.join(d, "manifest.json")) as f:
        return json.load(f)


def _write_manifest(d, doc):
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(doc, f)


def test_a_flipped_byte_is_found_and_the_file_named(saved):
    d, _ = saved
    path = os.path.join(d, "device-3", "leaf-0.npy")
    with open(path, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(CheckpointError, match=r"device-3/leaf-0\.npy: SHA-256 .* does not match .*'w' is corrupt"):
        graphc.load_checkpoint(d)
    # only a device that reads it finds out: device 0's piece does not overlap device 3's shard
    got = graphc.load_checkpoint(d, {"w": "[S(0), S(1)]", "b": "[R, R]"}, mesh=mesh({"a": 2, "b": 2}), devices=[0])
    assert list(got["w"].pieces) == [0]


def test_a_flipped_header_byte_is_found(saved):
    d, _ = saved
    path = os.path.join(d, "device-0", "leaf-1.npy")
    with open(path, "r+b") as f:
        f.seek(20)
        f.write(b"X")
    with pytest.raises(CheckpointError, match=r"device-0/leaf-1\.npy: SHA-256"):
        graphc.load_checkpoint(d)


def test_missing_and_truncated_shards_are_named_before_any_read(saved, monkeypatch):
    d, _ = saved
    monkeypatch.setattr(checkpoint, "copy_shard", None)  # nothing may be read before the checks
    os.truncate(os.path.join(d, "device-2", "leaf-0.npy"), 100)
    with pytest.raises(CheckpointError, match=r"device-2/leaf-0\.npy: 100 bytes, the manifest says 152"):
        graphc.load_checkpoint(d)
    os.remove(os.path.join(d, "device-2", "leaf-0.npy"))
    with pytest.raises(CheckpointError, match=r"device-2/leaf-0\.npy: missing \(device 2's shard of 'w'\)"):
        graphc.load_checkpoint(d)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda text: text[: len(text) // 2], r"manifest\.json:\d+:\d+: not a graphc checkpoint manifest \(bad JSON"),
        (lambda text: "", r"manifest\.json:1:1: not a graphc checkpoint manifest"),
        (lambda text: text.replace('"version": 1', '"version": 99'), r"version 99 is not supported \(expected 1\)"),
        (lambda text: text.replace('"kind": "checkpoint"', '"kind": "plan"'), "not a graphc checkpoint manifest"),
        (lambda text: "[" * 100000 + "]" * 100000, "manifest.json"),
    ],
)
def test_a_bad_manifest_is_named(saved, edit, message):
    d, _ = saved
    path = os.path.join(d, "manifest.json")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(edit(text))
    with pytest.raises(CheckpointError, match=message):
        graphc.load_checkpoint(d)


def _edit_shard(doc, leaf, shard, **fields):
    doc["leaves"][leaf]["shards"][shard].update(fields)
    return doc


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda doc: _edit_shard(doc, 0, 0, file="../outside.npy"), r"file '\.\./outside\.npy' is not a relative path"),
        (lambda doc: _edit_shard(doc, 0, 0, file="/etc/passwd"), "is not a relative path inside the checkpoint"),
        (lambda doc: _edit_shard(doc, 0, 0, file="device-0/../../outside.npy"), "not a relative path"),
        (lambda doc: _edit_shard(doc, 0, 0, file="device-0\\..\\x.npy"), "not a relative path"),
        (lambda doc: _edit_shard(doc, 0, 0, file="device-0/leaf-1.npy"), "listed twice"),
        (lambda doc: _edit_shard(doc, 0, 0, device=1), r"coord \[0, 0\] is not device 1's"),
        (lambda doc: _edit_shard(doc, 0, 0, device=9), r"device: expected an integer in 0\.\.3"),
        (lambda doc: _edit_shard(doc, 0, 0, bytes=-1), r"bytes: expected an integer >= 1"),
        (lambda doc: doc["leaves"][0].update(shape=[4, 2**40]), "leave a gap at index 6 of dim 1"),
        (
            lambda doc: [
                _edit_shard(doc, 0, 0, index=[[[0, 2]], [[0, 2**40]]]),
                doc["leaves"][0].update(shape=[4, 2**40]),
            ],
            r"bytes: 152 bytes cannot be a \.npy file of float32\[2, 1099511627776\]",
        ),
        (lambda doc: _edit_shard(doc, 0, 0, sha256="abc"), "64 lowercase hex digits"),
        (lambda doc: _edit_shard(doc, 0, 0, index=[[[0, 3]], [[0, 3]]]), "overlap at index 0 of dim 0"),
        (lambda doc: _edit_shard(doc, 0, 0, index=[[[0, 2]], [[0, 9]]]), r"index\[1\]: expected an integer in 1\.\.6"),
        (lambda doc: _edit_shard(doc, 0, 0, index=[[[1, 2]], [[0, 3]]]), "overlap at index 1 of dim 0"),
        (
            lambda doc: [_edit_shard(doc, 0, k, index=[[[1, 2]], runs]) for k, runs in ((0, [[0, 3]]), (1, [[3, 6]]))],
            "leave a gap at index 0 of dim 0",
        ),
        (lambda doc: _edit_shard(doc, 0, 0, index=[[[0, 2]]]), "expected a list of 2"),
        (lambda doc: doc["leaves"][0]["shards"].pop(), "do not cover the array exactly once"),
        (lambda doc: doc["leaves"][0].update(dtype="complex64"), "'complex64' is not one of"),
        (lambda doc: doc["leaves"][0].update(shape=[4, 7]), "leave a gap at index 6 of dim 1"),
        (lambda doc: doc["leaves"][0].update(spec="[S(0)]"), "has 1 placement"),
        (lambda doc: doc["leaves"][0].update(path=["x"]), r"path \['x'\] is not the tree's \['w'\]"),
        (lambda doc: doc["leaves"].pop(), "expected a list of 2"),
        (lambda doc: doc.update(tree={"dict": [["w", {"set": []}], ["b", "leaf"]]}), "unknown tree node 'set'"),
        (lambda doc: doc.update(mesh={"axes": {"dp": 0}}), r"mesh\.axes\['dp'\]: expected an integer in 1"),
        (lambda doc: doc.update(mesh={"axes": {"dp": 2**20, "tp": 2**20}}), "more than"),
    ],
)
def test_a_manifest_that_lies_is_refused(saved, edit, message):
    d, _ = saved
    doc = _manifest(d)
    edit(doc)
    _write_manifest(d, doc)
    with pytest.raises(CheckpointError, match=message):
        graphc.load_checkpoint(d)


def test_shards_out_of_the_checkpoint_are_refused(saved, tmp_path):
    d, _ = saved
    inside = os.path.join(d, "device-0", "leaf-0.npy")
    outside = str(tmp_path / "outside.npy")
    os.rename(inside, outside)
    os.symlink(outside, inside)  # the same bytes, through a link out of the checkpoint
    with pytest.raises(CheckpointError, match=r"device-0/leaf-0\.npy: leads outside the checkpoint"):
        graphc.load_checkpoint(d)
    os.remove(inside)
    os.mkdir(inside)
    with pytest.raises(CheckpointError, match=r"device-0/leaf-0\.npy: not a regular file"):
        graphc.load_checkpoint(d)


def _rewrite_shard(d, file, array):
    """Replace a shard with another .npy file and make the manifest agree on its size and hash."""
    path = os.path.join(d, file)
    os.remove(path)
    np.save(path, array, allow_pickle=True)
    with open(path, "rb") as f:
        data = f.read()
    doc = _manifest(d)
    for leaf in doc["leaves"]:
        for s in leaf["shards"]:
            if s["file"] == file:
                s.update(bytes=len(data), sha256=checkpoint_format.hashlib.sha256(data).hexdigest())
    _write_manifest(d, doc)


@pytest.mark.parametrize(
    "array, message",
    [
        (np.zeros((2, 3), np.int32), r"holds int32\(2, 3\), expected float32\(2, 3\)"),
        (np.zeros((3, 2), np.float32), r"holds float32\(3, 2\), expected float32\(2, 3\)"),
        (
            np.asfortranarray(np.zeros((2, 3), np.float32)),
            r"holds float32\(2, 3\), expected float32\(2, 3\) in C order",
        ),
        (np.array([{"a": 1}, None], dtype=object), "holds object"),
    ],
)
def test_a_shard_whose_header_disagrees_is_refused_without_unpickling(saved, array, message):
    d, _ = saved
    _rewrite_shard(d, "device-0/leaf-0.npy", array)
    with pytest.raises(CheckpointError, match=r"device-0/leaf-0\.npy: " + message):
        graphc.load_checkpoint(d)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.data())
def test_any_edit_of_the_manifest_loads_the_same_values_or_is_a_checkpoint_error(data):
    with tempfile.TemporaryDirectory() as tmp:
        state = {"w": rand((4, 6)), "b": (np.arange(3), 5)}
        d = graphc.save_checkpoint(
            tmp,
            state,
            {"w": "[S(0), S(1, blocks=2)]", "b": ("[R, S(0)]",)},
            mesh=mesh({"a": 2, "b": 3}),
            overwrite=True,
        )
        path = os.path.join(d, "manifest.json")
        with open(path, "rb") as f:
            text = bytearray(f.read())
        for _ in range(data.draw(st.integers(1, 3))):
            at = data.draw(st.integers(0, len(text) - 1))
            text[at] = data.draw(st.sampled_from(b'0129[]{}",:-. aSPRx\xff'))
        with open(path, "wb") as f:
            f.write(bytes(text))
        try:
            back = graphc.load_checkpoint(d)
        except CheckpointError:
            return
        assert same_bits(back["w"], state["w"]) and same_bits(back["b"][0], state["b"][0])


# --- atomic writes ------------------------------------------------------------------------------


def test_steps_and_the_latest(tmp_path):
    for step in (1, np.int64(10), 2):
        graphc.save_checkpoint(tmp_path, {"step": np.int64(step)}, step=step)
    assert sorted(os.listdir(tmp_path)) == ["step_00000001", "step_00000002", "step_00000010"]
    assert checkpoint.checkpoint_steps(tmp_path).keys() == {1, 2, 10}
    assert graphc.load_checkpoint(tmp_path)["step"] == 10
    assert graphc.load_checkpoint(tmp_path, step=2)["step"] == 2
    with pytest.raises(CheckpointError, match=r"no checkpoint of step 3 \(steps: \[1, 2, 10\]\)"):
        graphc.load_checkpoint(tmp_path, step=3)
    with pytest.raises(CheckpointError, match="exists; pass overwrite=True"):
        graphc.save_checkpoint(tmp_path, {"step": np.int64(0)}, step=10)
    graphc.save_checkpoint(tmp_path, {"step": np.int64(99)}, step=10, overwrite=True)
    assert graphc.load_checkpoint(tmp_path)["step"] == 99
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def test_a_folder_that_is_not_a_checkpoint_is_never_replaced(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(CheckpointError, match="exists and is not a graphc checkpoint"):
        graphc.save_checkpoint(tmp_path / "mine", {"x": np.zeros(2)}, overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    with pytest.raises(CheckpointError, match="does not exist"):
        graphc.save_checkpoint(tmp_path / "no" / "such" / "dir", {"x": np.zeros(2)})
    with pytest.raises(CheckpointError, match=r"manifest\.json: missing"):
        graphc.load_checkpoint(tmp_path / "mine")


def test_files_get_the_users_umask(tmp_path):
    old = os.umask(0o027)
    try:
        d = graphc.save_checkpoint(tmp_path / "c", {"x": np.zeros(2)})
    finally:
        os.umask(old)
    assert os.stat(os.path.join(d, "manifest.json")).st_mode & 0o777 == 0o640
    assert os.stat(os.path.join(d, "device-0", "leaf-0.npy")).st_mode & 0o777 == 0o640
    assert os.stat(d).st_mode & 0o777 == 0o750


def test_a_failure_mid_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    state = {"a": rand((4, 4)), "b": rand((4, 4), seed=1)}
    graphc.save_checkpoint(tmp_path, state, step=1)
    written = []
    real = checkpoint.write_npy

    def fail_on_second(path, data):
        if written:
            raise OSError(28, "No space left on device")
        written.append(path)
        return real(path, data)

    monkeypatch.setattr(checkpoint, "write_npy", fail_on_second)
    with pytest.raises(CheckpointError, match=r"step_00000002 not written: rank 0: OSError: .*No space left"):
        graphc.save_checkpoint(tmp_path, {"a": state["b"], "b": state["a"]}, step=2)
    assert os.listdir(tmp_path) == ["step_00000001"]  # no step 2, no temporary directory left
    assert same_bits(graphc.load_checkpoint(tmp_path)["a"], state["a"])


def test_a_failed_rename_puts_the_replaced_checkpoint_back(tmp_path, monkeypatch):
    old = {"x": rand((3,))}
    d = graphc.save_checkpoint(tmp_path / "c", old)
    real_rename = os.rename

    def rename(src, dst):
        if ".tmp-" in os.path.basename(src):
            raise OSError(5, "Input/output error")
        return real_rename(src, dst)

    monkeypatch.setattr(checkpoint.os, "rename", rename)
    with pytest.raises(CheckpointError, match="Input/output error"):
        graphc.save_checkpoint(d, {"x": rand((3,), seed=5)}, overwrite=True)
    assert os.listdir(tmp_path) == ["c"]
    assert same_bits(graphc.load_checkpoint(d)["x"], old["x"])


def test_a_crash_mid_write_leaves_nothing_that_looks_complete(tmp_path):
    """A process killed while writing its shards (os._exit: no cleanup runs)."""
    graphc.save_checkpoint(tmp_path, {"x": np.arange(4.0)}, step=1)
    script = textwrap.dedent(f"""
        import os, numpy as np, graphc
        from graphc.api import checkpoint
        real = checkpoint.write_npy
        calls = []
        def crash(path, data):
            calls.append(path)
            if len(calls) == 3:
                os._exit(9)
            return real(path, data)
        checkpoint.write_npy = crash
        mesh = graphc.Mesh({{"dp": 4}})
        graphc.save_checkpoint({str(tmp_path)!r}, {{"x": np.arange(8.0)}}, "[S(0)]", mesh=mesh, step=2)
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert res.returncode == 9, res.stderr
    names = sorted(os.listdir(tmp_path))
    assert names[1] == "step_00000001" and names[0].startswith(".step_00000002.tmp-"), names
    assert not os.path.exists(os.path.join(tmp_path, names[0], "manifest.json"))
    assert checkpoint.checkpoint_steps(tmp_path).keys() == {1}
    assert same_bits(graphc.load_checkpoint(tmp_path)["x"], np.arange(4.0))


# --- ranks holding only their own pieces (threads standing in for MPI ranks) ---------------------


class ThreadComm:
    """mpi4py's lower-case collectives between threads of one process, one thread per rank."""

    def __init__(self, world, rank):
        self.world, self.rank = world, rank

    def Get_rank(self):  # noqa: N802 (mpi4py's names)
        return self.rank

    def Get_size(self):  # noqa: N802
        return self.world["size"]

    def allgather(self, obj):
        w = self.world
        w["barrier"].wait()
        w["slots"][self.rank] = obj
        w["barrier"].wait()
        out = list(w["slots"])
        w["barrier"].wait()
        return out

    def gather(self, obj, root=0):
        out = self.allgather(obj)
        return out if self.rank == root else None

    def bcast(self, obj, root=0):
        return self.allgather(obj)[root]


def on_ranks(size, body):
    """``body(comm)`` on ``size`` threads; returns each rank's result or exception."""
    world = {"size": size, "barrier": threading.Barrier(size, timeout=20), "slots": [None] * size}
    results = [None] * size

    def run(rank):
        try:
            results[rank] = body(ThreadComm(world, rank))
        except BaseException as exc:  # noqa: BLE001 - returned to the test
            results[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def test_each_rank_writes_its_own_shards_and_reads_only_its_pieces(tmp_path):
    x, y = rand((4, 6)), np.arange(5, dtype=np.int64)
    axes = {"dp": 2}
    full = {"x": sharded(x, "[S(1)]", axes), "y": y}

    def save(comm):
        rank = comm.Get_rank()
        mine = ShardedArray({rank: full["x"].pieces[rank]}, full["x"].spec, full["x"].mesh, x.shape, x.dtype)
        return graphc.save_checkpoint(
            tmp_path, {"x": mine, "y": y}, {"x": None, "y": "[S(0)]"}, mesh=mesh(axes), step=4, comm=comm
        )

    assert on_ranks(2, save) == [str(tmp_path / "step_00000004")] * 2
    back = graphc.load_checkpoint(tmp_path)
    assert same_bits(back["x"], x) and same_bits(back["y"], y)

    def load(comm):
        return graphc.load_checkpoint(tmp_path, {"x": "[S(0)]", "y": "[R]"}, mesh=mesh({"tp": 2}), comm=comm)

    for rank, got in enumerate(on_ranks(2, load)):
        assert list(got["x"].pieces) == [rank] and same_bits(got["x"].pieces[rank], x[2 * rank : 2 * rank + 2])
        assert same_bits(got["y"].pieces[rank], y)


def test_a_rank_that_fails_fails_them_all_and_nothing_is_written(tmp_path):
    x = rand((4, 6))
    full = sharded(x, "[S(0)]", {"dp": 2})

    def save(comm):
        pieces = {0: full.pieces[0]} if comm.Get_rank() == 0 else {}  # rank 1 lost its piece
        value = ShardedArray(pieces, full.spec, full.mesh, x.shape, x.dtype)
        return graphc.save_checkpoint(tmp_path / "c", {"x": value}, comm=comm)

    errors = on_ranks(2, save)
    assert all(isinstance(e, CheckpointError) for e in errors), errors
    assert "rank 1: state leaf 'x': this process holds the pieces of devices [], not device 1's" in str(errors[0])
    assert not os.listdir(tmp_path)
    graphc.save_checkpoint(tmp_path / "c", {"x": full})
    os.remove(tmp_path / "c" / "device-1" / "leaf-0.npy")

    def load(comm):
        return graphc.load_checkpoint(tmp_path / "c", {"x": "[S(0)]"}, mesh=mesh({"dp": 2}), comm=comm)

    errors = on_ranks(2, load)
    assert all(isinstance(e, CheckpointError) and "device-1/leaf-0.npy: missing" in str(e) for e in errors), errors


def test_the_mpi_backends_sharded_arrays_bring_their_world_and_ranks(tmp_path):
    """A ShardedArray of the MPI backend carries its world (``.world.world``: the mpi4py
    communicator) and, on a sub-mesh, each device's rank (``.ranks``): save_checkpoint needs no
    comm= then, and each rank writes the devices it holds. Here rank 0 holds device 1."""
    x = rand((4, 6))
    full = sharded(x, "[S(0)]", {"dp": 2})

    class World:
        def __init__(self, comm):
            self.world = comm

    def save(comm):
        rank = comm.Get_rank()
        value = ShardedArray({1 - rank: full.pieces[1 - rank]}, full.spec, full.mesh, x.shape, x.dtype)
        object.__setattr__(value, "world", World(comm))
        object.__setattr__(value, "ranks", (1, 0))
        return graphc.save_checkpoint(tmp_path, {"x": value}, step=1)

    assert on_ranks(2, save) == [str(tmp_path / "step_00000001")] * 2
    assert same_bits(graphc.load_checkpoint(tmp_path)["x"], x)


# --- with the plans of parallelized steps -----------------------------------------------------------


def train_step(params, velocity, x, labels):
    loss, grads = graphc.value_and_grad(mlp.loss)(params, x, labels)
    params, velocity = graphc.optim.momentum(params, grads, velocity, lr=0.1)
    return params, velocity, loss


def _training_data(steps=20):
    rng = np.random.default_rng(0)
    params = mlp.init_params(rng, (8, 16, 4))
    xs = rng.standard_normal((steps, 8, 8)).astype(np.float32)
    labels = rng.integers(0, 4, size=(steps, 8))
    return params, graphc.optim.momentum_init(params), xs, labels


MEGATRON = {"layers": [{"w": "S(1)", "b": "S(0)"}, {"w": "S(0)", "b": "R"}]}


def test_train_on_dp2_resume_on_tp2_equals_an_uninterrupted_run(tmp_path):
    """Losses agree with one device to float32 rounding (rtol 1e-5; measured 1.2e-7): dp=2 sums
    the gradient's halves in another order. The checkpoint itself is exact, bit for bit."""
    params, velocity, xs, labels = _training_data()
    one = graphc.jit(train_step)
    p, v, want = params, velocity, []
    for x, y in zip(xs, labels):
        p, v, loss = one(p, v, x, y)
        want.append(float(loss))

    dp = graphc.parallelize(
        train_step, mesh=mesh({"dp": 2}), cache=False, sharded_state=True, in_specs=(None, None, "S(0)", "S(0)")
    )
    p, v, got = params, velocity, []
    for x, y in zip(xs[:10], labels[:10]):
        p, v, loss = dp(p, v, x, y)
        got.append(float(loss))
    assert isinstance(p["layers"][0]["w"], ShardedArray)
    graphc.save_checkpoint(tmp_path, {"params": p, "velocity": v}, dp.compile(p, v, xs[0], labels[0]), step=10)

    tp = graphc.parallelize(
        train_step, mesh=mesh({"tp": 2}), cache=False, sharded_state=True, in_specs=(MEGATRON, MEGATRON, "R", "R")
    )
    compiled = tp.compile(params, velocity, xs[0], labels[0])
    state = graphc.load_checkpoint(tmp_path, compiled)
    w = state["params"]["layers"][0]["w"]
    assert (
        w.spec == (S(1),) and w.mesh == compiled.plan.mesh and same_bits(np.asarray(w), np.asarray(p["layers"][0]["w"]))
    )
    p, v = state["params"], state["velocity"]
    for x, y in zip(xs[10:], labels[10:]):
        p, v, loss = tp(p, v, x, y)
        got.append(float(loss))
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_plan_names_must_match_the_state(tmp_path):
    params, velocity, xs, labels = _training_data(1)
    tp = graphc.parallelize(train_step, mesh=mesh({"tp": 2}), cache=False, in_specs=(MEGATRON, MEGATRON, "R", "R"))
    compiled = tp.compile(params, velocity, xs[0], labels[0])
    with pytest.raises(
        CheckpointError, match=r"'layers\.0\.w' is not an input of plan .*key the state by the step's argument names"
    ):
        graphc.save_checkpoint(tmp_path / "a", params, compiled)
    first, second = params["layers"]
    wrong = {"params": {"layers": [{"w": np.zeros((8, 3), np.float32), "b": first["b"]}, second]}}
    with pytest.raises(
        CheckpointError,
        match=r"'params\.layers\.0\.w' is f32\[8,3\], the plan's input %params\.layers\.0\.w is f32\[8,16\]",
    ):
        graphc.save_checkpoint(tmp_path / "b", wrong, compiled)
    held = {"params": params, "velocity": velocity}
    held["params"]["layers"][0]["w"] = sharded(params["layers"][0]["w"], "[S(0)]", {"tp": 2})
    with pytest.raises(CheckpointError, match=r"held as \[S\(0\)\], the plan gives \[S\(1\)\]"):
        graphc.save_checkpoint(tmp_path / "c", held, compiled)
    assert not os.listdir(tmp_path)


MPI_TRAINING = """
import sys, numpy as np, graphc
from mpi4py import MPI
from tests.test_checkpoint import MEGATRON, mesh, train_step, _training_data
params, velocity, xs, labels = _training_data()
rank = MPI.COMM_WORLD.Get_rank()
dp = graphc.parallelize(train_step, mesh=mesh({"dp": 2}), backend="mpi", cache=False, in_specs=(None, None, "S(0)", "S(0)"))
p, v = params, velocity
for x, y in zip(xs[:10], labels[:10]):
    p, v, loss = dp(p, v, x, y)
    if rank == 0:
        print(float(np.asarray(loss)))  # every result is this rank's ShardedArray; the loss is replicated
# no comm=: the ShardedArrays bring their MPI world (all replicated here: rank 0 writes them)
graphc.save_checkpoint(sys.argv[1], {"params": p, "velocity": v}, dp.compile(p, v, xs[0], labels[0]), step=10)

# one step on tp=2 under MPI: each rank loads only its pieces, and both write their shards
tp = graphc.parallelize(train_step, mesh=mesh({"tp": 2}), backend="mpi", cache=False, in_specs=(MEGATRON, MEGATRON, "R", "R"))
compiled = tp.compile(params, velocity, xs[0], labels[0])
state = graphc.load_checkpoint(sys.argv[1], compiled, comm=MPI.COMM_WORLD)
assert list(state["params"]["layers"][0]["w"].pieces) == [rank]
p, v, loss = tp(state["params"], state["velocity"], xs[10], labels[10])
if rank == 0:
    print(float(np.asarray(loss)))
graphc.save_checkpoint(sys.argv[1], {"params": p, "velocity": v}, compiled, step=11)
"""


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or mpiexec_path() is None,
    reason="needs the [mpi] extra: mpi4py and mpiexec (pip install -e '.[mpi]')",
)
def test_train_on_dp2_under_mpi_resume_on_tp2_under_threads(tmp_path):
    """Issue 17's version: 10 steps on dp=2 under ``mpiexec -n 2``, one on tp=2 under MPI (each
    rank loading and writing only its own pieces), then the rest on tp=2 threads."""
    params, velocity, xs, labels = _training_data()
    one = graphc.jit(train_step)
    p, v, want = params, velocity, []
    for x, y in zip(xs, labels):
        p, v, loss = one(p, v, x, y)
        want.append(float(loss))
    cmd = [str(mpiexec_path()), "-n", "2", sys.executable, "-c", MPI_TRAINING, str(tmp_path)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    got = [float(line) for line in res.stdout.split()]
    assert len(got) == 11 and sorted(os.listdir(tmp_path / "step_00000011")) == [
        "device-0",
        "device-1",
        "manifest.json",
    ]
    tp = graphc.parallelize(
        train_step, mesh=mesh({"tp": 2}), cache=False, sharded_state=True, in_specs=(MEGATRON, MEGATRON, "R", "R")
    )
    state = graphc.load_checkpoint(tmp_path, tp.compile(params, velocity, xs[0], labels[0]))
    p, v = state["params"], state["velocity"]
    for x, y in zip(xs[11:], labels[11:]):
        p, v, loss = tp(p, v, x, y)
        got.append(float(loss))
    np.testing.assert_allclose(got, want, rtol=1e-5)
