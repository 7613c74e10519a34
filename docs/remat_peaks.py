"""Peak memory of a GPT training step with and without recomputation: the plan's prediction and
the threaded runtime's measurement (docs/remat.md).

    python docs/remat_peaks.py
"""

from __future__ import annotations

import numpy as np

import graphc
from graphc.core.pytree import flatten
from graphc.interpreter import bind_arguments
from graphc.models import gpt


def main() -> None:
    args, kw = gpt.example_train_args(batch=16, seq=32, d=32)
    results = {}
    for mode, limit in [(False, None), ("auto", 3_300_000), ("auto", 3_100_000), (True, None)]:
        pf = graphc.parallelize(
            gpt.train_step, mesh={"dp": 2}, memory_limit=limit, static_argnames=("n_head",), recompute=mode, cache=False
        )
        c = pf.compile(*args, **kw)
        dyn, dkw, _ = pf.split_static(args, kw)
        arrays = bind_arguments(c.graph, dyn, dkw)
        peaks = []
        for _ in range(3):
            outs = c.executable.run_flat(arrays, profile=True)
            peaks.append(max(p["peak_bytes"] for p in c.executable.last_profile.values()))
        results[(mode, limit)] = outs
        again = [n for n in c.plan.nodes if n.recompute]
        print(
            f"recompute={mode!s:5} limit={limit}: {len(again)} recomputed, predicted step "
            f"{c.plan.cost.total_s * 1e3:.3f} ms, plan peak {c.plan.memory.peak_bytes[0]:,}, "
            f"measured peak_bytes {peaks}"
        )
    base = results[(False, None)]
    for key, outs in results.items():
        diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(flatten(outs)[0], base))
        print(key, "max |diff| against no recomputation:", diff)


if __name__ == "__main__":
    main()
