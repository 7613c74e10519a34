"""Parameter server benchmark (graphc/api/ps.py): throughput of sync, SSP and async training with
one straggler, against sync in the same run.

    graphc bench ps [--workers 4] [--servers 2] [--delay-ms 5] [--staleness 3] [--steps 30] [--repeat 5]

The model is logistic regression (``--batch`` x ``--features`` float32 per batch), its gradient
jitted once and shared by the workers. The straggler sleeps ``--delay-ms`` before each of its
steps (a sleep, so it models a slow machine without taking a core from the others), in two
scenarios:

* **fixed**: worker 0 is slow on every step. Batches are dealt round-robin, so every worker has
  the same number of steps and the whole list takes the straggler's time in every mode; what SSP
  and async change is how fast the *other* workers go. So the figure is **worker steps/s**: the
  sum over workers of each one's steps over its own time from start to its last push.
* **rotating**: one worker at a time is slow, a different one every ``--period`` steps. Every
  worker is slow for 1/N of its steps; sync waits for whoever is slow in each round, SSP and
  async let the others run ahead, so the wall time of the whole list differs: the figure is
  **steps/s**, all steps over the wall time.

Contenders run interleaved (one run of each per round, ``--repeat`` rounds); each figure is the
median with half its spread. Sync uses ``--lr``, SSP and async (which apply every worker's
gradient, N times as many steps) ``--lr / N``; the final loss of each is printed as a check that
they all trained. Timings on a shared machine move by 20% or more from run to run: compare the
rows of one run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from graphc.api.jit import jit
from graphc.api.ps import train
from graphc.autodiff import grad


def loss(params: dict, x: np.ndarray, y: np.ndarray) -> Any:
    # x [batch, features], y [batch] in {0, 1}: the mean logistic loss
    z = x @ params["w"] + params["b"]
    return np.mean(np.logaddexp(0.0, z) - y * z)


def grad_fn(params: dict, batch: tuple) -> Any:
    x, y = batch
    return grad(loss)(params, x, y)


def make_problem(workers: int, steps: int, batch: int, features: int, seed: int = 0) -> tuple[list, dict]:
    """``workers * steps`` batches of a noisy linear classification problem, and zero params."""
    rng = np.random.default_rng(seed)
    w_true = rng.standard_normal(features)
    batches = []
    for _ in range(workers * steps):
        x = rng.standard_normal((batch, features)).astype(np.float32)
        y = (x @ w_true + 0.5 * rng.standard_normal(batch) > 0).astype(np.float32)
        batches.append((x, y))
    params = {"w": np.zeros(features, np.float32), "b": np.zeros((), np.float32)}
    return batches, params


def slow_on(scenario: str, index: int, workers: int, period: int) -> bool:
    """Whether batch ``index`` (worker ``index % workers``, its step ``index // workers``) is slow."""
    worker, step = index % workers, index // workers
    if scenario == "fixed":
        return worker == 0
    if scenario == "rotating":
        return worker == (step // period) % workers
    return False


def straggling(compiled, delay_s: float):
    """A grad_fn (for ``jit=False``) over batches tagged (x, y, slow): sleeps before the slow ones."""

    def step(params, batch):
        x, y, slow = batch
        if slow:
            time.sleep(delay_s)
        return compiled(params, (x, y))

    return step


def mean_loss(params: dict, batches: list) -> float:
    x = np.concatenate([b[0] for b in batches]).astype(np.float64)
    y = np.concatenate([b[1] for b in batches])
    z = x @ params["w"] + params["b"]
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def med(values: list[float]) -> str:
    return f"{statistics.median(values):9.1f} ± {(max(values) - min(values)) / 2:6.1f}"


def run_scenario(scenario: str, a: argparse.Namespace, compiled, batches: list, params: dict) -> None:
    n = a.workers
    tagged = [(x, y, slow_on(scenario, i, n, a.period)) for i, (x, y) in enumerate(batches)]
    contenders = [("sync", None, a.lr), ("ssp", a.staleness, a.lr / n), ("async", None, a.lr / n)]
    fn = straggling(compiled, a.delay_ms / 1e3)
    rates: dict[str, list[float]] = {m: [] for m, _, _ in contenders}
    wall: dict[str, list[float]] = {m: [] for m, _, _ in contenders}
    stale: dict[str, list[int]] = {m: [] for m, _, _ in contenders}
    losses: dict[str, list[float]] = {m: [] for m, _, _ in contenders}
    for _ in range(a.repeat):
        for mode, staleness, lr in contenders:
            trained, stats = train(
                fn, params, tagged, workers=n, servers=a.servers, mode=mode, staleness=staleness, lr=lr, jit=False
            )
            rates[mode].append(sum(s / t for s, t in zip(stats["steps"], stats["worker_seconds"])))
            wall[mode].append(len(batches) / stats["seconds"])
            stale[mode].append(stats["max_staleness"])
            losses[mode].append(mean_loss(trained, batches))
    figure = rates if scenario == "fixed" else wall
    what = "worker steps/s" if scenario == "fixed" else "steps/s (wall)"
    print(f"\n  {scenario} straggler: {what} is the figure ({a.repeat} interleaved rounds, median ± half spread)")
    print(f"  {'mode':<10} {'worker steps/s':>18} {'steps/s (wall)':>18} {'x sync':>7} {'max stale':>9} {'loss':>7}")
    sync = statistics.median(figure["sync"])
    for mode, staleness, _ in contenders:
        label = mode if staleness is None else f"{mode} s={staleness}"
        print(
            f"  {label:<10} {med(rates[mode]):>18} {med(wall[mode]):>18} "
            f"{statistics.median(figure[mode]) / sync:7.2f} {max(stale[mode]):>9} {statistics.median(losses[mode]):7.4f}"
        )


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="graphc bench ps", description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--delay-ms", type=float, default=5.0, help="the straggler's sleep before each slow step")
    ap.add_argument("--staleness", type=int, default=3, help="SSP's bound")
    ap.add_argument("--steps", type=int, default=30, help="steps per worker")
    ap.add_argument("--period", type=int, default=2, help="rotating: steps before the next worker is slow")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    batches, params = make_problem(a.workers, a.steps, a.batch, a.features)
    compiled = jit(grad_fn)
    compiled(params, batches[0])  # compiled before any timing
    start = time.perf_counter()
    for b in batches[: 4 * a.workers]:
        compiled(params, b)
    step_ms = (time.perf_counter() - start) / (4 * a.workers) * 1e3
    print(
        f"parameter server benchmark: logistic regression, batches of {a.batch} x {a.features} float32, "
        f"{a.workers} workers x {a.steps} steps, {a.servers} servers"
    )
    print(
        f"  one gradient step: {step_ms:.2f} ms on one thread; straggler delay: {a.delay_ms:g} ms a slow step "
        f"(rotating: a new slow worker every {a.period} steps); SSP staleness {a.staleness}"
    )
    for scenario in ("fixed", "rotating"):
        run_scenario(scenario, a, compiled, batches, params)


if __name__ == "__main__":
    main()
