"""The cost model against the threaded runtime (issue 16): devices sharing cores, the matmul rate
table, the runtime's overhead per op when several devices run, and memory as the runtime holds it
(views, redistribution buffers, a buffer pool capped at the liveness peak)."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from graphc.builder import GraphBuilder
from graphc.core.errors import MeshError
from graphc.core.ir import TensorType
from graphc.core.mesh import Mesh
from graphc.core.profile import DEFAULT_MATMUL_EFFICIENCY, MachineProfile, matmul_key, size_class
from graphc.core.profiles import get_profile
from graphc.models import mlp
from graphc.passes.options import PlanOptions
from graphc.passes.partition import build_problem, optimize_for_planning, solve_problem, state_ties
from graphc.passes.sharding.memory import view_roots
from graphc.passes.sharding.strategies import full_time
from graphc.runtime.calibrate import calibrate
from graphc.runtime.executor import BufferPool

DEFAULT = MachineProfile.default()
F32 = np.dtype(np.float32)
# a machine of 2 cores shared by its device threads, with measured overheads
HERE = dataclasses.replace(
    DEFAULT, cores=2, dispatch_s=2e-6, concurrent_dispatch_s=10e-6, oversubscribed_dispatch_s=50e-6
)


def _matmul_graph(m: int, k: int, n: int, batch: tuple[int, ...] = (), dtype=F32):
    b = GraphBuilder("mm")
    x = b.input(TensorType((*batch, m, k), dtype))
    w = b.input(TensorType((*batch, k, n), dtype))
    y = b.op("matmul", x, w)
    return b.build([y])


# --- 1. more device threads than cores --------------------------------------------------------


def test_devices_beyond_the_cores_share_them():
    assert [HERE.device_share(n) for n in (1, 2, 4, 8)] == [1.0, 1.0, 0.5, 0.25]
    node = _matmul_graph(256, 256, 256).nodes[0]
    assert full_time(node, HERE, devices=4) == pytest.approx(2 * full_time(node, HERE, devices=2))
    # the fixed default and the GPU presets give every device hardware of its own
    for profile in (DEFAULT, get_profile("h100-sxm"), get_profile("a100-sxm")):
        assert profile.cores is None and profile.device_share(64) == 1.0
        assert profile.op_overhead(64) == 0.0


def test_data_parallel_on_more_devices_than_cores_is_not_predicted_faster():
    (params, x, labels), kw = mlp.example_train_args(batch=512, sizes=(256, 512, 16))
    import graphc

    def step_time(mesh: str, profile: MachineProfile) -> float:
        pf = graphc.parallelize(mlp.train_step, mesh=Mesh(mesh, profile=profile), static_argnames=("lr",), cache=False)
        return pf.plan(params, x, labels, **kw).cost.total_s

    # every device its own core: 4 devices are predicted much faster than 2
    assert step_time("dp=4", DEFAULT) < 0.7 * step_time("dp=2", DEFAULT)
    # 2 cores: the compute per device does not shrink past 2 devices, and 4 threads cost more per op
    assert step_time("dp=4", HERE) > step_time("dp=2", HERE)


# --- 2. matmul rates by dtype and size class ----------------------------------------------------


def test_size_classes_and_the_default_table():
    assert [size_class(n**3) for n in (16, 64, 95, 96, 256, 383, 384, 4096)] == [
        "small",
        "small",
        "small",
        "medium",
        "medium",
        "medium",
        "large",
        "large",
    ]
    assert matmul_key(48**3, True) == "small batched"
    assert DEFAULT.matmul_rate(np.float32) == 100e9 and DEFAULT.matmul_rate(np.float64) == 50e9
    for key, eff in DEFAULT_MATMUL_EFFICIENCY.items():
        assert DEFAULT.matmul_table["float32"][key] == pytest.approx(100e9 * eff)
        assert DEFAULT.matmul_table["float64"][key] == pytest.approx(50e9 * eff)
    # the GPU presets' table: every size of float32 at cuBLAS SGEMM's measured share of the fp32 peak
    # (profiles.SUSTAINED_SGEMM); a dtype without a row (their float64) runs every size at its peak
    h100 = get_profile("h100-sxm")
    assert (
        h100.matmul_rate(np.float32, 16**3)
        == h100.matmul_rate(np.float32, 4096**3)
        == pytest.approx(18.88 / 19.49 * h100.flops)
    )
    assert h100.matmul_rate(np.float64, 16**3) == h100.matmul_rate(np.float64) == 66.9e12


def test_contractions_are_priced_at_their_size_class_and_dtype():
    table = {"float32": {"small": 10e9, "large": 100e9, "small batched": 20e9}, "float64": {"large": 50e9}}
    profile = dataclasses.replace(DEFAULT, matmul_table=table, mem_bandwidth=1e15)  # compute-bound
    small = _matmul_graph(32, 32, 32).nodes[0]
    assert full_time(small, profile) == pytest.approx(2 * 32**3 / 10e9)
    batched = _matmul_graph(32, 32, 32, batch=(8,)).nodes[0]
    assert full_time(batched, profile) == pytest.approx(8 * 2 * 32**3 / 20e9)
    big = _matmul_graph(512, 512, 512).nodes[0]
    assert full_time(big, profile) == pytest.approx(2 * 512**3 / 100e9)
    medium = _matmul_graph(128, 128, 128).nodes[0]  # no "medium" entry: the dtype's peak
    assert full_time(medium, profile) == pytest.approx(2 * 128**3 / 100e9)
    double = _matmul_graph(512, 512, 512, dtype=np.dtype(np.float64)).nodes[0]
    assert full_time(double, profile) == pytest.approx(2 * 512**3 / 50e9)


def test_a_split_matmul_is_priced_at_the_size_one_device_runs():
    table = {"float32": {"small": 10e9, "medium": 100e9, "large": 100e9}}
    profile = dataclasses.replace(DEFAULT, matmul_table=table, mem_bandwidth=1e15)
    graph = _matmul_graph(1024, 64, 96)  # (1024 * 64 * 96)^(1/3) = 183: medium; split 16 ways: 73, small
    problem = build_problem(graph, Mesh("tp=16", profile=profile), PlanOptions(linear_partials=False))
    (node,) = [it for it in problem.items if it.kind == "node"]
    by_name = {st.name: st.compute_s for st in node.strategies}
    whole = 2 * 1024 * 64 * 96
    assert by_name["replicate"] == pytest.approx(whole / 100e9)
    split = [t for name, t in by_name.items() if name != "replicate"]
    assert split and all(t == pytest.approx(whole / 16 / 10e9) for t in split)


def test_profiles_stored_before_the_table_load_and_price_as_before():
    old = {
        "flops": 1e11,
        "mem_bandwidth": 1e10,
        "link": {"latency_s": 1e-5, "bandwidth": 5e9},
        "collective_overhead_s": 2e-5,
        "source": "calibrated long ago",
    }
    p = MachineProfile.from_json(json.loads(json.dumps(old)))
    assert (p.matmul_table, p.cores, p.dispatch_s, p.concurrent_dispatch_s, p.shared_mem_bandwidth) == (
        {},
        None,
        0.0,
        0.0,
        0.0,
    )
    assert p.matmul_rate(np.float32, 16**3) == 1e11
    assert MachineProfile.from_json(json.loads(json.dumps(HERE.to_json()))) == HERE


def test_bad_tables_and_core_counts_are_refused():
    with pytest.raises(MeshError, match="unknown size class 'tiny'"):
        dataclasses.replace(DEFAULT, matmul_table={"float32": {"tiny": 1e9}})
    with pytest.raises(MeshError, match="unknown dtype 'int8'"):
        dataclasses.replace(DEFAULT, matmul_table={"int8": {"small": 1e9}})
    with pytest.raises(MeshError, match="cores must be an integer >= 1"):
        dataclasses.replace(DEFAULT, cores=0)
    with pytest.raises(MeshError, match="dispatch_s must be a finite number"):
        dataclasses.replace(DEFAULT, dispatch_s=-1.0)


# --- 3. devices running at once ------------------------------------------------------------------


def test_op_overhead_grows_with_the_devices_running_at_once():
    assert HERE.op_overhead(1) == 2e-6
    assert HERE.op_overhead(2) == pytest.approx(10e-6)
    assert HERE.op_overhead(4) == pytest.approx(50e-6)  # twice the cores: the oversubscribed measurement
    assert HERE.op_overhead(3) == pytest.approx(30e-6)  # between
    assert HERE.op_overhead(6) == pytest.approx(90e-6)  # on along that line
    shared = dataclasses.replace(HERE, mem_bandwidth=10e9, shared_mem_bandwidth=12e9)
    assert shared.concurrent_bandwidth(1) == 10e9
    assert shared.concurrent_bandwidth(2) == pytest.approx(6e9)  # two cores copying share 12 GB/s
    assert shared.concurrent_bandwidth(4) == pytest.approx(3e9)  # and four threads share the two cores


def test_every_op_a_device_program_runs_pays_the_overhead_once():
    b = GraphBuilder("chain")
    x = b.input(TensorType((64, 64), F32))
    w = b.input(TensorType((64, 64), F32))
    y = b.op("matmul", x, w)
    z = b.op("exp", b.op("mul", y, y))  # mul and exp fuse into one kernel: the mul is no op of its own
    graph = b.build([b.op("matmul", z, w)])
    plain = build_problem(
        graph, Mesh("dp=2", profile=dataclasses.replace(HERE, dispatch_s=0.0, concurrent_dispatch_s=0.0))
    )
    priced = build_problem(graph, Mesh("dp=2", profile=HERE))
    extra = {}
    for a, c in zip(plain.items, priced.items):
        if a.kind == "node":
            extra[a.node.op.name] = extra.get(a.node.op.name, []) + [
                c.strategies[0].compute_s - a.strategies[0].compute_s
            ]
    assert extra["matmul"] == [pytest.approx(10e-6)] * 2
    assert extra["mul"] == [pytest.approx(0.0)]
    assert extra["exp"] == [pytest.approx(10e-6)]


def test_oversubscription_also_slows_collectives():
    (params, x, labels), kw = mlp.example_train_args(batch=64, sizes=(64, 64, 8))
    import graphc

    times = {}
    for name, profile in (("own cores", DEFAULT), ("2 cores", dataclasses.replace(DEFAULT, cores=2))):
        pf = graphc.parallelize(
            mlp.train_step, mesh=Mesh("dp=4", profile=profile), static_argnames=("lr",), cache=False
        )
        times[name] = pf.plan(params, x, labels, **kw).cost.comm_s
    assert times["2 cores"] > times["own cores"]


# --- 4. memory as the runtime holds it -------------------------------------------------------------


def test_views_hold_no_memory_of_their_own():
    b = GraphBuilder("views")
    x = b.input(TensorType((32, 64), F32))
    y = b.op("exp", x)
    t = b.op("transpose", y, perm=(1, 0))  # a view of y
    r = b.op("reshape", t, shape=(2048,))  # of a strided view: numpy copies
    s = b.op("reshape", y, shape=(64, 32))  # a view of y
    out = b.op(
        "add", b.op("reduce_sum", r, axes=(0,), keepdims=False), b.op("reduce_sum", s, axes=(0, 1), keepdims=False)
    )
    graph = b.build([out])
    roots = view_roots(graph)
    assert roots == {t: y, s: y}
    problem = build_problem(graph, Mesh("dp=1", profile=DEFAULT))
    ranges = {v: (a, z) for v, _i, a, z in problem.memory.live_ranges()}
    assert t not in ranges and s not in ranges and r in ranges
    pos = {item: p for p, item in enumerate(problem.order)}
    s_reader = next(i for i, it in enumerate(problem.items) if it.kind == "node" and s in it.node.inputs)
    assert ranges[y][1] >= pos[s_reader]  # y lives while its view s is read


def test_redistribution_buffers_are_counted_in_what_the_runtime_holds():
    import graphc

    def plan_on(mesh: str, batch: int):
        (params, x, labels), kw = mlp.example_train_args(batch=batch, sizes=(64, 64, 8))
        pf = graphc.parallelize(mlp.train_step, mesh=Mesh(mesh, profile=DEFAULT), static_argnames=("lr",), cache=False)
        return pf.plan(params, x, labels, **kw)

    # a batch of 256: at 64 the loss's all-reduce, priced alone, makes replicating the step cheaper
    plan = plan_on("dp=2", 256)
    assert any(c.kind == "all_reduce" for c in plan.collectives)
    # a reduced gradient is its fan-out's value, counted once (in the values): data parallelism
    # redistributes nothing else (it counted twice, 19% over the measured peak of gpt on dp=2,tp=2)
    assert plan.memory.held[0] == plan.memory.peak_bytes[0]
    assert json.loads(plan.to_json())["memory"]["held_bytes"] == list(plan.memory.held)
    # a tensor-parallel plan's redistributions make buffers of their own, beside the values (this
    # plan's are not at its peak, in the update)
    (params, x, labels), kw = mlp.example_train_args(batch=64, sizes=(256, 256, 256))
    graph = optimize_for_planning(graphc.trace(mlp.train_step, params, x, labels, **kw))
    problem = build_problem(graph, Mesh("tp=2", profile=DEFAULT), ties=state_ties(graph))
    choice = solve_problem(problem).choice
    assert [nb for nb, _a, _b in problem.memory.redistribution_buffers(choice) if nb > 0]
    assert problem.memory.held_peak(choice) >= problem.memory.peak(choice)[0]


def test_the_buffer_pool_never_holds_more_than_the_liveness_peak():
    import graphc

    def f(x, w):  # fused kernels between matmuls, 1 MiB values
        h = np.tanh(x) * 2.0  # its operand is an input: its result comes from the pool
        g = np.exp(h @ w * 0.1) + 1.0  # written over the product, which dies here
        return (g @ w) * 0.5 + 1.0

    x = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32) * 0.01
    w = np.random.default_rng(1).standard_normal((512, 512)).astype(np.float32) * 0.01
    compiled = graphc.jit(f).compile(x, w)
    ex = compiled.executable
    for _ in range(3):
        compiled(x, w)
        assert ex.pool.reused + ex.pool.allocated > 0
        assert ex.pool.free_bytes <= ex.program.high_water
    prof: dict = {}
    ex.run_flat([x, w], prof)
    # inputs + the live values + what the pool holds, never above inputs + the liveness peak
    assert prof["peak_bytes"] <= x.nbytes + w.nbytes + ex.program.high_water


def test_buffer_pool_trim_drops_largest_first():
    pool = BufferPool()
    big, small = pool.get((1024,), F32), pool.get((16,), F32)
    pool.give_back(big)
    pool.give_back(small)
    assert pool.free_bytes == 1024 * 4 + 16 * 4
    pool.trim(100)
    assert pool.free_bytes == 64 and pool.dropped == 1
    del big, small


# --- calibration -------------------------------------------------------------------------------


def test_calibration_measures_the_table_cores_and_overheads():
    p = calibrate(quick=True)
    assert p.cores is not None and p.cores >= 1
    for dtype in ("float32", "float64"):
        assert set(p.matmul_table[dtype]) == {
            "small",
            "small batched",
            "medium",
            "medium batched",
            "large",
            "large batched",
        }
        assert all(math.isfinite(r) and r > 0 for r in p.matmul_table[dtype].values())
    assert p.matmul_table["float32"]["large"] == p.flops
    assert p.dispatch_s > 0 and p.concurrent_dispatch_s > 0 and p.oversubscribed_dispatch_s > 0
    assert p.shared_mem_bandwidth >= p.mem_bandwidth
    assert "cores the devices share" in p.describe()
