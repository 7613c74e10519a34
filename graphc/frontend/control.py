"""Graph control flow from Python functions: ``cond``, ``while_loop``, ``fori_loop``.

Each branch or loop body is traced into a Region by a child TraceContext. Values the function
closes over are captured by the child context and passed to the op as extra operands, so regions
stay isolated. These functions are what the source transform (graphc/frontend/autograph.py)
calls for ``if``/``while``/``for`` on traced values; graphc.cond, graphc.while_loop and
graphc.fori_loop (frontend/entry.py) call them after transforming the user's functions. The
autodiff rules of the control-flow ops are with the ops (graphc/ops/control.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from graphc.core.errors import TraceError
from graphc.core.ir import Region, TensorType, Value
from graphc.core.pytree import TreeDef, flatten, unflatten
from graphc.frontend.tracer import (
    TraceContext,
    Tracer,
    context_stack,
    current_context,
    lift,
    rebind,
    restore,
    user_location,
)

# how the source transform marks a variable that has no value yet in a branch (autograph_runtime.py)
UNDEFINED_MARK = "<graphc: undefined variable>"


@dataclass
class Traced:
    """A traced region before it becomes a Region (outputs may still be added): its context, its
    output values in order, the raw result (a pytree whose array leaves are the first outputs),
    and the arrays from outside it that it wrote in place (not carried), each with its final
    value in the region (see TraceContext.log_write)."""

    ctx: TraceContext
    outputs: list[Tracer]
    result: Any
    written: dict[int, tuple[Tracer, Tracer]] = field(default_factory=dict)

    def region(self) -> Region:
        return Region(list(self.ctx.inputs), list(self.ctx.nodes), [o._value for o in self.outputs])

    def captured(self) -> list[Tracer]:
        return list(self.ctx.captured_outer)

    def add_output_for(self, array: Tracer) -> None:
        """Output ``array``'s value at the region's end: its final value if the region wrote it, else
        the value it has outside (captured)."""
        hit = self.written.get(id(array))
        self.outputs.append(hit[1] if hit is not None else self.ctx.local(array))


def trace(
    fn: Callable,
    in_types: Sequence[TensorType],
    name: str = "region",
    weak: Sequence[bool] = (),
    carried: Sequence[Tracer] = (),
    output_carried: bool = True,
) -> Traced:
    """Trace ``fn(*args)`` with one traced argument per type, in a child of the current trace
    (``fn`` as it is: callers transform user functions first, see frontend/entry.py).

    ``carried`` are arrays from outside (not views) that a loop carries: while tracing, each holds a
    region input of its own (after the arguments), and its final value is output after ``fn``'s
    (if ``output_carried``). Every other array from outside that ``fn`` writes in place is in
    ``written``. Afterwards all of them hold their values from before again."""
    parent = current_context()
    if parent is None:
        raise RuntimeError("trace_region needs an active trace")
    ctx = TraceContext(name, parent)
    args = [Tracer(ctx, Value(t, None, 0, None)) for t in in_types]
    for a, w in zip(args, weak):
        a._weak = w
    slots = [Value(c._val.type, None, 0, None) for c in carried]
    for a in args:
        a._born = ctx
    ctx.inputs.extend(a._value for a in args)
    ctx.inputs.extend(slots)
    stack = context_stack()
    stack.append(ctx)
    try:
        for array, slot in zip(carried, slots):
            ctx.written[id(array)] = (array, array._c, array._val)  # (given back at the end)
            restore(array, ctx, slot)
        result = fn(*args)
        leaves, treedef = flatten(result, is_leaf=lambda x: isinstance(x, Tracer))
        outs = [lift(x) if isinstance(x, (Tracer, np.ndarray, np.generic)) else x for x in leaves]
        outs = [_snapshot(ctx.local(o)) if isinstance(o, Tracer) else o for o in outs]  # (before the restore)
        outputs = [o for o in outs if isinstance(o, Tracer)]
        if output_carried:
            outputs += [_snapshot(ctx.local(array)) for array in carried]
        carried_ids = {id(a) for a in carried}
        written = {
            key: (array, _snapshot(ctx.local(array)))
            for key, (array, _, _) in ctx.written.items()
            if key not in carried_ids
        }
    finally:
        stack.pop()
        for array, home, value in ctx.written.values():
            restore(array, home, value)
    return Traced(ctx, outputs, unflatten(treedef, outs), written)


def _snapshot(t: Tracer) -> Tracer:
    return Tracer(t._ctx, t._value, t._weak)


def trace_region(
    fn: Callable, in_types: Sequence[TensorType], name: str = "region", weak: Sequence[bool] = ()
) -> tuple[Region, list[Tracer], Any]:
    """``trace`` for a region that must not write into arrays from outside it in place: the region,
    the outer values it captured (operands to append), and the raw result."""
    traced = trace(fn, in_types, name, weak)
    _no_writes(traced, name)
    return traced.region(), traced.captured(), traced.result


def _no_writes(traced: Traced, what: str) -> None:
    if traced.written:
        raise TraceError(
            f"the {what} function of a traced loop or branch writes in place into an array from outside it; "
            "graphc supports that in if/else branches and loop bodies, not here",
            user_location(),
        )


def _with_inputs(region: Region, extra: list[Value]) -> Region:
    return Region(region.inputs + extra, region.nodes, region.outputs)


def _unify_captures(
    regions: list[Region], captures: list[list[Tracer]], n_explicit: int
) -> tuple[list[Region], list[Tracer]]:
    """Give every region an input for every value any of them captured (same order)."""
    union: list[Tracer] = []
    seen: dict[Value, int] = {}
    for caps in captures:
        for c in caps:
            if c._value not in seen:
                seen[c._value] = len(union)
                union.append(c)
    fixed = []
    for region, caps in zip(regions, captures):
        own = {c._value: region.inputs[n_explicit + k] for k, c in enumerate(caps)}
        inputs = region.inputs[:n_explicit] + [own.get(u._value) or Value(u._value.type) for u in union]
        fixed.append(Region(inputs, region.nodes, region.outputs))
    return fixed, union


def _static_structure(result: Any) -> tuple[TreeDef, list[Any]]:
    leaves, treedef = flatten(result, is_leaf=lambda x: isinstance(x, Tracer))
    return treedef, leaves


def _describe_types(ts) -> str:
    return "(" + ", ".join(map(str, ts)) + ")"


def as_predicate(pred: Any, what: str) -> Tracer:
    """numpy's truth value of a traced array: a single element, nonzero."""
    p = lift(pred)
    if p.size != 1:
        raise TraceError(
            f"the truth value of an array with more than one element is ambiguous ({what} on an array of shape {p.shape}); "
            "use .any() or .all()",
            user_location(),
        )
    if p.ndim:
        p = p.reshape(())
    if p.dtype.kind != "b":
        p = p != 0
    return p


def cond(pred: Any, true_fn: Callable, false_fn: Callable, *operands: Any, names: Sequence[str] | None = None) -> Any:
    """``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``, as one graph op when
    ``pred`` is traced (both branches are traced; their results must agree in structure, shape
    and dtype). Static predicates just call the chosen branch."""
    if not isinstance(pred, Tracer):  # static (or eager): plain Python
        return true_fn(*operands) if pred else false_fn(*operands)
    p = as_predicate(pred, "if")
    ops = [lift(x) for x in operands]
    in_types = [o._value.type for o in ops]
    t_true, t_false = trace(true_fn, in_types, "true"), trace(false_fn, in_types, "false")
    targets = _weak_targets(t_true.result, t_false.result)
    if targets:  # a Python number in one branch, an array in the other: retrace with the number as that array
        t_true = trace(_promoting(true_fn, targets), in_types, "true")
        t_false = trace(_promoting(false_fn, targets), in_types, "false")
    # arrays from outside written in place in either branch: one more output each, then rebound
    written = list({**t_true.written, **t_false.written}.values())
    for traced in (t_true, t_false):
        for array, _ in written:
            traced.add_output_for(array)
    r_true, c_true, res_true = t_true.region(), t_true.captured(), t_true.result
    r_false, c_false, res_false = t_false.region(), t_false.captured(), t_false.result
    t_tree, t_leaves = _static_structure(res_true)
    f_tree, f_leaves = _static_structure(res_false)
    if names is not None and not same_tree(t_tree, f_tree):
        _explain_branch_mismatch(res_true, res_false, names)
    if not same_tree(t_tree, f_tree):
        raise TraceError(
            f"the branches of an if on a traced value give different structures: {t_tree} and {f_tree} "
            "(both branches must produce the same variables, with equal static values)",
            user_location(),
        )
    if r_true.out_types != r_false.out_types:
        if names is not None:
            _explain_branch_mismatch(res_true, res_false, names)
        raise TraceError(
            "the branches of an if on a traced value give arrays of different shape or dtype: "
            f"{_describe_types(r_true.out_types)} and {_describe_types(r_false.out_types)}",
            user_location(),
        )
    (r_true, r_false), captured = _unify_captures([r_true, r_false], [c_true, c_false], len(ops))
    outs = list(bind_multi_regions("cond", [p, *ops, *captured], {}, (r_true, r_false)))
    for (array, _), new in zip(written, outs[len(outs) - len(written) :]):
        rebind(array, new)
    outs = outs[: len(outs) - len(written)]
    t_arrays = [x for x in t_leaves if isinstance(x, Tracer)]
    f_arrays = [x for x in f_leaves if isinstance(x, Tracer)]
    for k, (a, b) in enumerate(zip(t_arrays, f_arrays)):
        outs[k]._weak = a._weak and b._weak
    it = iter(outs)
    return unflatten(t_tree, [next(it) if isinstance(x, Tracer) else x for x in t_leaves])


def _weak_targets(res_true: Any, res_false: Any) -> dict[int, tuple[TensorType, bool]]:
    """Top-level result positions where the branches give a Python number and an array, or two
    different Python numbers: the numbers become arrays (of the array's type, or weak arrays of
    the numbers' common type), as numpy would let either value flow on."""
    if not (isinstance(res_true, (list, tuple)) and isinstance(res_false, (list, tuple))) or len(res_true) != len(
        res_false
    ):
        return {}
    targets = {}
    for i, (a, b) in enumerate(zip(res_true, res_false)):
        for x, y in ((a, b), (b, a)):
            if isinstance(x, Tracer) and isinstance(y, (bool, int, float)):
                if isinstance(y, bool) and x.dtype.kind != "b":
                    continue
                targets[i] = (x._value.type, x._weak)
        if (
            isinstance(a, (bool, int, float))
            and isinstance(b, (bool, int, float))
            and not isinstance(a, Tracer)
            and not isinstance(b, Tracer)
            and not same_number(a, b)
        ):
            dt = np.result_type(np.asarray(a), np.asarray(b))
            targets[i] = (TensorType((), dt), not (isinstance(a, bool) and isinstance(b, bool)))
    return targets


def same_number(a: Any, b: Any) -> bool:
    """Whether two Python numbers are the same value: of one type and, for floats, of the same bits.
    Python calls 0.0 and -0.0 (or 1, 1.0 and True) equal, but a branch that gives -0.0 is not one
    that gives 0.0; a nan is the same as a nan."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a.hex() == b.hex()
    return bool(a == b)


def same_tree(a: TreeDef, b: TreeDef) -> bool:
    """TreeDef equality with the static leaves and dict keys compared by ``same_number`` (the
    dataclass equality takes 0.0 for -0.0 and 1 for True, and a nan for something else than a nan)."""
    if (a.kind, len(a.children), len(a.keys)) != (b.kind, len(b.children), len(b.keys)):
        return False
    if a.kind == "static":
        return _same_static(a.value, b.value)
    return all(_same_static(x, y) for x, y in zip(a.keys, b.keys)) and all(
        same_tree(x, y) for x, y in zip(a.children, b.children)
    )


def _same_static(a: Any, b: Any) -> bool:
    if isinstance(a, (bool, int, float)) or isinstance(b, (bool, int, float)):
        return same_number(a, b)
    return type(a) is type(b) and bool(a == b)


def _promoting(fn: Callable, targets: dict[int, tuple[TensorType, bool]]) -> Callable:
    def run(*args):
        out = list(fn(*args))
        for i, (t, weak) in targets.items():
            if isinstance(out[i], (bool, int, float)) and not isinstance(out[i], Tracer):
                arr = cast(Tracer, np.broadcast_to(lift(np.asarray(out[i], t.dtype)), t.shape))
                out[i] = arr if arr.shape else _weakened(arr, weak)
        return out

    return run


def _weakened(t: Tracer, weak: bool) -> Tracer:
    t = Tracer(t._ctx, t._value, weak)
    return t


def _explain_branch_mismatch(res_true: Any, res_false: Any, names: Sequence[str]) -> None:
    """Name the variable whose value differs in kind, shape or dtype between the branches."""

    def describe(v: Any) -> str:
        if isinstance(v, Tracer):
            return f"an array {v._value.type}"
        if isinstance(v, str) and v == UNDEFINED_MARK:
            return "not assigned"
        return repr(v)

    for name, a, b in zip(names, res_true, res_false):
        ta, la = _static_structure(a)
        tb, lb = _static_structure(b)
        types_a = [x._value.type if isinstance(x, Tracer) else None for x in la]
        types_b = [x._value.type if isinstance(x, Tracer) else None for x in lb]
        if ta != tb or types_a != types_b:
            if describe(a) == "not assigned" or describe(b) == "not assigned":
                why = "is assigned in only one branch (it has no value before the if)"
            else:
                why = f"is {describe(a)} in the true branch and {describe(b)} in the false branch"
            raise TraceError(
                f"variable {name!r} {why}; an if on a traced value becomes a graph cond whose branches must "
                "give every variable the same shape and dtype",
                user_location(),
            )


def bind_multi_regions(opname: str, inputs: list[Tracer], attrs: dict, regions: tuple) -> tuple[Tracer, ...]:
    ctx = current_context()
    assert ctx is not None  # control flow on traced values only happens inside a trace
    return ctx.emit(opname, inputs, attrs, regions)


def _carry_arrays(init: Sequence[Any], what: str) -> list[Tracer]:
    """Loop-carried values must be arrays; Python numbers become weak arrays (a counter ``i = 0``
    is carried as an int64 that still promotes like a Python int)."""
    out = []
    for x in init:
        weak = isinstance(x, (int, float)) and not isinstance(x, (bool, Tracer))
        if isinstance(x, (bool, int, float)) and not isinstance(x, Tracer):
            x = np.asarray(x)
        if not isinstance(x, (Tracer, np.ndarray, np.generic)):
            raise TraceError(
                f"{what}: loop variables must be arrays or numbers, got {type(x).__name__}", user_location()
            )
        t = lift(x)
        out.append(Tracer(t._ctx, t._value, weak or (isinstance(t, Tracer) and t._weak)))
    return out


def _settle_carry(
    carry: list[Tracer], body: Callable, extra_types: Sequence[TensorType] = ()
) -> tuple[list[Tracer], list[Tracer]]:
    """Trace the body until the loop's carry is known: a weak carried number takes the dtype its
    first iteration gives it (acc = 0.0 then acc = acc + x32.sum() is a float32 accumulator, as
    numpy makes it after one step), and the arrays from outside that the body writes in place
    (``buf[i] = x`` of a buffer made before the loop, a view's root) are carried too. Returns the
    carry and those arrays."""
    implicit: list[Tracer] = []
    for _ in range(6):
        in_types = [*extra_types, *(c._value.type for c in carry)]
        weak = [True] * len(extra_types) + [c._weak for c in carry]
        probe = trace(body, in_types, "probe", weak, carried=implicit, output_carried=False)
        changed = False
        for k, (c, r) in enumerate(zip(carry, probe.result)):
            if c._weak and isinstance(r, Tracer) and r.shape == c.shape and r.dtype != c.dtype:
                converted = c.astype(r.dtype)
                carry[k] = Tracer(converted._ctx, converted._value, r._weak)
                changed = True
        for array, _ in probe.written.values():
            implicit.append(array)
            changed = True
        if not changed:
            return carry, implicit
    raise TraceError(
        "a loop on a traced value: its carried variables did not settle (their dtypes, or the arrays its body "
        "writes in place, change from one trace of the body to the next)",
        user_location(),
    )


def _check_carry(body_types, in_types, names: Sequence[str] | None, what: str) -> None:
    if tuple(body_types) == tuple(in_types):
        return
    names = list(names or [f"#{i}" for i in range(len(in_types))])
    for name, a, b in zip(names, in_types, body_types):
        if a != b:
            raise TraceError(
                f"{what}: loop variable {name} is {a} before an iteration and {b} after it; a loop on a traced "
                "value needs each variable to keep its shape and dtype",
                user_location(),
            )
    raise TraceError(
        f"{what}: the body returns {len(body_types)} values for {len(in_types)} loop variables", user_location()
    )


def while_loop(
    cond_fn: Callable, body_fn: Callable, init: Sequence[Any], names: Sequence[str] | None = None
) -> list[Tracer]:
    """``while cond_fn(*carry): carry = body_fn(*carry)`` as one graph op. Returns the final carry.
    Arrays from outside that the body writes in place are carried as well, and hold their final
    values afterwards."""
    if current_context() is None:  # eager: plain Python
        carry = list(init)
        while cond_fn(*carry):
            carry = list(body_fn(*carry))
        return carry
    carry = _carry_arrays(init, "while")
    body = lambda *a: list(_carry_arrays(body_fn(*a), "while"))  # noqa: E731
    carry, implicit = _settle_carry(carry, body)
    in_types = [c._value.type for c in carry]
    weak = [c._weak for c in carry]
    t_cond = trace(
        lambda *a: as_predicate(cond_fn(*a), "while"), in_types, "cond", weak, carried=implicit, output_carried=False
    )
    _no_writes(t_cond, "condition")
    t_body = trace(body, in_types, "body", weak, carried=implicit)
    _no_writes(t_body, "body")  # (all found by _settle_carry)
    r_cond, r_body = t_cond.region(), t_body.region()
    state_types = in_types + [a._val.type for a in implicit]
    _check_carry(r_body.out_types, state_types, names, "while")
    n = len(state_types)
    (r_cond, r_body), captured = _unify_captures([r_cond, r_body], [t_cond.captured(), t_body.captured()], n)
    # captured values are loop invariants: the body passes them through unchanged
    r_body = Region(r_body.inputs, r_body.nodes, r_body.outputs + r_body.inputs[n:])
    operands = [*carry, *(_snapshot(a) for a in implicit), *captured]
    outs = bind_multi_regions("while_loop", operands, {}, (r_cond, r_body))
    return _loop_results(list(outs[:n]), weak, implicit)


def _loop_results(outs: list[Tracer], weak: list[bool], implicit: list[Tracer]) -> list[Tracer]:
    """The loop's carried results; the arrays it carried implicitly take their final values."""
    n = len(outs) - len(implicit)
    for array, new in zip(implicit, outs[n:]):
        rebind(array, new)
    result = outs[:n]
    for r, w in zip(result, weak):
        r._weak = w
    return result


def fori_loop(
    lower: Any, upper: Any, body_fn: Callable, init: Sequence[Any], step: int = 1, names: Sequence[str] | None = None
) -> list[Tracer]:
    """``for i in range(lower, upper, step): carry = body_fn(i, *carry)`` as one graph op (the
    bounds may be traced; ``step`` is a Python int). Returns the final carry. Arrays from outside
    that the body writes in place are carried as well, as in ``while_loop``."""
    if not isinstance(step, int) or step == 0:
        raise TraceError(
            f"range() step must be a non-zero Python int in a loop on a traced range, got {step!r}", user_location()
        )
    if current_context() is None:  # eager: plain Python
        carry = list(init)
        for i in range(int(lower), int(upper), step):
            carry = list(body_fn(np.int64(i), *carry))
        return carry
    lo = lift(np.asarray(lower, np.int64) if not isinstance(lower, Tracer) else lower)
    hi = lift(np.asarray(upper, np.int64) if not isinstance(upper, Tracer) else upper)
    for b in (lo, hi):
        if b.dtype.kind not in "iu" or b.ndim:
            raise TraceError(f"range() bounds must be integer scalars, got {b._value.type}", user_location())
    lo, hi = lo.astype(np.int64), hi.astype(np.int64)
    carry = _carry_arrays(init, "for")
    index_t = TensorType((), np.dtype(np.int64))
    body = lambda i, *a: list(_carry_arrays(body_fn(i, *a), "for"))  # noqa: E731
    carry, implicit = _settle_carry(carry, body, [index_t])
    in_types = [c._value.type for c in carry]
    weak = [c._weak for c in carry]
    # (the index is a Python int)
    t_body = trace(body, [index_t, *in_types], "body", [True, *weak], carried=implicit)
    _no_writes(t_body, "body")  # (all found by _settle_carry)
    r_body = t_body.region()
    state_types = in_types + [a._val.type for a in implicit]
    _check_carry(r_body.out_types, state_types, names, "for")
    n = len(state_types)
    r_body = Region(r_body.inputs, r_body.nodes, r_body.outputs + r_body.inputs[1 + n :])
    operands = [lo, hi, *carry, *(_snapshot(a) for a in implicit), *t_body.captured()]
    outs = bind_multi_regions("fori_loop", operands, {"step": step}, (r_body,))
    return _loop_results(list(outs[:n]), weak, implicit)
