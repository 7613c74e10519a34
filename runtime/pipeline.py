"""The pipeline runtime: runs a ``graphc.programs.PipelineProgram`` (built by
graphc/passes/pipeline_lower.py; nothing is planned or lowered here).

Every device runs its tasks in the order the program gives (GPipe or 1F1B): a forward task
``F(k)`` and a backward task ``B(k)`` per micro-batch, then its update tasks ``U``. Tasks are
graphs run by the single-device executor, whose collectives go to the device's communicator with
sub-mesh ranks mapped to the stage's devices.

Values crossing stages go through send/recv (tagged by value and micro-batch); values staying on a
device (residuals kept from F(k) for B(k)) are held until their last use. Meeting points add the
micro-batches' pieces in micro-batch order on the devices that produce them; the sub-mesh
collectives of the update (the data-parallel gradient all-reduce) then run once per step.
Everything is sent as soon as it is produced and the update is cut where it needs another stage's
update result, so devices cannot wait on each other in a cycle; every wait is bounded.

Memory follows the plan's models (passes/microbatch.py ``AccumulatingMemory`` for one stage,
passes/pipeline.py ``_stage_memory`` for a pipeline's): a device's tasks share one buffer pool,
trimmed before each task to that task's high-water mark; a backward task is handed the forward
values that die in it (``_dying``) and frees each at its last use; another micro-batch's copy of a
value the update reads is dropped after its backward task; a value one update segment passes to
a later one is dropped after the last segment reading it; forward and backward results are not
copied off their arguments (they stay in the pipeline).

``run_flat(arrays, profile=True)`` also records every task's start and end (Chrome trace,
measured bubble fraction), each device's peak bytes (what it holds besides the running task's
arguments: its pieces of the state and one micro-batch's inputs, its constants (one copy each,
shared by its tasks), the values kept; plus the task's
own peak: its arguments, the arrays it made, the pool's free buffers) and ``held_bytes``, the most
it holds between forward and backward tasks besides its inputs (the activations of the
micro-batches in flight and the running gradient sums).
"""

from __future__ import annotations

import time

import numpy as np

from graphc.core.buffers import unaliased
from graphc.core.errors import GraphcError
from graphc.core.spec import format_spec, unshard
from graphc.programs import PipelineProgram, PipelineTask
from graphc.runtime.comm import ThreadWorld
from graphc.runtime.constants import ConstantTable
from graphc.runtime.devices import CommProxy, ShardedArray, ShardedInput, local_piece, run_on_devices
from graphc.runtime.executor import BufferPool, Executable

_TAG_STRIDE = 4096  # message tag = value id * stride + micro-batch + 1 (-1: a value of the whole step)


class _SubMeshComm:
    """A device's communicator for programs lowered on its stage's sub-mesh: group members are
    sub-mesh device ids, mapped to the devices of this stage."""

    def __init__(self, comm, devices: tuple[int, ...]):
        self.comm = comm
        self.devices = devices
        self._groups: dict[tuple, tuple] = {}

    def _g(self, group):
        hit = self._groups.get(group)
        if hit is None:
            hit = self._groups[group] = tuple(self.devices[d] for d in group)
        return hit

    def all_reduce(self, x, group, inplace=False):
        return self.comm.all_reduce(x, self._g(group), inplace)

    def reduce_scatter(self, x, group, dim, blocks=1):
        return self.comm.reduce_scatter(x, self._g(group), dim, blocks)

    def all_gather(self, x, group, dim, blocks=1):
        return self.comm.all_gather(x, self._g(group), dim, blocks)

    def all_to_all(self, x, group, split_dim, concat_dim, split_blocks=1, concat_blocks=1):
        return self.comm.all_to_all(x, self._g(group), split_dim, concat_dim, split_blocks, concat_blocks)


class PipelineExecutable:
    """Runs a PipelineProgram: every device on a thread (``run_flat``), or, under MPI, the one
    device of this process (``devices=(rank,)``, runtime/ranks.py), whose tasks alone are built."""

    def __init__(self, program: PipelineProgram, timeout_s: float = 60.0, devices=None):
        self.program = program
        self.mesh = program.mesh
        self.m = program.m
        self.schedule = program.schedule
        self.timeout_s = timeout_s
        built = None if devices is None else set(devices)
        self.comms = {d: CommProxy() for devs in program.stage_devices for d in devs if built is None or d in built}
        # a device's tasks run one at a time: they share one buffer pool, so it keeps one task's
        # free buffers (at most its liveness high-water mark), not one pool per task and micro-batch
        self.pools = {d: BufferPool() for d in self.comms}
        sent = {v for task in program.tasks.values() for v in task.sends}
        self.donated = {key: _dying(program, task, sent) for key, task in program.tasks.items()}
        # a device's tasks read one copy of each constant (the k forward and k backward tasks of
        # the micro-batches and the update read the same mask), held all step and counted once
        self.constants = {d: ConstantTable() for d in self.comms}
        self.executables = {
            key: Executable(
                task.graph,
                self.comms[task.device],
                self.pools[task.device],
                self.donated[key],
                constants=self.constants[task.device],
            )
            for key, task in program.tasks.items()
            if built is None or task.device in built
        }
        self.last_profile: dict | None = None
        self._inputs_read: dict[int, set[int]] = {
            d: set() for devs in program.stage_devices for d in devs
        }  # the pieces each builds
        for (d, _ph, _k), task in program.tasks.items():
            self._inputs_read[d].update(v for v in task.in_ids if v < program.n_inputs)
        # meeting sums live in buffers kept from step to step: a fresh one would pay its page faults
        # in the middle of the pipeline every step (tens of ms for the gradients of large layers)
        self._acc_buffers: dict[int, dict[int, np.ndarray]] = {}

    @property
    def tasks(self) -> dict[tuple[int, str, int], PipelineTask]:
        return dict(self.program.tasks)

    def stage_of(self, device: int) -> int:
        return self.program.stage_of(device)

    # --- running --------------------------------------------------------------------------------

    def run_flat(self, arrays: list, profile: bool = False) -> list[np.ndarray]:
        """Run one step on whole inputs; returns the step's outputs (whole arrays)."""
        p = self.program
        arrays = [x if isinstance(x, ShardedInput) else np.asarray(x) for x in arrays]
        if len(arrays) != p.n_inputs:
            raise GraphcError(f"the step takes {p.n_inputs} arrays, got {len(arrays)}")
        pieces = self._split_inputs(arrays)
        world = ThreadWorld(self.mesh.size, timeout_s=self.timeout_s)
        for d, slot in self.comms.items():
            slot.current = _SubMeshComm(world.comm(d), p.stage_devices[p.stage_of(d)])
        prof: dict[int, dict] = {d: {"events": [], "peak_bytes": 0} for d in self.comms}
        t0 = time.perf_counter()
        results = run_on_devices(
            sorted(self.comms),
            world,
            self.mesh,
            self.timeout_s,
            lambda d: _DeviceRun(self, d, world.comm(d), pieces[d], prof[d] if profile else None).run(),
        )
        if profile:
            for x in prof.values():
                x["t0"] = t0
            self.last_profile = prof
        outs = [self._gather_output(k, vid, arrays, results) for k, vid in enumerate(p.out_ids)]
        return unaliased(outs, arrays)  # an input passed through, or a result returned twice, is copied

    def run_device(self, device: int, comm, pieces: dict, prof: dict | None = None) -> dict[int, np.ndarray]:
        """One device's part of one step (its tasks in the schedule's order), talking through
        ``comm`` (sends, receives, and its stage's collectives); returns the step's outputs this
        device holds. What ``run_flat`` runs on each device thread, and an MPI rank on its own."""
        p = self.program
        self.comms[device].current = _SubMeshComm(comm, p.stage_devices[p.stage_of(device)])
        return _DeviceRun(self, device, comm, pieces, prof).run()

    def _gather_output(self, k: int, vid: int, arrays: list[np.ndarray], results: dict) -> np.ndarray:
        p = self.program
        if vid < p.n_inputs:
            return arrays[vid]
        by_c = [results[d][vid] for d in p.stage_devices[p.owner(vid)]]
        if p.out_specs is None:
            return by_c[0]
        t = p.out_types[k]
        coords = {_sub_coord(p.sub_shape, c): x for c, x in enumerate(by_c)}
        return unshard(coords, p.out_specs[k], p.sub_shape, t.shape).astype(t.dtype, copy=False)

    def _split_inputs(self, arrays: list, only: int | None = None) -> dict[int, dict[tuple[int, int], np.ndarray]]:
        """device -> (input id, micro-batch) -> its piece; state (not split) under micro-batch -1.
        ``only``: that device's pieces alone (under MPI), built or read from a ShardedInput or a
        memory-mapped array without the rest."""
        p = self.program
        out: dict[int, dict] = {}
        for devs in p.stage_devices:
            for c, d in enumerate(devs):
                if only is not None and d != only:
                    continue
                # without sub-mesh specs every device of a stage holds whole micro-batches
                coord = _sub_coord(p.sub_shape, c) if p.in_specs is not None else ()
                mesh_shape = p.sub_shape if p.in_specs is not None else ()
                mine: dict[tuple[int, int], np.ndarray] = {}
                for i, x in enumerate(arrays):
                    if i not in self._inputs_read[d]:
                        continue
                    spec = p.in_specs[i] if p.in_specs is not None else ()
                    if isinstance(x, ShardedArray):  # under MPI: a result of a step, on its stage's ranks
                        x = self._held_piece(i, x, d, c, spec)
                        if x is None:  # the plan's own piece of this device: used as it is
                            mine[(i, -1)] = arrays[i].pieces[c]
                            continue
                    batches = range(self.m) if i in p.batch else (-1,)
                    for k in batches:
                        first = ((0, self.m, k),) if k >= 0 else ()
                        mine[(i, k)] = local_piece(x, spec, mesh_shape, coord, first)
                out[d] = mine
        return out

    def move_held_inputs(self, arrays: list, device: int, comm) -> list:
        """Under MPI, ``arrays`` with every ShardedArray that ``device`` reads but another stage
        holds replaced by its whole value (a parameter one stage updates and another reads, as a
        tied embedding): a replicated value is sent by the holder at the same place of its stage,
        a split one by every holder, and put together as the threaded runtime gathers a result
        (``unshard``, the same order: the same bits). Every rank calls it with the same
        arguments: holders send, readers receive (tagged by the input's id, which no task's
        message uses), in the same order everywhere, so no two ranks wait on each other."""
        p = self.program
        out = list(arrays)
        for i, x in enumerate(arrays):
            if not isinstance(x, ShardedArray) or x.ranks is None:
                continue
            replicated = all(q.kind == "R" for q in x.spec)
            for devs in p.stage_devices:
                for c, d in enumerate(devs):
                    if d in x.ranks or i not in self._inputs_read[d]:
                        continue
                    senders = [x.ranks[c % len(x.ranks)]] if replicated else list(x.ranks)
                    if device in senders:
                        comm.send(x.pieces[x.ranks.index(device)], d, _tag(i, -1))
                    if d != device:
                        continue
                    got = {x.mesh.coord(x.ranks.index(src)): comm.recv(src, _tag(i, -1)) for src in senders}
                    if replicated:
                        out[i] = next(iter(got.values()))
                    else:
                        out[i] = unshard(got, x.spec, tuple(x.mesh.shape), x.shape).astype(x.dtype, copy=False)
        return out

    def _held_piece(self, i: int, x: ShardedArray, device: int, c: int, spec) -> np.ndarray | None:
        """Input ``i`` of ``device`` (the ``c``-th of its stage) from a ShardedArray a step returned
        under MPI: the whole value when the piece this rank holds is all of it (a replicated spec),
        None when the piece is the one the plan gives the device (the same spec on the stage's
        sub-mesh: used as it is), else a GraphcError saying why it cannot be used here."""
        p = self.program
        stage = p.stage_devices[p.stage_of(device)]
        held = x.pieces.get(c) if x.ranks == stage else x.pieces.get(device) if x.ranks is None else None
        if held is None:
            raise GraphcError(
                f"input {i} is {x!r}, held by MPI ranks {x.holders()}, but pipeline stage {p.stage_of(device)} "
                f"(ranks {stage}) reads it: a sharded value is not moved between stages; pass a whole array "
                "(.gather() on every rank) or the value the same stage returned"
            )
        if all(q.kind == "R" for q in x.spec):
            return held
        if p.in_specs is not None and x.spec == tuple(spec) and tuple(x.mesh.shape) == p.sub_shape and i not in p.batch:
            return None
        raise GraphcError(
            f"input {i} is {x!r}, but the pipeline wants it in spec {format_spec(spec)} on its stage's "
            f"sub-mesh {p.sub_shape}: under MPI a sharded value is not resharded between calls; pass a whole array"
        )

    # --- reporting ------------------------------------------------------------------------------

    def measured_bubble(self) -> float:
        """1 - busy / (devices x span) of the last profiled run, forward and backward tasks only."""
        prof = self.last_profile
        if not prof:
            raise GraphcError("run with profile=True first")
        evs = [e for p in prof.values() for e in p["events"] if e[0] in ("F", "B")]
        if not evs:
            return 0.0
        start = min(e[2] for e in evs)
        end = max(e[3] for e in evs)
        busy = sum(e[3] - e[2] for e in evs)
        return 1.0 - busy / (len(prof) * (end - start))


def _dying(p: PipelineProgram, task: PipelineTask, sent: set[int]) -> frozenset[int]:
    """Positions of ``task``'s arguments that die in it, for its executable to free at their last
    use: in a backward task (a micro-batch's last on its device), the micro-batch's values its own
    stage made, sent nowhere, that neither the update nor the step's results read (``_drop``
    would delete them after the task)."""
    if task.phase != "B":
        return frozenset()
    stage = p.stage_of(task.device)
    out = set()
    for i, v in enumerate(task.in_ids):
        if v < p.n_inputs or v in sent or p.needed_later(v, stage) or task.in_ids.count(v) > 1:
            continue
        src, ph = p.producer(v)
        if src == stage and ph in ("F", "B"):
            out.add(i)
    return frozenset(out)


def _sub_coord(shape: tuple[int, ...], c: int) -> tuple[int, ...]:
    """Row-major coordinate of device ``c`` of a sub-mesh of ``shape``."""
    return tuple(int(x) for x in np.unravel_index(c, shape)) if shape else ()


class _DeviceRun:
    """One device's part of one step: its tasks in the schedule's order, the values it holds, the
    meeting sums it accumulates, and what it sends and receives."""

    def __init__(self, ex: PipelineExecutable, device: int, comm, pieces: dict, prof: dict | None):
        self.ex = ex
        self.p = ex.program
        self.device = device
        self.comm = comm
        self.pieces = pieces
        self.prof = prof
        self.stage = self.p.stage_of(device)
        self.c = self.p.stage_devices[self.stage].index(device)
        self.store: dict[tuple[int, int], np.ndarray] = {}  # (value id, micro-batch or -1) -> value
        self.acc: dict[int, np.ndarray] = {}  # meeting output id -> running sum
        self.buffers = ex._acc_buffers.setdefault(device, {})
        self.summand_of = {src: out for out, (src, _s) in self.p.meetings.items()}
        self.current = 0  # the micro-batch of the last forward or backward task

    def run(self) -> dict[int, np.ndarray]:
        for ph, k in self.p.order[self.stage]:
            if ph == "U":
                self._update()
                continue
            task = self.p.tasks[(self.device, ph, k)]
            if task.graph.nodes or task.out_ids:
                self._run_task(task, k)
            if ph == "B":  # this micro-batch's values are dead unless the update reads them
                self._drop(lambda key, k=k: key[1] == k, keep_needed=k == 0)
        return self._results()

    def _update(self) -> None:
        """The micro-batches have met: the sums become values of the step, sent where needed; then
        the update's segments run, each value another segment reads forgotten after the last
        segment reading it (unless the step returns it), as within a task."""
        for m_out, (_src, st) in self.p.meetings.items():
            if st != self.stage:
                continue
            self.store[(m_out, -1)] = self.acc[m_out]
            for dst in sorted({r[0] for r in self.p.readers.get(m_out, ()) if r[0] != self.stage}):
                self.comm.send(self.acc[m_out], self.p.device(dst, self.c), _tag(m_out, -1))
        self._drop(lambda key: key[1] >= 0)
        segments = [self.p.tasks[(self.device, "U", -1 - i)] for i in range(self.p.n_segments[self.device])]
        last = {v: i for i, task in enumerate(segments) for v in task.in_ids}
        returned = set(self.p.out_ids)
        for i, task in enumerate(segments):
            self._run_task(task, -1)
            for v in [v for v, j in last.items() if j == i and v >= self.p.n_inputs and v not in returned]:
                self.store.pop((v, -1), None)
                self.store.pop((v, 0), None)  # micro-batch 0's value the update read

    def _drop(self, which, keep_needed: bool = True) -> None:
        """Forget the values ``which`` picks, but (``keep_needed``) those the update or the
        step's results read: they read micro-batch 0's (``_fetch``, ``_results``), so another
        micro-batch's copy is dropped with the rest."""
        for key in [key for key in self.store if which(key)]:
            if not (keep_needed and self.p.needed_later(key[0], self.stage)):
                del self.store[key]

    def _fetch(self, vid: int, k: int) -> np.ndarray:
        if vid < self.p.n_inputs:
            return self.pieces[(vid, k if vid in self.p.batch else -1)]
        src, ph = self.p.producer(vid)
        # values of the whole step live under -1; the update reads a per-micro-batch value only when
        # it is the same for every micro-batch (passes/microbatch.py checks), so micro-batch 0's
        kk = -1 if ph in ("U", "M") else max(k, 0)
        hit = self.store.get((vid, kk))
        if hit is not None:
            return hit
        if src == self.stage:
            raise GraphcError(f"internal: value {vid} of micro-batch {kk} used before it was computed")
        x = self.comm.recv(self.p.device(src, self.c), _tag(vid, kk))
        self.store[(vid, kk)] = x
        return x

    def _run_task(self, task: PipelineTask, k: int) -> None:
        key = (self.device, task.phase, task.k)
        if task.phase in ("F", "B"):
            self.current = k
        args = [self._fetch(v, k) for v in task.in_ids]
        for i in self.ex.donated[key]:  # the task's executable frees them at their last use
            del self.store[(task.in_ids[i], k)]
        executable = self.ex.executables[key]
        # the device's pool keeps at most what this task's values need at their peak (the rule the
        # executor applies at its first step, applied before the task counts the pool's buffers)
        self.ex.pools[self.device].trim(executable.program.high_water)
        # what the device holds besides the task's arguments and constants (its profile counts those)
        if self.prof is not None:
            mine = {id(x) for x in args} | {id(c) for _s, c in executable.program.constants}
            before = self._held_bytes(skip=mine)
        else:
            before = 0
        start = time.perf_counter()
        tprof: dict | None = {} if self.prof is not None else None
        outs = executable.run_donating(args, tprof)
        kk = k if task.phase in ("F", "B") else -1
        for vid, y in zip(task.out_ids, outs):
            if vid in self.summand_of:
                self._accumulate(self.summand_of[vid], y)
            self.store[(vid, kk)] = y
            for dst in task.sends.get(vid, ()):
                self.comm.send(y, dst, _tag(vid, kk))
        if self.prof is not None:  # the task's work includes accumulating and sending its results
            self._record(task, start, time.perf_counter(), before + (tprof or {}).get("peak_bytes", 0), args)

    def _accumulate(self, m_out: int, y: np.ndarray) -> None:
        if m_out in self.acc:
            self.acc[m_out] += y
            return
        y = np.asarray(y)
        buf = self.buffers.get(m_out)
        if buf is None or buf.shape != y.shape or buf.dtype != y.dtype:
            buf = self.buffers[m_out] = np.empty_like(y)
        np.copyto(buf, y)
        self.acc[m_out] = buf

    def _held_bytes(self, skip: set[int] = frozenset(), extra: list = (), inputs: bool = True) -> int:  # type: ignore[assignment]
        """Bytes of the arrays the device holds between tasks: its inputs (the pieces of the
        step's state, and one micro-batch's pieces of the batch inputs, the current one's: as the
        memory model holds them, all step long, whether or not the running task reads them; and
        the constants its tasks share, each once), the
        values kept (each array once: a running sum is also a value of the step after the
        meeting), the running sums' buffers (kept from step to step) and ``extra``, without the
        arrays whose ids are in ``skip`` (``inputs=False``: and without the inputs)."""
        seen = set(skip)
        total = 0
        pieces = [x for (_i, k), x in self.pieces.items() if k < 0 or k == self.current] if inputs else []
        if inputs:  # the device's constants, shared by its tasks and held all step
            pieces += self.ex.constants[self.device].arrays()
        for x in [*pieces, *self.store.values(), *self.acc.values(), *self.buffers.values(), *extra]:
            if x is not None and id(x) not in seen:
                seen.add(id(x))
                total += np.asarray(x).nbytes
        return total

    def _record(self, task: PipelineTask, start: float, end: float, during: int, args: list) -> None:
        """``during``: the most the device held while the task ran (what it held besides the
        task's arguments, plus the task's own peak: its arguments, the arrays it made, the free
        buffers of the device's pool). After it: what it holds, the arguments still referenced
        and the pool's free buffers (the results are added to the running sums meanwhile)."""
        prof = self.prof
        assert prof is not None
        live = self._held_bytes(inputs=False)
        if task.phase in ("F", "B"):  # what the micro-batches in flight hold between tasks
            prof["held_bytes"] = max(prof.get("held_bytes", 0), live)
        prof["events"].append((task.phase, task.k, start, end))
        after = self._held_bytes(extra=args) + self.ex.pools[self.device].free_bytes
        prof["peak_bytes"] = max(prof["peak_bytes"], during, after)

    def _results(self) -> dict[int, np.ndarray]:
        owned = {}
        kept = {id(b) for b in self.buffers.values()}
        for vid in self.p.out_ids:
            if vid >= self.p.n_inputs and self.p.owner(vid) == self.stage:
                x = self.store[(vid, 0 if self.p.producer(vid)[1] in ("F", "B") else -1)]
                owned[vid] = x.copy() if id(x) in kept else x  # the caller's, not next step's buffer
        return owned


def _tag(vid: int, k: int) -> int:
    return vid * _TAG_STRIDE + (k + 1)


__all__ = ["PipelineExecutable"]
