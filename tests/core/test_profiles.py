"""Hardware profiles (graphc/core/profiles.py): presets, files, links by axis role, bfloat16
planning, and the plan's MFU."""

import dataclasses
import json
import os

import numpy as np
import pytest

import graphc
from graphc.cli.main import main
from graphc.core.errors import MeshError
from graphc.core.mesh import Mesh
from graphc.core.profile import Link, MachineProfile
from graphc.core.profiles import (
    CLUSTER_FIGURES,
    FLASH_DROPOUT,
    PRESETS,
    attention_dropout_slowdown,
    get_profile,
    read_profile,
    save_profile,
)
from graphc.models import llama, mlp
from graphc.passes.options import PlanOptions
from graphc.passes.partition import Pins, PlanCache
from graphc.passes.sharding.plan import ShardingPlan
from graphc.passes.sharding.strategies import full_time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
H100 = get_profile("h100-sxm")


@pytest.fixture(autouse=True)
def no_stored_profile(tmp_path, monkeypatch):
    """A user's own ~/.cache/graphc/profile.json must not leak into these tests."""
    monkeypatch.setenv("GRAPHC_PROFILE", str(tmp_path / "no-profile.json"))


def _llama_specs(dtype):
    return llama.example_train_specs(
        n_layer=1, d=64, n_head=4, n_kv_head=2, ffn=128, n_vocab=128, batch=4, seq=16, dtype=dtype
    )


def _plan(fn, args, kw, mesh, static, **options):
    return graphc.parallelize(fn, mesh=mesh, static_argnames=static, cache=False, **options).plan(*args, **kw)


# --- presets and links ------------------------------------------------------------------------


def test_presets_hold_the_spec_sheet_numbers():
    assert set(PRESETS) == {"h100-sxm", "a100-sxm", "cpu-here"}
    assert H100.name == "h100-sxm"
    assert H100.matmul_rate(graphc.bfloat16) == H100.matmul_rate(np.float16) == 989.4e12
    assert H100.matmul_rate(np.float32) == H100.flops == 66.9e12
    # achieved rates, each below its datasheet line rate (the measurements in profiles.py)
    assert H100.mem_bandwidth == pytest.approx(3.35e12 * 1727 / 1935)
    assert H100.link.bandwidth == 370e9 and H100.inter_link is not None and H100.inter_link.bandwidth == 46e9
    assert 1e-6 < H100.link.latency_s < H100.inter_link.latency_s <= 10e-6
    a100 = get_profile("a100-sxm")
    assert (a100.matmul_rate(graphc.bfloat16), a100.flops) == (312e12, 19.5e12)
    assert a100.mem_bandwidth == pytest.approx(2.039e12 * 1727 / 1935) and a100.mem_bandwidth < 2.039e12
    assert (a100.link.bandwidth, a100.inter_link and a100.inter_link.bandwidth) == (232.5e9, 24e9)
    assert a100.link.bandwidth < 300e9 and H100.link.bandwidth < 450e9  # NVLink line rates, one way
    # this machine: the stored calibration, here none, so the defaults; one link for every axis
    here = get_profile("cpu-here")
    assert here == MachineProfile.default() and here.name == "cpu-here" and here.inter_link is None
    assert here.matmul_rate(graphc.bfloat16) == here.flops  # unlisted dtypes run at the float32 rate
    assert "989.4 TF/s" in H100.describe() and "h100-sxm" in H100.describe()


def test_axis_roles_pick_the_link():
    m = Mesh("pp=2,dp=2,tp=2,sp=2,x=2", profile=H100)
    inter, intra = H100.inter_link, H100.link
    assert m.links == {"pp": inter, "dp": inter, "tp": intra, "sp": intra, "x": intra}
    # without a profile every device is a thread of this machine: one link for all roles
    plain = Mesh("dp=2,tp=2")
    assert plain.links["dp"] == plain.links["tp"] == MachineProfile.default().link


def test_per_axis_links_of_the_profile_and_link_overrides():
    own = Link(2e-6, 100e9)
    profile = dataclasses.replace(H100, axis_links={"tp": own, "dp": Link(1e-5, 10e9)})
    m = Mesh("dp=2,tp=2,pp=2", profile=profile)
    assert m.links == {"dp": Link(1e-5, 10e9), "tp": own, "pp": H100.inter_link}
    # --link still wins, per axis
    forced = Link(1e-3, 1e6)
    assert Mesh("dp=2,tp=2", links={"tp": forced}, profile=profile).links == {"dp": Link(1e-5, 10e9), "tp": forced}
    # a mesh given a profile later keeps its own overrides
    assert Mesh(Mesh("dp=2,tp=2", links={"dp": forced}), profile=H100).links == {"dp": forced, "tp": H100.link}
    # the mesh's JSON keeps every link and the profile; links that are the profile's are no overrides
    again = Mesh.from_json(json.loads(json.dumps(m.to_json())))
    assert again == m and again.links == m.links


def test_a_slow_data_axis_moves_traffic_off_it():
    """dp=2,tp=2 on H100 (dp across nodes at 50 GB/s) against the same GPUs with NVLink on both
    axes: the slow data axis carries fewer bytes, and the optimal objective can only grow."""
    (params, x, labels), kw = mlp.example_train_args(batch=2048, sizes=(2048, 2048, 10))
    one_node = dataclasses.replace(H100, inter_link=None)

    def plan(profile):
        return _plan(mlp.train_step, (params, x, labels), kw, Mesh("dp=2,tp=2", profile=profile), ("lr",))

    slow, fast = plan(H100), plan(one_node)
    assert slow.mesh.links["dp"].bandwidth == 46e9 and fast.mesh.links["dp"].bandwidth == 370e9

    def dp_bytes(p):
        return sum(c.local_bytes for c in p.collectives if c.axes == ("dp",))

    assert dp_bytes(slow) < dp_bytes(fast)  # here: none at all on dp, against the data-parallel gradients
    assert slow.solver.objective_s >= fast.solver.objective_s


# --- files and errors -----------------------------------------------------------------------------


def test_profile_file_round_trip(tmp_path):
    profile = dataclasses.replace(H100, name="my-cluster", axis_links={"tp": Link(2e-6, 100e9)})
    path = save_profile(profile, str(tmp_path / "cluster.json"))
    assert read_profile(path) == profile
    assert get_profile(path) == profile
    doc = json.loads(open(path).read())
    assert doc["name"] == "my-cluster" and doc["matmul_flops"]["bfloat16"] == 989.4e12
    assert doc["axis_links"] == {"tp": {"latency_s": 2e-6, "bandwidth": 100e9}}
    assert Mesh("dp=2,tp=2", profile=get_profile(path)).links["tp"] == Link(2e-6, 100e9)


REQUIRED = ("name", "flops", "matmul_flops", "mem_bandwidth", "link", "inter_link", "collective_overhead_s")


@pytest.mark.parametrize("key", [*REQUIRED, "fuses_elementwise"])
def test_a_profile_file_missing_a_field_names_it(tmp_path, key):
    doc = {k: v for k, v in H100.to_json().items() if k != key}
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(MeshError, match=f"profile file {path}: machine profile has no '{key}' key"):
        get_profile(str(path))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"matmul_flops": {"int8": 1e15}}, "unknown dtype 'int8'"),
        ({"matmul_flops": {"float32": 1e12}}, r"matmul_flops\['float32'\] is 1e\+12 but flops"),
        ({"matmul_flops": {"bfloat16": -1}}, r"matmul_flops\['bfloat16'\] must be a finite number"),
        ({"inter_link": {"latency_s": 1e-6}}, "machine profile 'inter_link' has no 'bandwidth' key"),
        ({"axis_links": {"tp": {"bandwidth": 1e9}}}, "machine profile 'axis_links' 'tp' has no 'latency_s' key"),
        ({"mem_bandwidth": "fast"}, "MachineProfile.mem_bandwidth must be a number"),
        ({"fuses_elementwise": "yes"}, "fuses_elementwise must be true or false"),
    ],
)
def test_bad_profile_fields(tmp_path, change, message):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({**H100.to_json(), **change}))
    with pytest.raises(MeshError, match=message):
        get_profile(str(path))


def test_unknown_names_and_unreadable_files(tmp_path):
    with pytest.raises(MeshError, match=r"unknown profile 'h200': expected one of h100-sxm, a100-sxm, cpu-here"):
        get_profile("h200")
    with pytest.raises(MeshError, match=r"cannot read profile file .*missing.json: No such file"):
        get_profile(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(MeshError, match=r"bad.json:1:2: not a machine profile \(bad JSON"):
        get_profile(str(bad))


@pytest.mark.parametrize(
    "profile, message",
    [
        ("nope", "unknown profile 'nope'"),
        ("missing-field.json", "machine profile has no 'mem_bandwidth' key"),
    ],
)
def test_cli_profile_errors_exit_2_without_a_traceback(tmp_path, monkeypatch, capsys, profile, message):
    monkeypatch.chdir(ROOT)
    if profile.endswith(".json"):
        doc = {k: v for k, v in H100.to_json().items() if k != "mem_bandwidth"}
        profile = str(tmp_path / profile)
        open(profile, "w").write(json.dumps(doc))
    args = ["compile", "models/mlp.py:train_step", "--example", "example_train_args", "--mesh", "dp=2"]
    assert main([*args, "--profile", profile, "-o", str(tmp_path / "plan.json"), "--quiet"]) == 2
    out, err = capsys.readouterr()
    assert message in err and err.startswith("graphc: error: --profile:")
    assert "Traceback" not in err and out == ""


# --- bfloat16 -------------------------------------------------------------------------------------


def test_bfloat16_keeps_python_scalars_weak_and_matmul_in_bfloat16():
    bf16 = graphc.bfloat16

    def f(a, b):
        return (a @ b) * 0.5 + 1, a + np.ones(8, np.float32)

    g = graphc.trace(f, graphc.ArraySpec((4, 8), bf16), graphc.ArraySpec((8, 8), bf16))
    assert [str(o.type) for o in g.outputs] == ["bf16[4,8]", "f32[4,8]"]
    assert str(graphc.parse(str(g))) == str(g)


def test_bfloat16_llama_traces_prints_and_parses():
    (args, kw) = _llama_specs(graphc.bfloat16)
    g = graphc.trace(llama.train_step, *args, **kw)
    text = str(g)
    assert "%params.embed : bf16[128,64]" in text
    matmuls = [n for n in g.nodes if n.op.name == "matmul"]
    assert matmuls and all(n.outputs[0].dtype == graphc.bfloat16 for n in matmuls)
    assert str(graphc.parse(text)) == text


def test_bfloat16_is_priced_at_two_bytes_and_the_bfloat16_rate():
    (a32, kw) = _llama_specs(np.float32)
    (a16, _kw) = _llama_specs(graphc.bfloat16)
    static = ("n_head", "n_kv_head", "lr")
    p32 = _plan(llama.train_step, a32, kw, Mesh("dp=2", profile=H100), static)
    p16 = _plan(llama.train_step, a16, kw, Mesh("dp=2", profile=H100), static)
    # the parameters and optimizer state dominate: half the bytes, less the int64 tokens and step count
    assert 0.45 < p16.memory.peak_bytes[0] / p32.memory.peak_bytes[0] < 0.55
    # a large matmul is compute bound: bfloat16 at the tensor cores' sustained rate (80% of the
    # datasheet peak, profiles.SUSTAINED_GEMM), float32 at cuBLAS SGEMM's measured share of fp32's
    # (profiles.SUSTAINED_SGEMM, 96.9%)
    for dtype, rate in ((graphc.bfloat16, 0.8 * 989.4e12), (np.float32, 18.88 / 19.49 * 66.9e12)):
        spec = graphc.ArraySpec((4096, 4096), dtype)
        (node,) = graphc.trace(lambda x, y: x @ y, spec, spec).nodes
        assert full_time(node, H100) == pytest.approx(2 * 4096**3 / rate)


# --- the plan: MFU, the profile, the cache key ------------------------------------------------------


@pytest.mark.slow
def test_plan_reports_mfu_and_records_the_profile():
    (args, kw) = _llama_specs(graphc.bfloat16)
    plan = _plan(llama.train_step, args, kw, "dp=2,tp=2", ("n_head", "n_kv_head", "lr"), profile="h100-sxm")
    c = plan.cost
    assert c.peak_dtype == "bfloat16" and c.peak_flops == 989.4e12
    assert c.model_flops > 0 and c.mfu == pytest.approx(c.model_flops / (c.total_s * 4 * c.peak_flops))
    assert 0 < c.mfu < 1
    doc = json.loads(plan.to_json())
    assert doc["cost"]["mfu"] == c.mfu and doc["cost"]["model_flops"] == c.model_flops
    assert doc["mesh"]["profile"]["name"] == "h100-sxm"
    assert doc["mesh"]["profile"]["matmul_flops"]["bfloat16"] == 989.4e12
    assert doc["mesh"]["links"]["dp"] == H100.inter_link.to_json()
    assert f"MFU {c.mfu:.1%}" in plan.summary() and "profile h100-sxm" in plan.summary()
    again = ShardingPlan.from_json(plan.to_json())
    assert again.cost == c and again.mesh.profile == H100
    # plans written before MFU existed still load
    for key in ("model_flops", "peak_dtype", "peak_flops", "mfu"):
        del doc["cost"][key]
    del doc["mesh"]["profile"]["name"]
    old = ShardingPlan.from_json(json.dumps(doc))
    assert old.cost.mfu is None and "MFU" not in old.summary()


def test_the_profile_is_part_of_the_plan_cache_key(tmp_path):
    cache = PlanCache(str(tmp_path))
    keys = {
        cache.key("h", Mesh("dp=2,tp=2", profile=p), Pins(), [], PlanOptions())
        for p in (MachineProfile.default(), H100, get_profile("a100-sxm"), dataclasses.replace(H100, name="other"))
    }
    assert len(keys) == 4


def test_attention_dropout_slowdown_reads_the_measured_rows():
    """FlashAttention's own A100 tables (profiles.FLASH_DROPOUT_MS): at a measured length its ratio,
    between two the slower of them, outside them the nearest; no rows, no cost."""
    assert attention_dropout_slowdown(FLASH_DROPOUT, 2048) == pytest.approx((2.81 / 2.40, 6.50 / 5.45))
    lo, hi = attention_dropout_slowdown(FLASH_DROPOUT, 1024), attention_dropout_slowdown(FLASH_DROPOUT, 2048)
    assert lo == pytest.approx((0.83 / 0.68, 1.86 / 1.62))
    assert attention_dropout_slowdown(FLASH_DROPOUT, 1500) == pytest.approx((max(lo[0], hi[0]), max(lo[1], hi[1])))
    assert attention_dropout_slowdown(FLASH_DROPOUT, 16) == pytest.approx((0.10 / 0.08, 0.15 / 0.11))
    assert attention_dropout_slowdown(FLASH_DROPOUT, 10**6) == pytest.approx((2678.11 / 2147.05, 6643.01 / 5343.19))
    assert attention_dropout_slowdown((), 2048) == (1.0, 1.0)
    assert all(f > 1 and b > 1 for _n, f, b in FLASH_DROPOUT)  # dropout never made the kernel faster
    assert CLUSTER_FIGURES["a100-sxm"].attention_dropout == FLASH_DROPOUT
    assert CLUSTER_FIGURES["h100-sxm"].attention_dropout == ()  # no H100 measurement: not priced
