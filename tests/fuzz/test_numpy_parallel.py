"""Differential fuzzing of ``graphc.parallelize`` against numpy: the random programs of
tests/fuzz/programs.py run on a mesh of two threads, split on a ``tp`` axis (any dim) or a ``dp``
axis (batch dims), and must equal numpy as ``graphc.jit`` must (tests/fuzz/compare.py
``check_runner``). Programs whose shapes the mesh cannot split (0-d, size-0 and size-1 dims, odd
sizes) still run, replicated; on ``tp`` two programs in three pin their inputs split (the
planner replicates values this small when left to itself). The warnings about a data axis that
splits nothing are expected and silenced.
"""

from __future__ import annotations

import functools
import zlib

import pytest
from hypothesis import given

import graphc
from tests.fuzz.compare import check_runner
from tests.fuzz.programs import describe, programs
from tests.fuzz.steps import run_program
from tests.helpers import fuzz_settings

pytestmark = pytest.mark.fuzz


def split_specs(inputs: tuple) -> tuple:
    """A spec per input: its first dim of even size split (``"S(d)"``), None (the planner's
    choice) for an input without one. Left to itself the planner replicates values this small."""
    specs = []
    for x in inputs:
        even = [d for d, n in enumerate(x.shape) if n % 2 == 0]
        specs.append(f"S({even[0]})" if even else None)
    return tuple(specs)


def check_parallel(program: tuple, mesh: dict, pin: bool) -> None:
    steps, outputs, inputs = program
    fn = functools.partial(run_program, steps, outputs)
    in_specs = split_specs(inputs) if pin else None
    runner = graphc.parallelize(fn, mesh=mesh, cache=False, in_specs=in_specs)
    # (an op linear in a partial sum carries the partial sums, docs/plans.md `linear0@tp`: a * (s0 + s1)
    # is computed as a * s0 + a * s1, within rounding; the sign of a zero it makes is rounding too,
    # 0 * (4 - 8) being -0.0 and 0 * 4 + 0 * -8 +0.0)
    check_runner(runner, program, f"parallelize(mesh={mesh}, in_specs={in_specs})", inexact_zero_signs=False)


def _pin(program: tuple) -> bool:
    """Two programs in three run with split inputs (which one: a hash of the program, so that a
    failure reproduces)."""
    return zlib.crc32(describe(*program).encode()) % 3 != 0


@given(programs())
@fuzz_settings(60)
def test_tp2_equals_numpy(program):
    check_parallel(program, {"tp": 2}, pin=_pin(program))


@given(programs())
@fuzz_settings(60)
def test_dp2_equals_numpy(program):
    """(A data axis splits batch dims only, which these programs seldom have: mostly replicated.)"""
    check_parallel(program, {"dp": 2}, pin=False)
