"""One options object (passes/options.py): ``graphc.parallelize``'s keywords and ``graphc compile``'s
flags build the same ``PlanOptions``; its JSON is derived from its fields and read back checked; old
spellings warn and old plan files load; the pipeline planner and the mesh search plan with it."""

import dataclasses
import inspect
import json
import os

import numpy as np
import pytest

import graphc
from graphc.api.parallel import RunOptions
from graphc.cli.common import plan_options
from graphc.cli.main import build_parser
from graphc.core.errors import GraphcError, PlanError
from graphc.models import mlp
from graphc.passes.options import RECOMPUTE_MODES, SCHEDULES, SOLVERS, ZERO_CHOICES, PlanOptions
from graphc.passes.partition import lower
from graphc.passes.pipeline import PipelinePlan
from graphc.passes.sharding.plan import ShardingPlan
from tests.helpers import graphc_cli as call

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TARGET = ["models/mlp.py:train_step", "--example", "example_train_args"]
EVERY_FLAG = [
    "--memory",
    "2GiB",
    "--time-limit",
    "30",
    "--zero",
    "0",  # a forced stage (1-3) with micro-batches is an error: micro-batched steps do not use ZeRO
    "--recompute",
    "off",
    "--microbatches",
    "4",
    "--schedule",
    "gpipe",
    "--no-shrink",
    "--free-axes",
    "--solver",
    "CBC",
    "--bucket",
    "1MiB",
    "--no-linear-partials",
]


def double(x):
    return 2 * x


def compile_args(*flags: str):
    return build_parser().parse_args(["compile", "model.py:f", "--mesh", "dp=2", *flags])


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("GRAPHC_PROFILE", str(tmp_path / "no_profile.json"))
    monkeypatch.chdir(ROOT)
    return tmp_path


# --- one object, built alike by the API and the CLI ---------------------------------------------------


def test_the_cli_flags_and_the_api_keywords_build_the_same_options():
    api = graphc.parallelize(
        double,
        mesh="dp=2",
        memory_limit="2GiB",
        time_limit=30,
        zero=0,
        recompute="off",
        microbatches=4,
        schedule="gpipe",
        shrink=False,
        free_axes=True,
        solver="CBC",
        bucket_bytes="1MiB",
        linear_partials=False,
    )
    want = PlanOptions(
        memory_limit=2 * 2**30,
        time_limit=30.0,
        zero=0,
        recompute="off",
        microbatches=4,
        schedule="gpipe",
        shrink=False,
        free_axes=True,
        solver="CBC",
        bucket_bytes=2**20,
        linear_partials=False,
    )
    assert api.options == plan_options(compile_args(*EVERY_FLAG)) == want
    # and the defaults are the object's own, everywhere
    assert graphc.parallelize(double, mesh="dp=2").options == plan_options(compile_args()) == PlanOptions()
    assert graphc.parallelize(double, mesh="dp=2").run_options == RunOptions()


def test_every_option_is_a_keyword_of_parallelize_and_a_flag_of_compile_and_run():
    names = {f.name for f in dataclasses.fields(PlanOptions)}
    assert names <= set(inspect.signature(graphc.parallelize).parameters)
    for command in ("compile", "run"):  # every flag's dest is in the namespace, given or not
        assert names <= set(vars(build_parser().parse_args([command, "model.py:f", "--mesh", "dp=2"]))), command
    assert plan_options(compile_args("--bucket", "0")).bucket_bytes == 0
    assert graphc.parallelize(double, mesh="dp=2", bucket_bytes=0).options.bucket_bytes == 0


@pytest.mark.parametrize(
    "flag,values",
    [("--zero", ZERO_CHOICES), ("--recompute", RECOMPUTE_MODES), ("--schedule", SCHEDULES), ("--solver", SOLVERS)],
)
def test_the_flags_take_the_options_values_and_nothing_else(flag, values, capsys):
    option = flag[2:]
    for value in values:
        assert getattr(compile_args(flag, str(value)), option) == value
        assert getattr(plan_options(compile_args(flag, str(value))), option) == value
    with pytest.raises(SystemExit) as info:
        compile_args(flag, "4")
    assert info.value.code == 2 and f"argument {flag}: invalid choice" in capsys.readouterr().err


def test_bad_values_are_plan_errors_naming_the_option():
    for keywords, match in [
        ({"zero": 4}, "zero must be one of 'auto', 0, 1, 2, 3"),
        ({"zero": "3"}, "zero must be one of"),
        ({"recompute": "sometimes"}, "recompute must be one of 'auto', 'on', 'off', got 'sometimes'"),
        ({"schedule": "zigzag"}, "schedule must be one of '1f1b', 'gpipe', got 'zigzag'"),
        ({"microbatches": 0}, "microbatches must be a positive int, got 0"),
        ({"time_limit": float("nan")}, "time_limit must be a positive number of seconds"),
        ({"shrink": 1}, "shrink must be True or False, got 1"),
    ]:
        with pytest.raises(PlanError, match=match):
            graphc.parallelize(double, mesh="dp=2", **keywords)
    with pytest.raises(GraphcError, match="bad memory_limit 'lots'"):
        graphc.parallelize(double, mesh="dp=2", memory_limit="lots")
    with pytest.raises(PlanError, match="bucket_bytes must be a number of bytes >= 0"):
        PlanOptions(bucket_bytes=-1)
    with pytest.raises(GraphcError, match="bucket_bytes must be non-negative, got -1"):
        graphc.parallelize(double, mesh="dp=2", bucket_bytes=-1)
    with pytest.raises(GraphcError, match="bad bucket_bytes 'lots'"):
        graphc.parallelize(double, mesh="dp=2", bucket_bytes="lots")
    with pytest.raises(GraphcError, match="memory_limit must be positive \\(at least 1 byte\\), got .0B."):
        graphc.parallelize(double, mesh="dp=2", memory_limit="0B")


@pytest.mark.parametrize(
    "value, match",
    [
        (-1, "memory_limit must be positive \\(at least 1 byte\\), got -1"),
        (0, "memory_limit must be positive \\(at least 1 byte\\), got 0"),
        (0.5, "memory_limit must be positive \\(at least 1 byte\\), got 0.5"),  # under a byte
        (np.int64(-3), "memory_limit must be positive \\(at least 1 byte\\), got -3"),
        ("-1GiB", "memory_limit must be positive \\(at least 1 byte\\), got '-1GiB'"),
        ("abc", "bad memory_limit 'abc': expected a number of bytes or e.g. 2GiB"),
        ("1.5XB", "bad memory_limit '1.5XB': expected a number of bytes or e.g. 2GiB"),
        (
            float("nan"),
            "bad memory_limit nan: expected a positive number of bytes under 2\\*\\*63",
        ),  # was numpy's ValueError
        (float("inf"), "bad memory_limit inf: expected a positive number of bytes"),
        ("1e-3", "memory_limit must be positive \\(at least 1 byte\\), got '1e-3'"),  # under a byte
        (10**30, "bad memory_limit 10+: expected a positive number of bytes under"),
        (True, "bad memory_limit True"),
    ],
)
def test_a_bad_memory_limit_is_an_error_naming_the_keyword(value, match):
    with pytest.raises(GraphcError, match=match):
        graphc.parallelize(double, mesh="dp=2", memory_limit=value)


def test_a_memory_limit_is_bytes_or_a_size_with_a_unit():
    for value, want in [
        (2e9, 2_000_000_000),
        ("1e9", 1_000_000_000),
        ("1.5GiB", 3 * 2**29),
        ("+2 KiB", 2048),
        (np.int64(4096), 4096),
    ]:
        assert graphc.parallelize(double, mesh="dp=2", memory_limit=value).options.memory_limit == want


def test_a_bucket_of_zero_bytes_is_no_buckets_however_it_is_written():
    for zero in (0, "0", "0B", "0MiB", 0.0):
        assert graphc.parallelize(double, mesh="dp=2", bucket_bytes=zero).options.bucket_bytes == 0
    assert graphc.parallelize(double, mesh="dp=2", bucket_bytes="1KiB").options.bucket_bytes == 1024
    with pytest.raises(GraphcError, match="backend must be one of 'threads', 'mpi'"):
        graphc.parallelize(double, mesh="dp=2", backend="gpu")


def test_the_old_spellings_warn_at_the_users_line_and_mean_the_new_ones():
    for name, old, new in [("recompute", True, "on"), ("recompute", False, "off"), ("zero", None, "auto")]:
        with pytest.warns(DeprecationWarning, match=f"{name}={old!r} is deprecated: write {name}={new!r}") as got:
            pf = graphc.parallelize(double, mesh="dp=2", **{name: old})
        assert got[0].filename == __file__
        assert getattr(pf.options, name) == new
    with pytest.raises(PlanError, match="recompute must be one of"):  # the object itself takes only the new ones
        PlanOptions(recompute=True)


# --- JSON --------------------------------------------------------------------------------------------


def test_the_json_is_every_field_and_reads_back_equal():
    options = PlanOptions(memory_limit=123, zero=2, recompute="on", microbatches=3, bucket_bytes=0, solver="CBC")
    doc = options.to_json()
    assert list(doc) == [f.name for f in dataclasses.fields(PlanOptions)]
    assert PlanOptions.from_json(json.loads(json.dumps(doc))) == options


def test_a_plan_files_options_are_checked_by_name():
    with pytest.raises(PlanError, match=r"p.json: options has an unknown option 'recompute_all'"):
        PlanOptions.from_json({"recompute_all": True}, "p.json")
    with pytest.raises(PlanError, match=r"p.json: options.memory_limit must be a positive number of bytes"):
        PlanOptions.from_json({"memory_limit": "2GiB"}, "p.json")
    with pytest.raises(PlanError, match=r"p.json: options must be a JSON object"):
        PlanOptions.from_json([1, 2], "p.json")


def test_old_plan_files_options_load_with_the_values_they_were_planned_with():
    # written before ZeRO, recomputation, micro-batches and gradient buckets existed
    oldest = {"memory_limit": None, "time_limit_s": 5.0, "solver": "highs", "shrink": True, "linear_partials": True}
    got = PlanOptions.from_json(oldest)
    assert (got.time_limit, got.zero, got.recompute, got.bucket_bytes, got.free_axes) == (5.0, 0, "off", 0, False)
    # written by the planner whose API spelled zero None and recompute True
    newer = {**oldest, "free_axes": False, "bucket_bytes": 1 << 20, "zero": None, "recompute": True}
    got = PlanOptions.from_json(newer)
    assert (got.zero, got.recompute, got.bucket_bytes) == ("auto", "on", 1 << 20)


def test_an_old_sharding_plan_file_loads_and_lowers_without_buckets(env):
    args, kwargs = mlp.example_train_args()
    pf = graphc.parallelize(mlp.train_step, mesh="dp=2", static_argnames=tuple(kwargs), cache=False, zero=0)
    plan, graph = pf.plan_and_graph(*args, **kwargs)
    doc = json.loads(plan.to_json())
    doc["options"] = {"memory_limit": None, "time_limit_s": 60.0, "solver": "highs", "shrink": True}
    old = ShardingPlan.from_json(json.dumps(doc), "old.json")
    assert old.options.bucket_bytes == 0 and plan.options.bucket_bytes > 0
    assert old.options.time_limit == 60.0 and old.options.zero == 0

    def all_reduces(p):
        return sum(n.op.name == "all_reduce" for n in lower(graph, p).devices[0].graph.nodes)

    assert all_reduces(old) > all_reduces(plan) >= 1  # the old file's gradients are reduced one by one


# --- the planners read it ------------------------------------------------------------------------------


def test_a_pipeline_plan_records_its_options_and_an_old_one_loads():
    args, kwargs = mlp.example_train_args()
    pf = graphc.parallelize(
        mlp.train_step, mesh="pp=2", microbatches=2, schedule="gpipe", static_argnames=tuple(kwargs), cache=False
    )
    plan = pf.plan(*args, **kwargs)
    assert (plan.m, plan.schedule) == (2, "gpipe") and plan.options == pf.options
    doc = json.loads(plan.to_json())
    assert doc["options"] == pf.options.to_json() and "microbatches" not in doc
    assert PipelinePlan.from_json(plan.to_json()).options == pf.options
    del doc["options"]  # as written before the options were: its micro-batches and schedule at the top
    old = PipelinePlan.from_json(json.dumps({**doc, "microbatches": 2, "schedule": "gpipe"}))
    assert (old.m, old.schedule, old.options.zero, old.options.recompute) == (2, "gpipe", 0, "off")


def test_what_a_pipeline_cannot_do_is_an_error_not_ignored():
    with pytest.raises(PlanError, match="zero=3: pipeline stages do not shard their state with ZeRO"):
        graphc.parallelize(double, mesh="pp=2,dp=2", zero=3)
    with pytest.raises(PlanError, match="recompute='on': pipelines do not recompute"):
        graphc.parallelize(double, mesh="pp=2", recompute="on")


def test_the_mesh_search_plans_with_the_commands_options(env):
    out = env / "plan.json"
    code, text, err = call("compile", *TARGET, "--devices", "2", "--zero", "3", "--quiet", "--no-cache", "-o", str(out))
    assert code == 0, err
    doc = json.loads(out.read_text())
    assert doc["options"]["zero"] == 3
    assert 3 in {d["zero"] for d in doc["inputs"] if d["name"].startswith("%params")}
    pipelines = [c for c in doc["search"]["candidates"] if "pp" in c["mesh"] and c["skipped"] is None]
    assert pipelines and all("pipeline stages do not shard their state with ZeRO" in c["error"] for c in pipelines)
