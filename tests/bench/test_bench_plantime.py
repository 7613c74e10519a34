"""``graphc bench plantime``: the machinery on a tiny model (no timing assertions)."""

import pytest

import graphc
from graphc.bench.plantime import Case, depth_cases, plan_case, solver_cases
from graphc.models import gpt


def test_plan_case_runs_every_stage_and_reports_the_ilp():
    case = Case("tiny GPT", gpt.train_step, lambda: gpt.example_train_args(batch=2, seq=8, d=16, n_layer=3), {"tp": 2})
    t = plan_case(case, "highs")
    assert list(t.stages) == ["trace", "optimize", "problem", "shrink", "solve", "plan", "collect", "write"]
    assert all(s >= 0 for s in t.stages.values()) and t.total == pytest.approx(sum(t.stages.values()))
    assert 0 < t.sizes["groups"] < t.sizes["items"] / 2 and t.sizes["variables"] > 0  # three blocks tied
    assert t.status == "optimal" and t.objective_s > 0
    assert t.sizes["plan_bytes"] > 1000  # the plan file graphc compile writes was written


def test_the_benchmark_cases_are_the_issue_targets():
    names = [c.name for c in depth_cases()]
    assert names[:5] == [
        "GPT-3 175B shapes, 4 layer(s), batch 64",
        "GPT-3 175B shapes, 12 layer(s), batch 64",
        "LLaMA-3-8B shapes, 8 layers",
        "LLaMA-3-8B shapes, 32 layers",
        "LLaMA-3-8B bf16 h100-sxm, 32 layers",
    ]
    assert [c.mesh for c in depth_cases()] == [{"dp": 8, "tp": 8}] * 5 + [{"dp": 2, "tp": 2}]
    # the checker's case: the repo's bf16 example on a GPU profile, no memory limit
    bf16 = depth_cases()[4]
    assert (bf16.profile, bf16.memory_limit) == ("h100-sxm", None)
    (params, *_rest), _kw = bf16.example()
    assert len(params["layers"]) == 32 and params["embed"].dtype == graphc.bfloat16
    # the default run plans the d=256 GPT at 100 layers; --deep at the target's 1,000
    assert [depth_cases()[5].name, depth_cases(deep=True)[5].name] == [
        "GPT d=256, 100 layers",
        "GPT d=256, 1000 layers",
    ]
    args, _kw = depth_cases(deep=True)[5].example()
    assert len(args[0]["blocks"]) == 1000
    assert len(solver_cases()) == 3


def test_a_case_with_dropout_traces_its_generator_and_keeps_its_rate_static():
    """The GPT-3 cases carry Megatron-LM's dropout: a Philox Generator (traced) and a rate (a
    number, static). A rate passed as an array made `if not p` a traced bool (the --deep run failed)."""
    from graphc.models import gpt3

    def example():
        args, kw = gpt3.example_train_specs(n_layer=1, d=32, n_head=2, seq=8, n_vocab=64, batch=4)
        assert kw["dropout_p"] == 0.1 and "rng" in kw
        return args, kw

    t = plan_case(Case("tiny GPT-3 with dropout", gpt3.train_step, example, {"dp": 2}), "highs")
    assert t.status == "optimal" and t.objective_s > 0


def test_compile_wall_runs_graphc_compile_as_a_user_does(tmp_path):
    """The wall-clock ratio's runs are whole ``graphc compile`` processes that write the slice's plan
    (the 4-layer one here: about 2 s)."""
    import json

    from graphc.bench.plantime import compile_wall

    assert compile_wall(4, str(tmp_path)) > 0
    doc = json.loads((tmp_path / "plan4.json").read_text())
    assert doc["mesh"]["axes"] == {"dp": 8, "tp": 8} and doc["solver"]["status"] == "optimal"
