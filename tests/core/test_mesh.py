"""graphc.core.mesh: mesh construction and device numbering, links, machine profiles, calibration, the CLI."""

import json
import math
import os
import time

import numpy as np
import pytest

from graphc.cli import main
from graphc.core.errors import GraphcError, MeshError
from graphc.core.mesh import Mesh, as_mesh, parse_links
from graphc.core.profile import DEFAULT_MATMUL_EFFICIENCY, Link, MachineProfile
from graphc.core.profiles import load_profile, profile_path, save_profile
from graphc.runtime.calibrate import calibrate

DEFAULT = MachineProfile.default()


@pytest.fixture(autouse=True)
def no_stored_profile(tmp_path, monkeypatch):
    """A user's own ~/.cache/graphc/profile.json must not leak into these tests."""
    monkeypatch.setenv("GRAPHC_PROFILE", str(tmp_path / "no-profile.json"))


# --- construction -----------------------------------------------------------------------------


def test_mesh_from_dict_string_and_mesh():
    a = Mesh({"dp": 2, "tp": 4})
    b = Mesh("dp=2,tp=4")
    c = Mesh(a)
    for m in (a, b, c):
        assert m.axis_names == ("dp", "tp")
        assert m.shape == (2, 4)
        assert m.size == 8
        assert m.ndim == 2
        assert m.profile == DEFAULT
    assert a == b == c
    assert repr(a) == "Mesh(dp=2, tp=4)"
    assert str(a) == "dp=2,tp=4"
    assert Mesh(" dp = 2 , tp=4 ") == a
    assert Mesh({"tp": 4, "dp": 2}) != a  # axis order matters
    assert Mesh({"x": np.int64(3)}).shape == (3,)


def test_as_mesh():
    m = Mesh("dp=2")
    assert as_mesh(m) is m
    assert as_mesh({"dp": 2}) == m
    assert as_mesh("dp=2") == m
    with pytest.raises(MeshError, match="a mesh is a dict"):
        as_mesh(2)
    with pytest.raises(MeshError, match="a mesh is a dict"):
        Mesh([("dp", 2)])


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "dp=2,tp",
            r"bad mesh 'dp=2,tp': 'tp' is not NAME=SIZE; expected NAME=SIZE\[,NAME=SIZE...\] such as dp=2,tp=4",
        ),
        ("dp=", r"'dp=' is not NAME=SIZE"),
        ("=2", r"'=2' is not NAME=SIZE"),
        ("dp=0", r"axis 'dp' has size 0; expected an integer >= 1"),
        ("dp=-1", r"axis 'dp' has size '-1'; expected an integer >= 1"),
        ("dp=2.5", r"axis 'dp' has size '2.5'"),
        ("dp=2,dp=4", r"axis 'dp' appears twice"),
        ("2d=2", r"axis name '2d' is not a Python identifier"),
        ("d-p=2", r"axis name 'd-p' is not a Python identifier"),
        ("", r"bad mesh '': expected NAME=SIZE"),
        ("  ", r"expected NAME=SIZE"),
        ("dp=2,,tp=4", r"'' is not NAME=SIZE"),
    ],
)
def test_bad_mesh_strings(text, message):
    with pytest.raises(MeshError, match=message) as info:
        Mesh(text)
    assert isinstance(info.value, GraphcError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    "axes, message",
    [
        ({}, "at least one axis"),
        ({"dp": 0}, "axis 'dp' has size 0"),
        ({"dp": True}, r"axis 'dp' has size True \(bool\)"),
        ({"dp": 2.0}, r"axis 'dp' has size 2.0 \(float\)"),
        ({"dp": "2"}, r"axis 'dp' has size '2' \(str\)"),
        ({1: 2}, "axis name 1 is not a Python identifier"),
    ],
)
def test_bad_mesh_dicts(axes, message):
    with pytest.raises(MeshError, match=message):
        Mesh(axes)


# --- devices ----------------------------------------------------------------------------------


def test_coord_and_device_id_are_row_major():
    m = Mesh("a=2,b=3,c=2")
    ids = np.arange(m.size).reshape(m.shape)
    assert m.devices() == list(range(12))
    for d in m.devices():
        c = m.coord(d)
        assert ids[c] == d
        assert m.device_id(c) == d
    assert m.coord(1) == (0, 0, 1)  # the last axis varies fastest
    assert m.coord(2) == (0, 1, 0)
    assert m.coord(6) == (1, 0, 0)
    for bad in (-1, 12, True, 1.0):
        with pytest.raises(MeshError, match=r"devices 0..11"):
            m.coord(bad)
    for bad in ((0, 0), (2, 0, 0), (0, 3, 0), (0, 0, -1)):
        with pytest.raises(MeshError, match="coordinates"):
            m.device_id(bad)


def test_group_and_groups_along_each_axis():
    m = Mesh("a=2,b=3,c=2")
    ids = np.arange(m.size).reshape(m.shape)
    for axis, name in enumerate(m.axis_names):
        want = np.moveaxis(ids, axis, -1).reshape(-1, m.shape[axis]).tolist()
        assert m.groups(name) == want
        assert m.groups(axis) == want
        for d in m.devices():
            g = m.group(d, name)
            assert d in g
            assert g in want
            assert [m.coord(x)[axis] for x in g] == list(range(m.shape[axis]))
            assert m.group(d, axis) == g
    assert m.group(7, "b") == [7, 9, 11]  # coords (1, 0..2, 1)


def test_axis_index():
    m = Mesh("dp=2,tp=4")
    assert m.axis_index("tp") == 1
    assert m.axis_index(0) == 0
    with pytest.raises(MeshError, match=r"mesh dp=2,tp=4 has no axis 'pp' \(axes: dp, tp\)"):
        m.axis_index("pp")
    with pytest.raises(MeshError, match="out of range"):
        m.group(0, 2)


# --- links ------------------------------------------------------------------------------------


def test_links_default_to_the_profile_link_and_can_be_overridden():
    slow = Link(1e-3, 1e6)
    m = Mesh("dp=2,tp=4", links={"tp": slow}, profile=DEFAULT)
    assert m.links == {"dp": DEFAULT.link, "tp": slow}
    assert list(m.links) == ["dp", "tp"]
    assert Mesh("dp=2,tp=4").links == {"dp": DEFAULT.link, "tp": DEFAULT.link}
    # copying keeps the override; a new profile changes only the axes that were not overridden
    other = MachineProfile(1e9, 1e9, Link(1e-5, 1e9), 0.0, source="test")
    copy = Mesh(m, profile=other)
    assert copy.links == {"dp": other.link, "tp": slow}
    assert Mesh(m, links={"dp": slow}).links == {"dp": slow, "tp": slow}
    assert m != Mesh("dp=2,tp=4")


def test_unknown_or_bad_link_is_rejected():
    with pytest.raises(MeshError, match=r"link given for axis 'pp', but the mesh has axes dp, tp"):
        Mesh("dp=2,tp=4", links={"pp": Link(1e-6, 1e9)})
    with pytest.raises(MeshError, match="link of axis 'dp' must be a Link"):
        Mesh("dp=2", links={"dp": (1e-6, 1e9)})


@pytest.mark.parametrize(
    "args, message",
    [
        ((0, 1e9), "Link.latency_s must be a finite number of seconds > 0"),
        ((1e-6, -1), "Link.bandwidth must be a finite number of bytes/s > 0"),
        ((1e-6, math.inf), "Link.bandwidth"),
        ((math.nan, 1e9), "Link.latency_s"),
        ((True, 1e9), "Link.latency_s must be a number of seconds, got True"),
        (("1us", 1e9), "Link.latency_s must be a number"),
    ],
)
def test_bad_link_values(args, message):
    with pytest.raises(MeshError, match=message):
        Link(*args)


def test_parse_links_and_units():
    links = parse_links("dp=1GB/s:50us,tp=10GB/s:5us")
    assert links == {"dp": Link(50e-6, 1e9), "tp": Link(5e-6, 10e9)}
    assert parse_links(" x = 2 GiB/s : 1.5ms ") == {"x": Link(1.5e-3, 2 * 2**30)}
    assert parse_links("x=1B/s:1s")["x"] == Link(1.0, 1.0)
    assert parse_links("x=3KB/s:2ns")["x"] == Link(2e-9, 3e3)
    assert parse_links("x=3KiB/s:1e2us")["x"] == Link(1e-4, 3 * 1024)
    assert parse_links("x=.5MB/s:1us")["x"].bandwidth == 5e5
    assert parse_links("x=1.5e1TB/s:0.3ms")["x"] == Link(0.3e-3, 1.5e13)
    assert parse_links("x=1MiB/s:1us")["x"].bandwidth == 2**20
    m = Mesh("dp=2,tp=4", links=parse_links("tp=10GB/s:5us"))
    assert m.links["tp"] == Link(5e-6, 10e9)


@pytest.mark.parametrize(
    "text, message",
    [
        ("", r"bad links '': expected NAME=BANDWIDTH:LATENCY\[,...\] such as dp=1GB/s:50us,tp=10GB/s:5us"),
        ("dp=1GB/s", r"bad link 'dp=1GB/s' in 'dp=1GB/s': expected NAME=BANDWIDTH:LATENCY"),
        ("dp:1GB/s:5us", r"bad link 'dp:1GB/s:5us'"),
        ("=1GB/s:5us", r"bad link '=1GB/s:5us'"),
        (
            "dp=1GB:5us",
            r"bad bandwidth '1GB' in 'dp=1GB:5us': expected a number with a unit \(B/s, .*\) such as 10GB/s",
        ),
        ("dp=1Gb/s:5us", r"bad bandwidth '1Gb/s'"),
        ("dp=1e9:5us", r"bad bandwidth '1e9'"),
        ("dp=GB/s:5us", r"bad bandwidth 'GB/s'"),
        (
            "dp=1GB/s:5",
            r"bad latency '5' in 'dp=1GB/s:5': expected a number with a unit \(s, ms, us, .*\) such as 50us",
        ),
        ("dp=1GB/s:5 minutes", r"bad latency '5 minutes'"),
        ("dp=1GB/s:0us", r"bad latency '0us' in 'dp=1GB/s:0us': it must be > 0"),
        ("dp=1GB/s:5us,dp=2GB/s:5us", r"axis 'dp' appears twice"),
        ("2d=1GB/s:5us", r"axis name '2d' is not a Python identifier"),
    ],
)
def test_bad_link_strings(text, message):
    with pytest.raises(MeshError, match=message):
        parse_links(text)


# --- JSON, equality, hashing ------------------------------------------------------------------


def test_mesh_json_round_trip_equality_and_hash():
    m = Mesh("dp=2,tp=4", links={"tp": Link(5e-6, 10e9)}, profile=DEFAULT)
    doc = m.to_json()
    assert doc["axes"] == {"dp": 2, "tp": 4}
    assert list(doc["axes"]) == ["dp", "tp"]
    assert doc["links"] == {"dp": {"latency_s": 20e-6, "bandwidth": 6e9}, "tp": {"latency_s": 5e-6, "bandwidth": 10e9}}
    assert doc["profile"] == DEFAULT.to_json()
    again = Mesh.from_json(json.loads(json.dumps(doc)))
    assert again == m
    assert hash(again) == hash(m)
    assert again.to_json() == doc
    assert len({m, again, Mesh("dp=2,tp=4"), Mesh("dp=2,tp=4")}) == 2
    # a link equal to the profile's is not an override: a new profile replaces it
    other = MachineProfile(1e9, 1e9, Link(1e-5, 1e9), 0.0, source="test")
    assert Mesh(again, profile=other).links["dp"] == other.link


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"links": {}, "profile": {}}, "mesh has no 'axes' key"),
        ({"axes": {"dp": 2}, "links": {}}, "mesh has no 'profile' key"),
        ({"axes": [["dp", 2]], "links": {}, "profile": {}}, "mesh 'axes' must be an object"),
        ({"axes": {"dp": 0}, "links": {}, "profile": DEFAULT.to_json()}, "axis 'dp' has size 0"),
        (
            {"axes": {"dp": 2}, "links": {"dp": {"bandwidth": 1e9}}, "profile": DEFAULT.to_json()},
            "mesh link 'dp' has no 'latency_s' key",
        ),
        (
            {"axes": {"dp": 2}, "links": {"tp": Link(1e-6, 1e9).to_json()}, "profile": DEFAULT.to_json()},
            "link given for axis 'tp'",
        ),
    ],
)
def test_bad_mesh_json(doc, message):
    with pytest.raises(MeshError, match=message):
        Mesh.from_json(doc)


def test_profile_json_round_trip_and_bad_keys():
    p = MachineProfile(1.5e11, 1.2e10, Link(3e-5, 5e9), 4e-5, source="calibrated on x")
    assert MachineProfile.from_json(json.loads(json.dumps(p.to_json()))) == p
    doc = p.to_json()
    for key in ("flops", "mem_bandwidth", "link", "collective_overhead_s"):
        broken = {k: v for k, v in doc.items() if k != key}
        with pytest.raises(MeshError, match=f"machine profile has no '{key}' key"):
            MachineProfile.from_json(broken)
    with pytest.raises(MeshError, match="MachineProfile.flops must be a number of flop/s, got 'fast'"):
        MachineProfile.from_json({**doc, "flops": "fast"})
    with pytest.raises(MeshError, match="machine profile 'link' has no 'bandwidth' key"):
        MachineProfile.from_json({**doc, "link": {"latency_s": 1e-6}})
    with pytest.raises(MeshError, match="machine profile must be a JSON object"):
        MachineProfile.from_json([1, 2])


def test_default_profile_is_the_documented_constants():
    table = {
        dtype: {key: peak * eff for key, eff in DEFAULT_MATMUL_EFFICIENCY.items()}
        for dtype, peak in (("float64", 50e9), ("float32", 100e9))
    }
    assert DEFAULT == MachineProfile(
        100e9,
        8e9,
        Link(20e-6, 6e9),
        20e-6,
        "default",
        matmul_flops={"float64": 50e9, "float32": 100e9},
        matmul_table=table,
    )
    assert "100.0 GF/s" in DEFAULT.describe()
    # every device its own core, no dispatch overhead: plans do not depend on the machine
    assert (DEFAULT.cores, DEFAULT.dispatch_s, DEFAULT.device_share(8), DEFAULT.op_overhead(8)) == (None, 0.0, 1.0, 0.0)


# --- the stored profile -----------------------------------------------------------------------


def test_profile_path(monkeypatch, tmp_path):
    monkeypatch.setenv("GRAPHC_PROFILE", str(tmp_path / "p.json"))
    assert profile_path() == str(tmp_path / "p.json")
    monkeypatch.delenv("GRAPHC_PROFILE")
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "cache"))
    assert profile_path() == str(tmp_path / "cache" / "profile.json")
    monkeypatch.delenv("GRAPHC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert profile_path() == str(tmp_path / "xdg" / "graphc" / "profile.json")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert profile_path() == os.path.join(os.path.expanduser("~"), ".cache", "graphc", "profile.json")


def test_save_and_load_profile(monkeypatch, tmp_path):
    path = tmp_path / "sub" / "profile.json"
    monkeypatch.setenv("GRAPHC_PROFILE", str(path))
    assert load_profile() == DEFAULT  # no file: the defaults, without measuring
    p = MachineProfile(2e11, 1e10, Link(1e-5, 4e9), 3e-5, source="test")
    assert save_profile(p) == str(path)
    assert load_profile() == p
    assert Mesh("dp=2").profile == p  # meshes without an explicit profile use the stored one
    assert os.listdir(path.parent) == ["profile.json"]  # no temporary file left behind
    other = tmp_path / "other.json"
    save_profile(DEFAULT, str(other))
    assert load_profile(str(other)) == DEFAULT


def test_bad_profile_file_names_the_file(monkeypatch, tmp_path):
    path = tmp_path / "profile.json"
    monkeypatch.setenv("GRAPHC_PROFILE", str(path))
    path.write_text("{not json")
    with pytest.raises(MeshError, match=rf"{path}:1:2: not a machine profile \(bad JSON"):
        load_profile()
    with pytest.raises(MeshError, match=str(path)):
        Mesh("dp=2")
    path.write_text('{"flops": 1e9}')
    with pytest.raises(MeshError, match=rf"{path}: machine profile has no 'link' key"):
        load_profile()


# --- calibration and the CLI ------------------------------------------------------------------


def test_calibrate_quick_measures_positive_finite_numbers():
    start = time.perf_counter()
    p = calibrate(quick=True)
    assert time.perf_counter() - start < 2
    for x in (p.flops, p.mem_bandwidth, p.link.bandwidth, p.link.latency_s, p.collective_overhead_s):
        assert math.isfinite(x) and x > 0
    assert p.source.startswith("calibrated on ")
    assert MachineProfile.from_json(p.to_json()) == p


def test_cli_calibrate_writes_a_loadable_profile(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert main(["calibrate", "--quick", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "GF/s" in printed and "GB/s" in printed and " us" in printed
    assert f"wrote {out}" in printed
    p = load_profile(str(out))
    assert p.source.startswith("calibrated on ")
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []


def test_cli_calibrate_show(monkeypatch, tmp_path, capsys):
    path = tmp_path / "profile.json"
    monkeypatch.setenv("GRAPHC_PROFILE", str(path))
    assert main(["calibrate", "--show"]) == 0
    printed = capsys.readouterr().out
    assert f"machine profile {path} (no such file: the built-in defaults)" in printed
    assert "source: default" in printed
    assert not path.exists()  # --show never measures or writes
    save_profile(MachineProfile(2e11, 1e10, Link(1e-5, 4e9), 3e-5, source="test"), str(path))
    assert main(["calibrate", "--show"]) == 0
    printed = capsys.readouterr().out
    assert "200.0 GF/s" in printed and "source: test" in printed
    path.write_text("[")
    assert main(["calibrate", "--show"]) == 2
    assert f"graphc: error: {path}:1:2" in capsys.readouterr().err
