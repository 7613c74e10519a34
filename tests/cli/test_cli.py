"""The graphc command line."""

import os
import subprocess
import sys

import pytest

import graphc
from tests.helpers import cache_of_its_own

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def run(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", "graphc.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_ir_prints_parseable_ir():
    res = run("ir", "models/mlp.py:mlp")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("graph @mlp(")
    assert 'loc("models/mlp.py":' in res.stdout
    assert str(graphc.parse(res.stdout)) == res.stdout


def test_ir_with_named_example_and_output_file(tmp_path):
    out = tmp_path / "loss.gir"
    res = run("ir", "models/gpt.py:lm_loss", "--example", "example_loss_args", "-o", str(out))
    assert res.returncode == 0, res.stderr
    text = out.read_text()
    assert text.startswith("graph @lm_loss(")
    again = run("ir", str(out))
    assert again.returncode == 0, again.stderr
    assert again.stdout == text
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


@pytest.mark.parametrize(
    "args, message",
    [
        (["ir", "models/mlp.py:nope"], "models/mlp.py: no function 'nope' (functions: accuracy,"),
        (["ir", "models/missing.py:f"], "models/missing.py: no such file"),
        (["ir", "models/mlp.py"], "expected FILE:FUNC"),
        (["ir", "models/mlp.py:mlp", "--example", "nothing"], "no function 'nothing' giving example arguments"),
    ],
)
def test_usage_errors_exit_2_with_a_message(args, message):
    res = run(*args)
    assert res.returncode == 2
    assert res.stdout == ""
    assert message in res.stderr


def test_malformed_gir_file_reports_file_line_and_column(tmp_path):
    bad = tmp_path / "bad.gir"
    bad.write_text("graph @g(%x : f32[2]) {\n  %0 = add(%x, %q) : f32[2]\n  return %0\n}\n")
    res = run("ir", str(bad))
    assert res.returncode == 2
    assert f"{bad}: line 2, column 16: value %q is used before it is defined" in res.stderr


def test_trace_error_in_user_file_is_reported(tmp_path):
    user = tmp_path / "user_model.py"
    user.write_text(
        "import numpy as np\ndef f(x):\n    return np.fft.rfft(x)\ndef example_args():\n    return (np.ones(3),), {}\n"
    )
    res = run("ir", f"{user}:f")
    assert res.returncode == 2
    assert "user_model.py:3: numpy.fft.rfft is not supported by graphc" in res.stderr


@pytest.mark.slow
def test_bench_reports_timings():
    res = run("bench", "models/mlp.py:mlp", "--repeat", "2")
    assert res.returncode == 0, res.stderr
    for word in ("trace", "print IR", "parse IR", "numpy", "reference interp", "faster than numpy"):
        assert word in res.stdout


def test_a_baseline_is_named_for_what_it_ran():
    """A function called directly is "numpy" only when it ran as numpy: a training step calling
    graphc.value_and_grad traces and interprets itself on every call (issue 27)."""
    from graphc.bench.timing import direct_call
    from graphc.models import mlp

    (args, kwargs) = mlp.example_train_args()
    assert direct_call(mlp.mlp, (args[0], args[1]), {})[0] == "numpy"
    assert direct_call(mlp.train_step, args, kwargs)[0] == "graphc's interpreter"


# --- graphc compile -------------------------------------------------------------------------------


def _compile(tmp_path, *extra):
    env = dict(
        os.environ, GRAPHC_CACHE_DIR=cache_of_its_own(tmp_path / "cache"), GRAPHC_PROFILE=str(tmp_path / "none.json")
    )
    return subprocess.run(
        [sys.executable, "-m", "graphc.cli", "compile", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_compile_writes_a_plan_and_recompiling_is_cached(tmp_path):
    out = tmp_path / "plan.json"
    args = ("models/mlp.py:train_step", "--example", "example_train_args", "--mesh", "dp=4", "-o", str(out))
    res = _compile(tmp_path, *args)
    assert res.returncode == 0, res.stderr
    assert "plan for @train_step on mesh (dp=4)" in res.stdout and "predicted step" in res.stdout
    assert "ILP" in res.stderr  # progress
    plan = graphc.Plan.load(str(out))
    assert plan.mesh.axis_names == ("dp",) and plan.mesh.shape == (4,)
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".graphc-")]  # no temporary left behind
    again = _compile(tmp_path, *args)
    assert again.returncode == 0 and "(cached)" in again.stderr


@pytest.mark.parametrize(
    "extra,message",
    [
        (("models/mlp.py:train_step", "--example", "example_train_args", "--mesh", "dp=4,tp"), "expected NAME=SIZE"),
        (("models/mlp.py:train_step", "--example", "example_train_args", "--mesh", "dp=0"), "dp"),
        (("models/mlp.py:no_such_fn", "--mesh", "dp=2"), "no_such_fn"),
        (
            ("models/mlp.py:train_step", "--example", "example_train_args", "--mesh", "dp=2", "--link", "dp=fast"),
            "dp=fast",
        ),
        (
            ("models/mlp.py:train_step", "--example", "example_train_args", "--mesh", "dp=2", "--memory", "1KiB"),
            "smallest per-device memory",
        ),
    ],
)
def test_compile_errors_exit_2_with_a_message_and_no_plan(tmp_path, extra, message):
    out = tmp_path / "plan.json"
    res = _compile(tmp_path, *extra, "-o", str(out))
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert message in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    assert not out.exists()


@pytest.mark.slow
def test_run_on_a_mesh_checks_numpy_and_writes_a_chrome_trace(tmp_path):
    import json

    trace = tmp_path / "timeline.json"
    env = dict(
        os.environ, GRAPHC_CACHE_DIR=cache_of_its_own(tmp_path / "cache"), GRAPHC_PROFILE=str(tmp_path / "none.json")
    )
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "graphc.cli",
            "run",
            "models/mlp.py:train_step",
            "--example",
            "example_train_args",
            "--mesh",
            "dp=2",
            "--repeat",
            "1",
            "--trace",
            str(trace),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert "equals graphc's interpreter: yes" in res.stdout and "peak memory" in res.stdout
    # the time in collectives, and of it the waiting for the last member (threads tell it apart)
    assert "in collectives  of it waiting" in res.stdout
    lines = res.stdout.splitlines()
    head = next(k for k, ln in enumerate(lines) if "of it waiting" in ln)
    rows = [ln.split() for ln in lines[head + 1 : head + 3]]
    assert len(rows) == 2 and all(r[-1] in ("s", "ms", "us") for r in rows), res.stdout
    doc = json.loads(trace.read_text())
    tracks = {e["tid"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert tracks == {0, 1}


@pytest.mark.slow
def test_compile_resolves_around_the_pins_of_a_hand_edited_plan_and_run_runs_it(tmp_path):
    import json

    env = dict(
        os.environ, GRAPHC_CACHE_DIR=cache_of_its_own(tmp_path / "cache"), GRAPHC_PROFILE=str(tmp_path / "none.json")
    )
    target = ("models/mlp.py:train_step", "--example", "example_train_args")
    plan_file, resolved = tmp_path / "plan.json", tmp_path / "resolved.json"
    res = _compile(tmp_path, *target, "--mesh", "dp=2", "-o", str(plan_file))
    assert res.returncode == 0, res.stderr
    doc = json.loads(plan_file.read_text())
    node = next(n for n in doc["nodes"] if n["op"] == "matmul" and n["alternatives"])
    node["strategy"], node["pinned"] = node["alternatives"][0]["strategy"], True
    plan_file.write_text(json.dumps(doc))
    res = _compile(tmp_path, *target, "--mesh", "dp=2", "--resolve-pins", str(plan_file), "-o", str(resolved))
    assert res.returncode == 0, res.stderr
    assert "re-solving around 1 pin(s)" in res.stderr
    again = graphc.Plan.load(str(resolved))
    pinned = next(n for n in again.nodes if n.index == node["index"])
    assert pinned.pinned and pinned.strategy == node["strategy"]
    res = subprocess.run(
        [sys.executable, "-m", "graphc.cli", "run", *target, "--plan", str(resolved), "--repeat", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert "on mesh dp=2" in res.stdout and "run as written" in res.stdout
    assert "equals graphc's interpreter: yes" in res.stdout


REPLICATING_MODEL = """
from tests.passes.sharding.test_roles import _mlp_args, _sgd_step


def step(params, x, y):
    return _sgd_step(params, x, y)


def example_args():
    return _mlp_args(6, 8, 16, 4), {}  # a batch of 6: dp=4 splits no batch dim
"""


def test_warnings_reach_stderr_of_compile_and_run(tmp_path):
    """A typo'd axis name (dq for dp) and a data axis that only replicates the work are graphc
    warnings on stderr, one line each; compile lists the plan's warnings in its summary instead."""
    res = _compile(
        tmp_path,
        "models/mlp.py:train_step",
        "--example",
        "example_train_args",
        "--mesh",
        "dq=2",
        "-o",
        str(tmp_path / "p.json"),
    )
    assert res.returncode == 0, res.stderr
    assert "graphc: warning: mesh axis 'dq' has no role, so it may split any dim" in res.stderr
    assert "close to dp (data role)" in res.stderr and "MeshWarning" not in res.stderr
    model = tmp_path / "replicating.py"
    model.write_text(REPLICATING_MODEL)
    env = dict(
        os.environ,
        PYTHONPATH=ROOT,
        GRAPHC_CACHE_DIR=cache_of_its_own(tmp_path / "cache"),
        GRAPHC_PROFILE=str(tmp_path / "none.json"),
    )
    cmd = [sys.executable, "-m", "graphc.cli"]
    ran = subprocess.run(
        [*cmd, "run", f"{model}:step", "--mesh", "dp=4", "--repeat", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert ran.returncode == 0, ran.stderr
    assert "equals graphc's interpreter: yes" in ran.stdout  # a training step: it interprets itself
    warned = [line for line in ran.stderr.splitlines() if line.startswith("graphc: warning:")]
    assert len(warned) == 1 and "dp=4 (data role) splits only batch dims" in warned[0], ran.stderr
    assert "batch dims of size 6: it replicates the work" in warned[0]
    compiled = subprocess.run(
        [*cmd, "compile", f"{model}:step", "--mesh", "dp=4", "--quiet", "-o", str(tmp_path / "r.json")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert compiled.returncode == 0, compiled.stderr
    assert compiled.stdout.count("replicates the work") == 1 and "replicates the work" not in compiled.stderr


def test_compile_writes_a_deep_plan_without_alternatives_unless_asked_and_explains_them(tmp_path, monkeypatch):
    """A plan of more items than ALTERNATIVES_IN_FILE (lowered here, so the MLP is "deep") is
    written without its alternatives; --alternatives writes them; --explain prints them, and
    solves again when the plan cache kept a plan without them."""
    import json

    from graphc.passes.sharding import plan as plan_module
    from tests.helpers import graphc_cli

    monkeypatch.setattr(plan_module, "ALTERNATIVES_IN_FILE", 10)
    monkeypatch.setenv("GRAPHC_CACHE_DIR", cache_of_its_own(tmp_path / "cache"))
    monkeypatch.setenv("GRAPHC_PROFILE", str(tmp_path / "none.json"))
    monkeypatch.chdir(ROOT)
    target = ("compile", "models/mlp.py:train_step", "--example", "example_train_args", "--mesh", "dp=2")
    out = tmp_path / "plan.json"
    code, _stdout, err = graphc_cli(*target, "-o", str(out))  # planned, and kept in the plan cache
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["alternatives_kept"] is False and not any("alternatives" in n for n in doc["nodes"])
    code, _stdout, err = graphc_cli(*target, "-o", str(out), "--alternatives")
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["alternatives_kept"] is True and any(n["alternatives"] for n in doc["nodes"])
    code, stdout, err = graphc_cli(*target, "-o", str(out), "--explain", "%params.layers.0.w")
    assert code == 0, err
    assert "solving again to price them" in err  # the cached plan was kept without them
    assert "\n  instead " in stdout and "not in this plan" not in stdout


@pytest.mark.parametrize(
    "where", [["--mesh", "pp=2", "--microbatches", "2"], ["--devices", "2"], ["--mesh", "dp=2", "--by-blocks"]]
)
def test_alternatives_is_refused_where_the_plan_written_has_none_of_its_own(where, tmp_path):
    from tests.helpers import graphc_cli

    code, _out, err = graphc_cli(
        "compile", f"{ROOT}/models/mlp.py:train_step", "--example", "example_train_args", *where, "--alternatives",
        "-o", str(tmp_path / "p.json"),
    )  # fmt: skip
    assert code == 2 and "--alternatives writes the alternatives of" in err, err
    assert not (tmp_path / "p.json").exists()
