"""Optimizer-state offload in the block search (passes/offload.py, passes/scale.py): only GPU
profiles with a host tier offload; offloading drops each device's peak by the state it moves and
adds the transfers and the CPU update as priced in passes/offload.py; the plan JSON marks the
offloaded values; the search chooses it only when nothing else fits or it is faster; and a plan
that offloads is never made into a plan to run."""

import dataclasses
import json
import time

import pytest

from graphc.cli.common import load_plan
from graphc.core.errors import PlanError
from graphc.core.profile import MachineProfile
from graphc.core.profiles import HOST_TIERS, get_profile, host_tier
from graphc.passes import scale, search
from graphc.passes.offload import offload_choices, offload_costs, offloads_state
from graphc.passes.options import PlanOptions
from graphc.passes.scale import Layout, search_layered
from graphc.passes.search import explain, search_meshes
from tests.passes.offload_models import NO_COST, gpt3_bf16_layered

H100 = get_profile("h100-sxm")
A100 = get_profile("a100-sxm")


@pytest.fixture(scope="module")
def model():
    return gpt3_bf16_layered(H100)


# a block whose activations are small beside its optimizer state (the case offload is for)
BLOCK = scale.SegmentCost(1e-3, 2e-3, 100, 10, 0.0, None)
SEGS = scale._Segments(NO_COST, BLOCK, NO_COST)


def test_the_gpu_presets_have_a_host_tier_with_sources_and_nothing_else_has():
    assert host_tier(H100).link.bandwidth == 64e9 and host_tier(A100).link.bandwidth == 32e9  # PCIe Gen5 / Gen4
    assert host_tier(H100).memory_bytes == host_tier(A100).memory_bytes == 2e12 / 8  # 2 TB per DGX of 8
    assert all(len(t.sources) == 3 for t in HOST_TIERS.values())
    assert host_tier(get_profile("cpu-here")) is None and host_tier(MachineProfile.default()) is None
    assert offload_choices(get_profile("cpu-here")) == ("off",)
    assert offload_choices(H100) == ("off", "optimizer", "activations", "both")


def test_a_profile_without_a_host_tier_never_offloads(model):
    cpu = MachineProfile.default()
    assert all(lo.offload == "off" for lo in scale.layouts(model, 4, None, PlanOptions(), offload_choices(cpu)))
    lo = Layout(1, 1, 1, 8, 1, 0, "off", "optimizer")
    plan, why = scale.compose(model, SEGS, lo, cpu, scale.cluster_figures(cpu), None)
    assert plan is None and "no host memory tier" in why


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_offload_drops_the_peak_by_the_state_and_adds_the_priced_transfers(model, zero):
    """Closed form (passes/offload.py): d2h = lat + P / bw, hidden behind the last backward;
    CPU Adam = (2 S + 2 P + G) / host DRAM bandwidth; h2d = lat + P / bw; S, P and G the state,
    parameters and gradients this device updates (its ZeRO share of the stage's layers and the
    ends; G = P in the even layout this builds by hand)."""
    figures = scale.cluster_figures(H100)
    D, t = 4, 2
    lo = Layout(pp=1, dp=D, tp=t, micro_batch=1, microbatches=2, zero=zero, recompute="off")
    kept, _ = scale.compose(model, SEGS, lo, H100, figures, None)
    off, why = scale.compose(model, SEGS, dataclasses.replace(lo, offload="optimizer"), H100, figures, None)
    assert why is None and kept.offload is None and off.offload is not None
    owned = 1 / t / (D if zero >= 1 else 1)
    share = model.state_bytes / (model.param_bytes + model.state_bytes)
    S = (model.state_bytes * 4 + model.other_state * share) * owned
    P = (model.param_bytes * 4 + model.other_state * (1 - share)) * owned
    assert off.offload.state_bytes == pytest.approx(S, rel=1e-12)
    assert max(kept.memory_bytes) - max(off.memory_bytes) == pytest.approx(S, abs=2)  # int rounding per stage
    host = host_tier(H100)
    d2h = host.link.latency_s + P / 64e9
    exposed = max(0.0, d2h - 2e-3 * 4)  # the stage's backward of one micro-batch: 4 layers of 2 ms
    cpu = (2 * S + 3 * P) / (2 * 307.2e9 / 8)
    h2d = host.link.latency_s + P / 64e9
    assert off.predicted["offload_s"] == pytest.approx(exposed + cpu + h2d, rel=1e-12)
    assert off.predicted["step_s"] - off.predicted["update_s"] == pytest.approx(
        kept.predicted["step_s"] - kept.predicted["update_s"], rel=1e-12
    )  # the device's update is replaced by the host's; nothing else changes
    assert off.offload == offload_costs(host, S, P, 8e-3, 1.0)


def test_offload_that_the_host_cannot_hold_is_rejected(model, monkeypatch):
    tiny = dataclasses.replace(HOST_TIERS["h100-sxm"], memory_bytes=1000.0)
    monkeypatch.setitem(HOST_TIERS, "h100-sxm", tiny)
    lo = Layout(1, 1, 1, 8, 1, 0, "off", "optimizer")
    plan, why = scale.compose(model, SEGS, lo, H100, scale.cluster_figures(H100), None)
    assert plan is None and "host memory" in why


def test_the_plan_json_marks_the_offloaded_values_and_the_summary_says_why(model):
    lo = Layout(1, 1, 2, 8, 1, 0, "off", "optimizer")
    plan, _ = scale.compose(model, SEGS, lo, H100, scale.cluster_figures(H100), None)
    doc = json.loads(plan.to_json())
    assert doc["layout"]["offload"] == "optimizer"
    marks = doc["offload"]
    assert marks["what"] == "optimizer state" and marks["values"] == list(model.state_names)
    assert set(marks["values"]) >= {"opt_state.m.blocks.0.qkv.w", "opt_state.v.blocks.3.qkv.w"}
    assert not any(v.startswith("params.") for v in marks["values"])
    assert marks["bytes_per_device"] == plan.offload.state_bytes
    assert marks["step_s"] == pytest.approx(marks["d2h_exposed_s"] + marks["host_update_s"] + marks["h2d_s"])
    text = plan.summary()
    assert "offload optimizer" in text and "less per device" in text and "Adam on the CPU" in text
    assert "no host tier" in text
    kept, _ = scale.compose(
        model, SEGS, dataclasses.replace(lo, offload="off"), H100, scale.cluster_figures(H100), None
    )
    assert json.loads(kept.to_json())["offload"] is None


def _peaks(outs, solved_only=False):
    return {o.layout: max(o.plan.memory_bytes) for o in outs if o.plan is not None and (o.exact or not solved_only)}


@pytest.fixture(scope="module")
def free(model):
    """The search of 2 devices without a limit, and a limit between the smallest peak that keeps
    the optimizer state on the device and the smallest that offloads it."""
    outs = search_layered(model, 2, PlanOptions(), H100, time.perf_counter() + 600)
    peaks = _peaks(outs)
    kept = min(p for lo, p in peaks.items() if lo.offload == "off")
    moved = min(p for lo, p in peaks.items() if lo.offload == "optimizer")
    assert moved < kept
    return outs, (kept + moved) // 2


@pytest.mark.slow
def test_the_search_offloads_only_when_nothing_else_fits(model, free):
    """Without a limit offload only costs time: never chosen. With the limit of ``free``, every
    plan that fits offloads."""
    outs, limit = free
    best = min((o for o in outs if o.plan), key=lambda o: o.plan.predicted["step_s"])
    assert best.layout.offload == "off"
    tight = search_layered(model, 2, PlanOptions(memory_limit=limit), H100, time.perf_counter() + 600)
    fits = [o for o in tight if o.plan is not None]
    # every plan that fits offloads the state ("both": and some activations, tests/passes/test_offload_activations.py)
    assert fits and all(offloads_state(o.layout.offload) and max(o.plan.memory_bytes) <= limit for o in fits)
    # keeping the state: over by the state moved, where both plans' segments were solved at their
    # micro-batch size (a scaled estimate the refinement left unsolved has memory of its own)
    peaks = _peaks(outs, solved_only=True)
    pairs = [
        (o, dataclasses.replace(o.layout, offload="off")) for o in fits if o.layout.offload == "optimizer" and o.exact
    ]
    pairs = [(o, twin) for o, twin in pairs if twin in peaks]
    assert pairs
    for o, twin in pairs:
        assert peaks[twin] - max(o.plan.memory_bytes) == pytest.approx(o.plan.offload.state_bytes, abs=2)


@pytest.mark.slow
def test_an_offloading_choice_stays_a_prediction_and_explain_says_why(model, free):
    g = model.graph
    cands = search_meshes(g, 2, PlanOptions(memory_limit=free[1]), profile=H100)
    best = cands[0]
    assert best.ok and offloads_state(best.layout.offload)  # "both" when moving activations too is faster
    assert isinstance(best.plan, scale.ComposedPlan) and "offloads the optimizer state" in best.whole_error
    text = explain(cands)
    assert f"offload {best.layout.offload}" in text
    assert "no plan that keeps the optimizer state on the device fits" in text
    assert "not a plan to run" in text
    unplanned = [dataclasses.replace(best, whole_error=None), *cands[1:]]  # a step too large to plan whole
    assert "offloads the optimizer state" in explain(unplanned)
    direct = dataclasses.replace(best, plan=None, whole_error=None)
    search._plan_whole(direct, g, PlanOptions(), H100, deadline=time.perf_counter() + 60)
    assert direct.plan is None  # never silently planned without the offload


def test_running_an_offloading_plan_is_a_clear_error(model, tmp_path):
    plan, _ = scale.compose(
        model, SEGS, Layout(1, 1, 2, 8, 1, 0, "off", "optimizer"), H100, scale.cluster_figures(H100), None
    )
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    with pytest.raises(PlanError, match="block search predicted.*--mesh"):
        load_plan(str(path))
