"""``graphc compile`` on a GPU profile under a limit only offloading meets (docs/remat.md, "In the
fixed-mesh planner"): the plan is written with its offload marked and explained, and ``graphc run
--plan`` refuses it with exit 2 and no traceback."""

import json

import pytest

from tests.cli.test_cli import run

MODEL = ["models/gpt3.py:train_step", "--example", "example_train_args", "--mesh", "dp=2"]
PLANNING = ["--profile", "h100-sxm", "--zero", "0", "--recompute", "off", "--no-cache"]


@pytest.mark.slow  # three CLI processes, each tracing and planning
def test_compile_writes_an_offloading_plan_and_run_refuses_it(tmp_path):
    free = tmp_path / "free.json"
    res = run("compile", *MODEL, *PLANNING, "-o", str(free), "--quiet")
    assert res.returncode == 0, res.stderr
    peak = json.loads(free.read_text())["memory"]["peak_bytes"][0]
    plan = tmp_path / "plan.json"
    limit = str(int(0.8 * peak))
    name = "%opt_state.m.blocks.0.fc.w"
    res = run("compile", *MODEL, *PLANNING, "--memory", limit, "-o", str(plan), "--explain", name)
    assert res.returncode == 0, res.stderr
    doc = json.loads(plan.read_text())
    assert doc["offload"]["reason"] == "fit" and doc["offload"]["values"]
    assert "offloaded to host memory" in res.stdout and "over the limit" in res.stdout
    assert ("in host memory (offloaded)" in res.stdout) == (name.lstrip("%") in doc["offload"]["values"])
    res = run("run", "models/gpt3.py:train_step", "--example", "example_train_args", "--plan", str(plan))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "host memory" in res.stderr and "not a plan to run" in res.stderr
