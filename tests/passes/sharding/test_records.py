"""Plan records are frozen slotted dataclasses built by keyword (passes/sharding/records.py), whose
JSON round-trips and whose hand-edited values of the wrong type are named where the file is read."""

import dataclasses
import json

import pytest

import graphc
from graphc.core.errors import PlanError
from graphc.models import mlp
from graphc.passes.pipeline import PipelinePlan, StageAssignment
from graphc.passes.sharding import records
from graphc.passes.sharding.items import Edge, Item
from graphc.passes.sharding.plan import ShardingPlan
from graphc.passes.sharding.strategies import Strategy

RECORDS = [
    *(getattr(records, name) for name in records.__all__),
    ShardingPlan,
    PipelinePlan,
    StageAssignment,
    Strategy,
    Item,
    Edge,
]


@pytest.fixture(scope="module")
def plans():
    args, kwargs = mlp.example_train_args()
    static = tuple(kwargs)
    sharded = graphc.parallelize(mlp.train_step, mesh="dp=2,tp=2", static_argnames=static, cache=False)
    piped = graphc.parallelize(mlp.train_step, mesh="pp=2,tp=2", microbatches=2, static_argnames=static, cache=False)
    return sharded.plan(*args, **kwargs), piped.plan(*args, **kwargs)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_records_are_slotted_dataclasses_built_by_keyword(record):
    assert dataclasses.is_dataclass(record) and "__slots__" in vars(record)
    first = dataclasses.fields(record)[0]
    assert first.kw_only
    with pytest.raises(TypeError):
        record(None)  # no positional construction: a record is read by its field names


def test_plans_round_trip_through_json(plans):
    sharded, piped = plans
    for plan, cls in ((sharded, ShardingPlan), (piped, PipelinePlan)):
        loaded = cls.from_json(plan.to_json())
        assert loaded == plan
        assert loaded.to_json() == plan.to_json()
    assert sharded.collectives and sharded.nodes[0].alternatives  # the records a plan holds are in the file


@pytest.mark.parametrize(
    "where,field,message",
    [
        ("nodes", "compute_s", r"p.json.nodes\[0\].compute_s: expected float, got str"),
        ("collectives", "time_s", r"p.json.collectives\[0\].time_s: expected float, got str"),
        ("inputs", "name", r"p.json.inputs\[0\].name: expected str, got int"),
    ],
)
def test_a_hand_edited_record_of_the_wrong_type_is_named_where_it_is_read(plans, where, field, message):
    doc = json.loads(plans[0].to_json())
    doc[where][0][field] = 12 if field == "name" else "12"
    with pytest.raises(PlanError, match=message):
        ShardingPlan.from_json(json.dumps(doc), "p.json")
