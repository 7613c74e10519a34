"""The on-disk caches (graphc/core/cache.py): where they live, which folders and files graphc
trusts, and sealed entries. A planted kernel never runs, a tampered plan is solved again, a
corrupt entry is rebuilt, and a folder that is not the user's alone is not used."""

from __future__ import annotations

import dataclasses
import os
import pickle
import stat
import warnings

import numpy as np
import pytest

import graphc
from graphc.core import cache
from graphc.core.errors import CacheWarning
from graphc.core.files import cache_dir
from graphc.passes.partition import PlanCache
from graphc.runtime import codegen


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    """An empty graphc cache folder of this test's own, and no kernels loaded in this process."""
    home = tmp_path / "cache"
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(home))
    monkeypatch.setattr(codegen, "_loaded", {})
    return home


def kernel_func(x):
    return np.tanh(x * 3.0 + 1.0) * x


def run_kernel(x):
    """Compile ``kernel_func`` afresh (a new jit, no kernel loaded in memory) and run it: (result,
    the compiled kernel's Numba dispatcher)."""
    codegen._loaded.clear()
    compiled = graphc.jit(lambda x: kernel_func(x)).compile(x)
    (kernel,) = compiled.executable.program.kernels
    return compiled(x), kernel.func


X = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)


class Planted:
    """A pickle that creates a marker file when it is loaded."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


# --- where caches live -----------------------------------------------------------------------------


def test_cache_dir_is_graphc_cache_dir_else_xdg_else_home(monkeypatch, tmp_path):
    monkeypatch.delenv("GRAPHC_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_dir("kernels") == os.path.join(os.path.expanduser("~"), ".cache", "graphc", "kernels")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir("plans") == str(tmp_path / "xdg" / "graphc" / "plans")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # invalid by the XDG spec: ignored
    assert cache_dir() == os.path.join(os.path.expanduser("~"), ".cache", "graphc")
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir("plans") == str(tmp_path / "mine" / "plans")


def test_cache_folders_are_created_private(cache_home):
    out, _ = run_kernel(X)
    np.testing.assert_allclose(out, kernel_func(X), rtol=1e-6)
    for folder in (cache_home, cache_home / "kernels"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    entries = list((cache_home / "kernels").iterdir())
    assert {p.suffix for p in entries} == {".py", ".nbk"}
    for p in entries:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600


# --- the kernel cache ------------------------------------------------------------------------------


def test_a_kernel_is_loaded_from_the_cache_by_a_second_compile(cache_home):
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        _, first = run_kernel(X)
        out, second = run_kernel(X)
    assert sum(first.stats.cache_misses.values()) == 1 and sum(first.stats.cache_hits.values()) == 0
    assert sum(second.stats.cache_hits.values()) == 1 and sum(second.stats.cache_misses.values()) == 0
    np.testing.assert_allclose(out, kernel_func(X), rtol=1e-6)


@pytest.mark.parametrize("keep_header", [False, True], ids=["raw pickle", "pickle behind a stolen seal"])
def test_a_planted_kernel_entry_never_runs(cache_home, tmp_path, keep_header):
    run_kernel(X)
    (entry,) = (cache_home / "kernels").glob("*.nbk")
    marker = tmp_path / "planted-ran"
    payload = pickle.dumps(Planted(marker))
    header = entry.read_bytes().split(b"\n", 1)[0] + b"\n" if keep_header else b""
    entry.write_bytes(header + payload)
    with pytest.warns(
        CacheWarning, match=f"{entry}: .*(no seal|does not match its seal|truncated or padded).*discarded"
    ):
        out, kernel = run_kernel(X)
    assert not marker.exists()
    np.testing.assert_allclose(out, kernel_func(X), rtol=1e-6)
    assert sum(kernel.stats.cache_misses.values()) == 1  # compiled again, and the entry rewritten
    assert entry.read_bytes().startswith(cache.MAGIC)


def test_a_planted_kernel_source_is_never_imported(cache_home, tmp_path):
    run_kernel(X)
    (source,) = (cache_home / "kernels").glob("*.py")
    marker = tmp_path / "planted-ran"
    source.write_text(f"open({str(marker)!r}, 'w')\n" + source.read_text())
    with pytest.warns(CacheWarning, match=f"{source}: kernel source copy does not hold the kernel source"):
        out, _ = run_kernel(X)
    assert not marker.exists()
    np.testing.assert_allclose(out, kernel_func(X), rtol=1e-6)
    assert not source.read_text().startswith("open(")  # rewritten


@pytest.mark.parametrize("damage", ["truncate", "flip a byte", "empty"])
def test_a_corrupt_kernel_entry_is_compiled_again_and_jit_keeps_working(cache_home, damage):
    run_kernel(X)
    (entry,) = (cache_home / "kernels").glob("*.nbk")
    data = entry.read_bytes()
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip a byte":
        data = data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:]
    else:
        data = b""
    entry.write_bytes(data)
    with pytest.warns(CacheWarning, match=f"{entry}: .*discarded; it is rebuilt"):
        out, kernel = run_kernel(X)
    np.testing.assert_allclose(out, kernel_func(X), rtol=1e-6)
    assert sum(kernel.stats.cache_misses.values()) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        _, again = run_kernel(X)  # the rebuilt entry is good
    assert sum(again.stats.cache_hits.values()) == 1


@pytest.mark.parametrize("mode, why", [(0o777, "world-writable"), (0o770, "group-writable")])
def test_a_cache_folder_others_can_write_is_not_used(cache_home, mode, why):
    cache_home.mkdir()
    cache_home.chmod(mode)
    with pytest.warns(CacheWarning, match=f"{cache_home}: cache folder is {why} .*working without this cache"):
        out, kernel = run_kernel(X)
    np.testing.assert_allclose(out, kernel_func(X), rtol=1e-6)
    assert kernel.stats.cache_path is None  # no disk cache at all
    assert list(cache_home.iterdir()) == []


def test_an_entry_others_can_write_is_not_read(cache_home):
    run_kernel(X)
    (entry,) = (cache_home / "kernels").glob("*.nbk")
    entry.chmod(0o666)
    with pytest.warns(CacheWarning, match=f"{entry}: cache entry is world-writable"):
        _, kernel = run_kernel(X)
    assert sum(kernel.stats.cache_misses.values()) == 1
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600  # rebuilt as the user's own


def test_a_symbolic_link_is_not_followed(cache_home, tmp_path):
    run_kernel(X)
    (entry,) = (cache_home / "kernels").glob("*.nbk")
    elsewhere = tmp_path / "elsewhere.nbk"
    elsewhere.write_bytes(entry.read_bytes())
    entry.unlink()
    entry.symlink_to(elsewhere)
    with pytest.warns(CacheWarning, match=f"{entry}: cache entry is a symbolic link"):
        _, kernel = run_kernel(X)
    assert sum(kernel.stats.cache_misses.values()) == 1
    assert not entry.is_symlink()


# --- the trust checks themselves -----------------------------------------------------------------


def fake_stat(real: os.stat_result, uid: int | None = None, mode: int | None = None) -> os.stat_result:
    fields = list(real)
    if uid is not None:
        fields[stat.ST_UID] = uid
    if mode is not None:
        fields[stat.ST_MODE] = stat.S_IFMT(real.st_mode) | mode
    return os.stat_result(fields)


def test_unsafe_reason_names_the_owner_and_the_write_bits(tmp_path):
    real = os.stat(tmp_path)
    me = os.geteuid()
    assert cache.unsafe_reason(fake_stat(real, uid=me, mode=0o700)) is None
    assert cache.unsafe_reason(fake_stat(real, uid=me, mode=0o755)) is None
    assert (
        cache.unsafe_reason(fake_stat(real, uid=me + 1, mode=0o700))
        == f"is owned by uid {me + 1}, not by you (uid {me})"
    )
    assert cache.unsafe_reason(fake_stat(real, uid=me, mode=0o702)) == "is world-writable (mode 0702)"
    assert cache.unsafe_reason(fake_stat(real, uid=me, mode=0o720)) == "is group-writable (mode 0720)"


def test_a_cache_folder_owned_by_someone_else_is_not_used(cache_home, monkeypatch):
    """Creating a folder of another user needs root; the check sees it through os.stat."""
    cache_home.mkdir(mode=0o700)
    real_stat = os.stat

    def stat_as_if_owned_by_someone_else(path, *args, **kwargs):
        st = real_stat(path, *args, **kwargs)
        return fake_stat(st, uid=os.geteuid() + 1) if os.fspath(path) == str(cache_home) else st

    monkeypatch.setattr(cache.os, "stat", stat_as_if_owned_by_someone_else)
    with pytest.warns(CacheWarning, match=f"{cache_home}: cache folder is owned by uid {os.geteuid() + 1}, not by you"):
        assert cache.private_dir(str(cache_home / "kernels")) is None


def test_a_world_writable_folder_above_the_cache_needs_the_sticky_bit(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(shared / "graphc"))
    shared.chmod(0o777)
    with pytest.warns(CacheWarning, match=f"{shared}: cache folder is world-writable without the sticky bit"):
        assert cache.private_dir(cache_dir("plans")) is None
    shared.chmod(0o1777)  # like /tmp: others cannot replace our folders in it
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert cache.private_dir(cache_dir("plans")) == str(shared / "graphc" / "plans")


def test_a_linked_cache_folder_is_checked_where_the_link_leads(tmp_path, monkeypatch):
    """A cache folder reached through a symbolic link (as the tests link their kernels) is trusted
    only if the folders it resolves through are safe too: a 0700 folder inside a world-writable
    folder without the sticky bit can be replaced by anyone, link or not."""
    shared = tmp_path / "shared"
    target = shared / "kernels"
    target.mkdir(parents=True, mode=0o700)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "kernels").symlink_to(target)
    monkeypatch.setenv("GRAPHC_CACHE_DIR", str(home))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert cache.private_dir(cache_dir("kernels")) == str(home / "kernels")
    shared.chmod(0o777)
    with pytest.warns(CacheWarning, match=f"{shared}: cache folder is world-writable without the sticky bit"):
        assert cache.private_dir(cache_dir("kernels")) is None
    shared.chmod(0o1777)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        assert cache.private_dir(cache_dir("kernels")) == str(home / "kernels")
    target.chmod(0o770)  # the folder it leads to must be the user's alone
    with pytest.warns(CacheWarning, match="is group-writable"):
        assert cache.private_dir(cache_dir("kernels")) is None


def test_seals_check_the_key_the_length_and_the_hash():
    blob = cache.seal("key-a", b"payload")
    assert cache.unseal(blob, "key-a") == (b"payload", "")
    assert cache.unseal(blob, "key-b")[1].startswith("cache entry was built from something else")
    assert cache.unseal(blob[:-1], "key-a")[1].startswith("truncated or padded cache entry (6 bytes")
    assert cache.unseal(blob[:-1] + b"P", "key-a")[1].startswith("corrupt cache entry")
    assert cache.unseal(b"payload", "key-a")[1] == "not a graphc cache entry (no seal)"
    assert cache.unseal(b"", "key-a")[1] == "not a graphc cache entry (no seal)"


# --- the plan cache --------------------------------------------------------------------------------


def mlp_step():
    from graphc.models import mlp

    args, kwargs = mlp.example_train_args(batch=8, sizes=(8, 16, 4))
    return mlp.train_step, args, kwargs


def test_a_tampered_plan_cache_entry_is_solved_again_and_the_loss_is_right(cache_home):
    step, args, kwargs = mlp_step()
    _, want_loss = step(*args, **kwargs)

    def parallel():
        return graphc.parallelize(step, mesh={"dp": 2}, static_argnames=("lr",))

    first = parallel().plan(*args, **kwargs)
    (entry,) = (cache_home / "plans").glob("*.plan")
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600 and entry.read_bytes().startswith(cache.MAGIC)
    assert parallel().plan(*args, **kwargs).timing["cached"] is True  # an intact entry is used

    text = entry.read_text()
    tampered = text.replace('"spec": "[S(0)]"', '"spec": "[R]"').replace('"out_specs": ["[P]"]', '"out_specs": ["[R]"]')
    assert tampered != text
    entry.write_text(tampered)
    pf = parallel()
    with pytest.warns(CacheWarning, match=f"{entry}: corrupt cache entry .*discarded; it is rebuilt"):
        again = pf.plan(*args, **kwargs)
    assert again.timing["cached"] is False  # solved again
    assert again.input_specs() == first.input_specs() and again.output_specs() == first.output_specs()
    assert [n.strategy for n in again.node_choices()] == [n.strategy for n in first.node_choices()]
    _, loss = pf(*args, **kwargs)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)


def test_a_plan_cache_entry_from_something_else_is_not_used(tmp_path):
    step, args, kwargs = mlp_step()
    plan = graphc.parallelize(step, mesh={"dp": 2}, cache=False, static_argnames=("lr",)).plan(*args, **kwargs)
    plans = PlanCache(str(tmp_path / "plans"))
    plans.put("a" * 32, plan)
    os.replace(tmp_path / "plans" / f"{'a' * 32}.plan", tmp_path / "plans" / f"{'b' * 32}.plan")
    with pytest.warns(CacheWarning, match="built from something else"):
        assert plans.get("b" * 32) is None
    assert not (tmp_path / "plans" / f"{'b' * 32}.plan").exists()
    plans.put("a" * 32, plan)
    assert plans.get("a" * 32).to_json() == plan.to_json()


# --- the machine profile kept in the cache folder -----------------------------------------------------


def test_a_stored_profile_others_can_write_is_not_read(cache_home, monkeypatch):
    from graphc.core.profile import MachineProfile
    from graphc.core.profiles import load_profile, save_profile

    monkeypatch.delenv("GRAPHC_PROFILE", raising=False)
    mine = dataclasses.replace(MachineProfile.default(), mem_bandwidth=1.5e12)
    path = save_profile(mine)
    assert path == str(cache_home / "profile.json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and stat.S_IMODE(cache_home.stat().st_mode) == 0o700
    assert load_profile().mem_bandwidth == 1.5e12
    os.chmod(path, 0o646)
    with pytest.warns(CacheWarning, match=f"{path}: machine profile is world-writable .*default profile"):
        assert load_profile() == MachineProfile.default()
