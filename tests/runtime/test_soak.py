"""Long runs hold: the GPT training step on ``dp=2,tp=2`` fed its own state step after step, on
device threads and under ``mpiexec -n 4``. Between step STEPS // 10 (after the first steps'
compiles and pool fills) and the last step, the process's resident memory stays within 5% and
its threads and open files do not grow; at the end the state trains on as it does on one device
(the last state's next step on the mesh equals that step on one device), and under MPI the state
equals the threaded run's bit for bit. The short form (100 steps on threads) runs in the quick
profile; the long ones (1,000 steps on threads, 200 under MPI: about a minute each on a loaded
2-core machine) are marked slow.
"""

from __future__ import annotations

import os
import re
import sys

import numpy as np
import pytest

import graphc
from graphc.core.pytree import flatten
from graphc.models import gpt
from tests.runtime.mpi_jobs import STATIC, example, soak_steps
from tests.runtime.test_mpi import JOBS, env, mpirun, needs_mpi  # noqa: F401 - env is a fixture
from tests.runtime.test_parallel_run import assert_close

MESH = "dp=2,tp=2"
pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc (Linux)")


def _check_usage(first: tuple[int, ...], last: tuple[int, ...], who: str) -> None:
    rss0, threads0, fds0 = first
    rss1, threads1, fds1 = last
    assert abs(rss1 - rss0) <= 0.05 * rss0, f"{who}: RSS {rss0 / 2**20:.1f} MiB -> {rss1 / 2**20:.1f} MiB"
    assert threads1 <= threads0, f"{who}: threads {threads0} -> {threads1}"
    assert fds1 <= fds0, f"{who}: open files {fds0} -> {fds1}"


def _threads_run(steps: int):
    """STEPS steps on threads, the state kept on the devices (ShardedArrays) from step to step:
    (the parallelized step, the last state, the losses, usage at STEPS // 10 and at the end)."""
    pf = graphc.parallelize(gpt.train_step, mesh=MESH, static_argnames=STATIC, sharded_state=True)
    params, state, losses, first, last = soak_steps(pf, steps)
    return pf, (params, state), losses, first, last


def _trains_on_as_on_one_device(pf, last_state) -> None:
    """The last state's next step on the mesh and on one device: equal to float32 tolerance (the
    devices sum their pieces in another order)."""
    (_, _, tokens, targets), kwargs = example()
    params, state = graphc.tree_map(np.asarray, last_state)
    one = graphc.jit(gpt.train_step, static_argnames=STATIC)
    want = one(params, state, tokens, targets, **kwargs)
    got = graphc.tree_map(np.asarray, pf(params, state, tokens, targets, **kwargs))
    assert_close(got, want)


@pytest.mark.parametrize("steps", [100, pytest.param(1000, marks=pytest.mark.long)])  # 1,000 steps: 25 s
def test_a_long_run_on_threads_holds_its_memory_threads_and_files(steps):
    pf, last, losses, first, end = _threads_run(steps)
    _check_usage(first, end, f"{steps} steps on {MESH} threads")
    assert losses[-1] < losses[0]  # it trained
    _trains_on_as_on_one_device(pf, last)


@pytest.mark.long
@pytest.mark.slow
@needs_mpi
@pytest.mark.parametrize("steps", [200])
def test_a_long_run_under_mpi_holds_on_every_rank(env, tmp_path, monkeypatch, steps):  # noqa: F811
    monkeypatch.setenv("GRAPHC_CACHE_DIR", env["GRAPHC_CACHE_DIR"])  # the ranks load the plan and kernels
    monkeypatch.setenv("GRAPHC_PROFILE", env["GRAPHC_PROFILE"])
    pf, last, losses, _first, _end = _threads_run(steps)
    out = tmp_path / "out.npz"
    res = mpirun(4, sys.executable, JOBS, "soak", MESH, str(steps), str(out), env=env, timeout=900)
    assert res.returncode == 0, res.stderr
    usage = {
        int(m[0]): [int(v) for v in m[1:]] for m in re.findall(r"usage (\d+) " + " ".join([r"(\d+)"] * 6), res.stdout)
    }
    assert sorted(usage) == [0, 1, 2, 3], res.stdout
    for rank, u in usage.items():
        _check_usage(tuple(u[:3]), tuple(u[3:]), f"rank {rank}, {steps} steps under mpiexec -n 4")
    got = np.load(out)
    want = [np.asarray(x) for x in flatten(last)[0]]
    for i, w in enumerate(want):  # the same plan on both backends: the same bits
        assert got[f"arr_{i}"].tobytes() == w.tobytes(), f"state leaf {i} differs from the threaded run"
    np.testing.assert_array_equal(got["losses"], np.array(losses))
