"""A census of the fuzz targets: draw N programs, check each, and tally every failure by class
instead of stopping at the first (what ``pytest --hypothesis-profile long`` does).

    PYTHONPATH=$PWD .venv/bin/python -m tests.fuzz.census jit 1000 [--seed 0] [--out census.json]

Targets: the test functions of tests/fuzz/test_numpy_*.py (``jit``, ``optimized``, ``tp2``,
``dp2``, ``grad``, ``jvp_vjp``, ``dup_grad``). A failure's class is its message's first line with
numbers, paths and line numbers blanked; for each class the census keeps how many programs failed
and the shortest failing program's description (a starting point for a minimal repro).
"""

from __future__ import annotations

import argparse
import json
import pickle
import re
import sys
import time
import traceback
from collections.abc import Callable

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import UnsatisfiedAssumption


def _targets() -> dict[str, Callable]:
    from tests.fuzz import test_numpy_grad, test_numpy_jit, test_numpy_parallel

    return {
        "jit": test_numpy_jit.test_jit_equals_numpy,
        "optimized": test_numpy_jit.test_optimized_graph_equals_interpreter,
        "tp2": test_numpy_parallel.test_tp2_equals_numpy,
        "dp2": test_numpy_parallel.test_dp2_equals_numpy,
        "grad": test_numpy_grad.test_grad_equals_finite_differences,
        "jvp_vjp": test_numpy_grad.test_jvp_and_vjp_agree,
        "dup_grad": test_numpy_grad.test_duplicate_index_write_gradients,
    }


KEEP = 5  # the shortest failing programs kept per class


def classify(exc: BaseException) -> str:
    """A failure's class: the assertion's first line (and which call, when the second line says),
    the cause's type and first line, with the numbers and file:line locations blanked."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    text = lines[0]
    if len(lines) > 1 and lines[1].startswith("("):  # which call: "(second call)", "(optimized graph ...)"
        text += " " + lines[1].split(")")[0] + ")"
    cause = exc.__cause__
    if cause is not None:
        first = (str(cause).strip().splitlines() or [""])[0]
        text += f" <- {type(cause).__name__}: {first}"
    text = re.sub(r"[\w./-]+\.py:\d+", "FILE:LINE", text)
    text = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "N", text)
    return text[:300]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("n", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the census here (JSON)")
    parser.add_argument("--last", help="write each program here before running it")
    parser.add_argument("--dump", help="pickle every failing program here, with its class")
    args = parser.parse_args(argv)
    test = _targets()[args.target]
    inner = test.hypothesis.inner_test
    classes: dict[str, dict] = {}
    dumped: list = []
    counts: dict[str, float] = {"programs": 0, "failed": 0, "passed_seconds": 0.0}
    start = time.time()

    from tests.fuzz.programs import GRAD, describe, programs
    from tests.fuzz.test_numpy_grad import duplicate_writes

    if args.target == "dup_grad":
        strategy = duplicate_writes()
    else:
        strategy = programs(GRAD) if args.target in ("grad", "jvp_vjp") else programs()

    @seed(args.seed)
    @settings(
        max_examples=args.n,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(example):
        counts["programs"] += 1
        if args.last:  # (a crash of the process leaves the program that crashed it here)
            with open(args.last, "w") as f:
                f.write(describe(*example) if args.target != "dup_grad" else repr(example))
        began = time.perf_counter()
        try:
            inner(example)
            counts["passed_seconds"] += time.perf_counter() - began
        except UnsatisfiedAssumption:
            counts["programs"] -= 1  # (not a program this target checks)
            return
        except Exception as exc:
            counts["failed"] += 1
            key = classify(exc)
            text = describe(*example) if args.target != "dup_grad" else repr(example)
            entry = classes.setdefault(key, {"count": 0, "example": text, "detail": "", "shortest": []})
            entry["count"] += 1
            if len(text) <= len(entry["example"]):
                entry["example"] = text
                entry["detail"] = "".join(traceback.format_exception_only(type(exc), exc))[-2000:]
            entry["shortest"] = sorted({*entry["shortest"], text}, key=len)[:KEEP]
            if args.dump:
                dumped.append((key, example))
        if counts["programs"] % 200 == 0:
            print(f"{counts['programs']} programs, {counts['failed']} failed, {time.time() - start:.0f} s", flush=True)

    run()
    if args.dump:
        with open(args.dump, "wb") as f:
            pickle.dump(dumped, f)
    counts["seconds"] = round(time.time() - start)
    counts["passed_seconds"] = round(counts["passed_seconds"], 1)
    report = {"target": args.target, **counts, "classes": classes}
    text = json.dumps(report, indent=1, default=str)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    for key, entry in sorted(classes.items(), key=lambda kv: -kv[1]["count"]):
        print(f"\n== {entry['count']}x {key}\n{entry['example']}")
    passed = counts["programs"] - counts["failed"]
    print(
        f"\n{args.target}: {counts['programs']} programs, {counts['failed']} failed, {counts['seconds']} s "
        f"({passed} passed in {counts['passed_seconds']} s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
