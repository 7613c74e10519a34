"""Automatic differentiation as graph transforms: reverse mode (``vjp``, ``grad``,
``value_and_grad``) and forward mode (``jvp``).

How it works. Everything runs inside a trace. Differentiating ``fn`` at traced ``primals`` first
gives each primal a fresh alias (so closures over the same value are constants, not inputs), runs
``fn`` (recording its nodes in the current trace: the forward part), then walks that stretch of
the trace:

* reverse mode walks it backwards, calling each op's ``vjp`` rule with the cotangents of the
  node's outputs; the rules are numpy code on traced arrays, so they emit nodes (tagged
  ``part=backward`` and carrying the forward node's source line) into the same trace;
* forward mode walks it forwards, calling each op's ``jvp`` rule with the input tangents.

Because the rules emit ordinary nodes, transforms compose: ``grad(grad(f))`` differentiates the
backward nodes of the inner ``grad``, and a training step that calls ``grad`` traces to one
graph. Called on numpy arrays (no trace active), the API traces the computation and evaluates it
with the reference interpreter, returning numpy results.

Only floating-point values are differentiable; integer and bool inputs get no gradient (None).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from graphc.core import dtypes
from graphc.core.errors import TraceError
from graphc.core.ir import Node, Region, Value
from graphc.core.pytree import flatten, flatten_as, unflatten
from graphc.frontend import control
from graphc.frontend import random as traced_random
from graphc.frontend.autograph_runtime import convert
from graphc.frontend.entry import trace
from graphc.frontend.tracer import (
    TraceContext,
    Tracer,
    bind,
    bind_multi,
    current_context,
    emit_block,
    lift,
    user_location,
)
from graphc.interpreter import evaluate


class RuleContext:
    """What a vjp/jvp rule sees of one node (the interface is graphc/ops/context.py): its inputs
    and outputs as traced arrays, its attributes, which inputs need a cotangent, and helpers that
    emit nodes, run regions and differentiate functions in the running trace."""

    def __init__(self, ctx: TraceContext, node: Node, needs: Sequence[bool] = ()):
        self.ctx = ctx
        self.node = node
        self.attrs = node.attrs
        self.inputs = [Tracer(ctx, v) for v in node.inputs]
        self.outputs = [Tracer(ctx, v) for v in node.outputs]
        self.needs = list(needs)

    def bind(self, opname: str, *xs: Tracer, **attrs: Any) -> Tracer:
        return bind(opname, *xs, **attrs)

    def bind_any(self, opname: str, *xs: Tracer, **attrs: Any):
        outs = bind_multi(opname, *xs, **attrs)
        return outs[0] if len(outs) == 1 else outs

    def zeros(self, like: Tracer | Value) -> Tracer:
        return cast(Tracer, np.broadcast_to(lift(np.zeros((), like.dtype)), like.shape))

    def instantiate(self, t: Tracer | None, like: Tracer) -> Tracer:
        """Materialize a symbolic zero (None) as zeros shaped like ``like``."""
        return self.zeros(like) if t is None else t

    def unbroadcast(self, g: Tracer, shape: tuple[int, ...]) -> Tracer:
        """Sum ``g`` over the dims that broadcasting added or stretched, giving ``shape``."""
        if g.shape == tuple(shape):
            return g
        lead = g.ndim - len(shape)
        axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
        summed = self.bind("reduce_sum", g, axes=axes, keepdims=False) if axes else g
        return summed.reshape(shape) if summed.shape != tuple(shape) else summed

    def broadcast_to_output(self, t: Tracer | None) -> Tracer | None:
        (y,) = self.outputs
        return t if t is None or t.shape == y.shape else cast(Tracer, np.broadcast_to(t, y.shape))

    def constant(self, value: np.ndarray) -> Tracer:
        return lift(value)

    def inline(self, region: Region, args: Sequence[Tracer]) -> list[Tracer]:
        # into the trace running now: a branch being traced is a child of the node's trace
        ctx = current_context()
        assert ctx is not None  # rules run inside a trace
        return emit_block(ctx, region.inputs, region.nodes, region.outputs, list(args))

    def vjp(self, fn: Callable, *primals: Any) -> tuple[Any, Callable]:
        return vjp(fn, *primals)

    def jvp(self, fn: Callable, primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[Any, Any]:
        return jvp(fn, primals, tangents)

    def cond(self, pred: Tracer, true_fn: Callable, false_fn: Callable, *operands: Any) -> Any:
        return control.cond(pred, true_fn, false_fn, *operands)

    def while_loop(self, cond_fn: Callable, body_fn: Callable, init: Sequence[Any]) -> list[Tracer]:
        return control.while_loop(cond_fn, body_fn, init)

    def fori_loop(self, lower: Any, upper: Any, body_fn: Callable, init: Sequence[Any], step: int = 1) -> list[Tracer]:
        return control.fori_loop(lower, upper, body_fn, init, step=step)


_FLOATS = frozenset(dt for dt in dtypes.SHORT_NAMES if dtypes.is_float(dt))  # (every value's dtype is one of these)


def differentiable(v: Value | Tracer) -> bool:
    return v.dtype in _FLOATS  # (dtypes.is_float of a canonical dtype, asked per value of the forward)


# --- the two walks ---------------------------------------------------------------------------------


def backward(
    ctx: TraceContext, nodes: list[Node], wrt: list[Value], outputs: list[Value], cotangents: list[Tracer | None]
) -> list[Tracer | None]:
    """Reverse-mode sweep over ``nodes`` (a stretch of ``ctx``'s trace): the cotangents of ``wrt``
    given those of ``outputs``. Emits the backward nodes into ``ctx``."""
    active = set(v for v in wrt if differentiable(v))
    for node in nodes:
        if not active.isdisjoint(node.inputs):
            active.update(o for o in node.outputs if differentiable(o))
    cts: dict[Value, Tracer] = {}
    for v, ct in zip(outputs, cotangents):
        if ct is not None and v in active:
            cts[v] = cts[v] + ct if v in cts else ct
    for node in reversed(nodes):
        if cts.keys().isdisjoint(node.outputs):
            continue
        needs = [v in active for v in node.inputs]
        if True not in needs:
            continue
        gs = [cts.pop(o, None) for o in node.outputs]
        if node.op.vjp is None:
            raise TraceError(f"{node.op.name} has no VJP rule", node.loc)
        saved = ctx.part, ctx.loc_override  # ctx.annotate(part="backward", loc=node.loc), inline: per node
        ctx.part, ctx.loc_override = "backward", node.loc or ctx.loc_override
        try:
            grads = node.op.vjp(RuleContext(ctx, node, needs), *gs)
            for v, g, need in zip(node.inputs, grads, needs):
                if need and g is not None:
                    if g.shape != v.shape or g.dtype != v.dtype:
                        raise AssertionError(f"vjp of {node.op.name} gave {g.dtype}{g.shape} for {v.type}")
                    cts[v] = cts[v] + g if v in cts else g
        finally:
            ctx.part, ctx.loc_override = saved
    return [cts.get(v) for v in wrt]


def forward(
    ctx: TraceContext,
    nodes: list[Node],
    wrt: list[Value],
    tangents: list[Tracer | None],
    outputs: list[Value | None],
) -> list[Tracer | None]:
    """Forward-mode sweep over ``nodes``: the tangents of ``outputs`` given those of ``wrt`` (None
    for an output that is not a traced value: it has no tangent)."""
    tans: dict[Value, Tracer] = {v: t for v, t in zip(wrt, tangents) if t is not None and differentiable(v)}
    for node in nodes:
        ts = [tans.get(v) for v in node.inputs]
        if all(t is None for t in ts):
            continue
        if node.op.jvp is None:
            raise TraceError(f"{node.op.name} has no JVP rule", node.loc)
        with ctx.annotate(loc=node.loc):
            out = node.op.jvp(RuleContext(ctx, node), *ts)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for v, t in zip(node.outputs, outs):
            if t is not None and differentiable(v):
                if t.shape != v.shape or t.dtype != v.dtype:
                    raise AssertionError(f"jvp of {node.op.name} gave {t.dtype}{t.shape} for {v.type}")
                tans[v] = t
    return [None if v is None else tans.get(v) for v in outputs]


# --- helpers for the public API ---------------------------------------------------------------------


def _as_primal(x: Any) -> Any:
    """Python floats (also inside pytrees) become float64 arrays so that they can be
    differentiated, like JAX; other leaves are unchanged."""
    if isinstance(x, float):
        return np.float64(x)
    if isinstance(x, dict):
        return {k: _as_primal(v) for k, v in x.items()}
    if type(x) in (list, tuple):
        return type(x)(_as_primal(v) for v in x)
    return x


def _alias(x: Any) -> Any:
    """A fresh traced value for a primal leaf (integers and static leaves pass through)."""
    if isinstance(x, (Tracer, np.ndarray, np.generic)):
        t = lift(x)
        return bind("convert", t, dtype=t.dtype) if differentiable(t) else t
    return x


_interpreted = 0  # calls of the transforms outside a trace (eager mode), for interpreted_calls()


def interpreted_calls() -> int:
    """How many times grad / value_and_grad / vjp / jvp were called on numpy arrays (outside a
    trace) in this process: each traced its function and ran it on graphc's reference interpreter.
    A benchmark that calls a model directly reads it to name its baseline honestly: a training
    step that calls graphc.value_and_grad is graphc's interpreter, not numpy."""
    return _interpreted


def _trace_and_run(fn: Callable, *args: Any) -> Any:
    """Eager mode: trace ``fn`` on ``args`` and evaluate it with the reference interpreter (a
    Generator argument runs on its state and advances, as in graphc.jit)."""
    global _interpreted
    _interpreted += 1
    args, _, generators = traced_random.bind_generators(args, {}, ambient=False)
    graph = trace(fn, *args)
    out = evaluate(graph, *args)
    traced_random.advance_generators(graph, args, {}, generators)
    return out


def _argnums_tuple(argnums: int | Sequence[int], nargs: int) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    for i in nums:
        if not -nargs <= i < nargs:
            raise TypeError(f"argnums {i} is out of range for a call with {nargs} positional arguments")
    return tuple(i % nargs for i in nums)


class _Recorded:
    """A function run under the current trace, with its primal aliases and output values."""

    def __init__(self, fn: Callable, primals: tuple, kwargs: dict | None = None):
        ctx = current_context()
        assert ctx is not None
        self.ctx = ctx
        leaves, self.in_tree = flatten(tuple(primals), is_leaf=lambda v: isinstance(v, Tracer))
        self.aliases = [_alias(leaf) for leaf in leaves]
        # the values differentiated with respect to: the aliases as they are now, before ``fn`` runs
        # (fn may write into its arguments in place, which rebinds the alias objects)
        self._wrt = [a._value if isinstance(a, Tracer) else None for a in self.aliases]
        start = len(ctx.nodes)
        out = convert(fn)(*unflatten(self.in_tree, self.aliases), **(kwargs or {}))
        self.nodes = ctx.nodes[start:]
        out_leaves, self.out_tree = flatten(out, is_leaf=lambda v: isinstance(v, Tracer))
        self.out_leaves = [lift(o) if isinstance(o, (Tracer, np.ndarray, np.generic)) else o for o in out_leaves]
        self.out = unflatten(self.out_tree, self.out_leaves)

    def wrt_values(self) -> list[Value | None]:
        return list(self._wrt)

    def pullback(self, cotangent: Any) -> tuple:
        cotangent = _as_primal(cotangent)
        if current_context() is not self.ctx:
            raise TraceError("a vjp function must be called inside the trace that created it", user_location())
        try:
            ct_leaves = flatten_as(cotangent, self.out_tree, path="cotangent")
        except ValueError as exc:
            raise TraceError(
                f"vjp: the cotangent does not match the function's output: {exc}", user_location()
            ) from None
        cts = []
        for out, ct in zip(self.out_leaves, ct_leaves):
            ct = lift(ct)
            if ct.shape != out.shape:
                raise TraceError(
                    f"vjp: cotangent of shape {ct.shape} for an output of shape {out.shape}", user_location()
                )
            cts.append(ct.astype(out.dtype) if ct.dtype != out.dtype else ct)
        wrt = self.wrt_values()
        grads = backward(
            self.ctx, self.nodes, [w for w in wrt if w is not None], [o._value for o in self.out_leaves], cts
        )
        it = iter(grads)
        leaves: list[Any] = []
        for w in wrt:
            if w is None or not differentiable(w):  # static or integer/bool leaf: no gradient
                leaves.append(None)
                if w is not None:
                    next(it)
                continue
            g = next(it)
            leaves.append(g if g is not None else np.broadcast_to(lift(np.zeros((), w.dtype)), w.shape))
        return tuple(unflatten(self.in_tree, leaves))


# --- public API -------------------------------------------------------------------------------------


def vjp(fn: Callable, *primals: Any) -> tuple[Any, Callable]:
    """``(fn(*primals), vjp_fn)`` where ``vjp_fn(cotangent)`` returns one cotangent pytree per
    primal (None for integer/bool leaves)."""
    primals = tuple(_as_primal(p) for p in primals)
    if current_context() is None:
        out = fn(*primals)

        def vjp_fn_eager(cotangent):
            return _trace_and_run(lambda p, c: vjp(fn, *p)[1](c), primals, _as_primal(cotangent))

        return out, vjp_fn_eager
    rec = _Recorded(fn, primals)
    return rec.out, rec.pullback


def jvp(fn: Callable, primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[Any, Any]:
    """``(fn(*primals), J tangents)``: forward mode. ``tangents`` has the structure of ``primals``."""
    primals = tuple(_as_primal(p) for p in primals)
    tangents = tuple(_as_primal(t) for t in tangents)
    if len(primals) != len(tangents):
        raise TypeError(f"jvp: {len(primals)} primals but {len(tangents)} tangents")
    if current_context() is None:
        return _trace_and_run(lambda p, t: jvp(fn, p, t), primals, tangents)
    rec = _Recorded(fn, primals)
    try:
        tan_leaves = flatten_as(tangents, rec.in_tree, path="tangents")
    except ValueError as exc:
        raise TraceError(f"jvp: tangents must have the structure of the primals: {exc}", user_location()) from None
    wrt, tans = [], []
    for w, t in zip(rec.wrt_values(), tan_leaves):
        if w is not None and t is not None:
            wrt.append(w)
            tans.append(lift(t).astype(w.dtype))
    outs = forward(rec.ctx, rec.nodes, wrt, tans, [o._value if isinstance(o, Tracer) else None for o in rec.out_leaves])
    out_tans = [
        t
        if t is not None
        else (np.broadcast_to(lift(np.zeros((), o.dtype)), o.shape) if isinstance(o, Tracer) else None)
        for t, o in zip(outs, rec.out_leaves)
    ]
    return rec.out, unflatten(rec.out_tree, out_tans)


def value_and_grad(fn: Callable, argnums: int | Sequence[int] = 0) -> Callable:
    """``f(*args) -> (fn(*args), gradient)``: the gradient of a scalar float ``fn`` with respect to
    positional argument(s) ``argnums``, in the same pytree structure as those arguments (a tuple of
    them when ``argnums`` is a tuple)."""

    def value_and_grad_fn(*args, **kwargs):
        nums = _argnums_tuple(argnums, len(args))
        args = tuple(_as_primal(a) if i in nums else a for i, a in enumerate(args))
        if current_context() is None:
            return _trace_and_run(lambda a, k: value_and_grad(fn, argnums)(*a, **k), args, kwargs)

        def restricted(*diff_args):
            full = list(args)
            for i, a in zip(nums, diff_args):
                full[i] = a
            return convert(fn)(*full, **kwargs)

        rec = _Recorded(restricted, tuple(args[i] for i in nums))
        out = rec.out
        if not (
            isinstance(out, (Tracer, np.ndarray, np.generic))
            and np.shape(out) == ()
            and dtypes.is_float(np.asarray(out).dtype)
            if not isinstance(out, Tracer)
            else out.shape == () and dtypes.is_float(out.dtype)
        ):
            raise TraceError(
                f"grad needs a function returning a float scalar; {getattr(fn, '__name__', 'fn')} returned "
                f"{_describe(out)}",
                user_location(),
            )
        out_t = lift(out)
        grads = rec.pullback(np.ones((), out_t.dtype))
        return out_t, grads if isinstance(argnums, (tuple, list)) else grads[0]

    value_and_grad_fn.__name__ = f"value_and_grad_{getattr(fn, '__name__', 'fn')}"
    return value_and_grad_fn


def grad(fn: Callable, argnums: int | Sequence[int] = 0) -> Callable:
    """The gradient function of a scalar float ``fn`` (see ``value_and_grad``)."""
    vg = value_and_grad(fn, argnums)

    def grad_fn(*args, **kwargs):
        if current_context() is None:
            return _trace_and_run(lambda a, k: vg(*a, **k)[1], tuple(_as_primal(a) for a in args), kwargs)
        return vg(*args, **kwargs)[1]

    grad_fn.__name__ = f"grad_{getattr(fn, '__name__', 'fn')}"
    return grad_fn


def _describe(x: Any) -> str:
    if isinstance(x, Tracer):
        return f"an array {x._value.type}"
    if isinstance(x, (np.ndarray, np.generic)):
        return f"an array of shape {np.shape(x)} and dtype {np.asarray(x).dtype}"
    return f"a {type(x).__name__}"
