"""The Python (Numba) source of a fused kernel, generated from its region.

A fused region works on an iteration space S = (..., n), seen as R = prod(S[:-1]) rows of n
elements. Every value of the region is at one of three levels: *elem* (one per element of S),
*row* (one per row: a reduction's result, a mean, a variance + eps) or *const* (a scalar constant,
hoisted out of all loops). The kernel loops over a range of rows; within a row it runs one or more
*phases*, each a single loop over the n elements that computes the elementwise values it can and
accumulates the last-axis reductions they feed; the row values a phase needs are computed between
loops. So softmax is three loops over a row (max; exp and its sum; the division) and layer norm
three (sum; deviations and their squares' sum; the result).

Three things keep a kernel near the speed of a copy of its bytes (graphc bench kernels):

* **No pass of its own for a reduction**: max and min (``fm.maximum`` / ``fm.minimum``:
  llvm.maximum, numpy's NaN propagation, vectorized) and integer sums accumulate in the loop
  that computes their input; their result does not depend on the order. A float sum does, and a
  loop that stores may run vectorized or scalar (LLVM checks at run time that its arrays do not
  overlap, and small arrays allocated side by side fail the check): so a float sum is taken after
  the loop, by a loop that stores nothing, from the row its input is in by then (softmax's
  exponentials), or recomputing a cheap input from the operands (layer norm's (x - mean)**2),
  else from a row the loop stages it in. float32 sums add in float32 within blocks of
  ``fm.ROW_SUM_BLOCK`` elements and in float64 across blocks.
* **Values a later phase reads live in an output row** when one of the same dtype is written no
  earlier than their last reader (softmax's exponentials wait in the output row that their
  quotients overwrite), else in a scratch row: the output row's first touch happens in a loop
  with arithmetic to hide it, and no extra row is cycled through the cache.
* **The first phase of the next row runs inside the last loop of this row** (software
  pipelining): the phase that reads a row from memory first (softmax's max, layer norm's sum) is
  otherwise light arithmetic stalled on DRAM; merged into the last loop of the row before, its
  loads overlap that loop's work. It applies when the first phase reads only per-element
  operands, scalars and constants, and keeps what later phases need in output rows.

A result may be written over an operand of its type (``KernelSpec.in_place_pairs``; the executor does so
when the operand dies at the kernel and nothing else holds it): every read of a row happens no
later than the first write into it, and such a call runs a variant that reads the operand
through the result's array (``source(aliased=)``): LLVM vectorizes one array read and written in
place, but not two arguments it cannot prove distinct.

Operands arrive as 2-d (R, n) views ("full"), per-row vectors (R,) ("row"), rows repeated with a
period (P, n) ("periodic": a (T, T) mask broadcast over batch and heads), vectors (n,) ("vec") or
scalars; anything else is materialized by the caller (runtime/codegen.py).
"""

from __future__ import annotations

import hashlib
import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from graphc.core.ir import Node, Region, Value
from graphc.core.traits import LOAD_STORE, Constant, Elementwise, Reduction
from graphc.ops import OPS
from graphc.runtime import fastmath
from graphc.runtime.kernelexpr import (
    arithmetic_expr,
    constant_text,
    convert_expr,
    logical_expr,
    np_type,
    power_expr,
    scalar_exponent,
    select_expr,
)

# part of every kernel's text: a cached kernel's machine code includes the fastmath functions it
# calls, so editing fastmath.py must give the kernels new cache entries
FASTMATH_VERSION = hashlib.sha256(pathlib.Path(fastmath.__file__).read_bytes()).hexdigest()[:12]


def is_reduction(node: Node) -> bool:
    """A row reduction of a kernel (passes/fuse.py puts only last-axis sums, maxes and mins in one)."""
    return node.op.has(Reduction)


def is_load_store_cheap(node: Node) -> bool:
    """An op a float sum's input may be recomputed through, in a loop of its own, rather than
    staged in a row (_Generator._row_sum): as cheap as the load and store it saves."""
    ew = node.op.trait(Elementwise)
    return ew is not None and ew.cost <= LOAD_STORE


RECOMPUTE_DEPTH = 4


@dataclass
class OperandKind:
    """How a kernel operand is passed and read: kind in full, row, periodic, vec, scalar."""

    kind: str
    period: int = 1

    def read(self, name: str, row: str = "r") -> str:
        """The text reading this operand at element ``j`` of row ``row``."""
        return {
            "full": f"{name}[{row}, j]",
            "row": f"{name}[{row}]",
            "periodic": f"{name}[{row} % {self.period}, j]",
            "vec": f"{name}[j]",
            "scalar": f"{name}[0]",
        }[self.kind]

    @property
    def per_element(self) -> bool:
        return self.kind in ("full", "periodic", "vec")


def operand_kind(shape: tuple[int, ...], space: tuple[int, ...], row_level: bool) -> OperandKind:
    n = space[-1] if space else 1
    padded = (1,) * (len(space) - len(shape)) + tuple(shape)
    if all(d == 1 for d in padded):
        return OperandKind("scalar")
    if padded == tuple(space) and not row_level:
        return OperandKind("full")
    if padded[-1] == 1 and padded[:-1] == tuple(space[:-1]):
        return OperandKind("row")
    if tuple(shape) == tuple(space[:-1]) and row_level:
        return OperandKind("row")
    if padded[-1] == n and not row_level:
        if all(d == 1 for d in padded[:-1]):
            return OperandKind("vec")
        for k in range(len(space) - 1):
            if all(d == 1 for d in padded[:k]) and padded[k:-1] == tuple(space[k:-1]):
                return OperandKind("periodic", int(np.prod(space[k:-1], dtype=np.int64)))
    return OperandKind("full")  # materialized by the caller


@dataclass
class _Pass:
    """One phase's share of an element loop over one row: lines before the loop, in the loop body,
    and after the loop."""

    init: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    final: list[str] = field(default_factory=list)


class KernelSpec:
    """Analysis of one fused region for given operand shapes: levels, phases, operand kinds, and
    the generated source."""

    def __init__(self, region: Region, space: tuple[int, ...]):
        self.region = region
        self.space = tuple(space)
        self.row_shapes = (self.space[:-1] + (1,), self.space[:-1]) if self.space else ((),)
        self.level: dict[Value, str] = {}
        self.phase: dict[Value, int] = {}  # elem values: the loop that computes them; row values: availability
        self.names: dict[Value, str] = {}
        self._analyse()

    # -- analysis ------------------------------------------------------------------------------
    def _analyse(self) -> None:
        region = self.region
        row_inputs: set[Value] = set()
        for node in region.nodes:  # an input used by a row op or a reduction-free row computation is row-level
            if (
                not is_reduction(node)
                and node.outputs[0].shape in self.row_shapes
                and node.outputs[0].shape != self.space
            ):
                row_inputs.update(v for v in node.inputs if v in region.inputs)
        for i, v in enumerate(region.inputs):
            self.names[v] = f"in{i}"
            self.level[v] = "row" if v in row_inputs else "elem"
            self.phase[v] = 0
        for k, node in enumerate(region.nodes):
            out = node.outputs[0]
            self.names[out] = f"v{k}"
            if node.op.has(Constant):
                self.level[out], self.phase[out] = "const", 0
            elif is_reduction(node):
                self.level[out] = "row"
                self.phase[out] = self.phase[node.inputs[0]] + 1
            elif out.shape == self.space:
                self.level[out] = "elem"
                self.phase[out] = max((self.phase[v] for v in node.inputs), default=0)
            else:
                self.level[out] = "row"
                self.phase[out] = max((self.phase[v] for v in node.inputs), default=0)
        self.n_phases = max([self._loop_phase(n) for n in region.nodes if self._in_loop(n)] + [0]) + 1
        # output index -> the phase whose loop writes it, for the elementwise results a loop writes
        # (not operands passed through; a value yielded twice: its first index)
        self.written_in: dict[int, int] = {
            i: self.phase[v]
            for i, v in enumerate(region.outputs)
            if self.level[v] == "elem" and v not in region.inputs and region.outputs.index(v) == i
        }

    def _in_loop(self, node: Node) -> bool:
        """Whether the node runs inside an element loop (an elementwise op or a reduction)."""
        return is_reduction(node) or self.level[node.outputs[0]] == "elem"

    def _loop_phase(self, node: Node) -> int:
        """The phase whose loop runs the node: a reduction accumulates in the loop of its input."""
        return self.phase[node.inputs[0]] if is_reduction(node) else self.phase[node.outputs[0]]

    def operand_kinds(self) -> list[OperandKind]:
        """How each operand is passed. An operand a reduction reads is a row of n elements, so it
        needs a per-element kind even when all its dims are 1 (a batch of one: space (1,) or
        (1, 1), where operand_kind would call it a scalar); the caller materializes it."""
        reduced = {n.inputs[0] for n in self.region.nodes if is_reduction(n)}
        kinds = []
        for v in self.region.inputs:
            kind = operand_kind(v.shape, self.space, self.level[v] == "row")
            kinds.append(OperandKind("full") if v in reduced and not kind.per_element else kind)
        return kinds

    def _last_reads(self) -> dict[Value, int]:
        """Elementwise values (not operands) read by a later phase than their own: the last phase
        that reads each."""
        last: dict[Value, int] = {}
        for node in self.region.nodes:
            p = self._loop_phase(node) if self._in_loop(node) else self.phase[node.outputs[0]]
            for v in node.inputs:
                if self.level.get(v) == "elem" and v not in self.region.inputs and self.phase[v] < p:
                    last[v] = max(last.get(v, p), p)
        return last

    def _homes(self, last_read: dict[Value, int]) -> dict[Value, int | None]:
        """Where each value read by a later phase waits: the index of an output row, or None (a
        scratch row). An elementwise result waits in its own output row. Another value may wait in
        the row of an output of its dtype that is written (at the end of its phase's loop body) no
        earlier than the value's last reader, if no other value waiting there is still needed."""
        region = self.region
        homes: dict[Value, int | None] = {}
        busy_until: dict[int, int] = {}  # output index -> last phase a value waiting there is read
        reserved = {region.outputs.index(v) for v in last_read if v in region.outputs}
        for v in sorted(last_read, key=lambda u: (self.phase[u], self.names[u])):
            if v in region.outputs:
                homes[v] = region.outputs.index(v)
                continue
            homes[v] = None
            for i, phase in self.written_in.items():
                out = region.outputs[i]
                if i in reserved or out.dtype != v.dtype or phase < last_read[v]:
                    continue
                if busy_until.get(i, -1) >= self.phase[v]:
                    continue
                homes[v] = i
                busy_until[i] = last_read[v]
                break
        return homes

    def _can_pipeline(self, kinds: list[OperandKind], homes: dict[Value, int | None]) -> bool:
        """Whether the first phase of row r+1 may run inside the last loop of row r: there is more
        than one phase, the first phase's loop reads only per-element operands, scalars, constants
        and its own values (no value of this row), and what later phases read from it waits in
        output rows (a scratch row holds one row at a time)."""
        if self.n_phases < 2:
            return False
        region = self.region
        for node in region.nodes:
            if not self._in_loop(node) or self._loop_phase(node) != 0:
                continue
            for v in node.inputs:
                if v in region.inputs:
                    if kinds[region.inputs.index(v)].kind == "row":
                        return False
                elif self.level[v] not in ("elem", "const"):
                    return False
        return all(home is not None for v, home in homes.items() if self.phase[v] == 0)

    def in_place_pairs(self, kinds: list[OperandKind]) -> list[tuple[int, int]]:
        """(operand, result) pairs that may share a buffer: the result may be written into the
        operand's rows (the executor does so when nothing else holds the operand). Safe when the
        operand is a full array of the result's type whose every read of row r happens no later
        than the first write into the result's row r: in an earlier phase, or in the same loop,
        where the generated body loads the operand first (``preload``). With pipelining the first
        phase of row r+1 reads row r+1 only, which the last loop of row r does not write."""
        region = self.region
        homes = self._homes(self._last_reads())
        read_in: dict[int, int] = {}  # operand index -> the last phase whose loop reads it
        for node in region.nodes:
            if self._in_loop(node):
                for v in node.inputs:
                    if v in region.inputs:
                        i = region.inputs.index(v)
                        read_in[i] = max(read_in.get(i, 0), self._loop_phase(node))
        first_write = dict(self.written_in)  # result index -> the first phase that writes its rows
        for v, home in homes.items():
            if home is not None and home in first_write:
                first_write[home] = min(first_write[home], self.phase[v])
        pairs: list[tuple[int, int]] = []
        taken: set[int] = set()
        for i, v in enumerate(region.inputs):
            if kinds[i].kind != "full" or v.shape != self.space or v in region.outputs:
                continue
            for k, phase in first_write.items():
                out = region.outputs[k]
                if k not in taken and out.dtype == v.dtype and out.shape == v.shape and phase >= read_in.get(i, 0):
                    pairs.append((i, k))
                    taken.add(k)
                    break
        return pairs

    # -- code generation -------------------------------------------------------------------------
    def source(self, kinds: list[OperandKind], aliased: frozenset[tuple[int, int]] = frozenset()) -> str:
        """The kernel's Python source for operands of these kinds: the imports and signature, then
        the hoisted constants, the scratch rows, and the loop over a range of rows. ``aliased``:
        the (operand, result) pairs of ``in_place_pairs`` that this variant is called with in one buffer;
        it reads those operands through the result's array. (Passed as two arguments, LLVM cannot
        tell the arrays are one, checks for overlap at run time and falls back to the scalar loop,
        several times slower: docs/measurements.md#aliased-kernel.)"""
        homes = self._homes(self._last_reads())
        preload = {self.region.inputs[i] for i, _ in self.in_place_pairs(kinds)}
        gen = _Generator(self, kinds, homes, preload, dict(aliased))
        loop = gen.pipelined_row_loop() if self._can_pipeline(kinds, homes) else gen.row_loop()
        body = self._constant_lines() + gen.scratch_lines() + loop
        lines = self._header_lines()
        lines.extend("    " + s for s in body)
        return "\n".join(lines) + "\n"

    def _header_lines(self) -> list[str]:
        """The imports, the decorator and the signature: ``kernel(in0, ..., out0, ..., r0, r1, n)``."""
        operands = [f"in{i}" for i in range(len(self.region.inputs))]
        results = [f"out{i}" for i in range(len(self.region.outputs))]
        return [
            f"# graphc fused kernel (fastmath {FASTMATH_VERSION})",
            "import math",
            "import numpy as np",
            "import numba",
            "from graphc.runtime import fastmath as fm",
            "",
            # numpy's error model: no zero-division checks (they stop vectorization; numpy gives inf).
            # No cache=True: load_kernel gives the kernel graphc's sealed disk cache instead of Numba's.
            '@numba.njit(nogil=True, error_model="numpy")',
            f"def kernel({', '.join(operands + results)}, r0, r1, n):",
        ]

    def _constant_lines(self) -> list[str]:
        """The region's scalar constants, hoisted out of the loops."""
        lines = []
        for node in self.region.nodes:
            if not node.op.has(Constant):
                continue
            out = node.outputs[0]
            lines.append(f"{self.names[out]} = {np_type(out.dtype)}({constant_text(node.attrs['value'])})")
        return lines

    def row_ref(self, v: Value) -> str:
        """How row-level code refers to a value: its per-row read for an operand, else its name."""
        return f"s_{self.names[v]}" if v in self.region.inputs else self.names[v]

    def expr(self, node: Node, ref: Callable[[Value], str] | None = None) -> str:
        """The expression computing the node's (scalar) result, ``ref(v)`` giving the text that reads
        operand ``v`` (default: its name)."""
        ref = ref or (lambda v: self.names[v])
        name = node.op.name
        args = [ref(v) for v in node.inputs]  # read first: an element loop emits an operand's load on its first read
        dtype = node.outputs[0].dtype
        text = power_expr(node, args) if name == "pow" and scalar_exponent(node) else None
        if name == "convert":
            text = convert_expr(node, args)
        if text is None:
            text = arithmetic_expr(name, args, dtype)
        if text is None:
            text = select_expr(name, args, dtype)
        if text is None:
            text = logical_expr(name, args, dtype, node.attrs)
        if text is None:
            raise NotImplementedError(f"no kernel code for {name}")
        return text


class _Rows:
    """Where a pass reads and writes: operands at row ``read``; element ``j`` of output ``k``'s row
    as ``{out}{k}[{at}, j]`` (``out``, or a name bound to it or to a dummy row). Records the
    outputs it refers to."""

    def __init__(self, read: str = "r", out: str = "out", at: str = "r"):
        self.read, self.out, self.at = read, out, at
        self.used: set[int] = set()

    def out_ref(self, k: int) -> str:
        self.used.add(k)
        return f"{self.out}{k}[{self.at}, j]"

    def row_ref(self, k: int) -> str:
        """Output ``k``'s whole row."""
        self.used.add(k)
        return f"{self.out}{k}[{self.at}]"


class _Generator:
    """The lines of one kernel: the scratch rows, each row's phases, the element loops."""

    def __init__(
        self,
        spec: KernelSpec,
        kinds: list[OperandKind],
        homes: dict[Value, int | None],
        preload: set[Value],
        aliased: dict[int, int],
    ):
        self.spec = spec
        self.kinds = kinds
        self.homes = homes
        self.preload = preload  # operands a result may overwrite: loaded first in every loop that reads them
        self.aliased = aliased  # operand index -> the result whose array it is read through
        self.staged_rows: dict[str, np.dtype] = {}  # rows float sums are staged in (_row_sum)

    def scratch_lines(self) -> list[str]:
        """A row-sized scratch buffer ``t_<name>`` for each value that waits for a later phase and
        has no output row to wait in."""
        spec = self.spec
        waiting = sorted((v for v, home in self.homes.items() if home is None), key=lambda v: spec.names[v])
        lines = [f"t_{spec.names[v]} = np.empty(n, dtype={np_type(v.dtype)})" for v in waiting]
        return lines + [f"{row} = np.empty(n, dtype={np_type(dt)})" for row, dt in self.staged_rows.items()]

    def home_ref(self, v: Value, rows: _Rows) -> str:
        """Element ``j`` of the row where ``v`` waits for its later readers."""
        home = self.homes[v]
        return f"t_{self.spec.names[v]}[j]" if home is None else rows.out_ref(home)

    def row_loop(self) -> list[str]:
        """The loop over rows: read the per-row operands, run the phases, compute the row ops after
        the last reduction, and write the per-row results."""
        spec = self.spec
        lines = self._row_operand_lines("r")
        for p in range(spec.n_phases):
            lines.extend(self._row_op_lines(p))
            lines.extend(self.loop([self.pass_of(p, _Rows(), "")]))
        lines.extend(self._row_op_lines(spec.n_phases))  # after the last reduction
        lines.extend(self._row_output_lines())
        return ["for r in range(r0, r1):"] + ["    " + s for s in lines]

    def pipelined_row_loop(self) -> list[str]:
        """The loop over rows of a pipelined kernel. It starts one row early: row r's last loop also
        runs row r+1's first phase, so the row before r0 runs only that (its own part writes into
        dummy rows) and the last row's next-row part reads the last row again and writes into
        dummy rows. Every row's phases thus run in the same loops (the same machine code, the same
        rounding of sums) whichever rows a thread is given."""
        spec = self.spec
        last = spec.n_phases - 1
        this, following = _Rows("lr", "O", "lo"), _Rows("rn", "P", "no")
        merged = self.loop([self.pass_of(last, this, ""), self.pass_of(0, following, "n_")])
        current = self._row_op_lines(0) + self._carried_lines()
        for p in range(1, last):
            current.extend(self._row_op_lines(p))
            current.extend(self.loop([self.pass_of(p, _Rows(), "")]))
        current.extend(self._row_op_lines(last))
        after = self._row_op_lines(spec.n_phases) + self._row_output_lines()
        body = ["cur = r >= r0", "lr = r if cur else r0"]  # lr: a row that exists, for reads
        body += self._row_operand_lines("lr")
        body += _guarded("cur", current)
        body.append("lo = r if cur else 0")
        body += [f"O{k} = out{k} if cur else d_out{k}" for k in sorted(this.used)]
        body += ["nxt = r + 1 < r1", "rn = r + 1 if nxt else lr", "no = rn if nxt else 0"]
        body += [f"P{k} = out{k} if nxt else d_out{k}" for k in sorted(following.used)]
        body += merged
        body += _guarded("cur", after)
        outputs = spec.region.outputs
        lines = ["if r0 >= r1:", "    return"]
        lines += [
            f"d_out{k} = np.empty((1, n), dtype={np_type(outputs[k].dtype)})"
            for k in sorted(this.used | following.used)
        ]
        # the row values the row before r0 reads, and the first phase's carried results
        for node in spec.region.nodes:
            v = node.outputs[0]
            if spec.level[v] == "row":
                lines.append(f"{spec.names[v]} = {np_type(v.dtype)}(0)")
                if is_reduction(node) and spec._loop_phase(node) == 0:
                    lines.append(f"n_{spec.names[v]} = {np_type(v.dtype)}(0)")
        lines.append("for r in range(r0 - 1, r1):")
        lines.extend("    " + s for s in body)
        return lines

    def _row_operand_lines(self, row: str) -> list[str]:
        """``s_<name> = ...`` for the operands with one value per row (or a scalar), read at ``row``."""
        spec = self.spec
        return [
            f"s_{spec.names[v]} = {kind.read(spec.names[v], row)}"
            for v, kind in zip(spec.region.inputs, self.kinds)
            if not kind.per_element
        ]

    def _carried_lines(self) -> list[str]:
        """The first phase's reductions of this row, computed in the loop of the row before."""
        spec = self.spec
        return [
            f"{spec.names[n.outputs[0]]} = n_{spec.names[n.outputs[0]]}"
            for n in spec.region.nodes
            if is_reduction(n) and spec._loop_phase(n) == 0
        ]

    def _row_op_lines(self, p: int) -> list[str]:
        """``name = expr`` for the row ops (non-reductions with a per-row result) of phase ``p`` (when
        their inputs are available; ``n_phases``: all those after the last reduction), in node order."""
        spec = self.spec
        lines = []
        for node in spec.region.nodes:
            out = node.outputs[0]
            at = spec.phase[out] == p or (p == spec.n_phases and spec.phase[out] > p)
            if not is_reduction(node) and spec.level[out] == "row" and at:
                lines.append(f"{spec.names[out]} = {spec.expr(node, spec.row_ref)}")
        return lines

    def _row_output_lines(self) -> list[str]:
        """Write the per-row and constant results, and copy the results that are elementwise operands."""
        spec = self.spec
        region = spec.region
        lines = []
        for i, v in enumerate(region.outputs):
            if spec.level[v] in ("row", "const"):
                lines.append(f"out{i}[r] = {spec.row_ref(v)}")
            elif spec.level[v] == "elem" and v in region.inputs:
                read = self.kinds[region.inputs.index(v)].read(spec.names[v])
                lines += ["for j in range(n):", f"    out{i}[r, j] = {read}"]
        return lines

    def pass_of(self, p: int, rows: _Rows, prefix: str) -> _Pass:
        """Phase ``p`` of a row (its operands and output rows as ``rows`` says, its values named
        with ``prefix``): compute the phase's elementwise values, keep those read later where they
        wait, accumulate its reductions, and write the results it produces (after every value of
        the body, so that an output row a value waits in is overwritten only once it was read)."""
        spec = self.spec
        region = spec.region
        loop = _ElementLoop(self, p, rows, prefix)
        out = _Pass(body=loop.lines)  # computations and accumulations in node order
        staged: list[Node] = []  # float sums: summed from a row after the loop (_row_sum)
        read_here = {v for n in region.nodes if spec._in_loop(n) and spec._loop_phase(n) == p for v in n.inputs}
        for v in region.inputs:
            if v in self.preload and v in read_here:
                loop.ref(v)  # before any write of this element (the result may share its buffer)
        for node in region.nodes:
            if not spec._in_loop(node) or spec._loop_phase(node) != p:
                continue
            v = node.outputs[0]
            if node.op is OPS.reduce_sum and v.dtype.kind == "f":
                staged.append(node)
                continue
            if is_reduction(node):
                _accumulate(out, node, prefix + spec.names[v], loop.ref(node.inputs[0]))
                continue
            loop.lines.append(f"{prefix}{spec.names[v]} = {spec.expr(node, loop.ref)}")
            if v in self.homes:
                loop.lines.append(f"{self.home_ref(v, rows)} = {prefix}{spec.names[v]}")
        written: dict[Value, str] = {}  # value -> the row it is in once the loop is done
        for i, v in enumerate(region.outputs):
            written_here = spec.level[v] == "elem" and v not in region.inputs and spec.phase[v] == p
            if written_here and self.homes.get(v) != i:
                loop.lines.append(f"{rows.out_ref(i)} = {loop.ref(v)}")
            if written_here:
                written.setdefault(v, rows.row_ref(i))
        for node in staged:
            self._row_sum(node, p, rows, prefix, loop, out, written)
        return out

    def _row_sum(
        self, node: Node, p: int, rows: _Rows, prefix: str, loop: _ElementLoop, into: _Pass, written: dict[Value, str]
    ) -> None:
        """A float sum of phase ``p``: summed after the loop by fm.row_sum32/64 from the row its
        input is in by then (its output row, or the row it waits in), else from a row the loop
        stages it in. Accumulated in the loop, a sum's order would be the vectorizer's: LLVM guards
        a vectorized loop that stores with a run-time check that the arrays do not overlap, which
        two small arrays allocated side by side can fail, and the scalar loop then adds in another
        order (one jitted function gave two different results depending on where its arrays were
        allocated). A loop with no stores needs no check: the reducer always runs the same code."""
        spec = self.spec
        x, v = node.inputs[0], node.outputs[0]
        name = prefix + spec.names[v]
        if x in written:
            row = written[x]
        elif self._waits(x, p):
            home = self.homes[x]
            row = f"t_{spec.names[x]}" if home is None else rows.row_ref(home)
        else:
            expr = self._recomputed(x, p, rows, RECOMPUTE_DEPTH)
            if expr is not None:  # cheap: recomputed by a loop of its own, which stores nothing
                into.final.extend(_store_free_sum(name, expr, x.dtype, v.dtype))
                return
            row = f"t_s{name}"
            self.staged_rows[row] = x.dtype
            loop.lines.append(f"{row}[j] = {np_type(x.dtype)}({loop.ref(x)})")
        reducer = "row_sum32" if x.dtype == np.float32 else "row_sum64"
        into.final.append(f"{name} = {np_type(v.dtype)}(fm.{reducer}({row}))")

    def _recomputed(self, v: Value, p: int, rows: _Rows, depth: int) -> str | None:
        """An expression for ``v`` at element ``j`` once phase ``p``'s loop has run, reading only
        operands, rows values wait in, row values and constants, through cheap ops (``CHEAP_OPS``,
        at most ``depth`` deep); None when ``v`` needs more."""
        spec = self.spec
        region = spec.region
        if v in region.inputs:
            i = region.inputs.index(v)
            kind = self.kinds[i]
            if not kind.per_element:
                return f"s_{spec.names[v]}"
            if i not in self.aliased:
                return kind.read(spec.names[v], rows.read)
            return rows.out_ref(self.aliased[i]) if self._holds(self.aliased[i], p, None) else None
        if spec.level[v] != "elem":
            return spec.names[v]  # a constant or a row value
        if self._waits(v, p):
            return self.home_ref(v, rows)
        node = v.producer
        if depth == 0 or node is None or not is_load_store_cheap(node):
            return None
        refs: dict[Value, str] = {}
        for u in node.inputs:
            text = self._recomputed(u, p, rows, depth - 1)
            if text is None:
                return None
            refs[u] = text
        return spec.expr(node, refs.__getitem__)

    def _waits(self, v: Value, p: int) -> bool:
        """Whether ``v`` is in the row it waits in once phase ``p``'s loop has run."""
        if v not in self.homes:
            return False
        home = self.homes[v]
        return home is None or self._holds(home, p, v)

    def _holds(self, k: int, p: int, v: Value | None) -> bool:
        """Whether output ``k``'s row, once phase ``p``'s loop has run, still holds what it held
        before that loop, or ``v`` written in it: the loop writes no other value into the row."""
        spec = self.spec
        writes = [u for u, home in self.homes.items() if home == k and spec.phase[u] == p]
        if spec.written_in.get(k) == p:
            writes.append(spec.region.outputs[k])
        return all(u is v for u in writes)

    @staticmethod
    def loop(passes: list[_Pass]) -> list[str]:
        """One loop over the elements of a row running ``passes`` together."""
        lines = [s for p in passes for s in p.init]
        body = [s for p in passes for s in p.body]
        if body:  # (a phase of row ops only has none)
            lines.append("for j in range(n):")
            lines.extend("    " + s for s in body)
        lines.extend(s for p in passes for s in p.final)
        return lines


def _store_free_sum(name: str, expr: str, dtype: np.dtype, result: np.dtype) -> list[str]:
    """A loop of its own summing ``expr`` (at element ``j``) into ``name``: it stores nothing, so
    LLVM vectorizes it without a run-time overlap check, the same way for every row. float32: in
    float32 within blocks of ROW_SUM_BLOCK elements (a constant trip count vectorizes fully), in
    float64 across blocks, as fm.row_sum32."""
    b, a, cast = f"b_{name}", f"a_{name}", np_type(result)
    if dtype != np.float32:
        return [
            f"{a} = np.float64(0.0)",
            "for j in range(n):",
            f"    {a} = fm.radd({a}, np.float64({expr}))",
            f"{name} = {cast}({a})",
        ]
    block = fastmath.ROW_SUM_BLOCK
    return [
        f"{a} = np.float64(0.0)",
        f"for jb in range(n // {block}):",
        f"    {b} = np.float32(0.0)",
        f"    for k in range({block}):",
        f"        j = jb * {block} + k",
        f"        {b} = fm.radd({b}, np.float32({expr}))",
        f"    {a} += np.float64({b})",
        f"{b} = np.float32(0.0)",
        f"for j in range(n - n % {block}, n):",
        f"    {b} = fm.radd({b}, np.float32({expr}))",
        f"{name} = {cast}({a} + np.float64({b}))",
    ]


def _guarded(condition: str, lines: list[str]) -> list[str]:
    """``lines`` under ``if condition:`` (nothing when there are none)."""
    return [f"if {condition}:"] + ["    " + s for s in lines] if lines else []


def _accumulate(into: _Pass, node: Node, name: str, x: str) -> None:
    """The lines that reduce ``x`` (read at element ``j``) into the row value ``name``, in the loop:
    max and min (of any type) and integer sums, whose result does not depend on the order."""
    dtype = node.outputs[0].dtype
    cast = np_type(dtype)
    acc = f"a_{name}"
    if node.op is OPS.reduce_sum:  # integers: exact in any order (float sums: _Generator.row_sum)
        into.init.append(f"{acc} = {cast}(0)")
        into.body.append(f"{acc} += {cast}({x})")
        into.final.append(f"{name} = {cast}({acc})")
        return
    largest = node.op is OPS.reduce_max
    if dtype.kind == "f":
        into.init.append(f"{acc} = {cast}(float('{'-' if largest else ''}inf'))")
        into.body.append(f"{acc} = fm.{'maximum' if largest else 'minimum'}({acc}, {cast}({x}))")
    else:
        if dtype.kind == "b":
            start = "False" if largest else "True"
        else:
            info = np.iinfo(dtype)
            start = f"{cast}({info.min if largest else info.max})"
        into.init.append(f"{acc} = {start}")
        into.body.append(f"{acc} = {'max' if largest else 'min'}({acc}, {cast}({x}))")
    into.final.append(f"{name} = {cast}({acc})")


class _ElementLoop:
    """The lines of one phase's loop body over the elements of a row, and how that body reads
    values: a per-element operand is loaded (``e_<name>``) the first time the body reads it."""

    def __init__(self, gen: _Generator, phase: int, rows: _Rows, prefix: str):
        self.gen = gen
        self.spec = gen.spec
        self.phase = phase
        self.rows = rows
        self.prefix = prefix
        self.lines: list[str] = []
        self.loaded: set[Value] = set()

    def ref(self, v: Value) -> str:
        """The text reading ``v`` at element ``j``: an operand's element or row value, the row where
        a value of an earlier phase waits, a value computed in this body, or a row value."""
        spec = self.spec
        name = spec.names[v]
        if v in spec.region.inputs:
            return self._operand_ref(v, name)
        if spec.level[v] == "elem" and spec.phase[v] < self.phase:
            return self.gen.home_ref(v, self.rows)
        if spec.level[v] == "elem":
            return self.prefix + name
        return name

    def _operand_ref(self, v: Value, name: str) -> str:
        """An operand: its per-row read ``s_<name>``, or its element ``e_<name>`` (loaded once)."""
        kind = self.gen.kinds[self.spec.region.inputs.index(v)]
        if not kind.per_element:
            return f"s_{name}"
        if v not in self.loaded:
            i = self.spec.region.inputs.index(v)
            read = self.rows.out_ref(self.gen.aliased[i]) if i in self.gen.aliased else kind.read(name, self.rows.read)
            self.lines.append(f"e_{self.prefix}{name} = {read}")
            self.loaded.add(v)
        return f"e_{self.prefix}{name}"
