"""Lowering a plan to device programs, checked with the lock-step simulator (the reference
implementations of the collectives) against the reference interpreter on the whole graph."""

import dataclasses

import numpy as np
import pytest

import graphc
from graphc.core.errors import VerifyError
from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.core.pytree import flatten
from graphc.interpreter import bind_arguments, run_flat
from graphc.passes.partition import lower
from graphc.programs import check_collective_order, simulate
from tests.helpers import quick_share, slow_param
from tests.models import foreign_models

PROFILE = MachineProfile.default()


def _static_names(kwargs):
    return tuple(k for k, v in kwargs.items() if not flatten(v)[0])


def lowered(fn, args, kwargs, axes):
    """(graph, plan, lowered program, the graph's flat arguments)."""
    mesh = Mesh(axes, profile=PROFILE)
    pf = graphc.parallelize(fn, mesh=mesh, cache=False, static_argnames=_static_names(kwargs))
    plan, graph = pf.plan_and_graph(*args, **kwargs)
    dyn_args, dyn_kwargs, _ = pf.split_static(args, kwargs)
    return graph, plan, lower(graph, plan), bind_arguments(graph, dyn_args, dyn_kwargs)


def check_simulated(fn, args, kwargs, axes, rtol):
    graph, plan, program, arrays = lowered(fn, args, kwargs, axes)
    program.verify()
    outs = simulate(program, program.shard_inputs(arrays))
    got = program.gather_outputs(outs)
    want = run_flat(graph, arrays)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)
        else:
            np.testing.assert_array_equal(g, w)
    return plan, program.devices


MESHES = [{"dp": 2}, {"tp": 4}, {"dp": 2, "tp": 2}]


def _models():
    from graphc.models import cnn, gpt, mlp

    return {
        "mlp_train": (mlp.train_step, *mlp.example_train_args(batch=64, sizes=(16, 32, 32, 10)), 1e-5),
        "gpt_train": (gpt.train_step, *gpt.example_train_args(), 1e-4),
        "gpt_forward": (gpt.gpt, *gpt.example_args(), 1e-4),
        "cnn_train": (cnn.train_step, *cnn.example_train_args(batch=4), 1e-4),
    }


MODELS = _models()


@pytest.mark.parametrize("axes", MESHES, ids=lambda a: ",".join(f"{k}={v}" for k, v in a.items()))
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n == "gpt_train" else n for n in sorted(MODELS)]
)
def test_models_lower_and_simulate_equal_the_interpreter(name, axes):
    fn, args, kwargs, rtol = MODELS[name]
    plan, programs = check_simulated(fn, args, kwargs, axes, rtol)
    n_coll = sum(1 for n in programs[0].graph.nodes if n.op.kind == "comm")
    assert len({len(p.graph.nodes) for p in programs}) == 1
    if plan.collectives:
        assert n_coll > 0


@pytest.mark.parametrize(
    "name",
    quick_share(
        [n for n in sorted(foreign_models.MODELS) if n not in ("encoder_pre_norm_eval", "gpt2_picogpt_token_array")],
        every=4,
    )
    + [slow_param(n) for n in ("encoder_pre_norm_eval", "gpt2_picogpt_token_array")],
)
def test_foreign_models_lower_and_simulate(name):
    fn, args, kwargs, rtol = foreign_models.MODELS[name]()
    check_simulated(fn, args, kwargs, {"a": 2, "b": 2}, max(rtol, 1e-5))


def test_gpt_tp4_programs_hold_the_plans_collectives():
    fn, args, kwargs, _ = MODELS["gpt_train"]
    graph, plan, program, _ = lowered(fn, args, kwargs, {"tp": 4})
    program = lower(
        graph, dataclasses.replace(plan, options=dataclasses.replace(plan.options, bucket_bytes=0))
    )  # unbucketed
    programs = program.devices
    kinds = sorted(c.kind for c in plan.collectives if c.kind not in ("slice", "zero"))
    prog_kinds = sorted(
        n.op.name
        for n in programs[0].graph.nodes
        if n.op.name in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
    )
    assert prog_kinds == kinds
    for p in programs:
        for n in p.graph.nodes:
            if n.op.kind == "comm" and "group" in n.attrs:
                assert n.attrs["group"] == (0, 1, 2, 3)
                assert n.loc is not None  # the user's line travels with the collective


def test_verifier_catches_collectives_in_different_orders():
    fn, args, kwargs, _ = MODELS["gpt_train"]
    _graph, _plan, program, _ = lowered(fn, args, kwargs, {"tp": 2})
    programs = program.devices
    check_collective_order(programs)
    nodes = programs[1].graph.nodes
    coll = [i for i, n in enumerate(nodes) if n.op.name in ("all_reduce", "all_gather", "reduce_scatter")]
    i = coll[0]
    j = next(
        k
        for k in coll[1:]
        if (nodes[k].op.name, str(nodes[k].inputs[0].type)) != (nodes[i].op.name, str(nodes[i].inputs[0].type))
    )
    nodes[i], nodes[j] = nodes[j], nodes[i]  # device 1 would enter them in another order: a deadlock
    with pytest.raises(VerifyError, match="collective #"):
        check_collective_order(programs)


def test_masked_lookup_out_of_range_raises_index_error_on_every_device():
    def embed(table, tokens):
        return graphc.shard(table, "S(0)")[tokens].sum(axis=-1)

    table = np.arange(32, dtype=np.float32).reshape(8, 4)
    tokens = np.array([[1, 7, -1, 3]])
    mesh = Mesh({"tp": 2}, profile=PROFILE)
    pf = graphc.parallelize(embed, mesh=mesh, cache=False)
    plan, graph = pf.plan_and_graph(table, tokens)
    program = lower(graph, plan)
    ok = program.gather_outputs(simulate(program, program.shard_inputs([table, tokens])))
    np.testing.assert_array_equal(ok[0], embed(table, tokens))
    bad = np.array([[1, 8, 0, 0]])  # 8 is out of range: device 0 owns rows 0-3 and must not return zeros
    with pytest.raises(IndexError):
        simulate(program, program.shard_inputs([table, bad]))
