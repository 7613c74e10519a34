"""The plan file of a deep model (issue 29; passes/sharding/plan.py ``ALTERNATIVES_IN_FILE``,
records.py): a plan of more items than that leaves the alternatives out of its JSON unless asked,
and every record leaves out its defaults, so the file grows with depth by about what a node's
choice takes (a 1,000-layer d=256 GPT's file was 505 MB, two thirds of it alternatives, and
pricing them most of the 76 s it took to write). What the file keeps round-trips; the plan just
made still explains every alternative; a plan read from a file without them says so."""

from __future__ import annotations

import json

import pytest

import graphc
from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.models import gpt
from graphc.passes.sharding import plan as plan_module
from graphc.passes.sharding.plan import ALTERNATIVES_IN_FILE, ShardingPlan

# A node's record without alternatives is about 200 bytes beside its source location
# ({"index": .., "name": "%5166", "op": "add", "part": "forward", "types": ["f32[8,128,1]"],
# "strategy": "e0@dp e1@tp", "in_specs": [..], "out_specs": [..], "compute_s": ..}); with its
# three alternatives it was about 1,100.
BYTES_PER_RECORD = 300


def _plan(n_layer: int) -> ShardingPlan:
    args, kw = gpt.example_train_args(batch=4, seq=8, d=16, n_layer=n_layer, n_head=2)
    step = graphc.parallelize(
        gpt.train_step,
        mesh=Mesh("dp=2,tp=2", profile=MachineProfile.default()),
        static_argnames=("n_head", "lr"),
        cache=False,
    )
    plan = step.plan(*args, **kw)
    assert isinstance(plan, ShardingPlan)
    return plan


def _items(plan: ShardingPlan) -> int:
    return len(plan.inputs) + len(plan.nodes) + len(plan.outputs)


def _within_bound(plan: ShardingPlan, text: str) -> None:
    """The file is at most ``BYTES_PER_RECORD`` a record, its source locations apart (their
    length is the path of the user's file)."""
    records = _items(plan) + len(plan.collectives)
    locs = sum(len(n.loc or "") for n in plan.nodes) + sum(len(c.loc or "") for c in plan.collectives)
    assert len(text) - locs <= BYTES_PER_RECORD * records, (len(text), records)


@pytest.fixture(scope="module")
def small():
    return _plan(3)


def test_a_plan_over_the_bound_leaves_alternatives_and_defaults_out(small, monkeypatch):
    monkeypatch.setattr(plan_module, "ALTERNATIVES_IN_FILE", _items(small) - 1)
    text = small.to_json()
    doc = json.loads(text)
    assert doc["alternatives_kept"] is False
    assert not any("alternatives" in r for r in doc["inputs"] + doc["nodes"] + doc["outputs"])
    # defaults are not written: no pinned false, no warning null
    assert not any("pinned" in r or "warning" in r for r in doc["nodes"] if not r.get("pinned"))
    _within_bound(small, text)
    # asked for, they are written whatever the size; a plan at most at the bound writes them
    full = json.loads(small.to_json(alternatives=True))
    assert full["alternatives_kept"] is True and any(n["alternatives"] for n in full["nodes"])
    monkeypatch.setattr(plan_module, "ALTERNATIVES_IN_FILE", _items(small))
    assert json.loads(small.to_json())["alternatives_kept"] is True
    assert json.loads(small.to_json(alternatives=False))["alternatives_kept"] is False


def test_a_file_without_alternatives_round_trips_and_its_plan_says_they_were_left_out(small):
    text = small.to_json(alternatives=False)
    loaded = ShardingPlan.from_json(text)
    assert loaded.to_json() == text and loaded.to_json(alternatives=True) == text  # none to write
    assert not loaded.alternatives_kept and not any(n.alternatives for n in loaded.nodes)
    assert [n.strategy for n in loaded.nodes] == [n.strategy for n in small.nodes]
    assert loaded.input_specs() == small.input_specs() and loaded.cost == small.cost
    node = next(n for n in small.nodes if n.alternatives)
    said = loaded.explain(node.name)
    assert "not in this plan: its file was written without them" in said and "instead" not in said
    # the plan just made prices them when read
    assert "instead" in small.explain(node.name)
    x = next(x for x in small.inputs if x.alternatives)
    assert "instead" in small.explain(x.name) and "instead" not in loaded.explain(x.name)
    # a file with them round-trips with them, as before
    full = ShardingPlan.from_json(small.to_json(alternatives=True))
    assert full.alternatives_kept and full == small


def test_a_pinned_node_and_a_warning_round_trip(small):
    doc = json.loads(small.to_json())
    doc["nodes"][0]["pinned"] = True
    doc["nodes"][1]["warning"] = "replicated"
    loaded = ShardingPlan.from_json(json.dumps(doc))
    assert loaded.nodes[0].pinned and loaded.nodes[1].warning == "replicated"
    again = json.loads(loaded.to_json())
    assert again["nodes"][0]["pinned"] is True and again["nodes"][1]["warning"] == "replicated"
    assert "pinned" not in again["nodes"][1] and "warning" not in again["nodes"][0]


@pytest.mark.long  # 18 s loaded: plans of deep steps
def test_a_deep_plans_file_grows_linearly_with_a_small_constant():
    """At 30 and 60 layers (both over ``ALTERNATIVES_IN_FILE`` items): the file per record is
    bounded, and doubling the depth at most doubles it."""
    plans = {n: _plan(n) for n in (30, 60)}
    texts = {n: p.to_json() for n, p in plans.items()}
    for n, p in plans.items():
        assert _items(p) > ALTERNATIVES_IN_FILE
        assert json.loads(texts[n])["alternatives_kept"] is False
        _within_bound(p, texts[n])
    assert len(texts[60]) <= 2 * len(texts[30])
    assert ShardingPlan.from_json(texts[60]).to_json() == texts[60]
