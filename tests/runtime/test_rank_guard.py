"""runtime/guarding.py and runtime/rank_guard.py without MPI: a rank's exit status passes through,
a signal becomes 128 + its number with a line naming it, the guard lives through the signals a
launcher sends the whole process group while its child handles them, and its child gets the
default handlers. ``import graphc`` in a process started by one named like hydra's proxy puts the
rest of the program in a guarded child (not when turned off, after mpi4py, or under the explicit
guard), and a failed rank's guard ends only after the processes its rank told it of."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from graphc.runtime.guarding import exit_status
from graphc.runtime.rank_guard import hydra_command

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the guard's process handling is tested on Linux")


def guard(*argv: str, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PMI_RANK="3", PYTHONPATH=ROOT)
    return subprocess.run(
        [sys.executable, "-m", "graphc.runtime.rank_guard", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        **kw,
    )


def test_exit_status_is_the_shells():
    assert [exit_status(c) for c in (0, 1, 255, -9, -15)] == [0, 1, 255, 137, 143]


def test_the_childs_exit_status_and_output_pass_through():
    res = guard(sys.executable, "-c", "import sys; print('out'); sys.exit(7)")
    assert (res.returncode, res.stdout, res.stderr) == (7, "out\n", "")


def test_a_child_killed_by_a_signal_becomes_128_plus_it_and_is_named():
    res = guard(sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert res.returncode == 137
    assert res.stderr.startswith("graphc: rank 3: its process ") and res.stderr.endswith(
        " was killed by signal 9 (SIGKILL)\n"
    ), res.stderr


def test_the_guard_outlives_the_groups_sigusr1_and_sigterm_which_its_child_handles():
    """What hydra does: a signal to the process group of guard and child. The child sees the
    default handlers (exec resets the guard's), handles them itself, and its status comes back."""
    child = (
        "import os, signal, sys\n"
        "assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL\n"
        "assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL\n"
        "got = []\n"
        "signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))\n"
        "signal.signal(signal.SIGTERM, lambda s, f: got.append(s))\n"
        "os.killpg(os.getpgrp(), signal.SIGUSR1)\n"
        "os.killpg(os.getpgrp(), signal.SIGTERM)\n"
        "while len(got) < 2:\n"
        "    signal.pause()\n"
        "sys.exit(5)\n"
    )
    res = guard(sys.executable, "-c", child, start_new_session=True)  # (the group is guard + child)
    assert (res.returncode, res.stderr) == (5, ""), res.stderr


def test_a_missing_command_and_no_command_are_errors():
    res = guard("/nonexistent/graphc-no-such-program")
    assert res.returncode == 127 and "cannot start /nonexistent/graphc-no-such-program" in res.stderr
    res = guard()
    assert res.returncode == 2 and "usage: python -m graphc.runtime.rank_guard COMMAND" in res.stderr


def test_hydra_command_puts_the_option_before_the_rank_count():
    assert hydra_command("mpiexec", 4, ["python", "train.py"], python="py") == [
        "mpiexec",
        "-disable-auto-cleanup",
        "-n",
        "4",
        "py",
        "-m",
        "graphc.runtime.rank_guard",
        "python",
        "train.py",
    ]


# --- the guard ``import graphc`` starts under hydra ----------------------------------------------

PROXY = (  # hydra's proxy as the rank guard sees it: the parent process named hydra_pmi_proxy
    "import os, subprocess, sys\n"
    "res = subprocess.run(sys.argv[1:])\n"
    "sys.exit(res.returncode if res.returncode >= 0 else 200 - res.returncode)\n"
)


def under_proxy(tmp_path, code: str, *, explicit: bool = False, **env) -> subprocess.CompletedProcess:
    """``python -c CODE`` (under the explicit guard if ``explicit``) started by a process named
    like hydra's proxy, with a rank's PMI_RANK."""
    proxy = tmp_path / "hydra_pmi_proxy"
    if not proxy.exists():
        proxy.symlink_to(sys.executable)  # (a process's name is the name it was started by)
    full = {k: v for k, v in os.environ.items() if k != "GRAPHC_RANK_GUARD"}
    full.update(PMI_RANK="3", PYTHONPATH=ROOT, **env)
    rank = [sys.executable, "-m", "graphc.runtime.rank_guard"] if explicit else []
    return subprocess.run(
        [str(proxy), "-c", PROXY, *rank, sys.executable, "-c", code],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


PARENT = "import os; parent = open(f'/proc/{os.getppid()}/comm').read().strip()\n"


def test_import_graphc_under_hydra_runs_the_rank_in_a_guarded_child(tmp_path):
    code = (
        PARENT + "import graphc, sys\nprint(parent, open(f'/proc/{os.getppid()}/comm').read().strip())\nsys.exit(7)\n"
    )
    res = under_proxy(tmp_path, code)
    assert (res.returncode, res.stdout, res.stderr) == (7, "hydra_pmi_proxy python\n", "")  # status passed on


def test_no_guard_when_turned_off_or_after_mpi4py_or_outside_hydra(tmp_path):
    code = PARENT + "import graphc\nprint(parent, open(f'/proc/{os.getppid()}/comm').read().strip())\n"
    res = under_proxy(tmp_path, code, GRAPHC_RANK_GUARD="0")
    assert (res.returncode, res.stdout) == (0, "hydra_pmi_proxy hydra_pmi_proxy\n"), res.stderr
    fake_mpi = "import sys, types; sys.modules['mpi4py.MPI'] = types.ModuleType('mpi4py.MPI')\n"
    res = under_proxy(tmp_path, fake_mpi + code)  # MPI may be initialized: no fork
    assert (res.returncode, res.stdout) == (0, "hydra_pmi_proxy hydra_pmi_proxy\n"), res.stderr
    res = guard(sys.executable, "-c", code)  # the explicit guard, outside hydra
    assert (res.returncode, res.stdout) == (0, "python python\n"), res.stderr
    grandparent = "pp = open(f'/proc/{os.getppid()}/stat').read().split(')')[1].split()[1]\n"
    code = PARENT + grandparent + "import graphc\nprint(parent, open(f'/proc/{pp}/comm').read().strip())\n"
    res = under_proxy(tmp_path, code, explicit=True)  # the explicit guard under hydra: one guard, not two
    assert (res.returncode, res.stdout) == (0, "python hydra_pmi_proxy\n"), res.stderr


def test_a_rank_killed_under_the_import_guard_is_named_and_ends_with_128_plus_9(tmp_path):
    code = "import graphc, os, signal\nprint(os.getpid(), flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n"
    res = under_proxy(tmp_path, code)
    pid = res.stdout.strip()
    assert res.returncode == 137, res.stderr  # an exit status the proxy sees, not a signal
    assert res.stderr == f"graphc: rank 3: its process {pid} was killed by signal 9 (SIGKILL)\n"


@pytest.mark.parametrize("explicit", [False, True], ids=["import", "explicit"])
def test_a_failed_ranks_guard_ends_only_after_the_ranks_it_was_told_of(tmp_path, explicit):
    """A rank tells its guard the pids of the other ranks on its machine; killed, its guard names
    it and then waits for those processes before it ends (so hydra kills no survivor early)."""
    peer = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    code = (
        "import graphc, os, signal\n"
        "from graphc.runtime.guarding import tell_guard\n"
        f"tell_guard([{peer.pid}])\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = dict(os.environ, PMI_RANK="3", PYTHONPATH=ROOT)
    env.pop("GRAPHC_RANK_GUARD", None)
    if explicit:
        argv = [sys.executable, "-m", "graphc.runtime.rank_guard", sys.executable, "-c", code]
    else:
        proxy = tmp_path / "hydra_pmi_proxy"
        proxy.symlink_to(sys.executable)
        argv = [str(proxy), "-c", PROXY, sys.executable, "-c", code]
    job = subprocess.Popen(argv, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert job.stderr is not None
        line = job.stderr.readline()  # the guard saw its rank killed
        assert line.startswith("graphc: rank 3: its process ") and line.endswith("(SIGKILL)\n"), line
        with pytest.raises(subprocess.TimeoutExpired):  # and waits while the peer lives
            job.wait(timeout=1.0)
        peer.communicate(b"")  # the peer ends
        assert job.wait(timeout=30) == 137
    finally:
        for p in (peer, job):
            if p.poll() is None:
                p.kill()
                p.wait()
