"""The training-layout table of docs/guide/memory.md (issue 21) and of docs/seqpar.md: one GPT train step on
4 devices, per layout its predicted and measured memory per device and traffic per step.

    .venv/bin/python docs/layouts_table.py [profile] [memory limit] [--all]

Layouts, each the solver's plan (priced with the profile given, default h100-sxm):
  dp=4               {"dp": 4}, tokens and targets given split on the batch (ZeRO off)
  dp=2, tp=2         {"dp": 2, "tp": 2}, no limit
  dp=2, tp=2, limit  the same under the memory limit given as the second argument
and with --all also: dp=4 with ZeRO-1, -2 and -3 forced, dp=4 with every activation that can be
recomputed recomputed, and the parameter server (graphc.ps.train, 4 workers, 2 servers, sync:
its traffic is each worker's pull and push of the parameters, its memory a worker's copy).

Predicted memory: the plan's liveness peak (``plan.memory.peak_bytes``, what a limit bounds)
and with redistribution buffers (``held``). Measured: the executor's profiled peak of the
device (its inputs, constants, live arrays and the buffer pool's free buffers). Traffic: the
bytes each device sends per step (``wire_bytes``: the ring algorithm's share of each
collective), from the plan's collectives and from the runtime's communication log.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import graphc
from graphc.core.pytree import flatten
from graphc.core.units import fmt_bytes
from graphc.interpreter import bind_arguments
from graphc.models import gpt

BATCH, SEQ, D, N_LAYER, N_HEAD = 4, 512, 512, 1, 4
MESH = {"dp": 2, "tp": 2}
ARGS = [a for a in sys.argv[1:] if a != "--all"]
PROFILE = ARGS[0] if ARGS else "h100-sxm"  # prices the plans (runs are on threads here)
LIMIT = ARGS[1] if len(ARGS) > 1 else None  # a memory limit for one more row: the solver's plan under it


def wire_bytes(kind: str, n: int, nbytes: int) -> float:
    """Bytes one device sends for a collective over ``n`` devices whose operand (gathered result,
    for an all-gather) is ``nbytes``, by the ring algorithm: an all-reduce sends twice what a
    reduce-scatter or an all-gather of the same tensor sends."""
    if kind in ("slice", "zero"):
        return 0.0
    return (2 if kind == "all_reduce" else 1) * (n - 1) / n * nbytes


def run(name, mesh, limit=None, in_specs=None, zero=0, recompute="off"):
    args, kw = gpt.example_train_args(batch=BATCH, seq=SEQ, d=D, n_layer=N_LAYER, n_head=N_HEAD)
    pf = graphc.parallelize(
        gpt.train_step,
        mesh=mesh,
        memory_limit=limit,
        in_specs=in_specs,
        static_argnames=("n_head", "lr"),
        cache=False,
        profile=PROFILE,
        recompute=recompute,  # off unless asked: under a limit recomputation may fit it more cheaply (docs/seqpar.md)
        zero=zero,
    )
    t0 = time.perf_counter()
    compiled = pf.compile(*args, **kw)
    plan_s = time.perf_counter() - t0
    got = compiled(*args, **kw)
    want = gpt.train_step(*args, **kw)
    for a, b in zip(flatten(got)[0], flatten(want)[0]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)  # equal to one device
    ex = compiled.executable
    ex.run_sharded(ex.shard(bind_arguments(compiled.graph, args, {})), profile=True)
    plan = compiled.plan
    prof = ex.last_profile or {}
    measured = max(p["peak_bytes"] for p in prof.values())
    sent = sum(wire_bytes(r["kind"], len(r["group"]), r["bytes"]) for r in prof[0]["comm_log"])
    kinds: dict[str, int] = {}
    for r in prof[0]["comm_log"]:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    sizes = dict(zip(plan.mesh.axis_names, plan.mesh.shape))
    predicted = sum(wire_bytes(c.kind, sizes[c.axes[0]], c.local_bytes) for c in plan.collectives)
    ln = sorted({str(n.out_specs[0]) for n in plan.nodes if n.part == "forward" and str(n.loc).endswith("gpt.py:30")})
    print(
        f"| {name} | {fmt_bytes(plan.memory.peak_bytes[0])} / {fmt_bytes(plan.memory.held[0])} "
        f"| {fmt_bytes(measured)} | {fmt_bytes(int(predicted))} | {fmt_bytes(int(sent))} "
        f"| {plan.cost.comm_s * 1e3:.2f} / {plan.cost.total_s * 1e3:.1f} ms "
        f"| {', '.join(f'{k} x{v}' for k, v in sorted(kinds.items()))} | {' '.join(ln)} | {plan_s:.1f} s |",
        flush=True,
    )
    return plan


def main():
    print(f"GPT train step, batch {BATCH} x {SEQ} tokens, d={D}, {N_LAYER} block, {N_HEAD} heads; profile {PROFILE}")
    print(
        "| layout | predicted peak / held | measured peak | predicted traffic | measured traffic "
        "| predicted comm / step | collectives (device 0) | layer norm x-mean | compile |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    run("dp=4", {"dp": 4}, in_specs=(None, None, "S(0)", "S(0)"))
    run("dp=2, tp=2", MESH)
    if LIMIT:
        run(f"dp=2, tp=2, limit {LIMIT}", MESH, limit=LIMIT)
    if "--all" in sys.argv:
        for stage in (1, 2, 3):
            run(f"dp=4, ZeRO-{stage}", {"dp": 4}, in_specs=(None, None, "S(0)", "S(0)"), zero=stage)
        run("dp=4, recompute all", {"dp": 4}, in_specs=(None, None, "S(0)", "S(0)"), recompute="on")
        parameter_server()


def parameter_server(workers: int = 4, servers: int = 2, steps: int = 2) -> None:
    """graphc.ps.train in sync mode on the same model's gradients: each worker holds a full copy
    of the parameters and its gradients, and pulls and pushes the parameters every step."""
    args, kw = gpt.example_train_args(batch=BATCH, seq=SEQ, d=D, n_layer=N_LAYER, n_head=N_HEAD)
    params, _, tokens, targets = args
    step = BATCH // workers
    batches = [(tokens[i * step : (i + 1) * step], targets[i * step : (i + 1) * step]) for i in range(workers * steps)]

    def grad_fn(p, batch):
        return graphc.grad(gpt.lm_loss)(p, batch[0], batch[1], N_HEAD)

    nbytes = sum(a.nbytes for a in flatten(params)[0])
    start = time.perf_counter()
    _, stats = graphc.ps.train(grad_fn, params, batches, workers=workers, servers=servers, mode="sync", lr=1e-3)
    print(
        f"| parameter server, {workers} workers, {servers} servers, sync | {fmt_bytes(2 * nbytes)} + activations "
        f"| (not profiled) | {fmt_bytes(2 * nbytes)} (pull + push) | not counted | {stats['seconds'] * 1e3 / steps:.0f} ms "
        f"a round here | | | {time.perf_counter() - start:.1f} s |",
        flush=True,
    )


if __name__ == "__main__":
    main()
