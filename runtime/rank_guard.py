"""One rank's process under hydra (MPICH's ``mpiexec``), so that a rank killed by a signal is
named by every survivor.

What hydra does (MPICH 5.0.2, measured with strace on its proxy): the moment it reaps a rank that
ended by a signal (``kill -9``, the OOM killer, a segfault) it sends SIGKILL to the process group
of every other rank of the job, with or without ``-disable-auto-cleanup`` (that option only adds a
SIGUSR1 half a millisecond earlier). Without the option it does the same as soon as a rank's PMI
connection closes before ``MPI_Finalize`` (a dying process's descriptors close before its end is
reported to anyone). SIGKILL cannot be caught, and it comes within a millisecond, before the
survivors' watchdogs can print; hydra's own message names the process of the first rank with a
non-zero status, which is not the lost one when the survivors were killed too
(docs/guide/mpi.md).

The guard takes the signal out of hydra's sight. Run every rank under it, with the option:

    mpiexec -disable-auto-cleanup -n 4 python -m graphc.runtime.rank_guard python train.py

It starts the rank's command as its child, in the guard's process group (so hydra's signals to
the group reach the rank), and ends with the child's status, a signal turned into 128 + its
number as a shell does. Hydra then sees a rank that exited with a status, not one killed by a
signal, and leaves the survivors to graphc's watchdog (runtime/mpi_world.py): each names the lost
rank and ends with status 1, and mpiexec ends with a non-zero status. The guard itself prints one
line naming the signal that killed its rank. It survives the signals hydra sends the whole group
(SIGINT for Ctrl-C, SIGTERM, SIGUSR1) while its child handles them, and its child is killed if
the guard is (``PR_SET_PDEATHSIG``, Linux). The watchdog watches the ranks on its own machine
only: with the option, ranks on other machines stop at their collective's timeout (a CommError,
then ``MPI_Abort``), not at once.

Only the standard library: the guard is the parent of every rank and costs one idle process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

# the signals hydra sends a rank's whole process group: the guard lives through them, its child acts
_PASSED_ON = ("SIGINT", "SIGTERM", "SIGUSR1", "SIGHUP")
HYDRA_OPTION = "-disable-auto-cleanup"


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it if the guard ends (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: the launcher's cleanup of the group remains
        pass


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: a signal ``s`` (Popen's ``-s``) becomes 128 + s."""
    return 128 - returncode if returncode < 0 else returncode


def run(argv: list[str]) -> int:
    """Run ``argv`` as this rank's process; its exit status, signals as 128 + their number."""
    if not argv:
        print("usage: python -m graphc.runtime.rank_guard COMMAND [ARG...]", file=sys.stderr)
        return 2
    for name in _PASSED_ON:  # handlers, not SIG_IGN: exec resets handlers, so the child gets the defaults
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), lambda signum, frame: None)
    try:
        child = subprocess.Popen(  # every inherited descriptor: the PMI connection (PMI_FD) is one
            argv, close_fds=False, preexec_fn=_die_with_parent if sys.platform == "linux" else None
        )
    except OSError as exc:
        print(f"graphc rank_guard: cannot start {argv[0]}: {exc}", file=sys.stderr)
        return 127
    returncode = child.wait()
    for name in _PASSED_ON:  # (Python's shutdown would restore the default action, which ends the guard by signal)
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    if returncode < 0 and -returncode != signal.SIGINT:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        rank = os.environ.get("PMI_RANK", "?")
        print(
            f"graphc: rank {rank}: its process {child.pid} was killed by signal {-returncode} ({name})",
            file=sys.stderr,
            flush=True,
        )
    return exit_status(returncode)


def is_hydra(mpiexec: str) -> bool:
    """Whether ``mpiexec`` is MPICH's hydra (its ``--version`` says so); the option is hydra's."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "HYDRA" in out


def hydra_command(mpiexec: str, n: int, argv: list[str], python: str = sys.executable) -> list[str]:
    """``mpiexec -disable-auto-cleanup -n N python -m graphc.runtime.rank_guard ARGV...``: hydra
    leaves the survivors of a killed rank to graphc (module doc)."""
    return [mpiexec, HYDRA_OPTION, "-n", str(n), python, "-m", "graphc.runtime.rank_guard", *argv]


if __name__ == "__main__":
    status = run(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # no interpreter shutdown: nothing can end the guard by a signal now
