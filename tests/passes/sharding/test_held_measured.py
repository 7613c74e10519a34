"""The plan's predicted memory (``plan.memory.held``: values and redistribution buffers, what the
runtime holds) against each device's measured peak (runtime/executor.py ``_Profile``: arguments,
constants, the arrays its steps made, the pool's free buffers), on a few models and meshes,
including the README's (gpt train_step on dp=2,tp=4).

The two differ only by what the accounting below names, computed from the plan and the device
programs, so the bounds are derived, not tolerances:

- above: the lowering folds a constant's redistribution into a constant of the device program,
  held all run, where the model counts a buffer between its readers; at most the device
  constants' bytes beyond the plan's constants (``constants_missed``);
- below: a fused kernel never writes the values that stay inside it (the update's elementwise
  chains), which the model counts for the update (passes/sharding/memory.py ``fused_inside``):
  at most the inner values of the largest kernel live at once (``fused_inner``).

Before the fixes this checks, the README's run measured 860 KiB against 751 KiB predicted (the
loss unpacked from the gradient bucket kept the whole bucket alive to the end), dp=2 measured
32 KiB over (a returned value's piece held while its output gather runs), dp=2,tp=2 was
over-predicted by 188 KiB (each reduced gradient counted twice, as its fan-out's value and as a
redistribution buffer), and the mlp's ZeRO-3 step on dp=2 by 156 KiB (a gathered weight counted
twice, as ZeRO-3's transient copy and as a redistribution buffer). A gradient bucket's buffer,
which its unpacked views keep alive until the last of them is read, was allowed above the
prediction by up to the largest bucket; the model counts it now (tests/passes/sharding/
test_bucket_memory.py)."""

from __future__ import annotations

import pytest

import graphc
from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.interpreter import bind_arguments
from graphc.models import gpt, mlp
from graphc.passes.sharding.memory import local_nbytes

DEFAULT = MachineProfile.default()


def constants_missed(compiled) -> int:
    """Bytes of the device program's constants beyond the plan's constants (in their specs)."""
    shape = tuple(compiled.plan.mesh.shape)
    planned = sum(
        local_nbytes(compiled.graph.nodes[n.index].outputs[0].type, n.out_specs[0], shape)
        for n in compiled.plan.nodes
        if n.op == "constant"
    )
    device = max(sum(c.nbytes for _s, c in ex.program.constants) for ex in compiled.executable.executables.values())
    return max(0, device - planned)


def largest_bucket(compiled) -> int:
    """The bytes of the largest gradient bucket of a device program: an all_reduce of a concatenate."""
    most = 0
    for p in compiled.program.devices:
        for node in p.graph.nodes:
            made = node.inputs[0].producer if node.inputs else None
            if node.op.name == "all_reduce" and made is not None and made.op.name == "concatenate":
                most = max(most, node.outputs[0].type.nbytes)
    return most


def fused_inner(compiled) -> int:
    """The most bytes of values one fused kernel of a device program keeps inside itself."""
    most = 0
    for p in compiled.program.devices:
        for node in p.graph.nodes:
            if node.op.name != "fused":
                continue
            region = node.regions[0]
            outs = set(region.outputs)
            most = max(most, sum(o.type.nbytes for n in region.nodes for o in n.outputs if o not in outs))
    return most


def measure(fn, args: tuple, kwargs: dict, mesh: str, **options):
    pf = graphc.parallelize(fn, mesh=Mesh(mesh, profile=DEFAULT), cache=False, **options)
    compiled = pf.compile(*args, **kwargs)
    dyn_args, dyn_kwargs, _ = pf.split_static(args, kwargs)
    compiled.executable.run_flat(bind_arguments(compiled.graph, dyn_args, dyn_kwargs), profile=True)
    peaks = {d: p["peak_bytes"] for d, p in compiled.executable.last_profile.items()}
    return compiled, peaks


def gpt_step():
    args, kwargs = gpt.example_train_args()
    return gpt.train_step, args, kwargs


def mlp_step():
    args, kwargs = mlp.example_train_args(batch=64, sizes=(64, 64, 8))
    return mlp.train_step, args, kwargs


def mlp_zero3_step():  # on dp=2 its first weight is ZeRO-3: gathered for each reader
    args, kwargs = mlp.example_train_args()
    return mlp.train_step, args, kwargs


@pytest.mark.parametrize(
    "make, mesh",
    [
        (gpt_step, "dp=2,tp=4"),  # the README's
        (gpt_step, "dp=2"),
        (gpt_step, "tp=2"),
        (mlp_step, "dp=2"),
        (mlp_zero3_step, "dp=2"),
        (mlp_step, "dp=2,tp=2"),
    ],
)
def test_measured_peak_is_the_predicted_held_memory_up_to_what_the_accounting_names(make, mesh):
    fn, args, kwargs = make()
    compiled, peaks = measure(fn, args, kwargs, mesh)
    above, below = constants_missed(compiled), fused_inner(compiled)
    for d, measured in peaks.items():
        predicted = compiled.plan.memory.held[d]
        assert predicted - below <= measured <= predicted + above, (d, measured, predicted, below, above)


def test_a_returned_value_is_no_view_of_a_gradient_bucket():
    # the loss is all-reduced over dp like the gradients, but returned: unpacked as a view of the
    # bucket, it held the whole bucket to the end of the run
    fn, args, kwargs = gpt_step()
    compiled, _ = measure(fn, args, kwargs, "dp=2")
    assert largest_bucket(compiled) > 0
    for p in compiled.program.devices:
        for v in p.graph.outputs:
            node = v.producer
            while node is not None and node.op.name in ("reshape", "slice"):
                node = node.inputs[0].producer
            made = node.inputs[0].producer if node is not None and node.inputs else None
            assert not (node is not None and node.op.name == "all_reduce" and made.op.name == "concatenate"), v
