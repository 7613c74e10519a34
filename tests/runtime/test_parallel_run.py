"""The multi-device runtime end to end: plan, lower, run on one thread per device with real
collectives, and compare with numpy eager; sharded state across steps; failures that stop all
devices and name the device and the user's line; a lost peer that times out with a name."""

import numpy as np
import pytest

import graphc
from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.core.pytree import flatten
from graphc.interpreter import bind_arguments
from graphc.passes.partition import compile_devices, lower
from graphc.runtime.comm import CommError
from graphc.runtime.devices import ParallelExecutable, ShardedArray
from tests.helpers import quick_share
from tests.models import foreign_models

PROFILE = MachineProfile.default()
MESHES = [{"dp": 2}, {"tp": 2}, {"tp": 4}, {"dp": 2, "tp": 2}, {"dp": 8}]


def _mesh(axes):
    return Mesh(axes, profile=PROFILE)


def _static_names(kwargs):
    return tuple(k for k, v in kwargs.items() if not flatten(v)[0])


def _models():
    from graphc.models import cnn, gpt, mlp, vit

    return {
        "mlp_train": (mlp.train_step, *mlp.example_train_args(batch=64, sizes=(16, 32, 32, 8))),
        "gpt_train": (gpt.train_step, *gpt.example_train_args(batch=8, seq=16)),
        "gpt_forward": (gpt.gpt, *gpt.example_args(batch=8, seq=16)),
        "cnn_train": (cnn.train_step, *cnn.example_train_args(batch=8)),
        "vit_train": (vit.train_step, *vit.example_train_args(batch=4)),
    }


MODELS = _models()


def assert_close(got, want, rtol=0.0):
    g, w = flatten(got)[0], flatten(want)[0]
    assert len(g) == len(w)
    for a, b in zip(g, w):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
        if b.dtype.kind == "f":
            tol = max(rtol, 1e-4 if b.dtype == np.float32 else 1e-9)
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol)
        else:
            np.testing.assert_array_equal(a, b)


def unfused_executable(fn, args, kwargs, axes, timeout_s=30.0):
    """Plan ``fn`` on the mesh and build its executable without fused kernels (no Numba compiles:
    fast to test on many meshes; the fused path is tested below). Returns (executable, flat
    arguments, the partitioned graph)."""
    pf = graphc.parallelize(fn, mesh=_mesh(axes), cache=False, static_argnames=_static_names(kwargs))
    plan, graph = pf.plan_and_graph(*args, **kwargs)
    exe = ParallelExecutable(compile_devices(lower(graph, plan), ("cse", "dce")), timeout_s=timeout_s)
    dyn_args, dyn_kwargs, _ = pf.split_static(args, kwargs)
    return exe, bind_arguments(graph, dyn_args, dyn_kwargs), graph


def run_unfused(fn, args, kwargs, axes):
    from graphc.core.pytree import unflatten

    exe, arrays, graph = unfused_executable(fn, args, kwargs, axes)
    return unflatten(graph.out_tree, exe.run_flat(arrays)), graph


@pytest.mark.parametrize("axes", quick_share(MESHES), ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()))
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n == "gpt_train" else n for n in sorted(MODELS)]
)
def test_models_on_meshes_equal_numpy(name, axes):
    fn, args, kwargs = MODELS[name]
    got, _graph = run_unfused(fn, args, kwargs, axes)
    assert_close(got, fn(*args, **kwargs))


@pytest.mark.parametrize("name", quick_share(sorted(foreign_models.MODELS), every=4))
def test_foreign_models_on_a_2x2_mesh(name):
    """Plain-numpy models of other styles (picoGPT, classes, RNNs, einsum attention, batch norm,
    im2col CNNs, mixture of experts, ...)."""
    fn, args, kwargs, rtol = foreign_models.MODELS[name]()
    got, _graph = run_unfused(fn, args, kwargs, {"dp": 2, "tp": 2})
    assert_close(got, fn(*args, **kwargs), rtol)


@pytest.mark.slow
def test_parallelize_runs_with_fused_kernels():
    from graphc.models import gpt

    args, kwargs = gpt.example_train_args(batch=4, seq=16)
    pf = graphc.parallelize(
        gpt.train_step, mesh=_mesh({"dp": 2, "tp": 2}), cache=False, static_argnames=("n_head", "lr")
    )
    got = pf(*args, **kwargs)
    assert_close(got, gpt.train_step(*args, **kwargs))
    compiled = pf.compile(*args, **kwargs)
    assert compiled is pf.compile(*args, **kwargs)  # cached by shapes, dtypes and static values
    assert any(n.op.name == "fused" for n in compiled.program.devices[0].graph.nodes)
    assert "all_" in compiled.ir("device") or "reduce_scatter" in compiled.ir("device")
    assert compiled.plan is not None


def test_training_steps_with_sharded_state_equal_eager_steps():
    from graphc.models import mlp

    (params, x, labels), kw = mlp.example_train_args(batch=64, sizes=(16, 32, 32, 8))
    pf = graphc.parallelize(
        mlp.train_step, mesh=_mesh({"dp": 2, "tp": 2}), cache=False, static_argnames=("lr",), sharded_state=True
    )
    p_eager, p_par = params, params
    for _ in range(3):
        p_eager, loss_eager = mlp.train_step(p_eager, x, labels, **kw)
        p_par, loss_par = pf(p_par, x, labels, **kw)
        np.testing.assert_allclose(loss_par, loss_eager, rtol=1e-5)
    leaves = flatten(p_par)[0]
    assert leaves and all(isinstance(a, ShardedArray) for a in leaves)  # stayed on the devices
    assert_close(graphc.tree_map(np.asarray, p_par), p_eager)
    for a in leaves:  # the whole value is the caller's own: writing into it leaves the devices alone
        whole = np.asarray(a)
        kept = whole.copy()
        whole[...] = 7
        np.testing.assert_array_equal(np.asarray(a), kept)


def test_results_of_later_calls_do_not_overwrite_earlier_ones():
    """Replicated results are the devices' own buffers, handed out: a later call must not reuse
    them (nor the split results' whole arrays)."""

    def step(w, x):
        h = np.tanh(x @ w) * 2.0 + 1.0
        return w - 0.1 * (x.T @ h), h.sum()

    rng = np.random.default_rng(0)
    w, x = rng.standard_normal((64, 64)).astype(np.float32), rng.standard_normal((128, 64)).astype(np.float32)
    pf = graphc.parallelize(step, mesh=_mesh({"dp": 2}), cache=False)
    first = pf(w, x)
    kept = [np.array(r) for r in first]
    for _ in range(3):
        later = pf(w * 2, x)
        assert not np.shares_memory(later[0], first[0])
    for got, want in zip(first, kept):
        np.testing.assert_array_equal(got, want)


def test_out_of_range_index_on_a_split_table_raises_index_error_naming_device_and_line():
    def embed(table, tokens):
        return graphc.shard(table, "S(0)")[tokens].sum(axis=-1)

    table = np.arange(32, dtype=np.float32).reshape(8, 4)
    pf = graphc.parallelize(embed, mesh=_mesh({"tp": 2}), cache=False)
    np.testing.assert_array_equal(pf(table, np.array([[1, 7, -1]])), embed(table, np.array([[1, 7, -1]])))
    with pytest.raises(IndexError, match=r"device \d.*test_parallel_run.py"):
        pf(table, np.array([[1, 8, 0]]))


def test_an_exception_on_one_device_stops_all_quickly():
    import time

    from graphc.models import gpt

    args, kwargs = gpt.example_train_args(batch=4, seq=16)
    exe, arrays, _graph = unfused_executable(gpt.train_step, args, kwargs, {"tp": 4})
    broken = exe.executables[2]

    def fail(*a, **k):
        raise ValueError("simulated failure")

    broken.run_flat = fail
    start = time.perf_counter()
    with pytest.raises(ValueError, match="device 2"):
        exe.run_flat(arrays)
    assert time.perf_counter() - start < 10  # not the 30 s collective timeout


def test_a_lost_peer_fails_with_a_named_timeout():
    from graphc.models import gpt

    args, kwargs = gpt.example_train_args(batch=4, seq=16)
    exe, arrays, graph = unfused_executable(gpt.train_step, args, kwargs, {"tp": 2}, timeout_s=0.5)
    n_out = len(graph.outputs)
    exe.executables[1].run_flat = lambda *a, **k: [None] * n_out  # device 1 never enters a collective
    with pytest.raises(CommError, match="did not arrive"):
        exe.run_flat(arrays)


# --- control flow and splits under parallelize (issue 18: crashed in planning) ---------------------


def _nested_if_elif(x):
    s = np.sum(x)
    if s > 10:
        y = x * 2.0
    elif s < -1:
        if np.max(x) > 0:
            y = x * 3.0
        else:
            y = x - 3.0
    else:
        y = np.tanh(x) - 1.0
    return y


def _loop_inside_if(x):
    y = x
    i = 0
    if np.sum(x) > 0:
        for i in range(3):
            y = np.exp(y * 0.1) + i
        while np.sum(y) < 1000.0:
            y = y * 2.0
    return y + i


@pytest.mark.parametrize("fn", [_nested_if_elif, _loop_inside_if], ids=lambda f: f.__name__)
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_nested_control_flow_under_parallelize(fn, sign):
    """The planner costs a control-flow node from its regions' nodes, nested cond / loops / fused
    kernels included (region_cost passed no regions to them: a TypeError in planning)."""
    x = sign * np.linspace(0.5, 2.0, 8)
    pf = graphc.parallelize(fn, mesh=_mesh({"dp": 2}), cache=False)
    assert_close(pf(x), fn(x), rtol=1e-12)
    assert_close(graphc.jit(fn)(x), fn(x), rtol=1e-12)


@pytest.mark.parametrize("shape", [(2,), (4,), (8, 3), (2, 1)])
def test_split_of_a_split_input_under_parallelize(shape):
    """np.split along a dim the input is split on re-splits that dim into blocks: a gather and a
    slice, never an all_to_all between a dim and itself."""
    x = np.arange(float(np.prod(shape))).reshape(shape)
    for fn in (lambda x: np.split(x, 2)[1], lambda x: np.split(x, 2)[0] * 2.0 + np.split(x, 2)[1]):
        pf = graphc.parallelize(fn, mesh=_mesh({"dp": 2}), in_specs=("S(0)",), cache=False)
        assert_close(pf(x), fn(x))


def test_a_replicated_result_is_not_a_piece_kept_on_the_devices():
    """A result returned whole and the same value kept sharded are separate arrays: writing into
    the first leaves every device's piece of the second alone."""

    def step(w, x):
        w2 = w - 0.1 * (x.T @ np.tanh(x @ w))
        return w2, w2

    rng = np.random.default_rng(0)
    w, x = rng.standard_normal((16, 16)).astype(np.float32), rng.standard_normal((32, 16)).astype(np.float32)
    pf = graphc.parallelize(step, mesh=_mesh({"dp": 2}), cache=False, sharded_state=True)
    state, out = pf(w, x)
    want = np.asarray(state).copy()
    out[...] = 0
    for piece in state.pieces.values():
        np.testing.assert_array_equal(piece, want)
    peek = graphc.parallelize(lambda w, x: (w, (x @ w).sum()), mesh=_mesh({"dp": 2}), cache=False)
    seen, _ = peek(state, x)
    assert not any(np.shares_memory(seen, p) for p in state.pieces.values())


@pytest.mark.parametrize("n", [2, 4])
def test_lookups_in_a_split_table_keep_negative_zeros(n):
    """A gather from (and a scatter-add into) a table split by rows masks the rows another device
    owns and sums the pieces: the masked rows give -0.0, the float sum's identity, so -0.0 in
    the table stays -0.0 (it used to come back as 0.0)."""
    table = np.array([[1.0, -0.0], [-0.0, -0.0], [-0.0, 5.0], [-0.0, -0.0]])
    updates = np.full((2, 2), -0.0)

    def lookup(t):
        return np.take(graphc.shard(t, "S(0)"), [1, 3], axis=0)

    def scatter(t, u):
        t = graphc.shard(t * 1.0, "S(0)")
        np.add.at(t, [1, 3], u)
        return t

    want_scatter = table.copy()
    np.add.at(want_scatter, [1, 3], updates)
    for fn, args, want in (
        (lookup, (table,), np.take(table, [1, 3], axis=0)),
        (scatter, (table, updates), want_scatter),
    ):
        got = graphc.parallelize(fn, mesh={"tp": n})(*args)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


def test_a_redistribution_program_moves_a_value_between_any_two_specs():
    """passes/lower.py ``redistribution_program`` (what graphc/api/reshard.py runs on MPI ranks for
    a ShardedArray a step wants in another spec): the plan's redistribution steps on every device;
    on threads, the whole value comes out as it went in, for every pair of specs over a 2 x 2 mesh
    (partial sums, splits of either dim over either axis, replicas)."""
    import itertools

    from graphc.core.ir import TensorType
    from graphc.core.mesh import Mesh
    from graphc.core.spec import P, R, S
    from graphc.passes.lower import redistribution_program
    from graphc.runtime.devices import ParallelExecutable

    mesh = Mesh({"dp": 2, "tp": 2})
    specs = [(R, R), (S(0), R), (R, S(1)), (S(0), S(1)), (S(1), S(0)), (P, R), (R, P), (P, S(1)), (P, P)]
    x = np.arange(8 * 12, dtype=np.float32).reshape(8, 12) - 40.0
    kinds = set()
    for src, dst in itertools.permutations(specs, 2):
        program = redistribution_program(TensorType(x.shape, x.dtype), src, dst, mesh).verify()
        kinds |= {n.op.name for p in program.devices for n in p.graph.nodes}
        (got,) = ParallelExecutable(program, timeout_s=20).run_flat([x])
        np.testing.assert_array_equal(got, x, err_msg=f"{src} -> {dst}")
    assert {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "shard_slice", "partial_zero"} <= kinds
