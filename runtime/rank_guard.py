"""``python -m graphc.runtime.rank_guard COMMAND...``: one rank's process under an explicit guard,
and the commands that start a job so (tests, ``graphc bench comm``).

``import graphc`` guards every rank hydra starts by itself (runtime/guarding.py, which says why).
This runs the same guard around any command, for a rank whose program imports mpi4py before
graphc, or does not import graphc at all:

    mpiexec -n 4 python -m graphc.runtime.rank_guard python train.py

It starts the command as its child (in the guard's process group, so hydra's signals to the group
reach it), with every inherited descriptor (the PMI connection is one), and ends as the guard
does: the child's status, a signal as 128 + its number and named in one line, after the other
ranks on this machine ended if the child failed. Only the standard library.
"""

from __future__ import annotations

import os
import subprocess
import sys

from graphc.runtime.guarding import FD_ENV, GUARD_ENV, die_with_parent, finish, survive_group_signals

HYDRA_OPTION = "-disable-auto-cleanup"


def run(argv: list[str]) -> int:
    """Run ``argv`` as this rank's process; its exit status, signals as 128 + their number."""
    if not argv:
        print("usage: python -m graphc.runtime.rank_guard COMMAND [ARG...]", file=sys.stderr)
        return 2
    # handlers, not SIG_IGN: exec resets handlers, so the child gets the defaults
    survive_group_signals(lambda signum, frame: None)
    report, write_end = os.pipe()
    os.set_inheritable(write_end, True)
    env = dict(os.environ, **{GUARD_ENV: "child", FD_ENV: str(write_end)})
    try:
        child = subprocess.Popen(  # every inherited descriptor: the PMI connection (PMI_FD) is one
            argv, close_fds=False, env=env, preexec_fn=die_with_parent if sys.platform == "linux" else None
        )
    except OSError as exc:
        print(f"graphc rank_guard: cannot start {argv[0]}: {exc}", file=sys.stderr)
        return 127
    finally:
        os.close(write_end)
    return finish(child.wait(), child.pid, report)


def is_hydra(mpiexec: str) -> bool:
    """Whether ``mpiexec`` is MPICH's hydra (its ``--version`` says so); the option is hydra's."""
    try:
        out = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "HYDRA" in out


def hydra_command(mpiexec: str, n: int, argv: list[str], python: str = sys.executable) -> list[str]:
    """``mpiexec -disable-auto-cleanup -n N python -m graphc.runtime.rank_guard ARGV...``: every
    rank under an explicit guard (what ``import graphc`` does by itself under hydra)."""
    return [mpiexec, HYDRA_OPTION, "-n", str(n), python, "-m", "graphc.runtime.rank_guard", *argv]


if __name__ == "__main__":
    status = run(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # no interpreter shutdown: nothing can end the guard by a signal now
