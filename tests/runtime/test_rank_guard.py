"""runtime/rank_guard.py without MPI: a rank's exit status passes through, a signal becomes
128 + its number with a line naming it, the guard lives through the signals a launcher sends the
whole process group while its child handles them, and its child gets the default handlers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from graphc.runtime.rank_guard import exit_status, hydra_command

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
