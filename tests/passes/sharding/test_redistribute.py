"""Redistribution plans are checked by executing them: every step is simulated on the per-device
pieces of a random tensor (collectives by their definitions), and the result must be the
target spec's pieces of the same tensor (for P: pieces that sum to it)."""

import itertools
from dataclasses import dataclass

import numpy as np
import pytest

from graphc.core.spec import P, R, S, format_spec, parse_spec, shard, unshard
from graphc.passes.sharding.redistribute import plan_steps, redistribution_time, step_time


@dataclass(frozen=True)
class _Link:
    latency_s: float = 5e-6
    bandwidth: float = 5e9


@dataclass(frozen=True)
class _Profile:
    flops: float = 1e11
    mem_bandwidth: float = 8e9
    collective_overhead_s: float = 1e-5

    def device_share(self, devices: int) -> float:  # every device a core of its own
        return 1.0

    def concurrent_bandwidth(self, devices: int) -> float:
        return self.mem_bandwidth


class _Mesh:
    def __init__(self, shape):
        self.shape = tuple(shape)
        self.axis_names = tuple(f"a{i}" for i in range(len(shape)))
        self.links = {n: _Link() for n in self.axis_names}
        self.profile = _Profile()


def _coords(mesh_shape):
    return list(itertools.product(*(range(n) for n in mesh_shape)))


def _block_take(a, dim, blocks, n, r):
    size = a.shape[dim]
    b = size // blocks
    c = b // n
    idx = (np.arange(blocks)[:, None] * b + r * c + np.arange(c)[None, :]).reshape(-1)
    return np.take(a, idx, axis=dim)


def _block_join(parts, dim, blocks):
    """Inverse of _block_take over r = 0..n-1."""
    n = len(parts)
    chunks = []
    for k in range(blocks):
        for r in range(n):
            c = parts[r].shape[dim] // blocks
            chunks.append(np.take(parts[r], np.arange(k * c, (k + 1) * c), axis=dim))
    return np.concatenate(chunks, axis=dim)


def _group(coord, axis, mesh_shape):
    return [coord[:axis] + (r,) + coord[axis + 1 :] for r in range(mesh_shape[axis])]


def simulate(pieces, steps, mesh_shape):
    for st in steps:
        a = st.axis
        n = mesh_shape[a]
        new = {}
        for c in pieces:
            grp = _group(c, a, mesh_shape)
            r = c[a]
            if st.kind == "all_reduce":
                new[c] = sum(pieces[g] for g in grp)
            elif st.kind == "reduce_scatter":
                t = st.dst[a]
                new[c] = _block_take(sum(pieces[g] for g in grp), t.dim, t.blocks, n, r)
            elif st.kind in ("all_gather", "all_to_all"):
                s = st.src[a]
                full = _block_join([pieces[g] for g in grp], s.dim, s.blocks)
                t = st.dst[a]
                new[c] = full if st.kind == "all_gather" else _block_take(full, t.dim, t.blocks, n, r)
            elif st.kind == "slice":
                t = st.dst[a]
                new[c] = _block_take(pieces[c], t.dim, t.blocks, n, r)
            elif st.kind == "zero":
                new[c] = pieces[c] if r == 0 else np.zeros_like(pieces[c])
            else:  # pragma: no cover
                raise AssertionError(st.kind)
        pieces = new
    return pieces


def _specs(shape, mesh_shape):
    per_axis = []
    for n in mesh_shape:
        opts = [R, P]
        for d, size in enumerate(shape):
            for b in (1, 2, 3):  # 3: the fused QKV layout S(d, blocks=3)
                if size % (b * n) == 0:
                    opts.append(S(d, b))
        per_axis.append(opts)
    out = []
    for combo in itertools.product(*per_axis):
        dims = [p.dim for p in combo if p.is_split]
        if len(dims) == len(set(dims)):
            out.append(tuple(combo))
    return out


def _start_pieces(x, spec, mesh_shape, rng):
    """Pieces of x under spec; P axes get a random decomposition (not just value + zeros)."""
    pieces = {c: shard(x, tuple(R if p.kind == "P" else p for p in spec), mesh_shape, c) for c in _coords(mesh_shape)}
    for a, p in enumerate(spec):
        if p.kind != "P":
            continue
        n = mesh_shape[a]
        for c in _coords(mesh_shape):
            if c[a] != 0:
                continue
            grp = _group(c, a, mesh_shape)
            noise = [rng.standard_normal(pieces[c].shape) for _ in range(n - 1)]
            base = pieces[c]
            pieces[grp[0]] = base - sum(noise)
            for g, z in zip(grp[1:], noise):
                pieces[g] = z + 0 * pieces[g]
    return pieces


@pytest.mark.parametrize(
    "mesh_shape,shape",
    [((2,), (4, 6)), ((2, 2), (4, 4)), ((2, 3), (6, 4)), ((4,), (8, 4)), ((3,), (9, 6)), ((2, 2), (6, 12))],
)
def test_every_redistribution_executes_to_its_target(mesh_shape, shape):
    rng = np.random.default_rng(0)
    mesh = _Mesh(mesh_shape)
    x = rng.standard_normal(shape)
    specs = _specs(shape, mesh_shape)
    for src, dst in itertools.product(specs, specs):
        steps = plan_steps(shape, 8, src, dst, mesh)
        got = simulate(_start_pieces(x, src, mesh_shape, rng), steps, mesh_shape)
        label = f"{format_spec(src)} -> {format_spec(dst)} via {[str(s) for s in steps]}"
        if any(p.kind == "P" for p in dst):
            np.testing.assert_allclose(unshard(got, dst, mesh_shape, shape), x, atol=1e-12, err_msg=label)
            for c in got:  # non-P axes must still be exact pieces
                assert got[c].shape == shard(x, dst, mesh_shape, c).shape, label
        else:
            for c in _coords(mesh_shape):
                np.testing.assert_allclose(got[c], shard(x, dst, mesh_shape, c), atol=1e-12, err_msg=label)
        for st in steps:  # no intermediate spec splits a dim twice
            dims = [p.dim for p in st.dst if p.is_split]
            assert len(dims) == len(set(dims)), label
            if st.kind == "all_to_all":  # the op moves a split to another dim (comm.all_to_all)
                assert st.src[st.axis].dim != st.dst[st.axis].dim, label


def test_cheapest_collective_per_transition():
    mesh = _Mesh((4,))
    kinds = {
        ("[P]", "[R]"): ["all_reduce"],
        ("[P]", "[S(0)]"): ["reduce_scatter"],
        ("[S(0)]", "[R]"): ["all_gather"],
        ("[S(0)]", "[S(1)]"): ["all_to_all"],
        ("[R]", "[S(1)]"): ["slice"],
        ("[S(1)]", "[S(1)]"): [],
    }
    for (a, b), want in kinds.items():
        assert [s.kind for s in plan_steps((8, 8), 4, parse_spec(a), parse_spec(b), mesh)] == want


def test_collective_cost_formulas():
    # large messages: ring all-reduce of B bytes over n: 2(n-1) alpha + 2 (n-1)/n B / bw + overhead
    n, nbytes, lat, bw, ovh = 4, 1 << 20, 1e-5, 1e9, 2e-5
    assert step_time("all_reduce", n, nbytes, lat, bw, ovh, 1e10) == pytest.approx(
        2 * 3 * lat + 2 * 0.75 * nbytes / bw + ovh
    )
    # all-gather: the latency term of recursive doubling (log2 n rounds), the bandwidth term of the ring
    assert step_time("all_gather", n, nbytes, lat, bw, ovh, 1e10) == pytest.approx(2 * lat + 0.75 * nbytes / bw + ovh)
    assert step_time("all_gather", 3, nbytes, lat, bw, ovh, 1e10) == pytest.approx(2 * lat + nbytes * 2 / 3 / bw + ovh)
    # small messages: recursive doubling all-reduce, log2 n rounds of the whole message
    assert step_time("all_reduce", 8, 4, lat, bw, ovh, 1e10) == pytest.approx(3 * (lat + 4 / bw) + ovh)
    assert step_time("all_to_all", n, nbytes, lat, bw, ovh, 1e10) == pytest.approx(3 * lat + 0.75 * nbytes / bw + ovh)
    assert step_time("all_reduce", 1, nbytes, lat, bw, ovh, 1e10) == 0
    mesh = _Mesh((4,))
    # reduce-scatter + all-gather move the bytes of one ring all-reduce; each pays log2(4) = 2
    # latencies where the ring pays 2 x 3, and one more call overhead
    ar = redistribution_time((1024, 256), 4, (P,), (R,), mesh)
    rs = redistribution_time((1024, 256), 4, (P,), (S(0),), mesh)
    ag = redistribution_time((1024, 256), 4, (S(0),), (R,), mesh)
    lat = mesh.links["a0"].latency_s
    assert rs + ag == pytest.approx(ar + mesh.profile.collective_overhead_s - 2 * lat)
    assert redistribution_time((1024, 256), 4, (R,), (R,), mesh) == 0


@pytest.mark.parametrize(
    "mesh_shape,shape", [((2,), (4, 6)), ((2, 2), (4, 4)), ((2, 3), (6, 4)), ((3,), (7, 5)), ((2, 2), (0, 4))]
)
def test_unshard_inverts_shard_for_every_spec(mesh_shape, shape):
    """unshard(shard(x)) is x for every spec (P axes summed, R copies counted once, uneven and
    blocked splits); a replicated value is its coordinate-0 piece itself, not a copy."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape)
    for spec in _specs(shape, mesh_shape):
        pieces = _start_pieces(x, spec, mesh_shape, rng)
        got = unshard(pieces, spec, mesh_shape, shape)
        np.testing.assert_allclose(got, x, atol=1e-12, err_msg=format_spec(spec))
        if all(p.kind == "R" for p in spec):
            assert got is pieces[(0,) * len(mesh_shape)]
    blocked = (S(0, 2),) + (R,) * (len(mesh_shape) - 1)
    if shape[0] % (2 * mesh_shape[0]) == 0:
        pieces = {c: shard(x, blocked, mesh_shape, c) for c in _coords(mesh_shape)}
        np.testing.assert_array_equal(unshard(pieces, blocked, mesh_shape, shape), x)
