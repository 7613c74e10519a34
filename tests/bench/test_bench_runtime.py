"""``graphc bench runtime``'s jit-call rows on a small size: the rows it prints, and the results of
the calls it times against numpy (no timing is checked)."""

import re

from graphc.bench.runtime import jit_call_rows
from graphc.runtime.executor import STRAIGHT_BYTES


def test_jit_call_rows_time_right_results_against_a_fresh_copy():
    size = 2 * STRAIGHT_BYTES // 4  # float32 results large enough to be lent (runtime/lending.py)
    rows = jit_call_rows(rounds=1, size=size, width=256)
    assert [r.figure for r in rows] == [
        "jit(gelu), 512K float32, 1-d",
        "jit(softmax), 2K rows of 256",
        "jit(layer norm), 2K rows",
        "  the same, last 2 results kept",
    ]
    assert [r.target for r in rows] == [0.8, 0.7, 0.7, 0.0]
    for r in rows:
        assert r.peer == "2-thread copy, new array"
        assert len(r.graphc_s) == len(r.peer_s) == 15 and min(r.graphc_s + r.peer_s) > 0
        err = float(re.search(r"max err (\S+?),?(?: |$)", r.note).group(1))
        # a result written over while held would be off by O(1); graphc's float32 exp/tanh and the
        # kernels' few roundings keep these within a few float32 ulps (~1e-6) of numpy's
        assert err < 1e-5, r.note
