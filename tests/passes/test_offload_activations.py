"""Activation offload in the block search (passes/offload.py ``activation_costs`` and
``stage_activations``, composed by passes/scale.py): a stage keeps a share of its stashed
activations in host memory, the copies priced over the profile's host link and hidden by the
stage's compute as far as it reaches; the search weighs it against recomputation by predicted step
time under the memory limit; the plan JSON marks it; a profile without a host tier never does it."""

import dataclasses
import json

import pytest

from graphc.core.profile import Link, MachineProfile
from graphc.core.profiles import HOST_TIERS, get_profile, host_tier
from graphc.passes import scale
from graphc.passes.offload import ACTIVATION_FRACTIONS, activation_costs, offload_choices
from graphc.passes.options import PlanOptions
from graphc.passes.scale import Layout
from tests.passes.offload_models import NO_COST, gpt3_bf16_layered

H100 = get_profile("h100-sxm")
FIGURES = scale.cluster_figures(H100)
A = 1e9  # bytes one layer stashes per micro-batch: large beside the test model's state
BLOCK = scale.SegmentCost(1e-3, 2e-3, int(A), 1000, 0.0, None)  # forward 1 ms, backward 2 ms a layer
SEGS = scale._Segments(NO_COST, BLOCK, NO_COST)
# two stages of two layers, four micro-batches: stage 0 holds two micro-batches' stash, stage 1 one
LO = Layout(pp=2, dp=1, tp=1, micro_batch=2, microbatches=4, zero=0, recompute="off")
# one stage of four layers, one micro-batch of 8 (no cut to choose: the stash is 4A)
ONE = Layout(pp=1, dp=1, tp=1, micro_batch=8, microbatches=1, zero=0, recompute="off")


@pytest.fixture(scope="module")
def model():
    return gpt3_bf16_layered(H100)


def test_the_overlap_rule_on_a_hand_worked_example():
    """Two values of 1.6 GB over a 32 GB/s link with 10 us a copy: each way 2 x 10 us + 3.2 GB /
    32 GB/s = 100.02 ms. Beside a 60 ms forward, 40.02 ms of the copies out wait; beside a 200 ms
    backward the copies back hide whole: 40.02 ms exposed, 160.02 ms hidden."""
    link = Link(10e-6, 32e9)
    cost = activation_costs(link, (1.6e9, 1.6e9), 0.060, 0.200, values=("a", "b"))
    assert cost.transfers == 2 and cost.nbytes == 3.2e9
    assert cost.out_s == pytest.approx(0.10002, rel=1e-12) and cost.back_s == pytest.approx(0.10002, rel=1e-12)
    assert cost.out_exposed_s == pytest.approx(0.04002, rel=1e-9) and cost.back_exposed_s == 0.0
    assert cost.exposed_s == pytest.approx(0.04002, rel=1e-9) and cost.hidden_s == pytest.approx(0.16002, rel=1e-9)
    short = activation_costs(link, (1.6e9, 1.6e9), 0.060, 0.050)  # a backward too short as well
    assert short.exposed_s == pytest.approx(0.04002 + 0.05002, rel=1e-9)
    assert activation_costs(link, (1.6e9, 1.6e9), 1.0, 1.0).exposed_s == 0.0  # compute hides everything


def test_offloading_a_share_of_the_stash_in_closed_form(model):
    """Half of each stage's stash in host memory: stage 0 (two micro-batches in flight) drops 2 x
    2A x 1/2 and holds one layer's half (A/2) in transit; stage 1 (one in flight) drops A and holds
    A/2. Each micro-batch copies 2 x A/2 each way per stage, beside a 2 ms forward and a 4 ms
    backward; the step adds (k + S - 1) x what they do not hide."""
    kept, _ = scale.compose(model, SEGS, LO, H100, FIGURES, None)
    lo = dataclasses.replace(LO, offload="activations")
    plan, why = scale.compose(model, SEGS, lo, H100, FIGURES, None, 0.5)
    assert why is None and kept.activations is None and plan.activations is not None
    assert kept.memory_bytes[0] - plan.memory_bytes[0] == pytest.approx(2 * A - A / 2, abs=2)
    assert kept.memory_bytes[1] - plan.memory_bytes[1] == pytest.approx(A - A / 2, abs=2)
    link = host_tier(H100).link
    copy = 2 * link.latency_s + A / link.bandwidth
    exposed = max(0.0, copy - 2e-3) + max(0.0, copy - 4e-3)
    acts = plan.activations
    assert acts.fraction == 0.5 and acts.value_bytes == (A / 2, A / 2) and acts.out_s == pytest.approx(copy)
    assert acts.exposed_s == pytest.approx(exposed, rel=1e-12)
    assert plan.predicted["step_s"] - kept.predicted["step_s"] == pytest.approx((4 + 2 - 1) * exposed, rel=1e-9)
    assert plan.predicted["act_offload_s"] == pytest.approx(4 * exposed, rel=1e-12)
    assert "activation copies (exposed)" in plan.breakdown()
    doc = json.loads(plan.to_json())
    assert doc["layout"]["offload"] == "activations" and doc["offload"]["what"] == "activations"
    assert "state_bytes" not in doc["offload"]  # the state stays
    marks = doc["offload"]["activations"]
    assert marks["fraction"] == 0.5 and marks["exposed_s"] == pytest.approx(exposed)
    assert marks["hidden_s"] == pytest.approx(2 * copy - exposed)
    assert "50% of the stash" in plan.summary() and "exposed" in plan.summary()
    assert json.loads(kept.to_json())["offload"] is None


def test_with_the_state_offloaded_too_both_are_priced(model):
    """ "both": the state's update on the host and the stash's copies; they share the link in
    different phases (passes/offload.py), so each is priced as on its own."""
    both, _ = scale.compose(model, SEGS, dataclasses.replace(LO, offload="both"), H100, FIGURES, None, 0.5)
    state, _ = scale.compose(model, SEGS, dataclasses.replace(LO, offload="optimizer"), H100, FIGURES, None)
    acts, _ = scale.compose(model, SEGS, dataclasses.replace(LO, offload="activations"), H100, FIGURES, None, 0.5)
    kept, _ = scale.compose(model, SEGS, LO, H100, FIGURES, None)
    assert both.offload == state.offload and both.activations == acts.activations
    step = lambda p: p.predicted["step_s"]  # noqa: E731
    assert step(both) - step(kept) == pytest.approx((step(state) - step(kept)) + (step(acts) - step(kept)), rel=1e-9)
    assert max(both.memory_bytes) < min(max(state.memory_bytes), max(acts.memory_bytes))


def test_the_layout_keeps_the_fastest_share_that_fits(model):
    """Without a fraction, compose tries ``ACTIVATION_FRACTIONS``: the least copying when nothing
    binds, the smallest share that fits under a limit, and the reason when none does."""
    lo = dataclasses.replace(ONE, offload="activations")
    free, _ = scale.compose(model, SEGS, lo, H100, FIGURES, None)
    assert free.activations.fraction == ACTIVATION_FRACTIONS[0]
    peaks = {
        f: max(scale.compose(model, SEGS, lo, H100, FIGURES, None, f)[0].memory_bytes) for f in ACTIVATION_FRACTIONS
    }
    limit = (peaks[0.5] + peaks[0.25]) // 2
    fit, _ = scale.compose(model, SEGS, lo, H100, FIGURES, limit)
    assert fit.activations.fraction == 0.5 and max(fit.memory_bytes) <= limit
    none, why = scale.compose(model, SEGS, lo, H100, FIGURES, peaks[1.0] - 10**6)
    assert none is None and "no cut" in why


def _best(model, limit, recompute=("off", "full")):
    """What the search chooses among this mesh's layouts: the fastest that fits (passes/scale.py)."""
    plans = [
        scale.compose(model, SEGS, dataclasses.replace(ONE, recompute=r, offload=f), H100, FIGURES, limit)[0]
        for r in recompute
        for f in offload_choices(H100)
    ]
    return min((p for p in plans if p is not None), key=lambda p: p.predicted["step_s"])


def test_activation_offload_is_what_lets_the_plan_fit(model):
    """Without recomputation, a limit below what keeping the stash or offloading the state needs
    is met only by moving activations."""
    kept = {
        f: scale.compose(model, SEGS, dataclasses.replace(ONE, offload=f), H100, FIGURES, None)[0]
        for f in ("off", "optimizer")
    }
    limit = min(max(p.memory_bytes) for p in kept.values()) - int(A / 2)
    best = _best(model, limit, recompute=("off",))
    assert best.layout.offload in ("activations", "both") and max(best.memory_bytes) <= limit
    assert best.activations is not None and json.loads(best.to_json())["offload"]["activations"]["fraction"] > 0


def test_it_wins_over_recomputation_on_a_fast_link_and_loses_on_a_slow_one(model, monkeypatch):
    """Under a limit that needs recomputation or activation offload, the H100's PCIe Gen5 hides a
    small stash's copies behind the compute (nothing exposed), which beats running the forward
    again; on a host link of 100 MB/s the copies cost more than the forward, and recomputation
    wins."""
    small = scale._Segments(NO_COST, dataclasses.replace(BLOCK, activation_bytes=10**7), NO_COST)

    def best(limit):
        plans = [
            scale.compose(model, small, dataclasses.replace(ONE, recompute=r, offload=f), H100, FIGURES, limit)[0]
            for r in ("off", "full")
            for f in offload_choices(H100)
        ]
        return min((p for p in plans if p is not None), key=lambda p: p.predicted["step_s"])

    kept = scale.compose(model, small, ONE, H100, FIGURES, None)[0]
    limit = max(kept.memory_bytes) - 10**7  # one layer's stash less: recompute or move some
    fast = best(limit)
    assert fast.layout.recompute == "off" and fast.layout.offload == "activations"
    assert fast.activations.exposed_s == 0.0 and fast.predicted["step_s"] == pytest.approx(kept.predicted["step_s"])
    slow_tier = dataclasses.replace(HOST_TIERS["h100-sxm"], link=Link(10e-6, 1e8))
    monkeypatch.setitem(HOST_TIERS, "h100-sxm", slow_tier)
    slow = best(limit)
    assert slow.layout.recompute == "full" and slow.layout.offload == "off"
    moved = scale.compose(model, small, dataclasses.replace(ONE, offload="activations"), H100, FIGURES, limit)[0]
    assert moved is not None and moved.predicted["step_s"] > slow.predicted["step_s"]  # it fits, but is slower
    assert moved.activations.exposed_s > 0


def test_a_profile_without_a_host_tier_never_offloads_activations(model):
    cpu = MachineProfile.default()
    for profile in (cpu, get_profile("cpu-here")):
        assert offload_choices(profile) == ("off",)
        assert all(lo.offload == "off" for lo in scale.layouts(model, 2, None, PlanOptions(), offload_choices(profile)))
        plan, why = scale.compose(
            model, SEGS, dataclasses.replace(LO, offload="activations"), profile, scale.cluster_figures(profile), None
        )
        assert plan is None and "no host memory tier" in why


def test_the_host_must_hold_the_stash_in_flight(model, monkeypatch):
    """Stage 0 keeps two micro-batches' offloaded share on the host: 2 x 2A x f."""
    tiny = dataclasses.replace(HOST_TIERS["h100-sxm"], memory_bytes=2 * 2 * A * 0.25 - 1)
    monkeypatch.setitem(HOST_TIERS, "h100-sxm", tiny)
    plan, why = scale.compose(model, SEGS, dataclasses.replace(LO, offload="activations"), H100, FIGURES, None, 0.25)
    assert plan is None and "host memory" in why
    tiny = dataclasses.replace(tiny, memory_bytes=2 * 2 * A * 0.25)
    monkeypatch.setitem(HOST_TIERS, "h100-sxm", tiny)
    assert scale.compose(model, SEGS, dataclasses.replace(LO, offload="activations"), H100, FIGURES, None, 0.25)[0]
