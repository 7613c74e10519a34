"""Differential fuzzing against numpy: random small programs of numpy operations
(tests/fuzz/programs.py: ufuncs and operators with Python and numpy scalars, reductions, einsum,
indexing, views, in-place writes through every index form and through views taken before,
np.UFUNC.at, ``out=``, scans, sorts, dtype conversions, if/elif on traced values) over bool,
int8-int64, uint8, float32 and float64 arrays whose shapes have size-1 and size-0 dims, and 0-d
arrays.

The properties, for each program:

- ``graphc.jit(program)(*inputs)`` equals numpy's result (tests/fuzz/compare.py ``check_runner``:
  values up to the rounding the program allows, errors where numpy raises, and results that share
  memory with nothing numpy's do not, over three calls with writes into the results between them).
- The traced graph evaluated by the reference interpreter equals numpy, and the traced graph,
  optimized (the default pipeline, fusion included) and evaluated by the interpreter, equals the
  traced graph evaluated by it.

The default profile runs in CI (derandomized); ``pytest -m fuzz --hypothesis-profile long
tests/fuzz`` runs 10,000 programs per target (docs/fuzzing_numpy.md).
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import given

import graphc
from tests.fuzz.compare import assert_matches, check_runner, exactness
from tests.fuzz.programs import describe, programs, quietly
from tests.fuzz.steps import run_program
from tests.helpers import fuzz_settings

pytestmark = pytest.mark.fuzz


@given(programs())
@fuzz_settings(200)
def test_jit_equals_numpy(program):
    steps, outputs, _inputs = program
    check_runner(graphc.jit(functools.partial(run_program, steps, outputs)), program, "jit")


@pytest.mark.slow
@given(programs())
@fuzz_settings(300)
def test_optimized_graph_equals_interpreter(program):
    """numpy vs the interpreter on the traced graph, and the optimized graph (fused) vs the interpreter."""
    steps, outputs, inputs = program
    fn = functools.partial(run_program, steps, outputs)
    if not check_runner(lambda *xs: graphc.evaluate(graphc.trace(fn, *xs), *xs), program, "trace + evaluate"):
        return  # (both raised)
    graph = quietly(graphc.trace, fn, *inputs)
    want = quietly(graphc.evaluate, graph, *inputs)
    optimized = graphc.optimize(graph)
    got = quietly(graphc.evaluate, optimized, *inputs)
    assert_matches(
        got, want, "(optimized graph vs traced graph) " + describe(*program), exactness(steps, outputs, inputs)
    )
