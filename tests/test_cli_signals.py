"""Ctrl-C (SIGINT) and SIGTERM end any graphc command within a second: one line on stderr, exit
status 130 (SIGINT) or 143 (SIGTERM), no traceback, no half-written output; even when the user's
code swallows the KeyboardInterrupt (graphc/cli/signals.py's watchdog)."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = {signal.SIGINT: "graphc: interrupted", signal.SIGTERM: "graphc: terminated (SIGTERM)"}
STATUS = {signal.SIGINT: 130, signal.SIGTERM: 143}

SWALLOWS = """
import time
import numpy as np


def f(x):
    return x * 2


def example_args():
    print("example started", flush=True)
    end = time.monotonic() + 60
    while time.monotonic() < end:  # a loop that swallows Ctrl-C, as careless code does
        try:
            time.sleep(0.01)
        except BaseException:
            pass
    return (np.ones(3),), {}
"""


def interrupt(tmp_path, argv, ready: str, sig: int) -> tuple[int, float, str, str]:
    """Start ``graphc argv``, wait until ``ready`` appears in its output, send ``sig``; returns
    (exit status, seconds from the signal to the exit, stdout, stderr)."""
    env = dict(os.environ, GRAPHC_CACHE_DIR=str(tmp_path / "cache"), GRAPHC_PROFILE=str(tmp_path / "none.json"))
    env.pop("GRAPHC_DEBUG", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "graphc", *argv],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = threading.Event()
    chunks: dict[str, list[str]] = {"out": [], "err": []}

    def read(stream, key):
        for line in stream:
            chunks[key].append(line)
            if ready in line:
                seen.set()

    readers = [
        threading.Thread(target=read, args=(proc.stdout, "out"), daemon=True),
        threading.Thread(target=read, args=(proc.stderr, "err"), daemon=True),
    ]
    for t in readers:
        t.start()
    try:
        assert seen.wait(240), f"never saw {ready!r}: {''.join(chunks['err'])}"
        time.sleep(0.3)  # well inside the phase
        assert proc.poll() is None, "".join(chunks["err"])
        start = time.monotonic()
        proc.send_signal(sig)
        proc.wait(10)
        elapsed = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for t in readers:
        t.join(5)
    return proc.returncode, elapsed, "".join(chunks["out"]), "".join(chunks["err"])


def check(code, elapsed, err, sig):
    assert code == STATUS[sig], err
    assert elapsed < 1.0, elapsed
    assert "Traceback" not in err
    assert err.rstrip().splitlines()[-1] == LINE[sig], err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_a_long_compile_stops_it_and_writes_no_plan(tmp_path, sig):
    out = tmp_path / "plan.json"
    argv = ["compile", "models/gpt.py:train_step", "--example", "example_train_specs", "--mesh", "dp=2,tp=4"]
    code, elapsed, _out, err = interrupt(tmp_path, [*argv, "--no-cache", "-o", str(out)], "ILP:", sig)
    check(code, elapsed, err, sig)
    assert not out.exists()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_a_run_stops_the_devices(tmp_path, sig):
    argv = ["run", "models/mlp.py:train_step", "--example", "example_train_args", "--mesh", "dp=2"]
    code, elapsed, _out, err = interrupt(tmp_path, [*argv, "--repeat", "100000"], "compiled in", sig)
    check(code, elapsed, err, sig)


def test_code_that_swallows_ctrl_c_is_still_stopped_within_a_second(tmp_path):
    (tmp_path / "swallows.py").write_text(SWALLOWS)
    argv = ["ir", f"{tmp_path}/swallows.py:f"]
    code, elapsed, _out, err = interrupt(tmp_path, argv, "example started", signal.SIGINT)
    check(code, elapsed, err, signal.SIGINT)


def test_debug_shows_where_the_interrupt_landed(tmp_path):
    argv = ["run", "models/mlp.py:train_step", "--example", "example_train_args", "--mesh", "dp=2"]
    code, elapsed, _out, err = interrupt(
        tmp_path, [*argv, "--repeat", "100000", "--debug"], "compiled in", signal.SIGINT
    )
    assert code == 130 and elapsed < 1.0
    assert "Traceback" in err and "KeyboardInterrupt" in err and err.rstrip().endswith(LINE[signal.SIGINT])


def test_an_interrupt_a_library_wrapped_is_still_an_interrupt(monkeypatch, capsys):
    """Ctrl-C landing while a C extension initializes (HiGHS, numba: imported lazily) comes back as
    ``ImportError: initialization failed`` caused by the KeyboardInterrupt: exit 130 with the one
    line, not an internal error."""
    import argparse
    import importlib

    cli = importlib.import_module("graphc.cli.main")

    def interrupted_import(args):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise ImportError("initialization failed") from exc

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    monkeypatch.setattr(parser, "parse_args", lambda argv: argparse.Namespace(func=interrupted_import))
    monkeypatch.setattr(cli.signals._state.reported, "is_set", lambda: False)
    assert cli.main(["ir", "model.py:f"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == LINE[signal.SIGINT], err
