"""The MPI backend (runtime/mpi.py, runtime/mpi_world.py, runtime/ranks.py) against the threaded one.

Jobs run under ``mpiexec -n 2`` and ``-n 4`` (4 ranks share this machine's 2 cores: MPICH needs no
flag for it, and graphc's waits yield the core when the node has more ranks than cores). Every
collective kind and layout gives the threaded backend's bits; so does the GPT training step (data
and tensor parallel) and a pipeline (GPipe and 1F1B), with whole inputs, a ShardedInput and a
memory-mapped .npy, and with state passed back as ShardedArrays. Bad launches stop every rank with
exit status 2 at once; a rank that raises ends the job with a message naming it; ranks given their
own GRAPHC_CACHE_DIR each compile and still agree. Without mpi4py, the error gives the install
command (no MPI needed for those tests).

Each job's time is bounded (subprocess timeout), so nothing here can hang. The threaded reference
is computed first, in this process, with the jobs' cache directory: the ranks then load its plan
and kernels instead of each solving the ILP on the shared cores.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import graphc
from graphc.core.pytree import flatten
from graphc.models import gpt
from tests.helpers import cache_of_its_own, mpiexec_path

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
JOBS = os.path.join(ROOT, "tests", "runtime", "mpi_jobs.py")
STATIC = ("n_head", "lr")


MPIEXEC = mpiexec_path()
needs_mpi = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or MPIEXEC is None,
    reason="the MPI backend needs mpi4py and mpiexec: pip install -e '.[mpi]'",
)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """The jobs' environment: one cache directory for the module, the default machine profile."""
    base = tmp_path_factory.mktemp("mpi")
    return dict(
        os.environ, GRAPHC_CACHE_DIR=cache_of_its_own(base / "cache"), GRAPHC_PROFILE=str(base / "no-profile.json")
    )


def mpirun(n: int, *args: str, env: dict, timeout: float = 120.0) -> subprocess.CompletedProcess:
    assert MPIEXEC is not None
    return subprocess.run(
        [MPIEXEC, "-n", str(n), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def _threaded(monkeypatch, env: dict, mesh: str, microbatches: int = 1, schedule: str = "1f1b"):
    """The step on threads, with the jobs' cache and profile; (first step, second step) leaves."""
    monkeypatch.setenv("GRAPHC_CACHE_DIR", env["GRAPHC_CACHE_DIR"])
    monkeypatch.setenv("GRAPHC_PROFILE", env["GRAPHC_PROFILE"])
    (params, state, tokens, targets), kwargs = gpt.example_train_args(batch=8, seq=16, n_layer=1)
    pf = graphc.parallelize(
        gpt.train_step, mesh=mesh, static_argnames=STATIC, microbatches=microbatches, schedule=schedule
    )
    first = pf(params, state, tokens, targets, **kwargs)
    again = pf(first[0], first[1], tokens, targets, **kwargs) if microbatches == 1 else None
    return flatten(first)[0], None if again is None else flatten(again)[0]


def _ranks_ok(stdout: str) -> list[int]:
    """The ranks that printed ``ok <rank>`` (lines of several ranks may interleave)."""
    return sorted(int(r) for r in re.findall(r"ok (\d+)", stdout))


def _assert_same_bits(got: np.ndarray, want) -> None:
    want = np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got.tobytes() == want.tobytes(), f"max abs diff {np.max(np.abs(got - want))}"


@needs_mpi
@pytest.mark.parametrize("n", [2, 4])
def test_every_collective_gives_the_threaded_bits(env, n):
    res = mpirun(n, sys.executable, JOBS, "collectives", env=env)
    assert res.returncode == 0, res.stderr
    assert _ranks_ok(res.stdout) == list(range(n)), res.stdout


@pytest.mark.slow
@needs_mpi
@pytest.mark.parametrize(
    "n, mesh, microbatches, schedule",
    [
        pytest.param(2, "dp=2", 1, "", marks=pytest.mark.long),  # 18 s loaded; dp=2,tp=2 covers it
        (4, "dp=2,tp=2", 1, ""),
        (2, "pp=2", 2, "1f1b"),
        (4, "pp=2,dp=2", 2, "gpipe"),
    ],
)
def test_gpt_train_step_equals_the_threaded_backend_bit_for_bit(
    env, tmp_path, monkeypatch, n, mesh, microbatches, schedule
):
    first, again = _threaded(monkeypatch, env, mesh, microbatches, schedule or "1f1b")
    out = tmp_path / "out.npz"
    extra = (str(microbatches), schedule) if microbatches > 1 else ()
    res = mpirun(n, sys.executable, JOBS, "step", mesh, str(out), *extra, env=env)
    assert res.returncode == 0, res.stderr
    assert _ranks_ok(res.stdout) == list(range(n)), res.stdout
    got = np.load(out)
    for i, want in enumerate(first):
        _assert_same_bits(got[f"first_{i}"], want)
    for i, want in enumerate(again or ()):  # the second step, its state passed back as ShardedArrays
        _assert_same_bits(got[f"again_{i}"], want)


@needs_mpi
@pytest.mark.parametrize(
    "n, mesh, schedule",
    [
        (2, "pp=2", "1f1b"),
        pytest.param(2, "dp=2", "1f1b", marks=pytest.mark.slow),  # gradient accumulation: one stage, no pp
        pytest.param(4, "dp=2,tp=2", "1f1b", marks=pytest.mark.long),  # 12 s loaded: accumulation, as dp=2's
        pytest.param(4, "pp=2,dp=2", "gpipe", marks=pytest.mark.slow),
        pytest.param(4, "pp=2,tp=2", "1f1b", marks=pytest.mark.slow),  # split parameters stay as they are
    ],
)
def test_a_pipeline_trains_with_its_state_fed_back_as_on_threads(env, tmp_path, monkeypatch, n, mesh, schedule):
    """Three GPT training steps on a pipeline, each taking the parameters and optimizer state the
    last returned: under MPI these are ShardedArrays held by the stage that updated them, and the
    tied embedding one stage updates is read by the other. Every step's results equal the
    threaded loop's bit for bit."""
    monkeypatch.setenv("GRAPHC_CACHE_DIR", env["GRAPHC_CACHE_DIR"])
    monkeypatch.setenv("GRAPHC_PROFILE", env["GRAPHC_PROFILE"])
    (params, state, tokens, targets), kwargs = gpt.example_train_args(batch=8, seq=16, n_layer=1)
    pf = graphc.parallelize(gpt.train_step, mesh=mesh, static_argnames=STATIC, microbatches=2, schedule=schedule)
    want = []
    for _ in range(3):
        params, state, loss = pf(params, state, tokens, targets, **kwargs)
        want.append(flatten((params, state, loss))[0])
    out = tmp_path / "out.npz"
    res = mpirun(n, sys.executable, JOBS, "train", mesh, str(out), "3", "2", schedule, env=env, timeout=240)
    assert res.returncode == 0, res.stderr
    assert _ranks_ok(res.stdout) == list(range(n)), res.stdout
    got = np.load(out)
    for s, leaves in enumerate(want):
        for i, w in enumerate(leaves):
            _assert_same_bits(got[f"step{s}_{i}"], w)
    assert not np.array_equal(got["step0_0"], got["step2_0"])  # the state moved from step to step


@pytest.mark.slow
@needs_mpi
def test_a_sharded_array_from_a_dp_step_feeds_a_tp_step(env, tmp_path, monkeypatch):
    """Under MPI, ShardedArrays a dp=2 step returned go to tp=2 steps that want them in other
    specs, and are redistributed on the ranks (graphc/api/reshard.py): the GPT step's replicated
    state cut into the tp pieces (local slices), and a batch-split activation all-gathered or
    re-split by an all-to-all. The results equal the threaded backend's, which passes whole
    arrays, bit for bit, and the single-device results."""
    from tests.runtime.mpi_jobs import head, hidden

    monkeypatch.setenv("GRAPHC_CACHE_DIR", env["GRAPHC_CACHE_DIR"])
    monkeypatch.setenv("GRAPHC_PROFILE", env["GRAPHC_PROFILE"])
    (params, state, tokens, targets), kwargs = gpt.example_train_args(batch=8, seq=16, n_layer=1)
    dp = graphc.parallelize(gpt.train_step, mesh="dp=2", static_argnames=STATIC)
    tp = graphc.parallelize(gpt.train_step, mesh="tp=2", static_argnames=STATIC)
    p1, s1, _ = dp(params, state, tokens, targets, **kwargs)
    result = tp(p1, s1, tokens, targets, **kwargs)
    rng = np.random.default_rng(0)
    x, w, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((16, 8), (8, 12), (12, 6)))
    h = graphc.parallelize(hidden, mesh="dp=2")(x, w)
    ys = [graphc.parallelize(head, mesh="tp=2", in_specs=pins)(h, w2) for pins in (("R", "S(1)"), ("S(1)", "R"))]
    want = flatten((result, ys))[0]
    out = tmp_path / "out.npz"
    res = mpirun(2, sys.executable, JOBS, "reshard", str(out), env=env, timeout=240)
    assert res.returncode == 0, res.stderr
    assert _ranks_ok(res.stdout) == [0, 1], res.stdout
    got = np.load(out)
    assert len(got.files) == len(want)
    for i, w_i in enumerate(want):
        _assert_same_bits(got[f"r{i}"], w_i)
    # against one device: h and h @ w2 are sums of 8 and 12 float32 products in any order, squared
    # and summed over 6; each result within 2 * (8 + 12 + 6 + 4) roundings of its terms' magnitudes
    single = graphc.jit(head)(graphc.jit(hidden)(x, w), w2)
    mag = np.abs(np.tanh(x.astype(np.float64) @ w)) @ np.abs(w2) + (np.abs(x) @ np.abs(w)) @ np.abs(w2)
    bound = 2 * (8 + 12 + 6 + 4) * float(np.finfo(np.float32).eps) * np.sum(mag**2, axis=1)
    for y in ys:
        assert np.all(np.abs(np.asarray(y, np.float64) - single) <= bound)


@needs_mpi
def test_rank_count_not_the_mesh_size_stops_every_rank_with_status_2(env):
    start = time.monotonic()
    res = mpirun(
        3,
        sys.executable,
        "-m",
        "graphc",
        "run",
        "models/gpt.py:train_step",
        "--example",
        "example_train_args",
        "--mesh",
        "dp=2,tp=2",
        "--backend",
        "mpi",
        env=env,
        timeout=30,
    )
    elapsed = time.monotonic() - start
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("has 4 devices but this MPI job has 3 processes") == 3, res.stderr
    assert "mpiexec -n 4" in res.stderr and "Traceback" not in res.stderr
    assert elapsed < 5.0 + 5.0  # the 5 s, with room for a loaded test machine


@needs_mpi
@pytest.mark.parametrize("n, mesh", [(2, "dp=2"), (2, "tp=2"), (2, "pp=2")])
def test_results_share_no_memory_with_the_arguments_on_any_rank(env, n, mesh):
    res = mpirun(n, sys.executable, JOBS, "alias", mesh, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    assert _ranks_ok(res.stdout) == list(range(n)), res.stdout


def _ends_within(pids: dict[int, int], seconds: float) -> dict[int, float]:
    """Seconds until each process ends (pidfds: the test waits for the exits, not for a time);
    the ones still running after ``seconds`` are missing from the result."""
    import select

    fds = {}
    for rank, pid in pids.items():
        try:
            fds[os.pidfd_open(pid)] = rank
        except ProcessLookupError:
            fds[-1 - rank] = rank  # gone already
    start, ended = time.monotonic(), {}
    try:
        for fd, rank in list(fds.items()):
            if fd < 0:
                ended[rank] = 0.0
                del fds[fd]
        while fds and time.monotonic() - start < seconds:
            ready, _, _ = select.select(list(fds), [], [], max(0.0, seconds - (time.monotonic() - start)))
            for fd in ready:
                ended[fds.pop(fd)] = time.monotonic() - start
                os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)
    return ended


def _launch(launcher: str, n: int, argv: list[str]) -> list[str]:
    """The command that starts ``argv`` on ``n`` ranks: ``hydra+guard`` is the default mpiexec (hydra)
    with every rank under graphc's rank guard (runtime/rank_guard.py), ``hydra`` the same mpiexec
    bare, ``gforker`` MPICH's other launcher."""
    from graphc.runtime.rank_guard import hydra_command, is_hydra

    assert MPIEXEC is not None
    if launcher == "gforker":
        return [os.path.join(os.path.dirname(MPIEXEC), "mpiexec.gforker"), "-n", str(n), *argv]
    if not is_hydra(MPIEXEC):
        pytest.skip(f"{MPIEXEC} is not MPICH's hydra")
    report = "-print-all-exitcodes"  # (hydra prints every rank's wait status; nothing else changes)
    if launcher == "hydra":
        return [MPIEXEC, report, "-n", str(n), *argv]
    return [MPIEXEC, report, *hydra_command(MPIEXEC, n, argv)[1:]]


def _hydra_statuses(output: str) -> list[int]:
    """Each rank's exit status, in rank order, from ``-print-all-exitcodes`` (wait statuses)."""
    found = re.search(r"Exit codes: \[[^\]]*\] ([\d,]+)", output)
    assert found, output
    return [os.waitstatus_to_exitcode(int(s)) for s in found.group(1).split(",")]


def _start_loop(launcher: str, env: dict):
    """4 ranks all-reducing in a loop, the other core busy: (job, busy, lines, pids once every rank
    said it is in the loop). The test waits for the ranks' readiness lines, never for a time."""
    import queue
    import threading

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # the other core busy
    job = subprocess.Popen(
        _launch(launcher, 4, [sys.executable, JOBS, "loop"]),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(ln) for ln in job.stdout or ()], daemon=True)
    reader.start()
    pids: dict[int, int] = {}
    deadline = time.monotonic() + 120
    while len(pids) < 4:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        for rank, pid in re.findall(r"ready (\d+) (\d+)", line):  # (ranks' lines may share one)
            pids[int(rank)] = int(pid)
    return job, busy, lines, reader, pids


def _stop(job, busy) -> None:
    busy.kill()
    busy.wait()
    if job.poll() is None:
        job.kill()
        job.wait()


@needs_mpi
@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="watching processes needs pidfds (Linux)")
@pytest.mark.parametrize("launcher", ["hydra", "gforker", pytest.param("hydra+guard", marks=pytest.mark.slow)])
def test_a_rank_killed_outright_ends_every_survivor_within_5_s_naming_it(env, launcher):
    """kill -9 of one of 4 ranks while all of them are in all-reduces, with the other core busy.
    Every survivor's watchdog sees the process end (runtime/mpi_world.py), prints a line naming the
    lost rank and ends its rank with status 1 within 5 s. Under the default mpiexec (hydra), bare
    as a user types it, ``import graphc`` put every rank under graphc's rank guard
    (runtime/guarding.py): the lost rank's guard names the signal, hydra kills no survivor before
    it said so, and hydra reports each rank's own status. The same with the guard run explicitly (``-disable-auto-cleanup``), and
    under MPICH's gforker, which needs no guard."""
    import signal

    job, busy, lines, reader, pids = _start_loop(launcher, env)
    try:
        os.kill(pids[2], signal.SIGKILL)
        ended = _ends_within({r: p for r, p in pids.items() if r != 2}, 5.0)
        job.wait(timeout=30)
        reader.join(10)
    finally:
        _stop(job, busy)
    output = "".join(lines.queue)
    assert sorted(ended) == [0, 1, 3], (ended, output)  # every survivor ended within 5 s
    assert job.returncode != 0, output
    named = re.findall(r"graphc: rank (\d+): stopping: rank (\d+) was lost", output)
    assert sorted(named) == [("0", "2"), ("1", "2"), ("3", "2")], output  # each survivor names the rank
    if launcher == "gforker":
        for rank in (0, 1, 3):
            assert f"[0]{rank}:Return code = 1" in output, output
        return
    # the lost rank's guard names its signal; hydra saw every rank end with its own status
    assert f"graphc: rank 2: its process {pids[2]} was killed by signal 9 (SIGKILL)" in output, output
    assert _hydra_statuses(output) == [1, 1, 128 + 9, 1], output
    assert job.returncode == 137, output


@needs_mpi
def test_ctrl_c_ends_every_rank_under_the_rank_guard(env):
    """Ctrl-C to mpiexec (hydra forwards SIGINT to every rank's process group, guard included):
    every rank stops with KeyboardInterrupt and the job ends with status 130."""
    import signal

    job, busy, lines, reader, pids = _start_loop("hydra", env)
    try:
        job.send_signal(signal.SIGINT)
        ended = _ends_within(pids, 5.0)
        job.wait(timeout=30)
        reader.join(10)
    finally:
        _stop(job, busy)
    output = "".join(lines.queue)
    assert sorted(ended) == [0, 1, 2, 3], (ended, output)
    assert job.returncode == 130, output
    assert output.count("KeyboardInterrupt") >= 1 and "was killed by signal" not in output, output


@pytest.mark.slow
@needs_mpi
def test_a_rank_that_raises_ends_the_job_naming_it(env):
    start = time.monotonic()
    res = mpirun(2, sys.executable, JOBS, "raise", env=env, timeout=60)
    elapsed = time.monotonic() - start
    assert res.returncode != 0
    assert "ValueError: boom on rank 1" in res.stderr  # the failed rank's traceback
    assert "rank 0: stopping: rank 1 failed: ValueError: boom on rank 1" in res.stderr  # the survivor's line
    assert "finished a step without rank 1" not in res.stdout
    assert elapsed < 45, elapsed  # compile + a bounded stop, not the 20 s collective timeout twice


@pytest.mark.slow
@needs_mpi
def test_ranks_with_their_own_cache_directories_share_nothing_but_mpi(env, tmp_path):
    base = {k: v for k, v in env.items() if k != "GRAPHC_CACHE_DIR"}
    run = [sys.executable, "-m", "graphc", "run", "models/mlp.py:train_step", "--example", "example_train_args"]
    run += ["--mesh", "dp=2", "--backend", "mpi", "--repeat", "1"]
    assert MPIEXEC is not None
    cmd = [MPIEXEC, "-n", "1", "-env", "GRAPHC_CACHE_DIR", str(tmp_path / "rank0"), *run]
    cmd += [":", "-n", "1", "-env", "GRAPHC_CACHE_DIR", str(tmp_path / "rank1"), *run]
    res = subprocess.run(cmd, cwd=ROOT, env=base, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "equals graphc's interpreter: yes" in res.stdout and "plan hash" in res.stdout
    for r in (0, 1):  # each rank planned and compiled into its own directory
        assert list((tmp_path / f"rank{r}" / "plans").iterdir())


# --- without MPI ----------------------------------------------------------------------------------


def test_without_mpi4py_the_cli_exits_2_with_the_install_command(monkeypatch, capsys):
    from graphc.cli.main import main

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py now fails, as when it is missing
    rc = main(
        ["run", "models/gpt.py:train_step", "--example", "example_train_args", "--mesh", "dp=2", "--backend", "mpi"]
    )
    err = capsys.readouterr().err
    assert rc == 2
    assert "pip install 'graphc[mpi]'" in err and "pip install -e '.[mpi]'" in err


def test_without_mpi4py_parallelize_names_the_install_command(monkeypatch):
    from graphc.runtime.mpi_world import MpiUnavailable

    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(MpiUnavailable, match=r"pip install 'graphc\[mpi\]'"):
        graphc.parallelize(gpt.train_step, mesh="dp=2", backend="mpi")
    with pytest.raises(graphc.GraphcError, match="backend must be one of"):
        graphc.parallelize(gpt.train_step, mesh="dp=2", backend="nccl")


@pytest.mark.slow
def test_sharded_input_and_memmap_on_threads_build_only_each_devices_piece(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", cache_of_its_own(tmp_path / "cache"))
    (params, state, tokens, targets), kwargs = gpt.example_train_args(batch=8, seq=16, n_layer=1)
    pf = graphc.parallelize(gpt.train_step, mesh="dp=2", static_argnames=STATIC)
    want = flatten(pf(params, state, tokens, targets, **kwargs))[0]
    asked = []

    def make_tokens(index):
        asked.append(index)
        return tokens[index]

    np.save(tmp_path / "targets.npy", targets)
    lazy_tokens = graphc.sharded_input(tokens.shape, tokens.dtype, make_tokens)
    got = flatten(pf(params, state, lazy_tokens, np.load(tmp_path / "targets.npy", mmap_mode="r"), **kwargs))[0]
    for a, b in zip(got, want):
        _assert_same_bits(np.asarray(a), b)
    assert sorted((i[0].start, i[0].stop) for i in asked) == [(0, 4), (4, 8)]  # one piece per device


def test_sharded_input_checks_what_its_function_returns():
    bad = graphc.sharded_input((4, 3), np.float32, lambda index: np.zeros((2, 2)))
    with pytest.raises(graphc.GraphcError, match=r"returned shape \[2, 2\], expected \[4, 3\]"):
        np.asarray(bad)


def test_sharded_array_gather_on_threads_is_the_whole_value(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", cache_of_its_own(tmp_path / "cache"))
    (params, state, tokens, targets), kwargs = gpt.example_train_args(batch=8, seq=16, n_layer=1)
    pf = graphc.parallelize(gpt.train_step, mesh="dp=2", static_argnames=STATIC, sharded_state=True)
    new_params = pf(params, state, tokens, targets, **kwargs)[0]
    leaf = flatten(new_params)[0][0]
    assert isinstance(leaf, graphc.ShardedArray)
    np.testing.assert_array_equal(leaf.gather(root=0), np.asarray(leaf))
    assert leaf.index(1) == tuple(slice(0, n) for n in leaf.shape)  # data parallel: every device holds it all
