"""Differential fuzzing of ``graphc.parallelize`` against numpy: the random programs of
tests/fuzz/programs.py run on a mesh of two threads, split on a ``tp`` axis (any dim) or a ``dp``
axis (batch dims), and must equal numpy as ``graphc.jit`` must (tests/fuzz/compare.py
``check_runner``). Programs whose shapes the mesh cannot split (0-d, size-0 and size-1 dims, odd
sizes) still run, replicated. The warnings about a data axis that splits nothing are expected and
silenced.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given

import graphc
from tests.fuzz.compare import check_runner
from tests.fuzz.programs import programs
from tests.fuzz.steps import run_program
from tests.helpers import fuzz_settings

pytestmark = pytest.mark.fuzz


def check_parallel(program: tuple, mesh: dict) -> None:
    steps, outputs, _inputs = program
    fn = functools.partial(run_program, steps, outputs)
    runner = graphc.parallelize(fn, mesh=mesh, cache=False)
    check_runner(runner, program, f"parallelize(mesh={mesh})")


@given(programs())
@fuzz_settings(100)
def test_tp2_equals_numpy(program):
    check_parallel(program, {"tp": 2})


@given(programs())
@fuzz_settings(100)
def test_dp2_equals_numpy(program):
    check_parallel(program, {"dp": 2})
