"""Run-time helpers called by source-transformed code (see autograph.py), and ``convert(fn)``, the
transform bound to them. Each helper keeps plain Python semantics for static values and emits
graph control flow for traced ones."""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphc.core.errors import SourceLoc, TraceError
from graphc.core.ir import TensorType
from graphc.core.pytree import flatten, unflatten
from graphc.frontend import autograph, control, einops_backend, masked, shadows
from graphc.frontend.library_calls import library_failure
from graphc.frontend.shadows import redirect
from graphc.frontend.tracer import (
    HANDLERS,
    Tracer,
    current_context,
    fresh,
    lift,
    user_errors,
    user_location,
)
from graphc.frontend.views import is_basic_key

_UNDEFINED_MARK = control.UNDEFINED_MARK


def convert(fn: Callable) -> Callable:
    """``fn`` with its control flow made traceable (frontend/autograph.py), or ``fn`` itself."""
    return autograph.transform(fn, _THIS_MODULE)


class _Undefined:
    """The value of a variable that is not bound yet (a branch or loop body may bind it), or that
    was only assigned inside a loop on a traced value (``name`` and ``loc`` say which loop).
    (Slots, no ``__dict__``: it is not a pytree object, core/pytree.py, and a result holding it
    gets its error.)"""

    __slots__ = ("name", "loc")

    def __init__(self, name: str | None = None, loc: SourceLoc | None = None):
        self.name = name
        self.loc = loc

    def __repr__(self) -> str:
        return "<undefined>"

    def error(self) -> TraceError:
        return TraceError(
            f"variable {self.name!r} is only assigned inside the body of a loop on a traced value, so it has no "
            "value after the loop (the loop's iterations are not known when tracing); give it a value before the "
            "loop to carry it from one iteration to the next",
            self.loc,
        )


UNDEF = _Undefined()


def is_undefined(v: Any) -> bool:
    return isinstance(v, _Undefined)


def values(local_vars: dict[str, Any], names: Sequence[str]) -> tuple:
    return tuple(local_vars.get(n, UNDEF) for n in names)


def _at_line(lineno: int) -> SourceLoc | None:
    loc = user_location()
    return SourceLoc(loc.file, lineno) if loc else None


def static_test(test: Any, kind: str, lineno: int) -> Any:
    """The condition of an if/while whose body leaves it early (return/break/continue/yield):
    it must be static."""
    if isinstance(test, Tracer):
        raise TraceError(
            f"`{kind}` inside an if/while whose condition is a traced value is not supported: graph control flow "
            "cannot leave a branch or loop early. Compute both outcomes and select with np.where, or move the "
            f"`{kind}` out of the traced branch",
            _at_line(lineno),
        )
    return test


def static_range(args: tuple, kind: str, lineno: int) -> range:
    if any(isinstance(a, Tracer) for a in args):
        what = "an `else:` clause" if kind == "else" else f"`{kind}`"
        raise TraceError(
            f"a for loop over a traced range() with {what} in its body is not supported: graph loops cannot "
            "leave early. Use a loop without it (or a range of Python ints, which is unrolled)",
            _at_line(lineno),
        )
    return range(*args)


def _mark_undefined(vals: Sequence[Any]) -> list[Any]:
    return [_UNDEFINED_MARK if is_undefined(v) else v for v in vals]


def _unmark(vals: Sequence[Any]) -> tuple:
    return tuple(UNDEF if isinstance(v, str) and v == _UNDEFINED_MARK else v for v in vals)


def _copy_containers(x: Any) -> Any:
    """New dict/list containers with the same items: a traced branch may assign d["k"] = v
    without the other branch (or the code after the if) seeing it. Arrays stay the same objects:
    their in-place writes in a branch are undone after it (control.py), and become the result."""
    if isinstance(x, dict):
        return {k: _copy_containers(v) for k, v in x.items()}
    if type(x) is list:
        return [_copy_containers(v) for v in x]
    if type(x) is tuple:
        return tuple(_copy_containers(v) for v in x)
    return x


def _is_leaf(x: Any) -> bool:
    return isinstance(x, (Tracer, np.ndarray))


def _objects(values: Sequence[Any]) -> list[list[Any] | None]:
    """Per variable, its array leaves as the array objects they are (a numpy array written with
    traced values as the Tracer that stands for it), or None where it has no leaves to compare."""
    out: list[list[Any] | None] = []
    for v in values:
        if is_undefined(v) or (isinstance(v, str) and v == _UNDEFINED_MARK):
            out.append(None)
            continue
        try:
            leaves, _ = flatten(v, is_leaf=_is_leaf)
        except TypeError:
            out.append(None)
            continue
        out.append([redirect(leaf) for leaf in leaves])
    return out


def _same_objects(result: Sequence[Any], seen: list[list[list[Any] | None]]) -> tuple:
    """The variables after a traced region: where every trace of the region left a variable's array
    leaf holding one and the same array object (written in place at most), that object itself,
    which its views and other names share (the region's writes were given back to it, control.py)."""
    out = []
    for k, v in enumerate(result):
        per_trace = [objs[k] for objs in seen]
        if is_undefined(v):
            out.append(v)
            continue
        leaves, tree = flatten(v, is_leaf=_is_leaf)
        known = [objs for objs in per_trace if objs is not None and len(objs) == len(leaves)]
        if not known or len(known) != len(per_trace):
            out.append(v)
            continue
        merged = [
            first if all(objs[j] is first for objs in known) and isinstance(first, Tracer) else leaf
            for j, (leaf, first) in enumerate(zip(leaves, known[0]))
        ]
        out.append(unflatten(tree, merged))
    return tuple(out)


def _into_region(vals: Sequence[Any]) -> None:
    """numpy arrays among a traced region's variables: shadows made for them while the region is
    traced belong to the current trace (shadows.py)."""
    ctx = current_context()
    assert ctx is not None
    pending = list(vals)
    while pending:
        v = pending.pop()
        if isinstance(v, np.ndarray):
            shadows.carried_into_region(v, ctx)
        elif isinstance(v, dict):
            pending.extend(v.values())
        elif type(v) in (list, tuple):
            pending.extend(v)


def if_stmt(test: Any, true_fn: Callable, false_fn: Callable, vals: tuple, names: tuple, assigns_attributes: bool):
    if not isinstance(test, Tracer):
        return true_fn(*vals) if test else false_fn(*vals)
    if assigns_attributes:
        raise TraceError(
            "assigning to an attribute inside an if on a traced value is not supported (nor writing into an "
            "attribute's or a global variable's items: obj.a[i] = v); assign to a local variable and set the "
            "attribute after the if",
            user_location(),
        )
    _into_region(vals)
    seen: list[list[list[Any] | None]] = []

    def branch(fn: Callable) -> Callable:
        def run():
            out = fn(*_copy_containers(vals))
            seen.append(_objects(out))
            return _mark_undefined(out)

        return run

    result = control.cond(test, branch(true_fn), branch(false_fn), names=names)
    return _same_objects(_unmark(result), seen[-2:])


def if_exp(test: Any, true_thunk: Callable, false_thunk: Callable) -> Any:
    if not isinstance(test, Tracer):
        return true_thunk() if test else false_thunk()
    return control.cond(test, lambda: [true_thunk()], lambda: [false_thunk()])[0]


def and_(*thunks: Callable) -> Any:
    value = thunks[0]()
    rest = thunks[1:]
    if not rest:
        return value
    if isinstance(value, Tracer):  # a and b == (b if a else a), as one cond
        return control.cond(value, lambda: [and_(*rest)], lambda: [value])[0]
    return and_(*rest) if value else value


def or_(*thunks: Callable) -> Any:
    value = thunks[0]()
    rest = thunks[1:]
    if not rest:
        return value
    if isinstance(value, Tracer):  # a or b == (a if a else b)
        return control.cond(value, lambda: [value], lambda: [or_(*rest)])[0]
    return value if value else or_(*rest)


def not_(x: Any) -> Any:
    if isinstance(x, Tracer):
        return np.logical_not(control.as_predicate(x, "not"))
    return not x


def _loop_state(vals: Sequence[Any], names: Sequence[str], what: str) -> tuple[list[Any], Any]:
    """Flatten loop variables to carried arrays (Python numbers become numpy scalars)."""
    for name, v in zip(names, vals):
        if is_undefined(v):
            raise TraceError(
                f"variable {name!r} is first assigned inside a {what} loop whose condition is traced; "
                "give it a value before the loop (graph loops carry each variable from one iteration to the next)",
                user_location(),
            )
    as_arrays = [_numbers_to_arrays(v) for v in vals]
    leaves, treedef = flatten(as_arrays, is_leaf=lambda x: isinstance(x, Tracer))
    return leaves, treedef


def _numbers_to_arrays(x: Any) -> Any:
    """Python numbers become weak arrays (they keep promoting like Python scalars, NEP 50)."""
    if isinstance(x, bool | int | float) and not isinstance(x, Tracer):
        t = lift(np.asarray(x))
        return Tracer(t._ctx, t._value, not isinstance(x, bool))
    if isinstance(x, dict):
        return {k: _numbers_to_arrays(v) for k, v in x.items()}
    if type(x) in (list, tuple):
        return type(x)(_numbers_to_arrays(v) for v in x)
    return x


class _LoopState:
    """A traced loop's variables as the graph loop carries them. Array objects the body keeps (it
    writes into them in place at most: a buffer filled in the loop, a view written through) stay
    the same objects, whose writes control.py carries; every other leaf (numbers, arrays the body
    assigns anew) is a loop variable of the graph loop."""

    def __init__(self, vals: Sequence[Any], names: Sequence[str], what: str, body: Callable, with_index: bool):
        self.vals, self.names, self.what, self.with_index = vals, list(names), what, with_index
        self.leaves, self.treedef = _loop_state(vals, names, what)
        self.objects = list(self.leaves)
        self.kept = self._probe(body)
        self.objects = [redirect(leaf) for leaf in self.leaves]  # (a numpy buffer the probe wrote: its shadow)

    def _probe(self, body: Callable) -> list[bool]:
        """Trace the body once on the arrays themselves to see which it keeps."""
        seen: list[list[Any]] = []

        def probe(*args):
            state = unflatten(self.treedef, list(self.objects))
            out = body(args[0], *state) if self.with_index else body(*state)
            leaves, tree = flatten([_numbers_to_arrays(v) for v in out], is_leaf=lambda x: isinstance(x, Tracer))
            seen.append([redirect(x) for x in leaves] if tree == self.treedef else [])
            return []

        index_types = [TensorType((), np.dtype(np.int64))] if self.with_index else []
        control.trace(probe, index_types, "probe", [True] * len(index_types))
        after = seen[0] if seen and seen[0] else [None] * len(self.leaves)
        return [now is not None and now is redirect(leaf) for leaf, now in zip(self.leaves, after)]

    def loop_variables(self) -> list[Any]:
        return [leaf for leaf, kept in zip(self.leaves, self.kept) if not kept]

    def state(self, variables: Sequence[Any]) -> Any:
        """The user's variables from the graph loop's ones."""
        it = iter(variables)
        return unflatten(self.treedef, [obj if kept else next(it) for obj, kept in zip(self.objects, self.kept)])

    def body(self, body_fn: Callable) -> Callable:
        """``body_fn`` on the user's variables, as a function of the graph loop's variables."""

        def run(*args):
            index, variables = (args[0], args[1:]) if self.with_index else (None, args)
            state = self.state(variables)
            out = body_fn(index, *state) if self.with_index else body_fn(*state)
            out_leaves, out_tree = flatten(
                [_numbers_to_arrays(v) for v in out], is_leaf=lambda x: isinstance(x, Tracer)
            )
            if out_tree != self.treedef:
                self._structure_error(state, out)
            for j, (obj, kept) in enumerate(zip(self.objects, self.kept)):
                if kept and redirect(out_leaves[j]) is not obj:
                    raise TraceError(
                        f"{self.what} loop on a traced value: a variable holds another array after this trace of the "
                        "body than after the first one (an array written in place in one, assigned anew in another)",
                        user_location(),
                    )
            return [x for x, kept in zip(out_leaves, self.kept) if not kept]

        return run

    def _structure_error(self, state: Any, out: Sequence[Any]) -> None:
        for name, before, after in zip(self.names, state, out):
            if (
                flatten(_numbers_to_arrays(before), is_leaf=lambda x: isinstance(x, Tracer))[1]
                != flatten(_numbers_to_arrays(after), is_leaf=lambda x: isinstance(x, Tracer))[1]
            ):
                raise TraceError(
                    f"{self.what} loop on a traced value: variable {name!r} changes its structure or static "
                    f"value in the body ({before!r} -> {after!r})",
                    user_location(),
                )
        raise TraceError(f"{self.what} loop on a traced value: the loop variables change structure", user_location())

    def leaf_names(self) -> list[str]:
        names = _leaf_names(self.vals, self.names)
        return [n for n, kept in zip(names, self.kept) if not kept]


def _leaf_names(vals: Sequence[Any], names: Sequence[str]) -> list[str]:
    out = []
    for name, v in zip(names, vals):
        leaves, _ = flatten(_numbers_to_arrays(v), is_leaf=lambda x: isinstance(x, Tracer))
        out.extend([name] if len(leaves) == 1 else [f"{name}[{i}]" for i in range(len(leaves))])
    return out


def _no_attribute_writes(assigns_attributes: bool, what: str) -> None:
    if assigns_attributes:
        raise TraceError(
            f"assigning to an attribute (obj.a = v, obj.a[i] = v) inside a {what} loop on a traced value is not "
            "supported; copy it to a local variable before the loop (buf = obj.a), write into that, and set "
            "the attribute after the loop",
            user_location(),
        )


def while_stmt(cond_fn: Callable, body_fn: Callable, vals: tuple, names: tuple, assigns_attributes=False) -> tuple:
    vals = tuple(vals)
    while True:
        test = cond_fn(*vals)
        if isinstance(test, Tracer):
            _no_attribute_writes(assigns_attributes, "while")
            return _graph_while(cond_fn, body_fn, vals, names)
        if not test:
            return vals
        vals = tuple(body_fn(*vals))


def _split_locals(vals: tuple, names: tuple) -> tuple[list[int], list[int]]:
    """Positions of carried variables (defined before the loop) and of body-local ones (first
    assigned in the body: temporaries, an inner loop's target), which are not carried."""
    carried = [k for k, v in enumerate(vals) if not is_undefined(v)]
    local = [k for k, v in enumerate(vals) if is_undefined(v)]
    return carried, local


def _carried_only(fn: Callable, vals: tuple, carried: list[int], with_index: bool) -> Callable:
    def run(*args):
        index, sub = (args[0], args[1:]) if with_index else (None, args)
        full = [UNDEF] * len(vals)
        for k, v in zip(carried, sub):
            full[k] = v
        out = fn(index, *full) if with_index else fn(*full)
        return tuple(out[k] for k in carried) if isinstance(out, (tuple, list)) else out

    return run


def _graph_while(cond_fn: Callable, body_fn: Callable, vals: tuple, names: tuple) -> tuple:
    carried, local = _split_locals(vals, names)
    sub_vals = tuple(vals[k] for k in carried)
    sub_names = tuple(names[k] for k in carried)
    cond_c = _carried_only(cond_fn, vals, carried, with_index=False)
    body_c = _carried_only(body_fn, vals, carried, with_index=False)
    _into_region(sub_vals)
    loop = _LoopState(sub_vals, sub_names, "while", body_c, with_index=False)
    out = control.while_loop(
        lambda *ls: cond_c(*loop.state(ls)), loop.body(body_c), loop.loop_variables(), names=loop.leaf_names()
    )
    result = list(vals)
    for k, v in zip(carried, loop.state(out)):
        result[k] = v
    for k in local:
        result[k] = _Undefined(names[k], user_location())
    return tuple(result)


def for_range(range_args: tuple, body_fn: Callable, vals: tuple, names: tuple, assigns_attributes=False) -> tuple:
    index, state = vals[0], tuple(vals[1:])
    if not any(isinstance(a, Tracer) for a in range_args):
        for i in range(*range_args):
            state = tuple(body_fn(i, *state))
            index = i
        return (index, *state)
    _no_attribute_writes(assigns_attributes, "for")
    if len(range_args) == 1:
        start, stop, step = 0, range_args[0], 1
    else:
        start, stop, step = (*range_args, 1)[:3]
    if isinstance(step, Tracer):
        raise TraceError("range() with a traced step is not supported; the step must be a Python int", user_location())
    carried, local = _split_locals(state, names[1:])
    sub_vals = tuple(state[k] for k in carried)
    sub_names = tuple(names[1:][k] for k in carried)
    body_c = _carried_only(body_fn, state, carried, with_index=True)
    _into_region(sub_vals)
    loop = _LoopState(sub_vals, sub_names, "for", body_c, with_index=True)
    out = control.fori_loop(
        start, stop, loop.body(body_c), loop.loop_variables(), step=int(step), names=loop.leaf_names()
    )
    result = list(state)
    for k, v in zip(carried, loop.state(out)):
        result[k] = v
    for k in local:
        result[k] = _Undefined(names[1:][k], user_location())
    return (_last_index(start, stop, int(step), index), *result)


def _last_index(start: Any, stop: Any, step: int, before: Any) -> Any:
    """The loop variable after ``for i in range(start, stop, step)``: the last index, or its value
    before the loop when the range is empty (a weak int, like the Python int it stands for)."""
    start = start if isinstance(start, Tracer) else np.asarray(start, np.int64)
    stop = stop if isinstance(stop, Tracer) else np.asarray(stop, np.int64)
    trips = np.maximum((stop - start + (step - 1 if step > 0 else step + 1)) // step, 0)
    last = start + (trips - 1) * step
    if not is_undefined(before):
        last = np.where(trips > 0, last, before)
    if isinstance(last, Tracer):
        last._weak = True
    return last


# --- subscripts: numpy arrays indexed by traced values, and assignments into arrays ------------------

SLICE = slice  # what transformed code builds ``a:b`` with (a user's name ``slice`` cannot shadow it)
_AUGMENTED = {
    name: getattr(operator, name)
    for name in ("iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "imatmul", "iand", "ior", "ixor")
    + ("ilshift", "irshift")
}


def _has_tracer(key: Any) -> bool:
    if isinstance(key, Tracer):
        return True
    if type(key) is tuple or type(key) is list:
        return any(_has_tracer(k) for k in key)
    if type(key) is slice:
        return isinstance(key.start, Tracer) or isinstance(key.stop, Tracer) or isinstance(key.step, Tracer)
    return False


def getitem(x: Any, key: Any) -> Any:
    """``x[key]``: numpy indexes a numpy array itself, so a traced index into one (``self.W[tokens]``,
    a module-level table) is traced here, the array becoming a constant of the graph. A numpy
    array written with traced values is read through the Tracer that stands for it (shadows.py),
    also when it is an item of a list or dict."""
    if isinstance(x, np.ndarray):
        x = redirect(x)
        if isinstance(x, np.ndarray) and _has_tracer(key):
            return lift(x)[key]
        return x[key]
    item = x[key]
    return redirect(item) if isinstance(item, np.ndarray) and not isinstance(x, Tracer) else item


def written(out: Any, result: Any) -> Any:
    """What ``out`` holds after ``f(..., out=out)`` (or ``out=(out,)``): a numpy array written with
    traced values cannot hold them, so the name takes the Tracer that stands for it now."""
    return redirect(out) if isinstance(out, np.ndarray) else out


def aliases(local_vars: dict[str, Any], names: Sequence[str]) -> tuple | None:
    """After a statement that may have written traced values into a numpy array: the values of the
    local ``names``, those that hold such an array replaced by the Tracer that stands for it (so a
    pure-numpy use of another name, ``b * 2``, sees the write); None when there is none."""
    if not shadows.any_shadows():
        return None
    out, changed = [], False
    for name in names:
        value = local_vars.get(name, UNDEF)
        new = redirect(value) if isinstance(value, np.ndarray) else value
        changed = changed or new is not value
        out.append(new)
    return tuple(out) if changed else None


def _is_array(x: Any) -> bool:
    return isinstance(x, (np.ndarray, Tracer))


def _traced(*xs: Any) -> bool:
    return any(_has_tracer(x) for x in xs)


def _in_region() -> bool:
    """Whether a traced branch or loop body is being traced (a write there is conditional)."""
    ctx = current_context()
    return ctx is not None and ctx.parent is not None


def _store(obj: Any, key: Any, value: Any) -> Any:
    """``obj[key] = value``; returns the object that now holds the result: ``obj`` itself, or for a
    numpy array written with traced values (or written inside a traced branch or loop body) the
    Tracer that stands for it now (shadows.py)."""
    if isinstance(obj, np.ndarray) and (_traced(key, value) or _in_region() or redirect(obj) is not obj):
        obj = user_errors(shadows.shadow_of)(obj)
    obj[key] = value  # (a Tracer rebinds itself: tracer.py rebind; a view writes into its root)
    return obj


def _holder_item(holder: Any, key: Any, writing: bool) -> Any:
    """``holder[key]`` on the way to a write: a numpy array indexed by a traced key is read as a view
    of the Tracer that stands for it, since the write goes there."""
    if writing and isinstance(holder, np.ndarray) and _has_tracer(key):
        return user_errors(shadows.shadow_of)(holder)[key]
    return getitem(holder, key)


def assign(root: Any, steps: tuple, value: Any, op: str | None = None, rebind: bool = True) -> Any:
    """``root.a[k1][k2] = value`` (``op``: ``+=`` and the other augmented assignments), where
    ``steps`` is ``((is_attribute, name or key), ...)``; returns what ``root`` holds afterwards.
    Without traced values this is exactly the Python statement. With them, a Tracer is written in
    place (a view writes into its root, tracer.py rebind), and a numpy array is replaced by the
    Tracer that stands for it (shadows.py), which is stored back into the attribute, dict or list
    it came from, or returned for the caller to rebind its name (the transformed code does
    ``x = assign(x, ...)``; ``rebind`` is False where it cannot)."""
    traced = _traced(value, *(key for _, key in steps)) or isinstance(root, Tracer) or _in_region()
    holders = [root]
    for is_attr, key in steps[:-1]:
        holders.append(getattr(holders[-1], key) if is_attr else _holder_item(holders[-1], key, traced))
    _, key = steps[-1]
    parent = holders[-1]
    shadowed = any(isinstance(h, np.ndarray) and redirect(h) is not h for h in holders)
    if not (traced or shadowed or any(isinstance(h, Tracer) for h in holders)):
        if op is None:
            parent[key] = value
        else:
            parent[key] = _AUGMENTED[op](parent[key], value)
        return root
    if op is not None and _is_array(parent) and masked.traced_mask(key):
        value, key = masked.masked_augmented(lift(redirect(parent)), key, value, _AUGMENTED[op]), Ellipsis
    elif op is not None:
        value = _augmented(parent, key, value, op)
    new = _store(parent, key, value)
    for i in range(len(holders) - 2, -1, -1):
        child, holder = holders[i + 1], holders[i]
        if new is child:
            return root  # written in place
        is_attr, key = steps[i]
        if is_attr:
            setattr(holder, key, new)
            return root
        if _is_array(holder):
            if not is_basic_key(key):
                return root  # x[idx][k] = v writes into a copy of x[idx] (numpy does nothing to x)
            # child, a numpy view of the numpy array holder, was replaced by a view of its buffer's shadow
            new = redirect(holder)
            continue
        holder[key] = new  # a list or dict item
        return root
    if new is not root and not rebind:
        raise TraceError(
            "writing traced values into a numpy array that is not a local variable (a closure variable) cannot "
            "update it; write into a copy held by a local name (buf = BUF.copy())",
            user_location(),
        )
    return new


def _augmented(parent: Any, key: Any, value: Any, op: str) -> Any:
    """The value of ``parent[key] op value`` that ``parent[key] op= value`` stores. An item of a list
    or dict is updated as the object it is (``lst[0] += x`` writes into that array); an element of
    an array is read as numpy reads it (a numpy scalar, or an array copied here so that the update
    does not reach the parent before the store): ``i[2] -= 2.5`` on an int array is fine, as in
    numpy, where ``i[1:] -= 2.5`` raises (the in-place subtract into an int array)."""
    if not _is_array(parent):
        return _AUGMENTED[op](getitem(parent, key), value)
    current = getitem(redirect(parent), key)
    if isinstance(current, np.ndarray):
        current = fresh(lift(current))
    elif isinstance(current, Tracer):
        scalar = current._scalar
        current = fresh(current)
        current._scalar = scalar
    return _AUGMENTED[op](current, value)


def call(_gc_fn: Callable, /, *args: Any, **kwargs: Any) -> Any:
    ctx = current_context()
    if ctx is None:
        return _gc_fn(*args, **kwargs)
    if shadows.any_shadows():  # numpy arrays written with traced values: their Tracers
        args = tuple(_redirect_deep(a) for a in args)
        kwargs = {k: _redirect_deep(v) for k, v in kwargs.items()}
        receiver = getattr(_gc_fn, "__self__", None)
        if isinstance(receiver, np.ndarray) and redirect(receiver) is not receiver:
            return getattr(redirect(receiver), _gc_fn.__name__)(*args, **kwargs)
    receiver = getattr(_gc_fn, "__self__", None)
    if isinstance(receiver, np.ndarray) and _traced(*args, *kwargs.values()):
        # a numpy array's method given a traced argument (X.dot(W) with X a numpy array): numpy's
        # methods do not dispatch to the argument, so the array becomes a constant of the graph
        return getattr(lift(receiver), _gc_fn.__name__)(*args, **kwargs)
    einops_backend.register_if_imported()  # (einops imported by the function being traced)
    replacement = HANDLERS.library(_gc_fn, args, kwargs) if HANDLERS.library is not None else None
    if replacement is not None:  # a scipy function graphc implements (frontend/scipy_table.py)
        return replacement(*args, **kwargs)
    converted = convert(_gc_fn)
    if converted is not _gc_fn or _unconverted(_gc_fn):  # a user function: its globals are read (core/captured.py)
        ctx.read_function(_gc_fn)
    try:
        return converted(*args, **kwargs)
    except Exception as exc:  # a library function failing on traced arguments: a TraceError at this line
        error = library_failure(exc, args, kwargs)
        if error is None:
            raise
        raise error from exc


def _unconverted(fn: Any) -> bool:
    """A user function traced without the source transform (``global`` statements, no source)."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    return code is not None and autograph.unconverted_reason(code) is not None


def _redirect_deep(x: Any) -> Any:
    """``x`` with the numpy arrays written with traced values in it (also inside lists, tuples and
    dicts) replaced by their Tracers; ``x`` itself when there are none."""
    if isinstance(x, np.ndarray):
        return redirect(x)
    if type(x) in (list, tuple):
        items = [_redirect_deep(v) for v in x]
        return type(x)(items) if any(a is not b for a, b in zip(items, x)) else x
    if type(x) is dict:
        values = {k: _redirect_deep(v) for k, v in x.items()}
        return values if any(values[k] is not x[k] for k in x) else x
    return x


_THIS_MODULE = sys.modules[__name__]  # what transformed code calls its helpers through
