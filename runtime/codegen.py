"""Numba kernels for ``fused`` nodes.

A fused region works on an iteration space S = (..., n), seen as R = prod(S[:-1]) rows of n
elements. The generated kernel loops over rows; within a row it runs one or more *phases*, each a
single loop over the n elements that computes the elementwise ops it can and accumulates the
last-axis reductions fed by them; per-row values (reduction results and the row ops after them,
such as a variance + eps) are computed between phases. Elementwise values needed in a later phase
are kept in a row-sized scratch buffer. So softmax is two passes over a row and layer norm three,
instead of one numpy call (and one temporary array) per op. Reductions read their row buffer
after the loop, with the vectorized reducers of runtime/rowops.py.

Operands arrive as 2-d (R, n) views, per-row vectors (R,), rows repeated with a period (P, n)
(a (T, T) mask broadcast over batch and heads), vectors (n,) or scalars; anything else is
materialized. Sums accumulate in float64 (int64 for integers). Kernels are compiled with
``nogil=True`` and cached on disk in the kernel cache folder (``<cache>/kernels``, see
graphc/core/files.py ``cache_dir``): another process that needs the same kernel loads its machine
code from a sealed entry (runtime/kernel_cache.py) instead of compiling it. Only the source
generated here is run; a copy of it is written next to the entries for people to read, and a file
found there is never imported.
"""

from __future__ import annotations

import hashlib
import linecache
import math
import os
import pathlib
import stat
import sys
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.core.cache import private_dir, unsafe_reason, warn_cache
from graphc.core.files import atomic_write, cache_dir
from graphc.core.ir import Node, Region, Value
from graphc.runtime import fastmath, rowops
from graphc.runtime.kernel_cache import attach_disk_cache
from graphc.runtime.threads import kernel_pool, kernel_threads

# part of every kernel's text: Numba's disk cache does not see changes in the functions a kernel
# calls, so editing fastmath.py must give the kernels new cache entries
FASTMATH_VERSION = hashlib.sha256(
    pathlib.Path(fastmath.__file__).read_bytes() + pathlib.Path(rowops.__file__).read_bytes()
).hexdigest()[:12]

REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min")
_FASTMATH = {"exp": "exp", "tanh": "tanh", "log": "log", "log1p": "log1p_", "expm1": "expm1_"}
_FLOAT_FUNCS = {"sqrt": "math.sqrt", "sin": "math.sin", "cos": "math.cos"}  # (kernels are float32/64 only)
_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def kernel_cache_dir() -> str | None:
    """The kernel cache folder, created 0700; None (after a CacheWarning) when it is not the user's alone."""
    return private_dir(cache_dir("kernels"))


def _np_type(dt: np.dtype) -> str:
    return "np.bool_" if dt.kind == "b" else f"np.{np.dtype(dt).name}"


@dataclass
class OperandKind:
    """How a kernel operand is passed and read: kind in full, row, periodic, vec, scalar."""

    kind: str
    period: int = 1

    def read(self, name: str) -> str:
        return {
            "full": f"{name}[r, j]",
            "row": f"{name}[r]",
            "periodic": f"{name}[r % {self.period}, j]",
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


def _operand_shape(kind: OperandKind, space: tuple[int, ...], rows: int, n: int):
    """(the shape the kernel reads an operand of this kind in, a view when the operand is
    C-contiguous; the shape a "full" operand is broadcast to first, or None)."""
    if kind.kind == "scalar":
        return (1,), None
    if kind.kind == "row":
        return (rows,), None
    if kind.kind == "vec":
        return (n,), None
    if kind.kind == "periodic":
        return (kind.period, n), None
    return (rows, n), tuple(space)


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
                node.op.name not in REDUCTIONS
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
            if node.op.name == "constant":
                self.level[out], self.phase[out] = "const", 0
            elif node.op.name in REDUCTIONS:
                self.level[out] = "row"
                self.phase[out] = self.phase[node.inputs[0]] + 1
            elif out.shape == self.space:
                self.level[out] = "elem"
                self.phase[out] = max((self.phase[v] for v in node.inputs), default=0)
            else:
                self.level[out] = "row"
                self.phase[out] = max((self.phase[v] for v in node.inputs), default=0)
        self.n_phases = (
            max(
                [self.phase[v] for v in self.phase if self.level[v] == "elem"]
                + [self.phase[n.inputs[0]] for n in region.nodes if n.op.name in REDUCTIONS]
                + [0]
            )
            + 1
        )

    def operand_kinds(self) -> list[OperandKind]:
        """How each operand is passed. An operand a reduction reads is a row of n elements, so it
        needs a per-element kind even when all its dims are 1 (a batch of one: space (1,) or
        (1, 1), where operand_kind would call it a scalar); the caller materializes it."""
        reduced = {n.inputs[0] for n in self.region.nodes if n.op.name in REDUCTIONS}
        kinds = []
        for v in self.region.inputs:
            kind = operand_kind(v.shape, self.space, self.level[v] == "row")
            kinds.append(OperandKind("full") if v in reduced and not kind.per_element else kind)
        return kinds

    # -- code generation -------------------------------------------------------------------------
    def source(self, kinds: list[OperandKind]) -> str:
        """The kernel's Python source for operands of these kinds: the imports and signature, then
        the hoisted constants, the scratch rows, and the loop over a range of rows."""
        used_later = self._values_used_later()
        body = self._constant_lines() + self._scratch_lines(used_later)
        body.append("for r in range(r0, r1):")  # a range of rows: threads split the rows
        body.extend("    " + s for s in self._row_lines(kinds, used_later))
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
            "from graphc.runtime import rowops",
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
            if node.op.name != "constant":
                continue
            out = node.outputs[0]
            lines.append(f"{self.names[out]} = {_np_type(out.dtype)}({_constant_text(node.attrs['value'])})")
        return lines

    def _values_used_later(self) -> set[Value]:
        """Elementwise values needed after the loop that computes them: read by a node of a later
        phase, or reduced (from their row buffer, after the loop)."""
        region = self.region
        used_later: set[Value] = set()
        for node in region.nodes:
            p = self._node_phase(node)
            for v in node.inputs:
                if self.level.get(v) == "elem" and v not in region.inputs and self.phase[v] < p:
                    used_later.add(v)
            if node.op.name in REDUCTIONS and node.inputs[0] not in region.inputs:
                used_later.add(node.inputs[0])  # reduced from its row buffer after the loop
        return used_later

    def _scratch_lines(self, used_later: set[Value]) -> list[str]:
        """A row-sized scratch buffer ``t_<name>`` for each value used in a later phase than its own."""
        return [
            f"t_{self.names[v]} = np.empty(n, dtype={_np_type(v.dtype)})"
            for v in sorted(used_later, key=lambda v: self.names[v])
        ]

    def _row_lines(self, kinds: list[OperandKind], used_later: set[Value]) -> list[str]:
        """The body of the loop over rows: read the per-row operands, run the phases, compute the row
        ops after the last reduction, and write the per-row results."""
        lines = self._row_operand_reads(kinds)
        for p in range(self.n_phases):
            lines.extend(self._phase_lines(p, kinds, used_later))
        lines.extend(self._row_op_lines(lambda phase: phase >= self.n_phases))  # after the last reduction
        lines.extend(self._row_output_lines(kinds))
        return lines

    def _row_operand_reads(self, kinds: list[OperandKind]) -> list[str]:
        """``s_<name> = ...`` for operands with one value per row (or a scalar): read once per row."""
        return [
            f"s_{self.names[v]} = {kind.read(self.names[v])}"
            for v, kind in zip(self.region.inputs, kinds)
            if not kind.per_element
        ]

    def _row_ref(self, v: Value) -> str:
        """How row-level code refers to a value: its per-row read for an operand, else its name."""
        return f"s_{self.names[v]}" if v in self.region.inputs else self.names[v]

    def _row_op_lines(self, available: Callable[[int], bool]) -> list[str]:
        """``name = expr`` for the row ops (non-reductions with a per-row result) whose phase (when
        their inputs are available) passes ``available``, in node order."""
        lines = []
        for node in self.region.nodes:
            out = node.outputs[0]
            if node.op.name not in REDUCTIONS and self.level[out] == "row" and available(self.phase[out]):
                lines.append(f"{self.names[out]} = {self._expr(node, self._row_ref)}")
        return lines

    def _phase_lines(self, p: int, kinds: list[OperandKind], used_later: set[Value]) -> list[str]:
        """Phase ``p`` of a row: the row ops available before it, then one loop over the row's
        elements (when the phase computes or writes elementwise values), then the reductions of the
        row buffers that loop filled."""
        region = self.region
        lines = self._row_op_lines(lambda phase: phase == p)
        reductions = [n for n in region.nodes if n.op.name in REDUCTIONS and self.phase[n.inputs[0]] == p]
        elems = [
            n
            for n in region.nodes
            if self.level[n.outputs[0]] == "elem" and self.phase[n.outputs[0]] == p and n.op.name != "constant"
        ]
        needs_loop = elems or any(self._written_in_loop(v, p) for v in region.outputs)
        if not needs_loop and not reductions:
            return lines
        if needs_loop:
            lines.append("for j in range(n):")
        lines.extend("    " + s for s in self._loop_body(p, kinds, elems, used_later))
        lines.extend(self._reduction_lines(reductions, kinds))
        return lines

    def _written_in_loop(self, v: Value, p: int) -> bool:
        """Whether result ``v`` is written element by element in the loop of phase ``p``."""
        return self.level[v] == "elem" and self.phase[v] == p and v not in self.region.inputs

    def _loop_body(self, p: int, kinds: list[OperandKind], elems: list[Node], used_later: set[Value]) -> list[str]:
        """The loop over element ``j`` of phase ``p``: compute the phase's elementwise values (saving
        those used later to their scratch rows) and write the results it produces."""
        loop = _ElementLoop(self, kinds, p)
        for node in elems:
            out = node.outputs[0]
            loop.lines.append(f"{self.names[out]} = {self._expr(node, loop.ref)}")
            if out in used_later:
                loop.lines.append(f"t_{self.names[out]}[j] = {self.names[out]}")
        for i, v in enumerate(self.region.outputs):
            if self._written_in_loop(v, p):
                loop.lines.append(f"out{i}[r, j] = {loop.ref(v)}")
        return loop.lines

    def _reduction_lines(self, reductions: list[Node], kinds: list[OperandKind]) -> list[str]:
        """Reduce each row buffer (vectorized, runtime/rowops.py): an operand's row, or a scratch row."""
        lines = []
        for node in reductions:
            out, x = node.outputs[0], node.inputs[0]
            row = self._row_of(x, kinds) if x in self.region.inputs else f"t_{self.names[x]}"
            lines.append(f"{self.names[out]} = {_np_type(out.dtype)}(rowops.{self._reducer(node)}({row}))")
        return lines

    def _row_output_lines(self, kinds: list[OperandKind]) -> list[str]:
        """Write the per-row and constant results, and copy the results that are elementwise operands."""
        region = self.region
        lines = []
        for i, v in enumerate(region.outputs):
            if self.level[v] in ("row", "const"):
                lines.append(f"out{i}[r] = {self._row_ref(v)}")
            elif self.level[v] == "elem" and v in region.inputs:
                lines.append(
                    f"for j in range(n):\n            out{i}[r, j] = {kinds[region.inputs.index(v)].read(self.names[v])}"
                )
        return lines

    def _node_phase(self, node: Node) -> int:
        out = node.outputs[0]
        if node.op.name in REDUCTIONS:
            return self.phase[node.inputs[0]]
        return self.phase[out]

    def _row_of(self, v: Value, kinds: list[OperandKind]) -> str:
        kind = kinds[self.region.inputs.index(v)]
        name = self.names[v]
        return {"full": f"{name}[r]", "periodic": f"{name}[r % {kind.period}]", "vec": name}[kind.kind]

    def _reducer(self, node: Node) -> str:
        kind = "f" if node.outputs[0].dtype.kind == "f" else "i"
        return {"reduce_sum": "row_sum", "reduce_max": "row_max", "reduce_min": "row_min"}[node.op.name] + "_" + kind

    def _expr(self, node: Node, ref: Callable[[Value], str] | None = None) -> str:
        """The expression computing the node's (scalar) result, ``ref(v)`` giving the text that reads
        operand ``v`` (default: its name)."""
        ref = ref or (lambda v: self.names[v])
        name = node.op.name
        args = [ref(v) for v in node.inputs]  # read first: an element loop emits an operand's load on its first read
        dtype = node.outputs[0].dtype
        text = _power_expr(node, args) if name == "pow" and _scalar_exponent(node) else None
        if text is None:
            text = _arithmetic_expr(name, args, dtype)
        if text is None:
            text = _select_expr(name, args, dtype)
        if text is None:
            text = _logical_expr(name, args, dtype, node.attrs)
        if text is None:
            raise NotImplementedError(f"no kernel code for {name}")
        return text


class _ElementLoop:
    """The lines of one phase's loop over the elements of a row, and how that loop reads values:
    a per-element operand is loaded (``e_<name>``) the first time the loop reads it."""

    def __init__(self, spec: KernelSpec, kinds: list[OperandKind], phase: int):
        self.spec = spec
        self.kinds = kinds
        self.phase = phase
        self.lines: list[str] = []
        self.loaded: set[Value] = set()

    def ref(self, v: Value) -> str:
        """The text reading ``v`` at element ``j``: an operand's element or row value, the scratch row
        of a value computed in an earlier phase, or the name of a value computed in this one."""
        spec = self.spec
        name = spec.names[v]
        if v in spec.region.inputs:
            return self._operand_ref(v, name)
        if spec.level[v] == "elem" and spec.phase[v] < self.phase:
            return f"t_{name}[j]"
        return name

    def _operand_ref(self, v: Value, name: str) -> str:
        """An operand: its per-row read ``s_<name>``, or its element ``e_<name>`` (loaded once)."""
        kind = self.kinds[self.spec.region.inputs.index(v)]
        if not kind.per_element:
            return f"s_{name}"
        if v not in self.loaded:
            self.lines.append(f"e_{name} = {kind.read(name)}")
            self.loaded.add(v)
        return f"e_{name}"


def _constant_text(value: np.ndarray) -> str:
    """A scalar constant as Python source (``float('inf')`` and ``float('nan')`` for non-finite floats)."""
    val = value.reshape(()).item()
    return f"float({str(val)!r})" if isinstance(val, float) and not math.isfinite(val) else repr(val)


def _arithmetic_expr(name: str, args: list[str], dtype: np.dtype) -> str | None:
    """Arithmetic and math functions, cast to the result dtype; None for other ops."""
    cast = _np_type(dtype)
    if name in _BINARY:
        return f"{cast}({args[0]} {_BINARY[name]} {args[1]})"
    if name in _FASTMATH:  # vectorizable versions (runtime/fastmath.py)
        return f"fm.{_FASTMATH[name]}{'32' if dtype == np.float32 else '64'}({args[0]})"
    if name in _FLOAT_FUNCS:
        return f"{cast}({_FLOAT_FUNCS[name]}({args[0]}))"
    if name == "neg":
        return f"{cast}(-{args[0]})"
    if name == "abs":
        return f"{cast}(abs({args[0]}))"
    if name == "sign":
        return f"{cast}(np.sign({args[0]}))"
    return None


def _scalar_exponent(node: Node) -> bool:
    """Whether numpy's float power loop sees this pow's exponent with stride 0, as one scalar for
    the whole loop: a 0-d exponent, or one of size 1 that is broadcast (the operand shapes differ
    from the result's, so numpy iterates them with stride 0); size-1 operands of the result's own
    shape are walked with their strides. It then takes the fast path below."""
    base, exponent = node.inputs
    out = node.outputs[0]
    if out.dtype.kind != "f" or exponent.type.size != 1:
        return False
    if exponent.ndim == 0:
        return True
    return not (exponent.shape == out.shape and (base.ndim == 0 or base.shape == out.shape))


def _power_expr(node: Node, args: list[str]) -> str:
    """numpy's float32/float64 power loop with a scalar exponent (see ``_scalar_exponent``): -1, 0,
    0.5, 1 and 2 are 1/x, 1, sqrt(x), x and x*x (sqrt(-0.0) is -0.0 and sqrt(-inf) nan, where pow
    gives 0.0 and inf), any other exponent pow."""
    x, e = args
    cast = _np_type(node.outputs[0].dtype)
    return (
        f"{cast}(1.0 / {x} if {e} == -1.0 else 1.0 if {e} == 0.0 else math.sqrt({x}) if {e} == 0.5 "
        f"else {x} if {e} == 1.0 else {x} * {x} if {e} == 2.0 else {x} ** {e})"
    )


def _select_expr(name: str, args: list[str], dtype: np.dtype) -> str | None:
    """maximum and minimum (NaN-propagating for floats, like numpy) and where; None for other ops."""
    if name == "maximum":
        a, b = args
        return f"({a} if ({a} != {a} or {a} > {b}) else {b})" if dtype.kind == "f" else f"max({a}, {b})"
    if name == "minimum":
        a, b = args
        return f"({a} if ({a} != {a} or {a} < {b}) else {b})" if dtype.kind == "f" else f"min({a}, {b})"
    if name == "where":
        return f"({args[1]} if {args[0]} else {args[2]})"
    return None


def _logical_expr(name: str, args: list[str], dtype: np.dtype, attrs: dict[str, Any]) -> str | None:
    """Comparisons, logical ops and dtype conversion; None for other ops."""
    if name == "compare":
        return f"({args[0]} {_COMPARE[attrs['direction']]} {args[1]})"
    if name == "logical_and":
        return f"({args[0]} and {args[1]})"
    if name == "logical_or":
        return f"({args[0]} or {args[1]})"
    if name == "logical_not":
        return f"(not {args[0]})"
    if name == "convert":
        if dtype.kind == "b":
            return f"({args[0]} != 0)"
        return f"{_np_type(dtype)}({args[0]})"
    return None


class CompiledKernel:
    """A compiled fused node for one set of operand shapes."""

    def __init__(self, node: Node, operand_shapes: list[tuple[int, ...]], alloc=np.empty):
        (region,) = node.regions
        space = _space_of(region)
        self.space = space
        self.rows = int(np.prod(space[:-1], dtype=np.int64)) if space else 1
        self.n = space[-1] if space else 1
        self.spec = KernelSpec(region, space)
        self.kinds = self.spec.operand_kinds()
        self.source = self.spec.source(self.kinds)
        self.func = load_kernel(self.source)
        self.out_types = [v.type for v in region.outputs]
        self.out_levels = [self.spec.level[v] for v in region.outputs]
        self.alloc = alloc
        # the call's per-operand and per-result work, decided once: a call of a small kernel
        # costs its numba dispatch (~0.5 us) plus a reshape per array
        self._operand_shapes = [_operand_shape(k, space, self.rows, self.n) for k in self.kinds]
        self._out_shapes = [
            (t.shape, t.dtype, (self.rows, self.n) if level == "elem" else (self.rows,))
            for t, level in zip(self.out_types, self.out_levels)
        ]
        self._may_split = self.rows >= 2 and self.rows * self.n >= PARALLEL_MIN_ELEMENTS
        # a kernel run in one call on the caller's thread is called through Python specialized to
        # its shapes (the executor calls ``call``); larger ones through ``__call__``, which splits rows
        self.call: Callable[..., tuple[np.ndarray, ...]] = (
            self if self._may_split else self._straight_call([v.type.shape for v in region.inputs])
        )

    def _straight_call(self, shapes: list[tuple[int, ...]]) -> Callable[..., tuple[np.ndarray, ...]]:
        """``__call__`` for operands of these (the region's) shapes as generated Python: the views
        and copies each operand needs are decided here, so a small kernel's call is its dispatch
        plus an allocation (about 0.5 us over the Numba call, against 1.2 for the general path)."""
        env: dict[str, Any] = {"asc": np.ascontiguousarray, "bcast": np.broadcast_to, "func": self.func}
        ins = [f"a{k}" for k in range(len(shapes))]
        lines = [f"def call({', '.join(ins)}):"]
        for k, (given, (shape, full)) in enumerate(zip(shapes, self._operand_shapes)):
            a = ins[k]
            if given != shape and full is not None and given != full:
                lines.append(f"    {a} = asc(bcast({a}, {full!r})).reshape({shape!r})")
                continue
            lines.append(f"    if not {a}.flags.c_contiguous: {a} = asc({a})")
            if given != shape:
                lines.append(f"    {a} = {a}.reshape({shape!r})")
        outs, views = [], []
        for k, (shape, dtype, view) in enumerate(self._out_shapes):
            env[f"d{k}"] = dtype
            lines.append(f"    o{k} = alloc({shape!r}, d{k})")
            outs.append(f"o{k}")
            views.append(f"o{k}" if shape == view else f"o{k}.reshape({view!r})")
        lines.append(f"    func({', '.join(ins + views)}, 0, {self.rows}, {self.n})")
        lines.append(f"    return ({', '.join(outs)},)")
        env["alloc"] = self.alloc
        exec(compile("\n".join(lines) + "\n", "<graphc kernel call>", "exec"), env)
        return env["call"]

    def __call__(self, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        operands = []
        for a, (shape, full) in zip(arrays, self._operand_shapes):
            if a.shape != shape:  # (an operand already in the kernel's shape needs no view)
                if full is not None and a.shape != full:
                    a = np.broadcast_to(a, full)  # materialized by ascontiguousarray below
                if not a.flags.c_contiguous:
                    a = np.ascontiguousarray(a)
                a = a.reshape(shape)
            elif not a.flags.c_contiguous:
                a = np.ascontiguousarray(a)
            operands.append(a)
        outs = []
        views = []
        for shape, dtype, view in self._out_shapes:
            buf = self.alloc(shape, dtype)
            outs.append(buf)
            views.append(buf if shape == view else buf.reshape(view))
        threads = kernel_threads() if self._may_split else 1
        if threads > 1 and self.rows >= threads:
            # rows split evenly; the caller runs the first share, pool threads the others (nogil)
            bounds = [self.rows * i // threads for i in range(threads + 1)]
            pool = kernel_pool(threads - 1)
            futures = [
                pool.submit(self.func, *operands, *views, bounds[i], bounds[i + 1], self.n) for i in range(1, threads)
            ]
            self.func(*operands, *views, bounds[0], bounds[1], self.n)
            for f in futures:
                f.result()
        else:
            self.func(*operands, *views, 0, self.rows, self.n)
        return tuple(outs)


# A kernel over at least this many elements splits its rows over the threads runtime/threads.py allows.
PARALLEL_MIN_ELEMENTS = 1 << 18


def _space_of(region: Region) -> tuple[int, ...]:
    """The iteration space: the largest elementwise shape in the region (or a reduction's input)."""
    shapes: list[tuple[int, ...]] = [()] + [o.shape for n in region.nodes for o in n.outputs]
    shapes += [n.inputs[0].shape for n in region.nodes if n.op.name in REDUCTIONS]
    return max(shapes, key=lambda s: (int(np.prod(s, dtype=np.int64)), len(s)))


_loaded: dict[str, Any] = {}
_lock = threading.Lock()


def load_kernel(source: str):
    """Compile the kernel in ``source``, its machine code loaded from the disk cache when a sealed
    entry for it is there. Only ``source`` itself is run: the copy written to the cache folder is
    for people (and tracebacks) and is never imported."""
    source_hash = hashlib.sha256(source.encode()).hexdigest()
    digest = source_hash[:20]
    with _lock:
        hit = _loaded.get(digest)
        if hit is not None:
            return hit
        folder = kernel_cache_dir()
        stem = f"k_{digest}"
        filename = os.path.join(folder, f"{stem}.py") if folder else f"<graphc kernel {stem}>"
        if folder:
            _write_readable_copy(filename, source)
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks
        name = f"graphc_kernel_{digest}"
        module = types.ModuleType(name)
        module.__file__ = filename
        sys.modules[name] = module  # Numba finds a cached kernel's globals by its module's name
        exec(compile(source, filename, "exec"), module.__dict__)
        if folder:
            attach_disk_cache(module.kernel, folder, stem, source_hash)
        _loaded[digest] = module.kernel
        return module.kernel


def _write_readable_copy(path: str, source: str) -> None:
    """Keep ``path`` holding ``source``: written when missing; replaced, with a warning, when it holds
    anything else (it is never run, so a planted file is only replaced)."""
    why = _copy_problem(path, source.encode())
    if why is None:
        return
    if why != "missing":
        warn_cache(path, f"kernel source copy {why}", "it was not run; rewritten")
        try:
            os.unlink(path)
        except OSError:
            pass
    try:
        atomic_write(path, source, mode=0o600)
    except OSError:
        pass  # the copy is for people; writing the compiled entry reports a folder that cannot be written


def _copy_problem(path: str, expected: bytes) -> str | None:
    """Why the file at ``path`` is not an intact copy of ``expected`` ("missing" when there is none)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return "is not a regular file"
        unsafe = unsafe_reason(st)
        if unsafe is not None:
            return unsafe
        if f.read() != expected:
            return "does not hold the kernel source it is named for"
    return None
