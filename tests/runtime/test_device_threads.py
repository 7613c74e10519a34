"""The threaded runtime keeps its device threads between runs (runtime/devices.py ``_Crew``)."""

import threading

import numpy as np
import pytest

import graphc
from graphc.core.errors import GraphcError
from graphc.core.mesh import Mesh
from graphc.runtime.comm import ThreadWorld
from graphc.runtime.devices import _Crew, run_on_devices


def _device_threads() -> int:
    return sum(t.name.startswith("graphc-device") for t in threading.enumerate())


def test_device_threads_are_reused_across_runs_and_parallelize_objects():
    x = np.arange(64, dtype=np.float64).reshape(8, 8)
    f = lambda a, w: np.tanh(a @ w) + a  # noqa: E731
    want = np.tanh(x @ x) + x
    for spec in ("dp=2", "tp=2", "dp=2"):
        pf = graphc.parallelize(f, mesh=spec)
        np.testing.assert_allclose(pf(x, x), want)
    before = _device_threads()
    for _ in range(20):
        for spec in ("dp=2", "tp=2"):
            np.testing.assert_allclose(graphc.parallelize(f, mesh=spec)(x, x), want)
    assert _device_threads() == before  # no thread started per call, none leaked


def test_a_failing_device_leaves_the_crew_usable():
    mesh = Mesh("dp=2")

    def body(d):
        if d == 1:
            raise ValueError("boom on 1")
        return d

    with pytest.raises(ValueError, match="device 1.*boom on 1"):
        run_on_devices([0, 1], ThreadWorld(2, 5.0), mesh, 5.0, body)
    assert run_on_devices([0, 1], ThreadWorld(2, 5.0), mesh, 5.0, lambda d: d * 10) == {0: 0, 1: 10}


def test_a_crew_that_timed_out_is_not_reused():
    release = threading.Event()
    crew = _Crew.acquire(2)
    try:
        assert not crew.run(lambda d: release.wait(5.0) if d == 1 else None, [0, 1], deadline=0.0)
        assert crew.broken
    finally:
        release.set()
        crew.release()
    assert all(c is not crew for c in _Crew._idle.get(2, []))


def test_devices_that_do_not_finish_are_named():
    release = threading.Event()
    mesh = Mesh("dp=2")
    try:
        with pytest.raises(GraphcError, match="graphc-device-1"):
            run_on_devices([0, 1], ThreadWorld(2, 0.1), mesh, -4.9, lambda d: release.wait(5.0) if d == 1 else d)
    finally:
        release.set()
