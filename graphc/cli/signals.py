"""Ctrl-C and SIGTERM end any ``graphc`` command within a second, with one line and a status.

SIGINT raises ``KeyboardInterrupt`` in the main thread, as Python does by default; SIGTERM raises
``Terminated``, a ``KeyboardInterrupt`` too, so every place that stops work on Ctrl-C (the ILP
solver's thread, the device threads, the MPI ranks) stops on SIGTERM the same way. ``graphc``'s
``main`` reports either in one line and exits 128 + the signal's number, as a shell reports a
process the signal ended: 130 for SIGINT, 143 for SIGTERM.

A watchdog bounds the stop: the C-level handler writes the signal's number to a pipe
(``signal.set_wakeup_fd``) the moment the signal arrives, even while the main thread is inside
a long C call; the watchdog thread, blocked on that pipe, wakes and, if the process has not ended
``GRACE_S`` later (main still unwinding, or interpreter shutdown waiting on a thread), prints the
line if it was not printed yet and ends the process with ``os._exit``. A second signal while
stopping ends it at once the same way. (Called in-process, ``main(argv)`` only raises and
reports: the caller's process is its own.)

The signal decides the status wherever it lands. Raised inside Python code that a C extension
calls, the ``KeyboardInterrupt`` can come back as another exception with no trace of it: numpy's
``==`` on structured arrays (``np.unique(m, axis=0)``) promotes their dtypes in Python and
replaces any error there by ``TypeError: Cannot compare structured arrays ...``. So ``received()``
tells the command that a signal arrived, and whatever exception then ends it is reported as that
signal. A signal that arrives while the handlers are being restored (the command's work done) is
recorded, not raised, and reported the same way.

After a signal the program ends with ``end_now`` once ``main`` has reported it: the interpreter's
own teardown (freeing every module: numpy, numba, HiGHS) can run for seconds after the line on a
busy machine (docs/measurements.md#teardown), and the watchdog cannot bound it (Python threads stop
running once teardown begins).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

GRACE_S = 0.6  # from the signal to the forced exit: within the promised second, with room for a busy machine
EXIT_STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}  # 128 + the signal's number
_STOP = b"\0"  # written to the pipe: the command ended without a signal


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread where Ctrl-C raises KeyboardInterrupt."""


def message(signum: int) -> str:
    """The one line a command stopped by ``signum`` prints."""
    if signum == signal.SIGTERM:
        return "graphc: terminated (SIGTERM)"
    return "graphc: interrupted"


class _State:
    def __init__(self) -> None:
        self.signum: int | None = None  # the first signal received
        self.reported = threading.Event()  # the line was printed
        self.program = False  # graphc is the process (not a caller's main(argv))
        self.closing = False  # the body ended: the handlers are being restored, a signal only records
        self.no_teardown = False  # the command asked to end without the interpreter's teardown


_state = _State()


def received() -> int | None:
    """The number of the first SIGINT or SIGTERM that arrived since ``stopped_by_signals`` began,
    or None: any exception that ends a command after a signal is that signal's doing."""
    return _state.signum


def report(cause: KeyboardInterrupt | int) -> int:
    """Print the one line for ``cause`` (the interrupt a signal raised, or the signal's number;
    once) and return the exit status."""
    if isinstance(cause, int):
        signum = signal.SIGTERM if cause == signal.SIGTERM else signal.SIGINT
    else:
        signum = signal.SIGTERM if isinstance(cause, Terminated) else signal.SIGINT
    if not _state.reported.is_set():
        _state.reported.set()
        print(message(signum), file=sys.stderr, flush=True)
    return EXIT_STATUS[signum]


def end_without_teardown() -> None:
    """Ask ``main`` to end the program (not an in-process caller) without the interpreter's
    teardown once the command has returned: ``graphc compile`` of a deep model leaves millions of
    objects (the graph, the problem, the plan) whose freeing and final collection took 20 s at
    1,000 layers, loaded, after the plan file was written."""
    _state.no_teardown = True


def ends_without_teardown() -> bool:
    return _state.no_teardown


def is_program() -> bool:
    """graphc is the process (``main()`` from the command line), not a caller's ``main(argv)``:
    the process ends once the command has."""
    return _state.program


def end_now(status: int) -> None:
    """End the process with ``status`` at once: stdout and stderr flushed, no interpreter teardown
    (the program's end after a signal, when ``main`` has reported it)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a closed pipe
            pass
    os._exit(status)


def _on_signal(signum: int, _frame) -> None:
    first = _state.signum is None
    if first:
        _state.signum = signum
    if not first and _state.program:  # a second signal while stopping: end now
        _force_exit(signum)
    if _state.closing:  # the command's work is done: main reports the recorded signal
        return
    if signum == signal.SIGTERM:
        raise Terminated()
    raise KeyboardInterrupt()


def _force_exit(signum: int) -> None:
    if not _state.reported.is_set():
        _state.reported.set()
        try:
            print(message(signum), file=sys.stderr, flush=True)
        except (OSError, ValueError):  # stderr closed
            pass
    end_now(EXIT_STATUS.get(signal.Signals(signum), 128 + signum))


def _watch(read_fd: int, program: bool) -> None:
    """Wait for a signal's byte on the pipe; then, for a program, end the process ``GRACE_S``
    later if it is still running (main unwinding slowly, or the interpreter's shutdown waiting)."""
    while True:
        try:
            data = os.read(read_fd, 1)
        except OSError:
            return
        if not data or data == _STOP:
            return
        if data[0] in EXIT_STATUS:
            break
    if not program:  # the caller's process: nothing to bound, and its main(argv) need not wait
        return
    time.sleep(GRACE_S)
    _force_exit(data[0])


@contextlib.contextmanager
def stopped_by_signals(program: bool) -> Iterator[None]:
    """Run the body with SIGINT and SIGTERM raising in the main thread and the watchdog armed.
    ``program``: graphc is the process (``main()`` from the command line), so after a signal the
    watchdog also bounds the interpreter's shutdown; an in-process caller (a test calling
    ``main(argv)``) gets the status back and keeps its process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    _state.signum = None
    _state.reported.clear()
    _state.program = program
    _state.closing = False
    _state.no_teardown = False
    old = {s: signal.getsignal(s) for s in EXIT_STATUS}
    old_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    watchdog = threading.Thread(target=_watch, args=(read_fd, program), name="graphc-signal-watchdog", daemon=True)
    watchdog.start()
    for s in EXIT_STATUS:
        signal.signal(s, _on_signal)
    try:
        yield
    finally:
        _state.closing = True
        for s, handler in old.items():
            signal.signal(s, handler)
        signal.set_wakeup_fd(old_fd)
        if _state.signum is None or not program:  # else the watchdog bounds the shutdown
            os.write(write_fd, _STOP)
            watchdog.join(GRACE_S + 0.5)
            os.close(read_fd)
            os.close(write_fd)


__all__ = [
    "EXIT_STATUS",
    "GRACE_S",
    "Terminated",
    "end_now",
    "end_without_teardown",
    "ends_without_teardown",
    "is_program",
    "message",
    "received",
    "report",
    "stopped_by_signals",
]
