"""Automatic mesh choice (passes/search.py) and the CLI's --devices / pipeline compile."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import graphc
from graphc.core.profile import Link, MachineProfile
from graphc.core.profiles import get_profile
from graphc.models import mlp
from graphc.passes import search
from graphc.passes.options import PlanOptions
from graphc.passes.partition import optimize_for_planning
from graphc.passes.search import AXES, TIME_UP, Candidate, _worth_more, explain, factorizations, search_meshes

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PROFILE = MachineProfile.default()


def graph_of(fn, args, kw):
    return optimize_for_planning(graphc.trace(fn, *args, **kw))


def test_factorizations():
    assert factorizations(1) == [{}]
    f8 = factorizations(8)
    assert len(f8) == 10 and all((s.get("pp", 1) * s.get("dp", 1) * s.get("tp", 1)) == 8 for s in f8)
    assert {"pp": 2, "dp": 2, "tp": 2} in f8 and {"dp": 8} in f8
    with pytest.raises(graphc.GraphcError):
        factorizations(0)


def test_slow_dp_link_flips_the_choice_to_a_pipeline():
    """Six equal layers on 2 devices: on a fast link data parallelism wins; as the dp link slows,
    its gradient all-reduce costs more than the pipeline's bubble and the choice flips."""
    args, kw = mlp.example_train_args(batch=256, sizes=(256,) * 6 + (16,))
    g = graph_of(mlp.train_step, args, kw)
    chosen = {}
    for bw in (6e9, 1e8):
        cands = search_meshes(g, 2, profile=PROFILE, axes=("pp", "dp"), links={"dp": Link(20e-6, bw)})
        chosen[bw] = cands[0].axes
        assert all(c.ok for c in cands)
    assert chosen[6e9] == {"dp": 2}
    assert chosen[1e8] == {"pp": 2}


def test_memory_limit_only_a_pipeline_meets():
    """Replicated weights do not fit one device; split into two stages they do."""
    args, kw = mlp.example_train_args(batch=16, sizes=(512, 512, 512, 8))
    g = graph_of(mlp.train_step, args, kw)
    weights = sum(v.type.nbytes for v in g.inputs[:6])
    # no ZeRO: dp=2 holds every weight, its gradient and the new one (2.5x); a stage of pp=2 holds
    # its half of them with its update's values and its activations (2.0x at any micro-batch count:
    # the update runs on its parameters' stage, one micro-batch or more)
    replicated = PlanOptions(memory_limit=int(weights * 2.2), zero=0)
    cands = search_meshes(g, 2, replicated, profile=PROFILE, axes=("pp", "dp"))
    best = cands[0]
    assert best.ok and "pp" in best.axes, [c.describe() for c in cands]
    dp = [c for c in cands if c.axes == {"dp": 2}]
    assert dp and not dp[0].ok


def test_meshes_whose_axes_have_other_roles_are_all_planned():
    """dp splits only batch dims and tp anything, so dp=8 and tp=8, or dp=2,tp=4 and dp=4,tp=2,
    are different problems: the search plans every one (it used to plan one of each pair)."""
    args, kw = mlp.example_train_args()
    g = graph_of(mlp.train_step, args, kw)
    cands = search_meshes(g, 8, profile=PROFILE, axes=("dp", "tp"))
    planned = sorted(tuple(sorted(c.axes.items())) for c in cands if c.plan is not None)
    assert planned == [(("dp", 2), ("tp", 4)), (("dp", 4), ("tp", 2)), (("dp", 8),), (("tp", 8),)]
    assert all(c.ok for c in cands)
    steps = {tuple(sorted(c.axes.items())): c.step_s for c in cands}
    assert steps[(("tp", 8),)] != steps[(("dp", 8),)]  # not one problem under two names


def test_the_search_says_what_it_considered_and_why_it_skipped_some():
    args, kw = mlp.example_train_args(batch=12, sizes=(32, 32, 8))
    g = graph_of(mlp.train_step, args, kw)
    cands = search_meshes(g, 4, profile=PROFILE, axes=("pp", "dp", "data"))  # dp and data: one role
    skipped = {(tuple(sorted(c.axes.items())), c.microbatches): c.skipped for c in cands if c.skipped}
    assert skipped[((("data", 4),), 1)] == "the same planning problem as dp=4"
    assert skipped[((("dp", 2), ("pp", 2)), 8)] == "indivisible: the batch of 12 does not split into 8 micro-batches"
    assert skipped[((("pp", 4),), 16)] == "indivisible: the batch of 12 does not split into 16 micro-batches"
    assert skipped[((("data", 2), ("pp", 2)), 1)] == "the same planning problem as pp=2,dp=2"
    assert all(c.skipped is None for c in cands if "data" not in c.axes and c.microbatches in (1, 2, 4))
    text = explain(cands)
    first = text.splitlines()[0]
    assert first.startswith("considered 6 mesh shapes (") and "data=4" in first and "pp=4" in first
    assert f"skipped {len(skipped)} (" in first and "indivisible micro-batch counts" in first
    verbose = explain(cands, verbose=True)
    for why in skipped.values():
        assert any(line.endswith(f"skipped ({why})") for line in verbose.splitlines()), why


def run_cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "graphc.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_cli_devices_search_writes_the_chosen_plan(tmp_path):
    res = run_cli(
        "compile",
        os.path.join(ROOT, "models/mlp.py") + ":train_step",
        "--example",
        "example_train_args",
        "--devices",
        "4",
        "--quiet",
        "-o",
        str(tmp_path / "plan.json"),
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert "searched" in res.stdout and "chose " in res.stdout and "why: " in res.stdout and "runner-up" in res.stdout
    assert "considered 6 mesh shapes (dp=2,tp=2; dp=4; pp=2,dp=2; pp=2,tp=2; pp=4; tp=4)" in res.stdout
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert doc["search"]["devices"] == 4 and len(doc["search"]["candidates"]) >= 5
    assert {"tp": 4} in [c["mesh"] for c in doc["search"]["candidates"]]
    # every plan of a search that plans each mesh whole is solved: none is a scaled estimate
    assert doc["search"]["estimates"] == 0 and all(c["estimate"] is None for c in doc["search"]["candidates"])


@pytest.mark.slow
def test_cli_compile_pipeline_plan(tmp_path):
    res = run_cli(
        "compile",
        os.path.join(ROOT, "models/gpt.py") + ":train_step",
        "--example",
        "example_train_args",
        "--mesh",
        "pp=2,dp=2",
        "--microbatches",
        "2",
        "--quiet",
        "--dump-ir",
        str(tmp_path / "ir"),
        "-o",
        str(tmp_path / "plan.json"),
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert "2 stages x 2 micro-batches" in res.stdout and "bubble" in res.stdout
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert [s["devices"] for s in doc["stages"]] == [[0, 1], [2, 3]]
    assert doc["tasks"]["0"] == ["F0", "F1", "B0", "B1", "U"]
    assert doc["sub_plan"]["mesh"]["axes"] == {"dp": 2}
    assert sorted(os.listdir(tmp_path / "ir"))[-5:] == [
        "device-0.gir",
        "device-1.gir",
        "device-2.gir",
        "device-3.gir",
        "microbatch.gir",
    ]


def test_cli_run_pipeline_with_trace(tmp_path):
    res = run_cli(
        "run",
        os.path.join(ROOT, "models/mlp.py") + ":train_step",
        "--example",
        "example_train_args",
        "--mesh",
        "pp=2,dp=2",
        "--microbatches",
        "4",
        "--schedule",
        "gpipe",
        "--repeat",
        "1",
        "--trace",
        str(tmp_path / "t.json"),
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    assert "equals graphc's interpreter: yes" in res.stdout and "bubble: measured" in res.stdout
    trace = json.loads((tmp_path / "t.json").read_text())
    names = {e["name"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert {"F0", "F3", "B0", "B3", "U"} <= names
    tracks = [e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"]
    assert len(tracks) == 4 and any("stage 1" in t for t in tracks)


def test_a_fixed_micro_batch_count_in_a_search_is_refused_not_dropped(tmp_path):
    """The search picks each candidate's micro-batch count; --microbatches with --devices used to be
    dropped without a word (the plan's options said 3, its layout ran 1)."""
    args, kw = mlp.example_train_args(batch=16, sizes=(8, 8, 4))
    g = graph_of(mlp.train_step, args, kw)
    with pytest.raises(graphc.GraphcError, match="microbatches=3 with a search of 2 devices"):
        search_meshes(g, 2, PlanOptions(microbatches=3), profile=PROFILE)
    from tests.helpers import graphc_cli

    target = os.path.join(ROOT, "models", "mlp.py") + ":train_step"
    code, out, err = graphc_cli(
        "compile",
        target,
        "--example",
        "example_train_args",
        "--devices",
        "2",
        "--microbatches",
        "4",
        "-o",
        str(tmp_path / "p.json"),
    )
    assert code == 2 and "fix the count on one mesh" in err and "Traceback" not in err, (code, out, err)
    assert not (tmp_path / "p.json").exists()


def test_a_search_whose_time_ran_out_before_any_plan_says_so(tmp_path):
    """Not "no mesh can run": every candidate was skipped at the time limit (the limit counts from
    launch, less a second kept for writing, so 0.01 s reaches none)."""
    from tests.helpers import graphc_cli

    target = os.path.join(ROOT, "models", "mlp.py") + ":train_step"
    out_file = str(tmp_path / "p.json")
    code, out, err = graphc_cli(
        "compile", target, "--example", "example_train_args", "--devices", "4", "--time-limit", "0.01", "-o", out_file
    )
    assert code == 2 and "Traceback" not in err, (code, out, err)
    assert "no plan for 4 devices within --time-limit 0.01 s" in err and "raise --time-limit" in err, err
    assert "no mesh" not in err + out and "no plan was made before the time limit ran out" in out, out
    assert not (tmp_path / "p.json").exists()


def test_a_flat_mesh_accumulates_gradients_when_the_batch_does_not_fit_at_once():
    """A batch whose activations do not fit on dp=2 or tp=2 at once: the search tries those meshes
    again with 2, 4, ... micro-batches (gradient accumulation, no pipeline) until one fits, and
    such a plan beats every pipeline (it used to plan pp=2 only, 1.9x slower here)."""
    args, kw = mlp.example_train_args(batch=4096, sizes=(256, 1024, 1024, 16))
    g = graph_of(mlp.train_step, args, kw)
    free = search_meshes(g, 2, profile=PROFILE)
    assert all(c.microbatches == 1 for c in free if "pp" not in c.axes)  # it fits at once: one pass
    limit = 30 * 2**20  # below dp=2's and tp=2's least memory in one pass (40.7 and 38.7 MiB)
    cands = search_meshes(g, 2, PlanOptions(memory_limit=limit), profile=PROFILE)
    best = cands[0]
    assert best.ok and "pp" not in best.axes and best.microbatches > 1, explain(cands, verbose=True)
    assert best.memory_bytes <= limit and best.plan.options.microbatches == best.microbatches
    one_pass = [c for c in cands if "pp" not in c.axes and c.microbatches == 1]
    assert len(one_pass) == 2 and not any(c.ok for c in one_pass) and all(c.over_memory for c in one_pass)
    piped = [c for c in cands if "pp" in c.axes and c.ok]
    assert piped and all(c.step_s > best.step_s for c in piped)
    assert f", {best.microbatches} micro-batches" in explain(cands).splitlines()[1]
    # each flat mesh stops at its first count that fits, or when no larger one can
    for axes in ({"dp": 2}, {"tp": 2}):
        counts = sorted(c.microbatches for c in cands if c.axes == axes)
        fits = sorted(c.microbatches for c in cands if c.axes == axes and c.ok)
        assert counts[0] == 1 and (not fits or counts[-1] == fits[0])


def test_a_flat_mesh_tries_more_micro_batches_only_after_a_memory_limit_error():
    """The error's class, not its words, says whether more micro-batches could help: only a
    MemoryLimitError (the step plans, but over the limit) leads to the next count, and only while
    the last doubling lowered the least memory needed by more than the excess left."""
    failed = Candidate(axes={"dp": 2}, microbatches=1, error="a pinned spec cannot be met")
    assert not _worth_more(failed, [], 1000)
    failed.over_memory = True
    assert _worth_more(failed, [], 1000) and not _worth_more(failed, [], None)
    assert _worth_more(failed, [2000, 1400], 1000)  # excess 400 < drop 600: a later count may fit
    assert not _worth_more(failed, [2000, 1500], 1000)  # excess 500 >= drop 500: none can


def test_a_search_whose_limit_ran_out_before_it_began_returns_at_once():
    """Tracing took the whole --time-limit: the search prices nothing (it took 2.3 s on the 175B
    step to find its blocks and hash its graph after the limit) and lists every mesh as skipped."""
    args, kw = mlp.example_train_args()
    g = graph_of(mlp.train_step, args, kw)
    cands = search_meshes(g, 4, profile=PROFILE, deadline=time.perf_counter() - 1.0)
    assert [c.axes for c in cands] == factorizations(4, AXES)
    assert all(c.skipped == TIME_UP and c.plan is None for c in cands)


def test_a_mesh_cut_short_by_its_share_of_the_time_gets_what_the_others_left(monkeypatch):
    """Each solve of a search gets an even share of the time left, so one hard ILP cannot spend
    every later mesh's time (a tiny GPT under a tight memory limit spent 52 s of 60 on dp=2,tp=2
    and never reached the pipelines); a mesh whose share ran out before any plan
    (TimeLimitError) is planned again with the time the others left."""
    args, kw = mlp.example_train_args()
    g = graph_of(mlp.train_step, args, kw)
    calls: list[tuple[str, float]] = []

    def plan_one(cand, graph, mesh, ties, options):  # dp=4's first share is too short to find a plan
        calls.append((cand.mesh_text, options.time_limit))
        if cand.axes == {"dp": 4} and len(calls) == 1:
            cand.error, cand.timed_out = "the time limit ran out before the sharding ILP found a plan", True
            return None
        cand.predicted_s = 1.0 if cand.axes == {"dp": 4} else 2.0
        return None

    monkeypatch.setattr(search, "_plan_one", plan_one)
    cands = search_meshes(g, 4, PlanOptions(time_limit=30.0), profile=PROFILE)
    shares = [t for _, t in calls]
    assert calls[0][0] == "dp=4" and calls[-1][0] == "dp=4" and len(calls) == 1 + sum(c.skipped is None for c in cands)
    assert shares[0] < 30.0 / 3  # a share, not the whole limit: more solves were expected after it
    assert shares[-1] > 10 * shares[0]  # planned again with all that was left (the fakes take no time)
    assert cands[0].axes == {"dp": 4} and cands[0].ok and not cands[0].timed_out


def test_tensor_parallel_groups_that_would_span_nodes_are_skipped_and_named():
    """On a100-sxm (8 GPUs a node) a tp group stays inside a node only if its size divides 8:
    12 devices as tp=3, 6 or 12 put some group on two nodes, and the profile would price its
    collectives on the node's link (NVLink). The whole-step search used to plan them; it skips
    them, naming why, as the block search leaves them out (passes/scale.py ``layouts``)."""
    args, kw = mlp.example_train_args(batch=12, sizes=(32, 32, 8))
    g = graph_of(mlp.train_step, args, kw)
    cands = search_meshes(g, 12, profile=get_profile("a100-sxm"), axes=("dp", "tp"))
    planned = {c.axes.get("tp", 1) for c in cands if c.skipped is None}
    assert planned == {1, 2, 4}
    skipped = {c.axes["tp"]: c.skipped for c in cands if c.skipped is not None}
    for t in (3, 6, 12):
        assert (
            skipped[t]
            == f"beyond a node: tp={t} does not divide a node of 8 devices (a100-sxm), so a group would span two"
        )
    assert "3 beyond a node" in explain(cands).splitlines()[0]
    same = search_meshes(g, 12, profile=PROFILE, axes=("dp", "tp"))  # this machine: one node, no limit
    assert all(c.skipped is None for c in same)
