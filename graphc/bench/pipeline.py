"""Pipeline benchmark: measured bubble fraction against (S-1)/(M+S-1), and 1F1B's activation
memory against GPipe's, on a balanced pipeline (equal layers).

    graphc bench pipeline [--stages 2] [--repeat 5]

The model is a stack of equal-width layers (models/mlp.py), so the stage cut can balance the
stages; each configuration runs warm ``repeat`` times with profiling, and the median measured
bubble (1 - busy / (devices x span) of the forward and backward tasks) is printed next to the
theory. Memory is what the runtime measures: the most a stage holds between tasks (activations
of the micro-batches in flight and the running gradient sums) and its peak.
"""

from __future__ import annotations

import argparse
import statistics
import time

from graphc.core.units import fmt_bytes
from graphc.frontend.entry import trace
from graphc.interpreter import bind_arguments
from graphc.models import mlp
from graphc.passes.microbatch import microbatch
from graphc.passes.options import PlanOptions
from graphc.passes.partition import optimize_for_planning
from graphc.passes.pipeline import plan_pipeline
from graphc.passes.pipeline_lower import lower_pipeline
from graphc.runtime.pipeline import PipelineExecutable


def uneven_theory(prof: dict, m: int) -> float:
    """The bubble a pipeline of these measured stage times has with no overhead: per micro-batch,
    stage s takes t_s (median forward + median backward); the step then takes sum_s t_s + (M-1)
    max_s t_s, and the stages are busy M sum_s t_s of S times that."""
    t = []
    for p in prof.values():
        f = [e[3] - e[2] for e in p["events"] if e[0] == "F"]
        b = [e[3] - e[2] for e in p["events"] if e[0] == "B"]
        t.append(statistics.median(f) + statistics.median(b))
    span = sum(t) + (m - 1) * max(t)
    return 1.0 - m * sum(t) / (len(t) * span)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="graphc bench pipeline", description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=512)
    a = ap.parse_args(argv)
    args, kw = mlp.example_train_args(batch=a.batch, sizes=(a.width,) * (a.layers + 1) + (16,))
    g = optimize_for_planning(trace(mlp.train_step, *args, **kw))
    flat = bind_arguments(g, args, kw)
    S = a.stages
    print(
        f"pipeline benchmark: MLP of {a.layers} layers {a.width} wide, batch {a.batch}, {S} stages "
        f"(one thread each, one BLAS thread each)"
    )
    print("  theory: (S-1)/(M+S-1) for equal stages; uneven: the same schedule with the stage times measured here")
    print(
        f"  {'schedule':<8} {'M':>3} {'step':>10} {'bubble measured':>16} {'theory':>7} {'uneven':>8} {'predicted':>9} "
        f"{'held (stage 0)':>15} {'peak (stage 0)':>15}"
    )
    for m in (1, 2, 4, 8, 16):
        for schedule in ("gpipe", "1f1b"):
            mb = microbatch(g, m)
            plan = plan_pipeline(g, {"pp": S}, PlanOptions(microbatches=m, schedule=schedule), mb=mb)
            pe = PipelineExecutable(lower_pipeline(g, plan, mb))
            pe.run_flat(flat)
            bubbles, steps = [], []
            for _ in range(a.repeat):
                t = time.perf_counter()
                pe.run_flat(flat, profile=True)
                steps.append(time.perf_counter() - t)
                bubbles.append(pe.measured_bubble())
            prof = pe.last_profile
            assert prof is not None  # the runs above were profiled
            d0 = min(prof)
            print(
                f"  {schedule:<8} {m:>3} {statistics.median(steps) * 1e3:8.1f} ms {statistics.median(bubbles):>15.1%} "
                f"{(S - 1) / (m + S - 1):>7.1%} {uneven_theory(prof, m):>8.1%} {plan.predicted['bubble']:>9.1%} "
                f"{fmt_bytes(prof[d0].get('held_bytes', 0)):>15} {fmt_bytes(prof[d0]['peak_bytes']):>15}"
            )


if __name__ == "__main__":
    main()
