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
``nogil=True`` and cached on disk: the generated source is written to the kernel cache folder
(``GRAPHC_CACHE_DIR``, default ~/.cache/graphc) under a name derived from its text, so another
process that needs the same kernel loads the machine code Numba cached there.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.core.files import atomic_write, cache_dir
from graphc.core.ir import Node, Region, Value
from graphc.runtime import fastmath, rowops
from graphc.runtime.threads import kernel_pool, kernel_threads

# part of every kernel's text: Numba's disk cache does not see changes in the functions a kernel
# calls, so editing fastmath.py must give the kernels new cache entries
FASTMATH_VERSION = hashlib.sha256(
    open(fastmath.__file__, "rb").read() + open(rowops.__file__, "rb").read()
).hexdigest()[:12]

REDUCTIONS = ("reduce_sum", "reduce_max", "reduce_min")
_FASTMATH = {"exp": "exp", "tanh": "tanh", "log": "log", "log1p": "log1p_", "expm1": "expm1_"}
_FLOAT_FUNCS = {"sqrt": "math.sqrt", "sin": "math.sin", "cos": "math.cos"}  # (kernels are float32/64 only)
_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**"}
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def kernel_cache_dir() -> str:
    path = cache_dir("kernels")
    os.makedirs(path, exist_ok=True)
    return path


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


def prepare_operand(x: np.ndarray, kind: OperandKind, space: tuple[int, ...]) -> np.ndarray:
    """The array the kernel reads for an operand of this kind (a view when possible)."""
    n = space[-1] if space else 1
    rows = int(np.prod(space[:-1], dtype=np.int64)) if space else 1
    if kind.kind == "scalar":
        return np.ascontiguousarray(x).reshape(1)
    if kind.kind == "row":
        return np.ascontiguousarray(x).reshape(rows)
    if kind.kind == "vec":
        return np.ascontiguousarray(x).reshape(n)
    if kind.kind == "periodic":
        return np.ascontiguousarray(x).reshape(kind.period, n)
    if x.shape != tuple(space):
        x = np.broadcast_to(x, space)
    return np.ascontiguousarray(x).reshape(rows, n)


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
        row_inputs = set()
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
        return [operand_kind(v.shape, self.space, self.level[v] == "row") for v in self.region.inputs]

    # -- code generation -------------------------------------------------------------------------
    def source(self, kinds: list[OperandKind]) -> str:
        region = self.region
        outs = region.outputs
        lines = [
            f"# graphc fused kernel (fastmath {FASTMATH_VERSION})",
            "import math",
            "import numpy as np",
            "import numba",
            "from graphc.runtime import fastmath as fm",
            "from graphc.runtime import rowops",
            "",
            # numpy's error model: no zero-division checks (they stop vectorization; numpy gives inf)
            '@numba.njit(nogil=True, cache=True, error_model="numpy")',
            f"def kernel({', '.join([f'in{i}' for i in range(len(region.inputs))] + [f'out{i}' for i in range(len(outs))])}, r0, r1, n):",
        ]
        body: list[str] = []
        # scalar constants, hoisted
        for node in region.nodes:
            if node.op.name == "constant":
                val = node.attrs["value"].reshape(()).item()
                text = f"float({str(val)!r})" if isinstance(val, float) and not math.isfinite(val) else repr(val)
                body.append(f"{self.names[node.outputs[0]]} = {_np_type(node.outputs[0].dtype)}({text})")
        # scratch rows for elementwise values used in a later phase than their own
        used_later: set[Value] = set()
        for node in region.nodes:
            p = self._node_phase(node)
            for v in node.inputs:
                if self.level.get(v) == "elem" and v not in region.inputs and self.phase[v] < p:
                    used_later.add(v)
            if node.op.name in REDUCTIONS and node.inputs[0] not in region.inputs:
                used_later.add(node.inputs[0])  # reduced from its row buffer after the loop
        for v in sorted(used_later, key=lambda v: self.names[v]):
            body.append(f"t_{self.names[v]} = np.empty(n, dtype={_np_type(v.dtype)})")
        body.append("for r in range(r0, r1):")  # a range of rows: threads split the rows
        inner: list[str] = []
        for v, kind in zip(region.inputs, kinds):
            if not kind.per_element:  # one value per row (or a scalar): read once per row
                inner.append(f"s_{self.names[v]} = {kind.read(self.names[v])}")

        def row_ref(v: Value) -> str:
            return f"s_{self.names[v]}" if v in region.inputs else self.names[v]

        for p in range(self.n_phases):
            # row ops available before this phase
            for node in region.nodes:
                out = node.outputs[0]
                if node.op.name not in REDUCTIONS and self.level[out] == "row" and self.phase[out] == p:
                    inner.append(f"{self.names[out]} = {self._expr(node, row_ref)}")
            reductions = [n for n in region.nodes if n.op.name in REDUCTIONS and self.phase[n.inputs[0]] == p]
            elems = [
                n
                for n in region.nodes
                if self.level[n.outputs[0]] == "elem" and self.phase[n.outputs[0]] == p and n.op.name != "constant"
            ]
            needs_loop = elems or any(
                self.level[v] == "elem" and self.phase[v] == p and v not in region.inputs for v in outs
            )
            if not needs_loop and not reductions:
                continue
            if needs_loop:
                inner.append("for j in range(n):")
            loop: list[str] = []
            loaded: set[Value] = set()

            def elem_ref(v: Value, p=p, loop=loop, loaded=loaded) -> str:
                name = self.names[v]
                if v in region.inputs:
                    kind = kinds[region.inputs.index(v)]
                    if kind.per_element and v not in loaded:
                        loop.append(f"e_{name} = {kind.read(name)}")
                        loaded.add(v)
                    return f"e_{name}" if kind.per_element else f"s_{name}"
                if self.level[v] == "elem" and self.phase[v] < p:
                    return f"t_{name}[j]"
                return name

            for node in elems:
                out = node.outputs[0]
                loop.append(f"{self.names[out]} = {self._expr(node, elem_ref)}")
                if out in used_later:
                    loop.append(f"t_{self.names[out]}[j] = {self.names[out]}")
            for i, v in enumerate(outs):
                if self.level[v] == "elem" and self.phase[v] == p and v not in region.inputs:
                    loop.append(f"out{i}[r, j] = {elem_ref(v)}")
            inner.extend("    " + s for s in loop)
            for node in reductions:  # reduce the row (vectorized, runtime/rowops.py)
                out, x = node.outputs[0], node.inputs[0]
                row = self._row_of(x, kinds) if x in region.inputs else f"t_{self.names[x]}"
                inner.append(f"{self.names[out]} = {_np_type(out.dtype)}(rowops.{self._reducer(node)}({row}))")
        for node in region.nodes:  # row ops after the last reduction
            out = node.outputs[0]
            if node.op.name not in REDUCTIONS and self.level[out] == "row" and self.phase[out] >= self.n_phases:
                inner.append(f"{self.names[out]} = {self._expr(node, row_ref)}")
        for i, v in enumerate(outs):
            if self.level[v] in ("row", "const"):
                inner.append(f"out{i}[r] = {row_ref(v)}")
            elif self.level[v] == "elem" and v in region.inputs:
                inner.append(
                    f"for j in range(n):\n            out{i}[r, j] = {kinds[region.inputs.index(v)].read(self.names[v])}"
                )
        body.extend("    " + s for s in inner)
        lines.extend("    " + s for s in body)
        return "\n".join(lines) + "\n"

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

    def _expr(self, node: Node, ref=None) -> str:
        ref = ref or (lambda v: self.names[v])
        name = node.op.name
        args = [ref(v) for v in node.inputs]
        out = node.outputs[0]
        cast = _np_type(out.dtype)
        if name in _BINARY:
            return f"{cast}({args[0]} {_BINARY[name]} {args[1]})"
        if name == "compare":
            return f"({args[0]} {_COMPARE[node.attrs['direction']]} {args[1]})"
        if name in _FASTMATH:  # vectorizable versions (runtime/fastmath.py)
            return f"fm.{_FASTMATH[name]}{'32' if out.dtype == np.float32 else '64'}({args[0]})"
        if name in _FLOAT_FUNCS:
            return f"{cast}({_FLOAT_FUNCS[name]}({args[0]}))"
        if name == "neg":
            return f"{cast}(-{args[0]})"
        if name == "abs":
            return f"{cast}(abs({args[0]}))"
        if name == "sign":
            return f"{cast}(np.sign({args[0]}))"
        if name == "maximum":
            a, b = args
            return f"({a} if ({a} != {a} or {a} > {b}) else {b})" if out.dtype.kind == "f" else f"max({a}, {b})"
        if name == "minimum":
            a, b = args
            return f"({a} if ({a} != {a} or {a} < {b}) else {b})" if out.dtype.kind == "f" else f"min({a}, {b})"
        if name == "where":
            return f"({args[1]} if {args[0]} else {args[2]})"
        if name == "logical_and":
            return f"({args[0]} and {args[1]})"
        if name == "logical_or":
            return f"({args[0]} or {args[1]})"
        if name == "logical_not":
            return f"(not {args[0]})"
        if name == "convert":
            if out.dtype.kind == "b":
                return f"({args[0]} != 0)"
            return f"{cast}({args[0]})"
        raise NotImplementedError(f"no kernel code for {name}")


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

    def __call__(self, *arrays: np.ndarray) -> list[np.ndarray]:
        operands = [prepare_operand(a, k, self.space) for a, k in zip(arrays, self.kinds)]
        outs = []
        views = []
        for t, level in zip(self.out_types, self.out_levels):
            buf = self.alloc(t.shape, t.dtype)
            outs.append(buf)
            views.append(buf.reshape(self.rows, self.n) if level == "elem" else buf.reshape(self.rows))
        threads = kernel_threads()
        if threads > 1 and self.rows >= threads and self.rows * self.n >= PARALLEL_MIN_ELEMENTS:
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
    shapes = [()] + [o.shape for n in region.nodes for o in n.outputs]
    shapes += [n.inputs[0].shape for n in region.nodes if n.op.name in REDUCTIONS]
    return tuple(max(shapes, key=lambda s: (int(np.prod(s, dtype=np.int64)), len(s))))


_loaded: dict[str, Any] = {}
_lock = threading.Lock()


def load_kernel(source: str):
    """Compile (or load from the disk cache) the kernel in ``source``."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:20]
    with _lock:
        hit = _loaded.get(digest)
        if hit is not None:
            return hit
        path = os.path.join(kernel_cache_dir(), f"k_{digest}.py")
        if not os.path.exists(path):
            atomic_write(path, source)
        name = f"graphc_kernel_{digest}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        _loaded[digest] = module.kernel
        return module.kernel
