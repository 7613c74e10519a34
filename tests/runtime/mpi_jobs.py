"""Jobs tests/runtime/test_mpi.py runs under ``mpiexec -n N python tests/runtime/mpi_jobs.py JOB ...`` (not a test
module: every rank runs it). Each job prints ``ok <rank>`` on every rank that finished and writes
what the test compares (rank 0, ``.npz``).

    collectives [DTYPE]          every collective kind and layout, and send/recv, on MpiComm and on
                                 ThreadComm (in this process): identical bits (DTYPE f32, bf16, f16)
    step MESH OUT [M SCHEDULE]   the GPT training step on MESH (a pipeline of M micro-batches with
                                 a pp axis): the gathered results to OUT; whole inputs, a
                                 ShardedInput and a memory-mapped .npy give the same bits, and
                                 each rank builds or reads only its piece
    train MESH OUT STEPS M SCHEDULE
                                 STEPS GPT training steps on a pipeline MESH, each fed the state
                                 the last returned (ShardedArrays held by the stage that owns
                                 them): every step's gathered results to OUT
    reshard OUT                  ShardedArrays from dp=2 steps fed to tp=2 steps (the GPT training
                                 step's state; a batch-split activation): redistributed on the
                                 ranks, the gathered results to OUT
    soak MESH STEPS OUT          STEPS GPT training steps on MESH, each fed the state the last
                                 returned; every rank prints its RSS, threads and open files at
                                 step STEPS // 10 and at the end, rank 0 writes the gathered state
    loop                         every rank all-reduces in a loop (at most 60 s), after printing
                                 ``ready <rank> <pid>`` once every rank is in it and watches the
                                 others' processes: a rank to kill
    raise                        rank 1 raises in the user's loop while rank 0 waits in a collective
    alias MESH                   results share no memory with the arguments on any rank
    low_float DTYPE MESH OUT     the MLP's value_and_grad on 16-bit floats (bf16, f16): the gathered
                                 results to OUT
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time

import numpy as np

import graphc
from graphc.core.pytree import flatten
from graphc.core.spec import S
from graphc.models import gpt, mlp
from graphc.runtime.comm import ThreadWorld
from graphc.runtime.devices import ShardedArray
from graphc.runtime.mpi import MpiComm
from graphc.runtime.mpi_world import MpiWorld

STATIC = ("n_head", "lr")


def example():
    return gpt.example_train_args(batch=8, seq=16, n_layer=1)


def _threaded(n: int, body) -> dict:
    world = ThreadWorld(n, timeout_s=20)
    results: dict = {}
    threads = [threading.Thread(target=lambda d=d: results.__setitem__(d, body(world.comm(d), d))) for d in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


CASES = [  # (kind, shape on n ranks, attributes; root -1: the last rank)
    ("all_reduce", lambda n: (7,), {}),
    ("all_reduce", lambda n: (100_000,), {}),  # above SMALL_ALL_REDUCE_BYTES: chunks
    ("all_reduce_inplace", lambda n: (3, 7000), {}),
    ("reduce_scatter", lambda n: (4 * n, 6), {"dim": 0}),
    ("reduce_scatter", lambda n: (3, 2 * n), {"dim": 1}),
    ("reduce_scatter", lambda n: (2, 6 * n), {"dim": 1, "blocks": 3}),
    ("reduce_scatter", lambda n: (2 * n + 1, 3), {"dim": 0}),  # uneven pieces
    ("all_gather", lambda n: (3, 5), {"dim": 0}),  # uneven: rank r passes 3 + r rows
    ("all_gather", lambda n: (3, 5), {"dim": 1}),
    ("all_gather", lambda n: (2, 6), {"dim": 1, "blocks": 3}),
    ("all_to_all", lambda n: (2 * n, 4), {"split_dim": 0, "concat_dim": 1}),
    ("all_to_all", lambda n: (3, 4, 6 * n), {"split_dim": 2, "concat_dim": 1, "split_blocks": 3}),
    ("broadcast", lambda n: (5, 3), {"root": -1}),
    ("scatter", lambda n: (2 * n, 3), {"root": 0, "dim": 0}),
    ("scatter", lambda n: (3, 6 * n), {"root": -1, "dim": 1, "blocks": 3}),
    ("gather", lambda n: (2, 3), {"root": 1, "dim": 1}),
    ("reduce", lambda n: (9, 4), {"root": 0}),
]


def collectives(dtype_name: str = "f32") -> None:
    dtype = {"f32": np.float32, "bf16": graphc.bfloat16, "f16": np.float16}[dtype_name]
    world = MpiWorld.get()
    n, rank = world.size, world.rank
    group = tuple(range(n))
    world.setup([group])
    comm = MpiComm(world, timeout_s=20)
    comm.check_calls = True
    for k, (kind, shape_of, attrs) in enumerate(CASES):
        attrs = {a: (v % n if v >= 0 else n - 1) if a == "root" else v for a, v in attrs.items()}
        shape = shape_of(n)

        def call(c, d, kind=kind, shape=shape, attrs=attrs, k=k):
            rng = np.random.default_rng(100 * k + d)
            if kind == "all_gather" and attrs["dim"] == 0:
                shape = (shape[0] + d, *shape[1:])
            x = rng.standard_normal(shape).astype(dtype)
            if kind == "all_reduce_inplace":
                return c.all_reduce(x, group, inplace=True)
            return getattr(c, kind)(x, group, **attrs)

        want = _threaded(n, call)[rank]
        got = call(comm, rank)
        if want is None or got is None:
            assert want is None and got is None, (kind, attrs)
            continue
        assert got.shape == want.shape and got.dtype == want.dtype, (kind, attrs, got.shape, want.shape)
        assert got.tobytes() == want.tobytes(), f"{kind} {shape} {attrs}: different bits from the threaded backend"
    # send/recv: FIFO per (source, tag), tags independent, any dtype
    right, left = (rank + 1) % n, (rank - 1) % n
    for t in range(3):
        comm.send(np.arange(6, dtype=np.int64).reshape(2, 3) * rank + t, right, tag=5)
    comm.send(np.full(4, rank, np.float16), right, tag=9)
    assert comm.recv(left, tag=9).tolist() == [left] * 4
    for t in range(3):
        y = comm.recv(left, tag=5)
        assert y.shape == (2, 3) and (y == np.arange(6).reshape(2, 3) * left + t).all()
    comm.flush_sends()
    comm.barrier(group)
    print(f"ok {rank}", flush=True)


def step(mesh: str, out: str, microbatches: int = 1, schedule: str = "1f1b") -> None:
    (params, state, tokens, targets), kwargs = example()
    pf = graphc.parallelize(
        gpt.train_step, mesh=mesh, static_argnames=STATIC, backend="mpi", microbatches=microbatches, schedule=schedule
    )
    world = pf.world
    first = pf(params, state, tokens, targets, **kwargs)
    leaves = flatten(first)[0]
    assert all(isinstance(x, graphc.ShardedArray) for x in leaves)
    whole = [x.gather(0) for x in leaves]

    # the same step with the tokens built piece by piece and the targets read from a memmap
    asked: list = []

    def make_tokens(index):
        asked.append(index)
        return tokens[index]

    path = os.path.join(tempfile.gettempdir(), f"graphc-mpi-targets-{os.getppid()}-{world.rank}.npy")
    np.save(path, targets)
    lazy = pf(
        params,
        state,
        graphc.sharded_input(tokens.shape, tokens.dtype, make_tokens),
        np.load(path, mmap_mode="r"),
        **kwargs,
    )
    os.unlink(path)
    lazy_whole = [x.gather(0) for x in flatten(lazy)[0]]
    # no rank builds the whole batch: a data-parallel piece, or one micro-batch of it
    rows = [len(range(*i[0].indices(tokens.shape[0]))) for i in asked]
    assert all(r * max(2 if "dp=2" in mesh else 1, microbatches) <= tokens.shape[0] for r in rows), asked
    if microbatches == 1:  # the state stays on the devices: its pieces go back in as they are
        new_params, new_state, _loss = first
        again = pf(new_params, new_state, tokens, targets, **kwargs)
        again_whole = [x.gather(0) for x in flatten(again)[0]]
    if world.rank == 0:
        for a, b in zip(whole, lazy_whole):
            assert a.tobytes() == b.tobytes(), "a ShardedInput / memmap gave other bits than whole inputs"
        arrays = {f"first_{i}": a for i, a in enumerate(whole)}
        if microbatches == 1:
            arrays.update({f"again_{i}": a for i, a in enumerate(again_whole)})
        np.savez(out, **arrays)
    print(f"ok {world.rank}", flush=True)


def train(mesh: str, out: str, steps: int, microbatches: int, schedule: str) -> None:
    """A training loop: every step takes the parameters and optimizer state the last returned."""
    (params, state, tokens, targets), kwargs = example()
    pf = graphc.parallelize(
        gpt.train_step, mesh=mesh, static_argnames=STATIC, backend="mpi", microbatches=microbatches, schedule=schedule
    )
    arrays = {}
    for s in range(steps):
        params, state, loss = pf(params, state, tokens, targets, **kwargs)
        for i, x in enumerate(flatten((params, state, loss))[0]):
            whole = x.gather(0)
            if pf.world.rank == 0:
                arrays[f"step{s}_{i}"] = whole
    if pf.world.rank == 0:
        np.savez(out, **arrays)
    print(f"ok {pf.world.rank}", flush=True)


def hidden(x, w):
    return np.tanh(x @ w)  # [batch, d] -> [batch, h]


def head(h, w2):
    return np.sum((h @ w2) ** 2, axis=1)  # [batch, h] -> [batch]


def reshard(out: str) -> None:
    """dp=2 results (ShardedArrays in the dp plan's specs) passed to tp=2 steps, which want them in
    theirs: the GPT step's new parameters and state, and a batch-split activation."""
    (params, state, tokens, targets), kwargs = example()
    dp = graphc.parallelize(gpt.train_step, mesh="dp=2", static_argnames=STATIC, backend="mpi")
    tp = graphc.parallelize(gpt.train_step, mesh="tp=2", static_argnames=STATIC, backend="mpi")
    params, state, _ = dp(params, state, tokens, targets, **kwargs)
    result = tp(params, state, tokens, targets, **kwargs)
    rng = np.random.default_rng(0)
    x, w, w2 = (rng.standard_normal(s).astype(np.float32) for s in ((16, 8), (8, 12), (12, 6)))
    h = graphc.parallelize(hidden, mesh="dp=2", backend="mpi")(x, w)
    assert h.spec == (S(0),), h.spec
    ys = []
    for pins in (("R", "S(1)"), ("S(1)", "R")):  # all_gather; all_to_all
        tp_head = graphc.parallelize(head, mesh="tp=2", backend="mpi", in_specs=pins)
        assert tp_head.compile(h, w2).program.in_specs[0] != h.spec
        ys.append(tp_head(h, w2))
    gathered = [a.gather(0) for a in flatten((result, ys))[0]]
    if tp.world.rank == 0:
        np.savez(out, **{f"r{i}": a for i, a in enumerate(gathered)})
    print(f"ok {tp.world.rank}", flush=True)


def process_usage() -> tuple[int, int, int]:
    """(resident bytes, threads, open file descriptors) of this process (Linux /proc)."""
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return rss, len(os.listdir("/proc/self/task")), len(os.listdir("/proc/self/fd"))


def soak_steps(pf, steps: int):
    """``steps`` GPT training steps of ``pf`` on the example, each fed the state the last returned:
    (params, state, the losses, process_usage() at step ``steps // 10`` and at the end)."""
    (params, state, tokens, targets), kwargs = example()
    first = None
    losses = []
    for s in range(steps):
        if s == steps // 10:
            first = process_usage()
        params, state, loss = pf(params, state, tokens, targets, **kwargs)
        losses.append(float(np.asarray(loss)))
    assert first is not None
    return params, state, losses, first, process_usage()


def soak(mesh: str, steps: int, out: str) -> None:
    pf = graphc.parallelize(gpt.train_step, mesh=mesh, static_argnames=STATIC, backend="mpi")
    params, state, losses, first, last = soak_steps(pf, steps)
    print(f"usage {pf.world.rank} {' '.join(map(str, first + last))}", flush=True)
    gathered = [x.gather(0) for x in flatten((params, state))[0]]
    if pf.world.rank == 0:
        np.savez(out, *gathered, losses=np.array(losses))
    print(f"ok {pf.world.rank}", flush=True)


def all_reduce_loop() -> None:
    world = MpiWorld.get()
    group = tuple(range(world.size))
    world.setup([group])
    comm = MpiComm(world, timeout_s=30)
    x = np.ones(1 << 18, np.float32)
    comm.all_reduce(x, group)
    comm.barrier(group)
    deadline = time.monotonic() + 30
    while not world.watching_peers() and time.monotonic() < deadline:  # (the watchdog's exchange of pids)
        time.sleep(0.001)
    print(f"ready {world.rank} {os.getpid()}", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        comm.all_reduce(x, group)
    print(f"rank {world.rank} finished the loop", flush=True)


def raise_on_rank_1() -> None:
    (params, state, tokens, targets), kwargs = example()
    pf = graphc.parallelize(gpt.train_step, mesh="dp=2", static_argnames=STATIC, backend="mpi", timeout_s=20)
    pf(params, state, tokens, targets, **kwargs)
    if pf.world.rank == 1:
        raise ValueError("boom on rank 1")
    pf(params, state, tokens, targets, **kwargs)  # waits for rank 1 in its first collective
    print("rank 0 finished a step without rank 1", flush=True)


def alias(mesh: str) -> None:
    """Every rank's pieces of the results share no memory with its arguments (issue 27): a pure
    reshape, a copy, an argument passed through, and a pipeline that returns its arguments."""
    from graphc.models import mlp

    x = np.arange(48.0).reshape(8, 6)
    if mesh.startswith("pp"):
        (args, kwargs) = mlp.example_train_args()

        def passing(params, x, labels, lr=0.1):
            new, loss = mlp.train_step(params, x, labels, lr)
            return new, loss, params, x

        pf = graphc.parallelize(passing, mesh=mesh, microbatches=2, backend="mpi")
        cases = [(pf, args, kwargs)]
    else:
        cases = [
            (graphc.parallelize(f, mesh=mesh, backend="mpi"), (x,), {})
            for f in (lambda x: x.reshape(-1), lambda x: np.copy(x), lambda x: (x, x * 1))
        ]
    for pf, args, kwargs in cases:
        ins, _ = flatten(args)
        outs, _ = flatten(pf(*args, **kwargs))
        for o in outs:
            local = (
                (o.local if o.pieces else None) if isinstance(o, ShardedArray) else o
            )  # (a rank outside its stage holds none)
            if isinstance(local, np.ndarray):
                assert not any(np.shares_memory(local, a) for a in ins), "a result shares memory with an argument"
    print(f"ok {pf.world.rank}", flush=True)


def mlp_case(dtype, batch=32, sizes=(24, 16, 16, 5)):
    """The MLP's loss arguments with parameters and inputs in ``dtype`` (tests/runtime/test_low_float.py)."""
    (params, x, labels), _ = mlp.example_loss_args(batch, sizes, seed=3)
    layers = [{k: a.astype(dtype) for k, a in layer.items()} for layer in params["layers"]]
    return {"layers": layers}, x.astype(dtype), labels


def low_float(dtype_name: str, mesh: str, out: str) -> None:
    """tests/runtime/test_low_float.py: a 16-bit MLP's loss and gradients under MPI."""
    dtype = graphc.bfloat16 if dtype_name == "bf16" else np.float16
    params, x, labels = mlp_case(dtype)
    pf = graphc.parallelize(graphc.value_and_grad(mlp.loss), mesh=mesh, backend="mpi")
    whole = [a.gather(0) for a in flatten(pf(params, x, labels))[0]]
    if pf.world.rank == 0:
        np.savez(out, **{f"leaf_{i}": a.view(np.uint16) for i, a in enumerate(whole)})
    print(f"ok {pf.world.rank}", flush=True)


if __name__ == "__main__":
    job, *rest = sys.argv[1:]
    if job == "collectives":
        collectives(*rest)
    elif job == "step":
        step(rest[0], rest[1], *(int(rest[2]), rest[3]) if len(rest) > 2 else ())
    elif job == "train":
        train(rest[0], rest[1], int(rest[2]), int(rest[3]), rest[4])
    elif job == "reshard":
        reshard(rest[0])
    elif job == "soak":
        soak(rest[0], int(rest[1]), rest[2])
    elif job == "loop":
        all_reduce_loop()
    elif job == "raise":
        raise_on_rank_1()
    elif job == "alias":
        alias(rest[0])
    elif job == "low_float":
        low_float(rest[0], rest[1], rest[2])
    else:
        raise SystemExit(f"unknown job {job!r}")
