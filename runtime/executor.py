"""The single-device executor: runs an optimized graph as a precompiled list of steps.

Each node becomes one step: a fused node calls its Numba kernel, a control-flow node runs its
regions as sub-programs, every other op calls its numpy/BLAS reference implementation. Values
live in numbered slots; a slot is cleared after its last use (liveness), and kernel output
buffers whose last reference is dropped go back to a pool keyed by shape and dtype, so a warm run
reuses memory instead of paying page faults for fresh temporaries.

The pool never makes a program hold more than its values need at their peak: a run counts the
bytes of the live arrays its steps made (views of other arrays count nothing), and whenever
those plus the pool's free buffers exceed the highest live count seen so far, the pool drops
free buffers (``BufferPool.trim``). So a device's memory at any moment is at most its liveness
peak, the number the planner's memory model predicts (passes/sharding/problem.py). An executable
that lends its results (``graphc.jit``'s: runtime/lending.py) keeps the buffers of its last two
calls' results; those the caller has dropped become free buffers at the start of the next run.

A program whose values are all small (under ``STRAIGHT_BYTES``, an RNN step or a decode step)
needs none of that: it runs as one generated straight-line Python function, its arrays
allocated fresh and dropped at their last use (``Program._straight_line``), which costs a call
per step and nothing else.
"""

from __future__ import annotations

import functools
import math
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.core.buffers import root_buffer, unaliased
from graphc.core.errors import NUMPY_ERRORS, GraphcError, NumpyError, note_where, numpy_error
from graphc.core.ir import Graph, Node, Value
from graphc.core.traits import Collective, Constant, DeviceLocal, FreshResult, Fused, ViewOf
from graphc.ops import OPS
from graphc.ops.precision import computes_in_float32, in_float32, result_dtypes
from graphc.ops.shape import slice_index
from graphc.runtime.constants import ConstantTable
from graphc.runtime.einsum import einsum_step
from graphc.runtime.lending import Lender


class BufferPool:
    """Reusable output buffers, handed out by (shape, dtype); thread-safe."""

    def __init__(self):
        self._free: dict[tuple, list[np.ndarray]] = {}
        # id -> weak reference: an id alone may be reused by a later, unrelated array
        self._owned: dict[int, weakref.ref] = {}
        self._lock = threading.Lock()
        self.reused = 0
        self.allocated = 0
        self.dropped = 0
        self.free_bytes = 0  # bytes of the free buffers held
        self.lender = Lender()  # results lent to the caller (runtime/lending.py)

    @property
    def lent_bytes(self) -> int:
        """Bytes of the results lent to callers that the pool still keeps (runtime/lending.py)."""
        return self.lender.bytes

    def get(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        key = (shape, np.dtype(dtype).str)
        with self._lock:
            bucket = self._free.get(key)
            if bucket:
                self.reused += 1
                buf = bucket.pop()
                self.free_bytes -= buf.nbytes
                return buf
            self.allocated += 1
        buf = np.empty(shape, dtype)
        with self._lock:
            self._owned[id(buf)] = weakref.ref(buf)
        return buf

    def give_back(self, arr: Any) -> None:
        """Return ``arr`` if the pool made it and nothing else refers to it (no views, not an output)."""
        if not isinstance(arr, np.ndarray) or arr.base is not None:
            return
        ref = self._owned.get(id(arr))
        if ref is None or id(ref()) != id(arr):  # not ours (an id alone may belong to a newer array)
            return
        if sys.getrefcount(arr) > 3:  # the caller's reference, this argument, getrefcount's own
            return
        with self._lock:
            self._free.setdefault((arr.shape, arr.dtype.str), []).append(arr)
            self.free_bytes += arr.nbytes

    def trim(self, limit: int) -> None:
        """Drop free buffers, largest first, until the pool holds at most ``limit`` bytes."""
        with self._lock:
            for key in sorted(self._free, key=lambda k: -self._free[k][0].nbytes if self._free[k] else 0):
                bucket = self._free[key]
                while bucket and self.free_bytes > limit:
                    self.free_bytes -= bucket.pop().nbytes
                    self.dropped += 1
                if self.free_bytes <= limit:
                    break

    def forget(self, arr: Any) -> None:
        """``arr`` leaves the executor (a result handed to the caller): never reuse it."""
        if isinstance(arr, np.ndarray):
            with self._lock:
                self._owned.pop(id(arr), None)

    def reclaim_lent(self) -> None:
        """Lent results that nothing outside the pool refers to any more become free buffers."""
        with self._lock:
            if not self.lender.bytes:
                return
            for buf in self.lender.reclaim():
                self._free.setdefault((buf.shape, buf.dtype.str), []).append(buf)
                self.free_bytes += buf.nbytes
                self._owned[id(buf)] = weakref.ref(buf)

    def lend(self, outs: list, ks: list[int]) -> None:
        """Results ``outs[k]`` (k in ``ks``) leave the executor: each that is one of the pool's
        buffers is replaced by a new view of it, and the pool keeps the buffer to take back once the
        caller has dropped every view of it (runtime/lending.py); the others are only forgotten."""
        with self._lock:
            mine = []
            for k in ks:
                arr = outs[k]
                if not isinstance(arr, np.ndarray):
                    continue
                ref = self._owned.pop(id(arr), None)
                if arr.base is None and ref is not None and ref() is arr:
                    mine.append(k)
            views = self.lender.lend([outs[k] for k in mine])
        for k, v in zip(mine, views):
            outs[k] = v


@dataclass(slots=True)
class Step:
    """One node of a program as the run loop executes it."""

    fn: Callable  # called on the operand arrays; returns a result or a tuple / list of them
    ins: list[int]  # operand slots
    outs: list[int]  # result slots
    counted: bool  # whether its results are counted in the live bytes (not all small)
    frees: list[int]  # dead slots after it to count out and offer the pool
    small_frees: list[int]  # dead small slots only to clear
    in_place: tuple | None  # a kernel that may write a result over an operand dying here: (kernel, [(operand, result)])
    outside: int  # bytes of counted results the step allocates itself rather than taking from the pool


class Program:
    """A compiled block (a graph body or a region)."""

    def __init__(
        self,
        inputs: list[Value],
        nodes: list[Node],
        outputs: list[Value],
        pool: BufferPool,
        stats: dict[str, Any],
        comm=None,
        donated: frozenset[int] = frozenset(),
        shared: ConstantTable | None = None,
    ):
        self.pool = pool
        # ``shared``: the device's one copy of each constant, shared by the programs it runs (a
        # pipeline's task programs, regions): constants are read-only, no kernel writes them
        self.shared = shared
        # inputs the caller hands over (Executable.run_donating): freed at their last use, counted
        # as the run's own values until then (a pipeline's backward task reads its forward's values)
        self.donated = frozenset(i for i in donated if inputs[i] not in outputs)
        self.comm = comm  # the device's communicator (runtime/comm.py) in a multi-device run
        self.high_water = 0  # the most bytes of live arrays made by the steps of one run so far
        slot: dict[Value, int] = {}
        for v in inputs:
            slot[v] = len(slot)
        self.n_inputs = len(inputs)
        self.constants: list[tuple[int, np.ndarray]] = []
        self.kernels: list[Any] = []  # the CompiledKernel of each fused step, in order
        self.nodes: list[Node] = []  # the node of each step (for error messages)
        # one step per node: (function, operand slots, result slots, slots freed after it)
        steps: list[tuple[Callable, list[int], list[int], list[int]]] = []
        kernel_of_step: dict[int, Any] = {}
        # slots of small arrays that cannot look into a counted buffer (small fresh arrays, and
        # small views of those, of inputs or of constants): not pooled, not counted
        small: set[int] = set()
        uncounted_roots = set(range(len(inputs)))  # inputs: never the run's to free
        # a program of only modest values (an RNN's steps next to its batched input projection)
        # runs as straight-line code even if some are above SMALL_BYTES: those are allocated
        # fresh (the allocator's heap, no page faults) and freed at their last use, not pooled
        self._modest = not any(n.regions and not n.op.has(Fused) for n in nodes) and all(
            o.type.nbytes < STRAIGHT_BYTES for n in nodes for o in n.outputs
        )
        for node in nodes:
            if node.op.has(Constant):
                slot[node.outputs[0]] = len(slot)
                value = np.asarray(node.attrs["value"])
                self.constants.append((slot[node.outputs[0]], value if shared is None else shared.get(value)))
                uncounted_roots.add(slot[node.outputs[0]])
                continue
            fn = self._make_step(node, stats)
            kernel_of_step[len(steps)] = self.kernels[-1] if node.op.has(Fused) else None
            safe_operands = all(slot[v] in small or slot[v] in uncounted_roots for v in node.inputs)
            for o in node.outputs:
                slot[o] = len(slot)
                if _small_fresh(node, o) or (safe_operands and o.type.nbytes < SMALL_BYTES and not node.regions):
                    small.add(slot[o])
            steps.append((fn, [slot[v] for v in node.inputs], [slot[o] for o in node.outputs], []))
            self.nodes.append(node)
        self.n_slots = len(slot)
        self.out_slots = [slot[v] for v in outputs]
        made_by = {slot[o]: n for n in nodes for o in n.outputs}
        self.aliasing = ResultAliasing(self.out_slots, self.n_inputs, made_by)
        # values in buffers this program's steps allocated (not inputs, constants or views)
        fresh_slots = {slot[o] for n in nodes if n.op.has(FreshResult) and not n.regions for o in n.outputs}
        # outputs that may be the pool's buffers (Executable.run_flat takes them out of it)
        self.pooled_outputs = [k for k, s in enumerate(self.out_slots) if s not in small]
        keep = set(self.out_slots) | {s for s, _ in self.constants}
        last: dict[int, int] = {}
        for k, step in enumerate(steps):
            for s in step[1]:
                last[s] = k
        for s, k in last.items():
            if s not in keep and (s >= self.n_inputs or s in self.donated):
                steps[k][3].append(s)
        self.steps = [
            Step(
                fn,
                ins,
                outs,
                counted=not all(s in small for s in outs),
                frees=[s for s in frees if s not in small],
                small_frees=[s for s in frees if s in small],
                in_place=_in_place(kernel_of_step.get(k), self.nodes[k], ins, frees, small, fresh_slots),
                outside=0
                if self.nodes[k].op.has(Fused)
                else sum(
                    v.type.nbytes for v, s in zip(self.nodes[k].outputs, outs) if s in fresh_slots and s not in small
                ),
            )
            for k, (fn, ins, outs, frees) in enumerate(steps)
        ]

        # a program whose every value is small keeps no accounting: it runs as one generated
        # straight-line Python function (a call per step, locals for slots), as torch.fx does
        self._straight = (
            self._straight_line()
            if not self.donated and (self._modest or not any(st.counted or st.frees for st in self.steps))
            else None
        )
        if self._straight is not None:
            self.pooled_outputs = []

    def _straight_line(self, handed: bool = False, unalias: bool = True) -> Callable[[Sequence[np.ndarray]], list]:
        """``run`` of this program as generated Python: ``v7 = f3(v0, v5)`` per step, ``del`` after
        each slot's last use, constants and step functions as globals, an error re-raised by
        ``_straight_error`` (which names the step). ``self._step_of_line`` maps a source line to
        its step. ``handed``: the results as ``Executable`` hands them to a caller (``_handed_out``;
        ``unalias``: copied where they share memory, unless the caller's are private)."""
        names = {s: f"v{s}" for s in range(self.n_slots)}
        env: dict[str, Any] = {"fail": self._straight_error, "result": _handed_result}
        lines = ["def run(args):", "  try:"]
        if self.n_inputs:
            lines.append(f"    {', '.join(names[s] for s in range(self.n_inputs))}, = args")
        for s, value in self.constants:
            env[names[s]] = value
        step_line: dict[int, int] = {}
        uses: dict[int, int] = {}
        for st in self.steps:
            for i in st.ins:
                uses[i] = uses.get(i, 0) + 1
        for s in self.out_slots:
            uses[s] = uses.get(s, 0) + 1
        # views used once: their expression and the slots it reads, in the line of their user
        inline: dict[int, tuple[str, set[int]]] = {}
        body: list[tuple[str, set[int], int]] = []  # (line, slots it reads, step)
        fresh: set[int] = set()  # slots that surely hold a new writeable array of 1 or more dims
        for k, st in enumerate(self.steps):
            fn, ins, outs = st.fn, st.ins, st.outs
            node = self.nodes[k]
            args, reads = [], set()
            for i in ins:
                expr, more = inline.pop(i, (names[i], {i}))
                args.append(expr)
                reads |= more
            view = _view_expression(node, args[0], k) if node.op.has(ViewOf) else None
            if view is not None:
                env[f"a{k}"] = view[1]
                if uses.get(outs[0], 0) == 1 and outs[0] not in self.out_slots:
                    inline[outs[0]] = (view[0], reads)
                    continue
                body.append((f"    {names[outs[0]]} = {view[0]}", reads, k))
                continue
            env[f"f{k}"] = fn
            body.append((_call_line(node, [names[o] for o in outs], f"f{k}({', '.join(args)})"), reads, k))
            if node.op.has(Fused) or node.op is OPS.matmul:
                fresh.update(o for o, v in zip(outs, node.outputs) if v.type.ndim)
        # each local made by a step is deleted after the last line that reads it (not the results)
        keep = set(self.out_slots) | {s for s, _ in self.constants} | set(range(self.n_inputs))
        dies = _last_reads(body, keep, names)
        for n, (line, _reads, k) in enumerate(body):
            lines.append(line)
            step_line[len(lines)] = k
            if n in dies:
                lines.append(f"    del {', '.join(dies[n])}")
        if handed:  # constants and views of them are read-only, numpy scalars become arrays
            results = [names[s] if s in fresh else f"result({names[s]})" for s in self.out_slots]
        else:
            results = [names[s] for s in self.out_slots]
        if (
            handed and unalias and self.aliasing.needed
        ):  # results that may share memory with the arguments or each other
            env["unalias"] = self.aliasing.apply
            lines.append(f"    return unalias([{', '.join(results)}], args)")
        else:
            lines.append(f"    return [{', '.join(results)}]")
        lines += ["  except Exception as exc:", "    fail(exc)", "    raise"]
        source = "\n".join(lines) + "\n"
        code = compile(source, "<graphc program>", "exec")
        exec(code, env)
        self._step_of_line = step_line
        return env["run"]

    def _make_step(self, node: Node, stats: dict[str, Any]) -> Callable:
        if node.op.has(Fused):
            # numba loads here, when a graph first has a fused kernel: plain graphs and the reference
            # paths never pay its import (docs/measurements.md#numba-import)
            from graphc.runtime.codegen import CompiledKernel

            start = time.perf_counter()
            small = self._modest or all(_small_fresh(node, o) for o in node.outputs)
            kernel = CompiledKernel(node, [v.shape for v in node.inputs], alloc=np.empty if small else self.pool.get)
            stats["compile_s"] = stats.get("compile_s", 0.0) + time.perf_counter() - start
            stats.setdefault("kernels", []).append(len(node.regions[0].nodes))
            self.kernels.append(kernel)
            return kernel.call
        if node.op.has(Collective):
            return _collective_step(node, self.comm)
        if node.regions:
            regions = [
                Program(r.inputs, r.nodes, r.outputs, self.pool, stats, shared=self.shared) for r in node.regions
            ]
            runners = [r.run for r in regions]
            impl = node.op.impl
            attrs = node.attrs
            by_region = {id(r): run for r, run in zip(node.regions, runners)}

            def run_control(*xs):
                return impl(lambda region, arrays: by_region[id(region)](list(arrays)), node.regions, *xs, **attrs)

            return run_control
        step = self._op_step(node)
        # bfloat16 and float16: in float32, each result rounded, as the interpreter (ops/precision.py)
        return in_float32(step, result_dtypes(node)) if computes_in_float32(node) else step

    def _op_step(self, node: Node) -> Callable:
        """The function a step calls for a node that is not fused, a collective or control flow."""
        if node.op is OPS.matmul:
            return _matmul if max(v.type.ndim for v in node.inputs) > 2 else np.matmul
        if node.op is OPS.einsum:
            return einsum_step(node.attrs["equation"], [v.type for v in node.inputs])
        attrs = node.attrs
        if node.op is OPS.slice:
            index = slice_index(attrs["starts"], attrs["stops"], attrs["steps"])
            return lambda x: x[index]
        if node.op is OPS.reshape:
            shape = attrs["shape"]
            return lambda x: x.reshape(shape)
        if node.op is OPS.transpose:
            perm = attrs["perm"]
            return lambda x: x.transpose(perm)
        if len(node.outputs) == 1 and node.outputs[0].type.ndim:
            # one array result: the impl's own (numpy returns arrays, not scalars, for ndim >= 1),
            # without OpDef.evaluate's tuple and asarray (a cost on every step of a small op:
            # docs/measurements.md#op-evaluate)
            return functools.partial(node.op.impl, **attrs) if attrs else node.op.impl
        evaluate = node.op.evaluate
        if not attrs:
            return evaluate
        return lambda *xs: evaluate(*xs, **attrs)

    def run(self, args: Sequence[np.ndarray], profile: dict | None = None) -> list[np.ndarray]:
        """The program's results on ``args``. ``profile``: a dict that receives every step's event
        (name, source line, start, end, bytes a collective moves) in ``profile["events"]`` and the
        peak bytes the device holds in ``profile["peak_bytes"]``: its inputs and constants, the
        arrays its steps made (views count nothing) and the free buffers of its pool (the numbers a
        memory model predicts)."""
        if profile is None and self._straight is not None:
            return self._straight(args)
        recorder = None
        if profile is not None:
            held = [a for i, a in enumerate(args) if i not in self.donated]
            recorder = _Profile(profile, held, self.constants, self.pool.free_bytes)
        return self._run_steps(args, recorder)

    def _run_steps(self, args: Sequence[np.ndarray], profile: _Profile | None) -> list[np.ndarray]:
        """The steps one by one, counting the live bytes and trimming the pool (see the module doc);
        with ``profile``, every value is counted and every step timed."""
        env: list[Any] = [None] * self.n_slots
        env[: self.n_inputs] = args
        for s, value in self.constants:
            env[s] = value
        pool = self.pool
        live, high = 0, self.high_water
        buffers = _Buffers([a for i, a in enumerate(args) if i not in self.donated], self.constants)
        if self.donated:
            live = self._take_donated(args, buffers)
        clock = time.perf_counter
        for k, st in enumerate(self.steps):
            if st.outside and live + st.outside + pool.free_bytes > high:
                pool.trim(max(0, high - live - st.outside))  # room for what the step allocates itself
            start = clock() if profile is not None else 0.0
            try:
                if st.in_place is None:
                    results = st.fn(*[env[i] for i in st.ins])
                else:
                    results = _call_in_place(st.fn, st.in_place, st.ins, env, buffers)
            except Exception as exc:
                self._step_failed(k, exc)
                raise
            if type(results) is not tuple and type(results) is not list:
                results = (results,)
            counting = st.counted or profile is not None  # a profile measures exactly: every value counts
            live += _store(env, st.outs, results, buffers if counting else None)
            if profile is not None:
                high = max(high, live)
                profile.step(self.nodes[k], start, clock(), live + pool.free_bytes)
                live -= _free(env, st.frees + st.small_frees, buffers, pool)
            else:
                for s in st.small_frees:
                    env[s] = None
                if not (st.counted or st.frees):
                    continue
                live -= _free(env, st.frees, buffers, pool)
            if live > high:
                high = live
            if live + pool.free_bytes > high:
                pool.trim(high - live)
        self.high_water = high
        if profile is not None:
            profile.finish()
        return [env[s] for s in self.out_slots]

    def _take_donated(self, args: Sequence[np.ndarray], buffers: _Buffers) -> int:
        """The run holds the donated inputs now, until their last use (the caller's list lets go
        of them); the bytes they add to the live ones."""
        live = sum(buffers.hold(args[i]) for i in sorted(self.donated))
        if isinstance(args, list):
            for i in self.donated:
                args[i] = None
        return live

    def _step_failed(self, k: int, exc: Exception) -> None:
        """Step ``k`` raised ``exc``: note the node and its source line on it; a numpy error is
        raised again as a NumpyError (the caller re-raises anything else as it is)."""
        node = self.nodes[k]
        note_where(exc, node.op.name, node.loc)
        if _is_numpy_error(exc):
            raise numpy_error(exc, NumpyError).with_traceback(exc.__traceback__) from None

    def _straight_error(self, exc: Exception) -> None:
        """An exception from the generated code: name the step it came from (a numpy error is
        raised again as a NumpyError; others go on as they are, with the note)."""
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != "<graphc program>":
            tb = tb.tb_next
        if tb is None:
            return
        k = self._step_of_line.get(tb.tb_lineno)
        if k is None:  # the arguments' unpacking or the results' line: no step to name
            return
        self._step_failed(k, exc)


def _store(env: list, outs: list[int], results: Sequence[Any], buffers: _Buffers | None) -> int:
    """Put a step's results in their slots; the bytes they add to the live ones (``buffers``:
    counted; None: not counted)."""
    added = 0
    for s, r in zip(outs, results):
        env[s] = r
        if buffers is not None:
            added += buffers.hold(r)
    return added


def _free(env: list, slots: list[int], buffers: _Buffers, pool: BufferPool) -> int:
    """Clear dead slots, offering their buffers to the pool; the live bytes this frees."""
    freed = 0
    for s in slots:
        arr = env[s]
        env[s] = None
        freed += buffers.release(arr)
        pool.give_back(arr)
        del arr
    return freed


class _Profile:
    """What a profiled run records (Program.run): each step's event, and the peak bytes held."""

    def __init__(self, out: dict, args: Sequence[np.ndarray], constants: list[tuple[int, np.ndarray]], pool_bytes: int):
        self.out = out
        self.events = out.setdefault("events", [])
        self.held = sum(np.asarray(a).nbytes for a in args) + sum(c.nbytes for _, c in constants)
        self.peak = self.held + pool_bytes

    def step(self, node: Node, start: float, end: float, made_bytes: int) -> None:
        """A step ran from ``start`` to ``end``; its results and the pool's free buffers, with the
        values live before it, are ``made_bytes``."""
        moves = node.op.has(Collective) or node.op.has(DeviceLocal)
        nbytes = sum(v.type.nbytes for v in node.inputs) if moves else 0
        self.events.append((node.op.name, str(node.loc) if node.loc else "", start, end, nbytes))
        self.peak = max(self.peak, self.held + made_bytes)

    def finish(self) -> None:
        self.out["peak_bytes"] = max(self.out.get("peak_bytes", 0), self.peak)


class ResultAliasing:
    """Which results of a program may share memory with its arguments or with each other, and the
    copies that prevent it: a caller who writes into a result must never change an argument or
    another result (numpy's ``np.copy(x)``, ``x * 1`` and ``(x * 2, x * 2)`` give new arrays; graphc's
    simplification may leave an output that is an input, or one value returned twice).

    ``always``: results that are an argument itself, or a value an earlier result already is: always
    copied. ``check``: whether some result is made by an op whose result may be a view of its
    operand (a shape op, a control-flow op, a collective): then every result's buffer is compared
    with the arguments' and the earlier results' at each call, and copied if it is one of them.
    Results of elementwise, reduction, contraction and fused ops are new buffers and cost nothing.
    Unlike numpy, graphc hands out a new array even where numpy's result would be a view of an
    argument (``lambda x: x.T``), as ``jax.jit`` does."""

    def __init__(self, out_slots: list[int], n_inputs: int, made_by: dict[int, Node]):
        self.always: list[int] = []
        seen: set[int] = set()
        self.check = False
        for k, s in enumerate(out_slots):
            node = made_by.get(s)
            if s < n_inputs or s in seen:
                self.always.append(k)
            elif node is not None and (not node.op.has(FreshResult) or node.regions) and not node.op.has(Constant):
                self.check = True
            seen.add(s)
        self.needed = bool(self.always) or self.check

    def apply(self, outs: list, args: Sequence[Any]) -> list:
        for k in self.always:
            outs[k] = np.array(outs[k], copy=True)
        return unaliased(outs, args) if self.check else outs


def _handed_result(o: Any) -> np.ndarray:
    """A result as a caller gets it: an array (not a numpy scalar) that is its own to write."""
    if type(o) is not np.ndarray:
        o = np.asarray(o)
    return o if o.flags.writeable else o.copy()


def _is_numpy_error(exc: Exception) -> bool:
    """An error numpy raised on a step's values (an integer to a negative power, an index out of
    bounds): re-raised as a NumpyError that is also of numpy's class (core/errors.py numpy_error)."""
    return isinstance(exc, NUMPY_ERRORS) and not isinstance(exc, GraphcError)


# Fresh arrays below this size are neither pooled nor counted by a run (the profiled run counts
# them): the allocator recycles them without page faults, and the bookkeeping would cost more
# than the small ops that make them (docs/measurements.md#buffer-pool).
SMALL_BYTES = 1 << 16
# A program none of whose values reaches this size runs as straight-line code (Program._modest).
STRAIGHT_BYTES = 1 << 20


def _call_line(node: Node, outs: list[str], call: str) -> str:
    """The generated line of a step that is not a view (those are inlined expressions)."""
    if len(outs) > 1:
        return f"    {', '.join(outs)}, = {call}"
    (v,) = outs
    if node.op is OPS.matmul:  # np.matmul / _matmul: the array itself
        return f"    {v} = {call}"
    if node.op.has(Fused):  # CompiledKernel.call: a tuple
        return f"    {v}, = {call}"
    # a tuple or list of one result, or the result itself (see Program.run)
    return f"    {v} = {call}; {v} = {v}[0] if type({v}) is tuple or type({v}) is list else {v}"


def _last_reads(body: list[tuple[str, set[int], int]], keep: set[int], names: dict[int, str]) -> dict[int, list[str]]:
    """Line number -> the locals last read by that line (other than ``keep``)."""
    last: dict[int, int] = {}
    for n, (_line, reads, _k) in enumerate(body):
        for r in reads:
            last[r] = n
    dies: dict[int, list[str]] = {}
    for r, n in last.items():
        if r not in keep:
            dies.setdefault(n, []).append(names[r])
    return {n: sorted(d) for n, d in dies.items()}


def _view_expression(node: Node, operand: str, k: int) -> tuple[str, Any] | None:
    """Python source of a view step on ``operand`` (its attribute bound as the global ``a{k}``);
    None for a view op that runs as a call (broadcast_to, split)."""
    a = node.attrs
    if node.op is OPS.slice:
        return f"{operand}[a{k}]", slice_index(a["starts"], a["stops"], a["steps"])
    if node.op is OPS.reshape:
        return f"{operand}.reshape(a{k})", a["shape"]
    if node.op is OPS.transpose:
        return f"{operand}.transpose(a{k})", a["perm"]
    return None


def _small_fresh(node: Node, v: Value) -> bool:
    return node.op.has(FreshResult) and v.type.nbytes < SMALL_BYTES


def _in_place(kernel: Any, node: Node, ins: list[int], frees: list[int], small: set[int], fresh: set[int]):
    """For a kernel step: (kernel, [(operand position, result index)]) for each pair the kernel
    allows (CompiledKernel.in_place) whose operand dies at this step, is read once by it and lives
    in a counted buffer this program made; None when there is none."""
    if kernel is None or not kernel.in_place:
        return None
    pairs = []
    for i, k in kernel.in_place:
        s = ins[i]
        if s in frees and s not in small and s in fresh and ins.count(s) == 1:
            if node.inputs[i].type == node.outputs[k].type:
                pairs.append((i, k))
    return (kernel, pairs) if pairs else None


def _call_in_place(fn: Callable, in_place: tuple[Any, list[tuple[int, int]]], ins: list[int], env: list, buffers):
    """Run a kernel step, writing each result of ``in_place`` over its dying operand when nothing
    else holds that operand's buffer (no other live value, no view of it: ``buffers.sole``)."""
    kernel, pairs = in_place
    args = [env[i] for i in ins]
    given = {k: args[i] for i, k in pairs if buffers.sole(args[i])}
    if not given:
        return fn(*args)
    return kernel.call_into(args, given)


class _Buffers:
    """The buffers a run's live values look into, each counted once: a view of an array counts
    its root buffer (a transpose of a fresh temporary holds the temporary), inputs and constants
    count nothing (they are not the run's to free)."""

    def __init__(self, args: Sequence[np.ndarray], constants: list[tuple[int, np.ndarray]]):
        self.users: dict[int, list] = {}  # id of a root buffer -> [values looking into it, bytes]
        for a in [*args, *(c for _, c in constants)]:
            root = root_buffer(a)
            if root is not None:
                self.users[id(root)] = [1 << 60, 0]  # never released, never counted

    def hold(self, x: Any) -> int:
        """Count value ``x``; the bytes its buffer adds to the live ones."""
        root = root_buffer(x)
        if root is None:
            return 0
        entry = self.users.get(id(root))
        if entry is not None:
            entry[0] += 1
            return 0
        self.users[id(root)] = [1, root.nbytes]
        return root.nbytes

    def sole(self, x: Any) -> bool:
        """Whether ``x`` is a C-contiguous, writeable array over the whole of a buffer that no other
        live value looks into (a result may then be written over it)."""
        root = root_buffer(x)
        if root is None or not x.flags.c_contiguous or not x.flags.writeable or x.size != root.size:
            return False
        entry = self.users.get(id(root))
        return entry is not None and entry[0] == 1

    def release(self, x: Any) -> int:
        """Value ``x`` is dead; the bytes this frees from the live ones."""
        root = root_buffer(x)
        entry = self.users.get(id(root)) if root is not None else None
        if entry is None:
            return 0
        entry[0] -= 1
        if entry[0] > 0:
            return 0
        del self.users[id(root)]
        return entry[1]


# the attributes each collective's communicator method (of the op's name) takes after the group
_COLLECTIVE_ARGS = {
    "all_reduce": (),
    "reduce_scatter": ("dim", "blocks"),
    "all_gather": ("dim", "blocks"),
    "all_to_all": ("split_dim", "concat_dim", "split_blocks", "concat_blocks"),
}


def _collective_step(node: Node, comm) -> Callable:
    """A collective of a device program, performed by the device's communicator."""
    if comm is None:
        raise GraphcError(
            f"{node.op.name} at {node.loc} needs a communicator: run device programs with runtime/devices.py"
        )
    group = node.attrs["group"]
    args = tuple(node.attrs[a] for a in _COLLECTIVE_ARGS[node.op.name])
    name = node.op.name  # (looked up at each call: a device's communicator changes between runs)
    return lambda x: getattr(comm, name)(x, group, *args)


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.matmul, with batched operands made contiguous first: numpy's batched matmul on strided
    views (attention's q @ k.swapaxes(-1, -2)) was measured slower than copying and calling BLAS
    (docs/measurements.md#batched-matmul, whose re-measurement with numpy 2.4 no longer shows it).
    A batch times a matrix is one GEMM on the flattened batch (numpy calls one per batch entry,
    which is slower: docs/measurements.md#batched-matmul)."""
    if a.ndim > 2 and not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    if b.ndim == 2:
        rows = math.prod(a.shape[:-1])
        return np.matmul(a.reshape(rows, a.shape[-1]), b).reshape(a.shape[:-1] + b.shape[1:])
    if b.ndim > 2 and not b.flags.c_contiguous:
        b = np.ascontiguousarray(b)
    return np.matmul(a, b)


class Executable:
    """A graph compiled for the single-device executor. ``pool``: the buffer pool it takes its
    buffers from (default: its own); graphs that run one after the other on the same device (a
    pipeline's tasks) share one, so the device keeps one pool's free buffers, not one per graph."""

    def __init__(
        self,
        graph: Graph,
        comm=None,
        pool: BufferPool | None = None,
        donated: frozenset[int] = frozenset(),
        private: bool = False,
        lend: bool = False,
        constants: ConstantTable | None = None,
    ):
        self.graph = graph
        # ``lend``: results made in the pool leave as views of its buffers, taken back once the
        # caller dropped them (runtime/lending.py): a call in a loop writes into warm memory
        self.lend = lend
        # ``private``: the results go to a caller that never writes into them nor hands them on (a
        # pipeline's values between its tasks), so a result may be an argument or share its memory
        self.private = private
        self.pool = BufferPool() if pool is None else pool
        self.stats: dict[str, Any] = {}
        start = time.perf_counter()
        self.program = Program(
            graph.inputs, graph.nodes, graph.outputs, self.pool, self.stats, comm, donated, constants
        )
        if self.program._straight is not None:  # nothing pooled: one generated function does it all
            self.run_arrays = self.program._straight_line(handed=True, unalias=not private)  # type: ignore[method-assign,assignment]
        self.stats["build_s"] = time.perf_counter() - start

    def run_flat(self, arrays: list[np.ndarray], profile: dict | None = None) -> list[np.ndarray]:
        if profile is not None:
            args = [np.asarray(a) for a in arrays]
            self._reclaim()
            return self._handed_out(self.program.run(args, profile), args)
        return self.run_arrays([np.asarray(a) for a in arrays])

    def run_donating(self, arrays: list, profile: dict | None = None) -> list[np.ndarray]:
        """``run_flat`` that takes the donated inputs (the ``donated`` positions given when it was
        built) out of ``arrays`` (set to None there): with no other reference left, each is freed
        at its last use instead of living to the end of the run."""
        args = [np.asarray(a) for a in arrays]
        arrays[:] = [None if i in self.program.donated else a for i, a in enumerate(arrays)]
        self._reclaim()
        return self._handed_out(self.program.run(args, profile), args)

    def run_arrays(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``run_flat`` of arguments that are all ndarrays already."""
        self._reclaim()
        return self._handed_out(self.program.run(arrays), arrays)

    def _reclaim(self) -> None:
        """Before a run: the lent results the caller has dropped become free buffers of the pool,
        which the run reuses or trims like any other (so a run stays within its liveness peak)."""
        if self.lend:
            self.pool.reclaim_lent()

    def _handed_out(self, outs: list, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        if self.lend:
            self.pool.lend(outs, self.program.pooled_outputs)
        else:
            for k in self.program.pooled_outputs:
                self.pool.forget(outs[k])
        # constants are read-only and shared between calls: callers get writeable copies
        handed = [_handed_result(o) for o in outs]
        aliasing = self.program.aliasing
        return aliasing.apply(handed, args) if aliasing.needed and not self.private else handed
