"""The mesh benchmark's pieces: rank correlation, plan variants, and the CLI end to end."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest

from graphc.bench.mesh import bench_plans, spearman
from graphc.models import mlp

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    # ties get average ranks: x ranks (0.5, 0.5, 2), y ranks (0, 1, 2)
    a, b = np.array([0.5, 0.5, 2]) - 1, np.array([0, 1, 2.0]) - 1
    assert math.isclose(spearman([1, 1, 5], [1, 2, 3]), (a @ b) / math.sqrt((a @ a) * (b @ b)))
    assert math.isnan(spearman([1], [2]))
    assert math.isnan(spearman([1, 1], [2, 3]))


@pytest.mark.slow
def test_plan_variants_run_and_the_solver_choice_is_cheapest():
    (params, x, labels), kw = mlp.example_train_args(batch=256, sizes=(256, 256, 16))  # big enough to split
    rows = bench_plans(mlp.train_step, (params, x, labels), kw, ("lr",), {"dp": 2}, repeat=1)
    assert [r.get("error") for r in rows] == [None] * len(rows)
    assert len(rows) == 5 and all(r["measured"] > 0 for r in rows)
    best = rows[0]["predicted"]
    # the ILP's optimum is no worse than any plan it finds under extra pins
    assert all(best <= r["predicted"] * (1 + 1e-6) for r in rows)
    assert rows[-1]["predicted"] > best  # every node replicated does not split the compute


def _bench_mlp_train_step(mesh: str, *flags: str) -> subprocess.CompletedProcess:
    """``graphc bench models/mlp.py:train_step --mesh MESH --repeat 1 FLAGS`` from the repository root."""
    argv = ["bench", "models/mlp.py:train_step", "--example", "example_train_args", "--mesh", mesh, "--repeat", "1"]
    return subprocess.run(
        [sys.executable, "-m", "graphc.cli", *argv, *flags], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_cli_bench_mesh_with_plans():
    res = _bench_mlp_train_step("dp=2", "--plans")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "state sharded" in out and "equals graphc's interpreter: yes" in out
    assert "busbw" in out and "Spearman rank correlation" in out and "no plan" not in out


def test_the_mesh_profile_splits_each_device_program_by_kind_and_profiles_the_ceiling():
    """A data-parallel plan: each device's steps by kind fit in its program's span, the span in
    the call, the devices all-reduce and the ceiling's threads (single-device programs) do not; a
    plan that is not data parallel on one axis has no ceiling."""
    import graphc
    from graphc.api.parallel import parallelize
    from graphc.bench.mesh import KINDS, ceiling_inputs, profile_mesh
    from graphc.interpreter import bind_arguments

    (params, x, labels), kw = mlp.example_loss_args(batch=256, sizes=(256, 256, 16))  # big enough to split
    pf = parallelize(mlp.loss, mesh="dp=2", cache=False)
    compiled = pf.compile(params, x, labels)
    assert [s[0].is_split for s in compiled.program.in_specs] == [False] * 4 + [True] * 2  # data parallel
    arrays = bind_arguments(compiled.graph, (params, x, labels), {})
    prof = profile_mesh(mlp.loss, compiled, arrays, (), {}, repeat=2)
    assert sorted(prof["devices"]) == [0, 1] and sorted(prof["threads"]) == [0, 1]
    for runs, collective in ((prof["devices"], True), (prof["threads"], False)):
        for r in runs.values():
            assert sum(r[k] for k in KINDS) <= r["span"] * (1 + 1e-9) + 1e-9
            assert r["matmul"] > 0 and (r["collective"] > 0) == collective
    assert all(r["span"] <= prof["call"] for r in prof["devices"].values())
    # each device's pieces are half the batch: the ceiling's calls give the device's own loss
    calls = ceiling_inputs(compiled, arrays, {})
    assert calls is not None and [c[0][1].shape for c in calls] == [(128, 256), (128, 256)]
    halves = [graphc.evaluate(graphc.trace(mlp.loss, *args), *args) for args, _ in calls]
    # (float32 means of 128 and 256 terms: each within 256 float32 ulps of the exact mean)
    assert np.isclose(np.mean(halves), mlp.loss(params, x, labels), rtol=256 * 2.0**-23)
    two_axes = parallelize(mlp.loss, mesh="dp=2,tp=2", cache=False).compile(params, x, labels)
    assert ceiling_inputs(two_axes, bind_arguments(two_axes.graph, (params, x, labels), {}), {}) is None
    # the training step's plan splits the first weight on its rows too (784 of them, the batch 64): not a ceiling
    (p2, x2, l2), kw2 = mlp.example_train_args()
    step = parallelize(mlp.train_step, mesh="dp=2", static_argnames=("lr",), cache=False).compile(p2, x2, l2, **kw2)
    if any(p.is_split for p in step.program.in_specs[0]):
        assert ceiling_inputs(step, bind_arguments(step.graph, (p2, x2, l2), {}), kw2) is None
    (small, xs, ls), _ = mlp.example_loss_args(batch=64, sizes=(32, 64, 8))  # too small to split: replicated
    replicated = parallelize(mlp.loss, mesh="dp=2", cache=False).compile(small, xs, ls)
    assert not any(p.is_split for spec in replicated.program.in_specs for p in spec)
    assert ceiling_inputs(replicated, bind_arguments(replicated.graph, (small, xs, ls), {}), {}) is None


@pytest.mark.slow
def test_cli_bench_on_a_pipeline_mesh():
    """A pp mesh: no state loop and no per-device profile (a pipeline runs tasks, not one program
    per device), the pipeline plan's own predicted step."""
    res = _bench_mlp_train_step("pp=2")
    assert res.returncode == 0, res.stderr
    assert "predicted step (plan)" in res.stdout and "equals graphc's interpreter: yes" in res.stdout
    assert "where a call on the mesh spends its time" not in res.stdout
