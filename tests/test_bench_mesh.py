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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


@pytest.mark.slow
def test_cli_bench_mesh_with_plans():
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "graphc.cli",
            "bench",
            "models/mlp.py:train_step",
            "--example",
            "example_train_args",
            "--mesh",
            "dp=2",
            "--repeat",
            "1",
            "--plans",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "state sharded" in out and "equals graphc's interpreter: yes" in out
    assert "busbw" in out and "Spearman rank correlation" in out and "no plan" not in out
