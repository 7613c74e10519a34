"""The guard of one rank's process under hydra (MPICH's ``mpiexec``), so that a rank killed by a
signal is named by every survivor.

What hydra does (MPICH 5.0.2; its proxy, src/pm/hydra/proxy/pmip.c and pmip_cb.c, and strace):
the moment it reaps a rank that ended by a signal (``kill -9``, the OOM killer, a segfault) it
sends SIGKILL to the process group of every other rank of the job, with or without
``-disable-auto-cleanup``. With auto-cleanup (the default) it does the same as soon as a rank's
PMI connection closes before ``MPI_Finalize``. SIGKILL cannot be caught and comes within a
millisecond, before the survivors' watchdogs (runtime/mpi_world.py) can print; hydra's own banner
names the process of the first rank with a non-zero status, which is not the lost one when the
survivors were killed too. No signal comes first (no SIGTERM to handle).

The guard takes the death out of hydra's sight. Under hydra, ``import graphc`` forks
(``guard_this_rank``): the child goes on as the rank, and the parent, the process hydra started
and watches, becomes its guard. The guard holds the rank's PMI connection open (an inherited
descriptor) and, when the rank ends, ends with its status, a signal turned into 128 + its number
as a shell does, so hydra sees a rank that exited. If the rank failed (a signal, a non-zero
status), the guard first waits, at most ``PEER_WAIT_S``, until the other ranks' processes on this
machine have ended too (each rank tells its guard their pids, ``tell_guard``, once the world has
exchanged them): hydra's cleanup then kills nothing that still had a line to print. Meanwhile
every survivor's watchdog names the lost rank and ends its rank with status 1. The guard of a
killed rank prints one line naming the signal. It survives the signals hydra sends the whole group
(SIGINT for Ctrl-C, SIGTERM, SIGUSR1) while its child handles them, and its child is killed if the
guard is (``PR_SET_PDEATHSIG``, Linux).

The guard is a fork of the program as it was at ``import graphc``: it keeps (copy-on-write, never
written) the memory the program held then, so a program should import graphc before it loads
data. No guard when: ``GRAPHC_RANK_GUARD=0``; the parent is not hydra's proxy (``hydra_pmi_proxy``:
gforker, Open MPI, a plain ``python``); mpi4py was imported before graphc (MPI may be initialized:
a fork then would split one rank in two); a Python thread is running; not Linux. The same guard
runs explicitly as ``mpiexec -n 4 python -m graphc.runtime.rank_guard python train.py``
(runtime/rank_guard.py). The watchdog watches the ranks on its own machine only: ranks on other
machines stop at their collective's timeout (a CommError, then ``MPI_Abort``) or by hydra's
cleanup.

Only the standard library: the guard is the parent of every rank and costs one idle process.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time
from typing import Any

# the signals hydra sends a rank's whole process group: the guard lives through them, its child acts
_PASSED_ON = ("SIGINT", "SIGTERM", "SIGUSR1", "SIGHUP")
HYDRA_PROXY = "hydra_pmi_proxy"  # the name of hydra's proxy process, the parent of every rank
GUARD_ENV = "GRAPHC_RANK_GUARD"  # "0": no guard; "child": this process is a guarded rank
FD_ENV = "GRAPHC_RANK_GUARD_FD"  # the explicit guard's pipe for the peers' pids
_PMI_REPLY_S = 2.0  # at most this long for hydra's answer to a guard's PMI finalize
PEER_WAIT_S = 10.0  # a failed rank's guard waits at most this long for the other ranks on its machine

_report_fd: int | None = None  # in a guarded rank: where to tell the guard the peers' pids


def die_with_parent() -> None:
    """In the child: SIGKILL it if the guard ends (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: the launcher's cleanup of the group remains
        pass


def exit_status(returncode: int) -> int:
    """A child's status as a shell reports it: a signal ``s`` (Popen's ``-s``) becomes 128 + s."""
    return 128 - returncode if returncode < 0 else returncode


def tell_guard(pids: list[int]) -> None:
    """In a guarded rank: the pids of the other ranks' processes on this machine, for the guard to
    wait for if this rank fails. Nothing outside a guard."""
    global _report_fd
    if _report_fd is None and os.environ.get(FD_ENV, "").isdigit():
        _report_fd = int(os.environ.pop(FD_ENV))
    if _report_fd is None:
        return
    try:
        os.write(_report_fd, (" ".join(map(str, pids)) + "\n").encode())
    except OSError:  # the guard is gone (then so is this process, soon)
        pass


def _peers(report: int) -> list[int]:
    """The pids the rank told its guard (the rank has ended: what it wrote is all there is)."""
    os.set_blocking(report, False)
    data = b""
    try:
        while chunk := os.read(report, 4096):
            data += chunk
    except BlockingIOError:  # a process the rank started still holds the write end
        pass
    lines = [ln for ln in data.decode(errors="replace").splitlines() if ln.strip()]
    return [int(p) for p in lines[-1].split() if p.isdigit()] if lines else []


def _await_peers(pids: list[int], seconds: float) -> None:
    """Until every process in ``pids`` has ended, at most ``seconds``."""
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except OSError:  # ended already (or no pidfds here)
            pass
    deadline = time.monotonic() + seconds
    try:
        while fds and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select(fds, [], [], left)
            for fd in ready:
                fds.remove(fd)
                os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)


def survive_group_signals(handler: Any) -> None:
    """``handler`` for each signal hydra sends a rank's whole process group."""
    for name in _PASSED_ON:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), handler)


def _finalize_pmi() -> None:
    """Say PMI's ``finalize`` on the dead rank's connection (the PMI-1 wire form, which hydra's
    proxy reads next to PMI-2's): hydra then takes the guard's exit as a rank's exit with a status,
    not as a rank that left without finalizing, whose cleanup SIGKILLs every other guard and
    hides their statuses. Best effort: a connection already finalized or closed answers nothing."""
    fd = os.environ.get("PMI_FD", "")
    if not fd.isdigit():
        return
    try:
        os.write(int(fd), b"cmd=finalize\n")
        if select.select([int(fd)], [], [], _PMI_REPLY_S)[0]:
            os.read(int(fd), 4096)  # cmd=finalize_ack
    except OSError:
        pass


def finish(returncode: int, child_pid: int, report: int | None) -> int:
    """The guard's exit status once its child ended (``returncode`` as Popen's), after naming a
    signal that killed it and, for a failed rank of a job, waiting for the other ranks' processes
    on this machine and finalizing its PMI connection."""
    survive_group_signals(signal.SIG_IGN)  # (Python's shutdown would restore the default action)
    if returncode < 0 and -returncode != signal.SIGINT:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        rank = os.environ.get("PMI_RANK", "?")
        line = f"graphc: rank {rank}: its process {child_pid} was killed by signal {-returncode} ({name})\n"
        os.write(2, line.encode())
    peers = _peers(report) if returncode != 0 and report is not None else None
    if peers is not None and hasattr(os, "pidfd_open"):
        _await_peers(peers, PEER_WAIT_S)
    if peers:  # the rank joined graphc's MPI world (so MPI, and PMI, were initialized)
        _finalize_pmi()
    return exit_status(returncode)


def _parent_is_hydra() -> bool:
    try:
        with open(f"/proc/{os.getppid()}/comm") as f:
            return f.read().strip() == HYDRA_PROXY
    except OSError:
        return False


def _running_the_guard() -> bool:
    """Whether this process is ``python -m graphc.runtime.rank_guard`` (importing graphc on its way)."""
    argv = sys.orig_argv
    return any(a == "-m" and b == "graphc.runtime.rank_guard" for a, b in zip(argv, argv[1:]))


def _wanted() -> bool:
    if "PMI_RANK" not in os.environ or os.environ.get(GUARD_ENV, "") in ("0", "child"):  # (most imports stop here)
        return False
    import threading

    return (
        sys.platform == "linux"
        and not _running_the_guard()
        and "mpi4py.MPI" not in sys.modules
        and threading.active_count() == 1
        and hasattr(os, "pidfd_open")
        and _parent_is_hydra()
    )


def guard_this_rank() -> None:
    """At ``import graphc`` in a rank started by hydra: fork; the child returns and goes on as the
    rank, the parent guards it and never returns (module doc)."""
    global _report_fd
    if not _wanted():
        return
    sys.stdout.flush()
    sys.stderr.flush()
    report, write_end = os.pipe()
    guard = os.getpid()
    child = os.fork()
    if child == 0:
        os.close(report)
        die_with_parent()
        if os.getppid() != guard:  # the guard ended before the line above
            os._exit(1)
        os.environ[GUARD_ENV] = "child"
        _report_fd = write_end
        return
    os.close(write_end)
    status = 1
    try:
        survive_group_signals(lambda signum, frame: None)
        _, wait_status = os.waitpid(child, 0)
        status = finish(os.waitstatus_to_exitcode(wait_status), child, report)
    finally:  # never the rest of the program, its atexit handlers or a second flush of its buffers
        os._exit(status)
