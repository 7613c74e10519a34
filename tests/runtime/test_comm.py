"""The thread communicator (runtime/comm.py) against its numpy reference and an independent
definition of every collective (sum, concatenate, split); matching, timeouts and aborts.

Every test runs device threads through ``run_devices``, which joins them with a deadline and
fails if one is still running: nothing here can hang."""

from __future__ import annotations

import functools
import math
import operator
import threading
import time

import numpy as np
import pytest

import graphc.runtime.comm as comm_module
from graphc.core.errors import GraphcError
from graphc.core.spec import S, shard
from graphc.ops.comm import reference
from graphc.runtime.comm import CommAborted, CommError, Communicator, ThreadComm, ThreadWorld

JOIN_S = 10.0  # no test should keep a device thread this long


def run_devices(n: int, body, world: ThreadWorld | None = None, timeout_s: float = 5.0, abort: bool = True):
    """``body(comm, device)`` on ``n`` device threads of one world.

    Returns ``(results, errors, world)``, dicts by device. A device that raises aborts the world
    (as the runtime does) unless ``abort=False``. Fails the test if a thread is still running
    after JOIN_S."""
    world = world or ThreadWorld(n, timeout_s=timeout_s)
    results: dict[int, object] = {}
    errors: dict[int, BaseException] = {}

    def device(d: int) -> None:
        try:
            results[d] = body(world.comm(d), d)
        except BaseException as exc:  # noqa: BLE001 - collected for the test to inspect
            errors[d] = exc
            if abort:
                world.abort(d, exc)

    threads = [threading.Thread(target=device, args=(d,), daemon=True) for d in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + JOIN_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a device thread hung"
    return results, errors, world


def run_ok(n: int, body, **kwargs) -> dict:
    results, errors, _ = run_devices(n, body, **kwargs)
    assert not errors, errors
    return results


# --- an independent definition of the block layout and the collectives ----------------------------


def split(x: np.ndarray, dim: int, n: int, blocks: int) -> list[np.ndarray]:
    """The n pieces of dim: each of ``blocks`` equal blocks array_split into n, piece r = the r-th
    part of every block."""
    per_block = [np.array_split(b, n, axis=dim) for b in np.split(x, blocks, axis=dim)]
    return [np.concatenate([parts[r] for parts in per_block], axis=dim) for r in range(n)]


def join(pieces: list[np.ndarray], dim: int, blocks: int) -> np.ndarray:
    halves = [np.split(p, blocks, axis=dim) for p in pieces]
    return np.concatenate([h[b] for b in range(blocks) for h in halves], axis=dim)


def independent(
    kind: str, xs: list, root=0, dim=0, blocks=1, split_dim=0, concat_dim=1, split_blocks=1, concat_blocks=1
) -> list:
    n = len(xs)
    if kind in ("all_reduce", "reduce", "reduce_scatter"):
        total = np.sum(np.stack(xs), axis=0, dtype=xs[0].dtype)
        if kind == "all_reduce":
            return [total] * n
        if kind == "reduce":
            return [total if r == root else None for r in range(n)]
        return split(total, dim, n, blocks)
    if kind == "all_gather":
        return [join(xs, dim, blocks)] * n
    if kind == "gather":
        return [join(xs, dim, blocks) if r == root else None for r in range(n)]
    if kind == "broadcast":
        return [xs[root]] * n
    if kind == "scatter":
        return split(xs[root], dim, n, blocks)
    if kind == "all_to_all":
        return [
            join([split(x, split_dim, n, split_blocks)[r] for x in xs], concat_dim, concat_blocks) for r in range(n)
        ]
    raise ValueError(kind)


def call(comm: ThreadComm, kind: str, x, group, **attrs):
    return getattr(comm, kind)(x, group, **attrs)


def assert_equal_results(got, want, exact: bool):
    if want is None:
        assert got is None
        return
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    if exact:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# --- every collective, every group size -----------------------------------------------------------

DTYPES = (np.float32, np.float64, np.int64)
KINDS = ("all_reduce", "reduce", "reduce_scatter", "all_gather", "gather", "broadcast", "scatter", "all_to_all")


def cases(kind: str, n: int, rng) -> list[tuple[dict, list]]:
    """(attrs, inputs by rank) for ``kind`` on ``n`` ranks: dtypes x dims 0/1 x blocks 1/2, and
    uneven sizes where blocks=1 allows them."""
    out = []
    for dtype in DTYPES:
        for dim in (0, 1):
            for blocks in (1, 2):
                for uneven in (False, True):
                    if uneven and (blocks > 1 or kind in ("all_reduce", "reduce", "broadcast")):
                        continue
                    size = 2 * n + 1 if uneven else 2 * n * blocks  # 2n+1: array_split with ragged pieces
                    shape = [3, 5, 2]
                    attrs: dict = {}
                    if kind in ("reduce_scatter", "scatter"):
                        shape[dim] = size
                        attrs = {"dim": dim, "blocks": blocks}
                    elif kind in ("all_gather", "gather"):
                        shape[dim] = 2 * blocks
                        attrs = {"dim": dim, "blocks": blocks}
                    elif kind == "all_to_all":
                        shape[dim] = size
                        shape[1 - dim] = 2 * blocks
                        attrs = {
                            "split_dim": dim,
                            "concat_dim": 1 - dim,
                            "split_blocks": blocks,
                            "concat_blocks": blocks,
                        }
                    elif dim == 1 or blocks == 2:
                        continue  # all_reduce, reduce, broadcast: no dim
                    if kind in ("reduce", "gather", "broadcast", "scatter"):
                        attrs["root"] = (dim + blocks) % n
                    xs = []
                    for r in range(n):
                        piece_shape = list(shape)
                        if uneven and kind in ("all_gather", "gather"):  # the pieces array_split made
                            piece_shape[dim] = len(np.array_split(np.arange(size), n)[r])
                        xs.append((rng.standard_normal(piece_shape) * 100).astype(dtype))
                    out.append((attrs, xs))
    return out


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", range(1, 9))
def test_collective_matches_reference_and_numpy(kind, n):
    rng = np.random.default_rng(n)
    todo = cases(kind, n, rng)
    assert todo
    group = tuple(range(n))
    copies = [[x.copy() for x in xs] for _, xs in todo]

    def device(comm, d):
        return [call(comm, kind, xs[d], group, **attrs) for attrs, xs in todo]

    results = run_ok(n, device)
    for k, (attrs, xs) in enumerate(todo):
        want_ref = reference(kind, xs, **attrs)
        want_np = independent(kind, xs, **attrs)
        for d in range(n):
            got = results[d][k]
            assert_equal_results(got, want_ref[d], exact=True)
            assert_equal_results(got, want_np[d], exact=xs[0].dtype.kind == "i")
            if got is not None:
                assert not any(np.shares_memory(got, x) for x in xs), "a result must be a new array"
        for x, before in zip(xs, copies[k]):
            np.testing.assert_array_equal(x, before)  # inputs are not modified


@pytest.mark.parametrize("n", [2, 4])
def test_block_layout_is_graphc_spec(n):
    """reduce_scatter with blocks=2 keeps exactly graphc.core.spec.shard's piece of S(1, blocks=2)."""
    xs = [np.arange(3 * 4 * n, dtype=np.float64).reshape(3, 4 * n) * (r + 1) for r in range(n)]
    out = run_ok(n, lambda comm, d: comm.reduce_scatter(xs[d], tuple(range(n)), 1, blocks=2))
    total = sum(xs)
    for d in range(n):
        np.testing.assert_array_equal(out[d], shard(total, (S(1, blocks=2),), (n,), (d,)))


def test_reference_rejects_unknown_kind():
    with pytest.raises(ValueError, match="not a collective"):
        reference("all_sum", [np.ones(2)])


# --- all_reduce: fixed summation order, in place ------------------------------------------------


@pytest.mark.parametrize("n", [3, 5, 8])
def test_all_reduce_bits_identical_across_ranks_and_runs(n):
    rng = np.random.default_rng(0)
    xs = [(rng.standard_normal(10_007) * 10.0 ** rng.integers(-6, 6, 10_007)).astype(np.float32) for _ in range(n)]
    group = tuple(range(n))
    runs = []
    for inplace in (False, True):
        inputs = [x.copy() for x in xs]
        out = run_ok(n, lambda comm, d: comm.all_reduce(inputs[d], group, inplace=inplace))  # noqa: B023
        runs.append([out[d].tobytes() for d in range(n)])
    assert len({b for run in runs for b in run}) == 1, "all ranks, both runs: the same bits"
    assert runs[0][0] == reference("all_reduce", xs)[0].tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_all_reduce_in_many_pieces(monkeypatch, dtype):
    """Chunks longer than a piece are summed and copied out piece by piece (the last one short)."""
    monkeypatch.setattr(comm_module, "_PIECE_BYTES", 64 * 8)
    n = 3
    rng = np.random.default_rng(1)
    xs = [(rng.standard_normal(5_001) * 1000).astype(dtype) for _ in range(n)]
    inputs = [x.copy() for x in xs]
    out = run_ok(n, lambda comm, d: comm.all_reduce(inputs[d], (0, 1, 2), inplace=d == 2))
    want = reference("all_reduce", xs)[0]
    for d in range(n):
        assert out[d].tobytes() == want.tobytes()


def test_all_reduce_in_place_writes_into_x():
    n = 4
    xs = [np.full((64, 3), d + 1, np.int64) for d in range(n)]
    ids = [id(x) for x in xs]
    # ranks 0 and 2 in place, 1 and 3 not: a member's choice does not affect the others
    out = run_ok(n, lambda comm, d: comm.all_reduce(xs[d], (0, 1, 2, 3), inplace=d % 2 == 0))
    for d in range(n):
        np.testing.assert_array_equal(out[d], np.full((64, 3), 10))
        assert (id(out[d]) == ids[d]) == (d % 2 == 0)
    np.testing.assert_array_equal(xs[1], np.full((64, 3), 2))  # not in place: input untouched


def test_in_place_needs_a_writeable_contiguous_array():
    x = np.ones((4, 6))[:, ::2]
    _, errors, _ = run_devices(1, lambda comm, d: comm.all_reduce(x, (0,), inplace=True))
    assert isinstance(errors[0], ValueError)


# --- groups ----------------------------------------------------------------------------------------


def test_rows_and_columns_of_a_2x4_mesh_run_concurrently():
    """Device d sits at (d // 4, d % 4); each does a row all_reduce, then a column all_gather, twice."""
    rows = [(0, 1, 2, 3), (4, 5, 6, 7)]
    cols = [(c, c + 4) for c in range(4)]

    def device(comm, d):
        row, col = rows[d // 4], cols[d % 4]
        x = np.full((2, 3), float(d))
        out = []
        for step in range(2):
            s = comm.all_reduce(x + step, row)
            out.append(comm.all_gather(s, col, 0))
        return out

    results = run_ok(8, device)
    for d in range(8):
        for step in range(2):
            want = np.concatenate([np.full((2, 3), sum(r) + 4.0 * step) for r in rows])
            np.testing.assert_array_equal(results[d][step], want)


def test_overlapping_groups_in_the_same_order():
    """(0, 1) then (1, 2) then (0, 1, 2): a device in two groups alternates between them."""

    def device(comm, d):
        got = []
        if d in (0, 1):
            got.append(comm.all_reduce(np.array([d + 1]), (0, 1)))
        if d in (1, 2):
            got.append(comm.all_reduce(np.array([d + 1]), (1, 2)))
        got.append(comm.broadcast(np.array([7]) if d == 2 else None, (0, 1, 2), root=2))
        return [int(g[0]) for g in got]

    assert run_ok(3, device) == {0: [3, 7], 1: [3, 5, 7], 2: [5, 7]}


def test_rank_follows_the_order_of_the_group():
    """group (2, 0, 1): device 2 is rank 0, so its piece comes first."""
    out = run_ok(3, lambda comm, d: comm.all_gather(np.array([d]), (2, 0, 1), 0))
    for d in range(3):
        np.testing.assert_array_equal(out[d], [2, 0, 1])


def test_root_is_a_rank_of_the_group():
    """group (2, 0, 1), root 0: device 2 is the root."""

    def device(comm, d):
        x = np.array([10 * d + 1])
        return comm.broadcast(x, (2, 0, 1), root=0), comm.reduce(x, (2, 0, 1), root=0)

    out = run_ok(3, device)
    assert [int(out[d][0][0]) for d in range(3)] == [21, 21, 21]
    assert out[2][1][0] == 33 and out[0][1] is None and out[1][1] is None


def test_bad_groups_raise_value_error():
    world = ThreadWorld(2)
    comm = world.comm(0)
    assert world.comm(0) is comm and isinstance(comm, Communicator)
    for group in [(1,), (0, 0), (0, 2), [0, 1], ()]:
        with pytest.raises(ValueError):
            comm.all_reduce(np.ones(2), group)
    with pytest.raises(ValueError, match="root must be a rank"):
        comm.broadcast(np.ones(2), (0, 1), root=2)
    with pytest.raises(ValueError, match="does not split"):
        comm.reduce_scatter(np.ones((5, 2)), (0, 1), 0, blocks=2)


# --- point to point --------------------------------------------------------------------------------


def test_send_recv_fifo_per_tag_and_buffered():
    def device(comm, d):
        if d == 0:
            x = np.zeros(3)
            for k in range(5):
                x[:] = k
                comm.send(x, 1)  # copied: changing x afterwards does not change the message
            comm.send(np.array([99]), 1, tag=7)
            return None
        time.sleep(0.05)  # every send happens before the first recv
        tagged = comm.recv(0, tag=7)
        return [int(tagged[0])] + [int(comm.recv(0)[0]) for _ in range(5)]

    assert run_ok(2, device)[1] == [99, 0, 1, 2, 3, 4]


def test_exchange_both_send_first_does_not_deadlock():
    def device(comm, d):
        comm.send(np.full(1 << 16, d, np.float32), 1 - d)
        return comm.recv(1 - d)

    out = run_ok(2, device)
    assert out[0][0] == 1 and out[1][0] == 0


def test_recv_times_out_naming_the_source():
    _, errors, _ = run_devices(2, lambda comm, d: comm.recv(1, tag=3) if d == 0 else None, timeout_s=0.3)
    assert isinstance(errors[0], CommError)
    assert "recv from device 1 (tag 3) on device 0" in str(errors[0])


# --- mismatches, lost peers, aborts ---------------------------------------------------------------


def test_different_collectives_raise_comm_error_naming_both():
    def device(comm, d):
        x = np.ones((4, 3), np.float32)
        return comm.all_gather(x, (0, 1), 0) if d == 0 else comm.all_reduce(x, (0, 1))

    _, errors, _ = run_devices(2, device, abort=False)
    for d in (0, 1):
        assert type(errors[d]) is CommError
        msg = str(errors[d])
        assert "#0 on group (0, 1)" in msg
        assert "device 0 called all_gather(dim=0, blocks=1) on float32[4, 3]" in msg
        assert "device 1 called all_reduce() on float32[4, 3]" in msg


@pytest.mark.parametrize("other", [np.ones((5, 3), np.float32), np.ones((4, 3), np.float64)])
def test_different_shapes_or_dtypes_raise_comm_error(other):
    mine = np.ones((4, 3), np.float32)
    _, errors, _ = run_devices(2, lambda comm, d: comm.all_reduce(mine if d == 0 else other, (0, 1)), abort=False)
    for d in (0, 1):
        msg = str(errors[d])
        assert "float32[4, 3]" in msg and f"{other.dtype}{list(other.shape)}" in msg, msg


def test_different_attributes_raise_comm_error():
    x = np.ones((4, 4))
    _, errors, _ = run_devices(2, lambda comm, d: comm.all_gather(x, (0, 1), d), abort=False)
    assert "dim=0" in str(errors[0]) and "dim=1" in str(errors[0])


def test_lost_peer_raises_comm_error_within_the_timeout():
    def device(comm, d):
        if d == 2:
            return None  # never calls
        comm.barrier((0, 1))  # an earlier collective on another group: sequence numbers are per group
        return comm.all_reduce(np.ones(4), (0, 1, 2))

    start = time.monotonic()
    _, errors, _ = run_devices(3, device, timeout_s=0.5, abort=False)
    assert time.monotonic() - start < 3.0
    assert set(errors) == {0, 1}
    for d in (0, 1):
        assert isinstance(errors[d], CommError) and not isinstance(errors[d], CommAborted)
        msg = str(errors[d])
        assert "all_reduce #0 on group (0, 1, 2): devices (2,) did not arrive within 0.5 s" in msg, msg


def test_late_member_fails_at_once_after_a_timeout():
    def device(comm, d):
        if d == 1:
            time.sleep(0.8)
        return comm.all_reduce(np.ones(4), (0, 1))

    _, errors, _ = run_devices(2, device, timeout_s=0.3, abort=False)
    assert "devices (1,) did not arrive within 0.3 s (device 0 waiting)" in str(errors[0])
    assert "device 1 arrived after that" in str(errors[1])


def test_failed_device_aborts_the_others_promptly():
    group = (0, 1, 2, 3)

    def device(comm, d):
        comm.all_reduce(np.ones(8), group)
        if d == 2:
            time.sleep(0.05)
            raise RuntimeError("boom on purpose")
        if d == 3:
            return comm.recv(2)  # a pending point-to-point wait is abandoned too
        return comm.all_gather(np.ones(8), group, 0)

    start = time.monotonic()
    _, errors, world = run_devices(4, device, timeout_s=30.0)
    assert time.monotonic() - start < 2.0, "an abort must not wait for the 30 s timeout"
    assert isinstance(errors[2], RuntimeError)
    for d in (0, 1, 3):
        assert isinstance(errors[d], CommAborted), errors[d]
        assert "device 2 failed (RuntimeError: boom on purpose)" in str(errors[d])
        assert f"device {d} abandoned" in str(errors[d])
    assert world.failed[0] == 2
    # and every later wait fails at once
    with pytest.raises(CommAborted):
        world.comm(0).barrier((0, 1))
    assert issubclass(CommAborted, CommError) and issubclass(CommError, GraphcError)


def test_the_log_records_every_call():
    def device(comm, d):
        comm.all_reduce(np.ones((4, 4), np.float32), (0, 1))
        comm.all_gather(np.ones((2, 4), np.float32), (0, 1), 0)
        comm.barrier((0, 1))
        return comm.log

    logs = run_ok(2, device)
    for log in logs.values():
        assert [e["kind"] for e in log] == ["all_reduce", "all_gather", "barrier"]
        assert [e["bytes"] for e in log] == [64, 64, 0]
        assert all(e["group"] == (0, 1) and e["seconds"] >= 0 for e in log)


def test_the_log_says_how_long_each_member_waited_for_the_last_to_arrive():
    def device(comm, d):
        if d == 1:
            time.sleep(0.05)  # arrives last: device 0 waits for it (no figure is checked)
        comm.all_reduce(np.ones((4, 4), np.float32), (0, 1))
        comm.barrier((0, 1))
        return comm.log

    logs = run_ok(2, device)
    for k in range(2):
        a, b = logs[0][k], logs[1][k]
        assert 0 <= a["waited"] <= a["seconds"] and 0 <= b["waited"] <= b["seconds"]
        # both waited until the same moment, the last arrival: start + waited is equal (up to the
        # rounding of a subtraction and an addition of perf_counter values)
        assert math.isclose(a["start"] + a["waited"], b["start"] + b["waited"], rel_tol=2 * np.finfo(float).eps)
        late, early = (a, b) if a["start"] > b["start"] else (b, a)
        assert late["waited"] <= early["waited"]


def test_sum_order_is_rank_order():
    """float32: (1e8 + 1) - 1e8 = 0 but 1e8 - 1e8 + 1 = 1: the order is visible, and it is rank order."""
    xs = [np.float32([1e8]), np.float32([1.0]), np.float32([-1e8])]
    out = run_ok(3, lambda comm, d: comm.all_reduce(xs[d], (0, 1, 2)))
    want = functools.reduce(operator.add, xs)
    assert out[0][0] == want[0] == 0.0
