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
from graphc.core.pytree import flatten, unflatten
from graphc.frontend import autograph, control
from graphc.frontend.tracer import (
    HANDLERS,
    Tracer,
    current_context,
    fresh,
    library_failure,
    lift,
    user_errors,
    user_location,
)

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
    """New dict/list containers and array objects with the same values: a traced branch may
    assign d["k"] = v or update y += 1 in place without the other branch (or the code after the
    if) seeing it."""
    if isinstance(x, Tracer):
        return fresh(x)
    if isinstance(x, np.ndarray):  # a static write into a numpy buffer in one branch only
        return x.copy()
    if isinstance(x, dict):
        return {k: _copy_containers(v) for k, v in x.items()}
    if type(x) is list:
        return [_copy_containers(v) for v in x]
    if type(x) is tuple:
        return tuple(_copy_containers(v) for v in x)
    return x


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

    def branch(fn: Callable) -> Callable:
        return lambda: _mark_undefined(fn(*_copy_containers(vals)))

    result = control.cond(test, branch(true_fn), branch(false_fn), names=names)
    return _unmark(result)


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


def call(_gc_fn: Callable, /, *args: Any, **kwargs: Any) -> Any:
    if current_context() is None:
        return _gc_fn(*args, **kwargs)
    receiver = getattr(_gc_fn, "__self__", None)
    if isinstance(receiver, np.ndarray) and _traced(*args, *kwargs.values()):
        # a numpy array's method given a traced argument (X.dot(W) with X a numpy array): numpy's
        # methods do not dispatch to the argument, so the array becomes a constant of the graph
        return getattr(lift(receiver), _gc_fn.__name__)(*args, **kwargs)
    replacement = HANDLERS.library(_gc_fn, args, kwargs) if HANDLERS.library is not None else None
    if replacement is not None:  # a scipy function graphc implements (frontend/scipy_table.py)
        return replacement(*args, **kwargs)
    try:
        return convert(_gc_fn)(*args, **kwargs)
    except Exception as exc:  # a library function failing on traced arguments: a TraceError at this line
        error = library_failure(exc, args, kwargs)
        if error is None:
            raise
        raise error from exc


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


def _flat_body(body_fn: Callable, treedef: Any, names: Sequence[str], what: str, with_index: bool) -> Callable:
    def run(*args):
        index, leaves = (args[0], args[1:]) if with_index else (None, args)
        state = unflatten(treedef, list(leaves))
        out = body_fn(index, *state) if with_index else body_fn(*state)
        out_leaves, out_tree = flatten([_numbers_to_arrays(v) for v in out], is_leaf=lambda x: isinstance(x, Tracer))
        if out_tree != treedef:
            for name, before, after in zip(names, state, out):
                if (
                    flatten(_numbers_to_arrays(before), is_leaf=lambda x: isinstance(x, Tracer))[1]
                    != flatten(_numbers_to_arrays(after), is_leaf=lambda x: isinstance(x, Tracer))[1]
                ):
                    raise TraceError(
                        f"{what} loop on a traced value: variable {name!r} changes its structure or static "
                        f"value in the body ({before!r} -> {after!r})",
                        user_location(),
                    )
            raise TraceError(f"{what} loop on a traced value: the loop variables change structure", user_location())
        return out_leaves

    return run


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
    leaves, treedef = _loop_state(sub_vals, sub_names, "while")
    out = control.while_loop(
        lambda *ls: cond_c(*unflatten(treedef, list(ls))),
        _flat_body(body_c, treedef, sub_names, "while", with_index=False),
        leaves,
        names=_leaf_names(sub_vals, sub_names),
    )
    result = list(vals)
    for k, v in zip(carried, unflatten(treedef, list(out))):
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
    leaves, treedef = _loop_state(sub_vals, sub_names, "for")
    out = control.fori_loop(
        start,
        stop,
        _flat_body(body_c, treedef, sub_names, "for", with_index=True),
        leaves,
        step=int(step),
        names=_leaf_names(sub_vals, sub_names),
    )
    result = list(state)
    for k, v in zip(carried, unflatten(treedef, list(out))):
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
    a module-level table) is traced here, the array becoming a constant of the graph."""
    if isinstance(x, np.ndarray) and _has_tracer(key):
        return lift(x)[key]
    return x[key]


def written(out: Any, result: Any) -> Any:
    """What ``out`` holds after ``f(..., out=out)``: a numpy array written with traced values
    cannot hold them, so the name takes the traced result (frontend/indexing.py ufunc_inplace)."""
    if isinstance(out, np.ndarray) and isinstance(result, Tracer):
        return result
    return out


def _is_array(x: Any) -> bool:
    return isinstance(x, (np.ndarray, Tracer))


def _traced(*xs: Any) -> bool:
    return any(_has_tracer(x) for x in xs)


def _updated(x: Tracer, key: Any, value: Any) -> Tracer:
    """The value of ``x`` after ``x[key] = value``, as a new Tracer."""
    setitem = HANDLERS.setitem
    assert setitem is not None  # (frontend/indexing.py registers it)
    return user_errors(setitem)(x, key, value)


def _store(obj: Any, key: Any, value: Any, functional: bool) -> Any:
    """``obj[key] = value``; returns the object that now holds the result: ``obj`` itself, or a new
    Tracer for a numpy array written with traced values (and for a Tracer when ``functional``: an
    element of another array, whose write the caller carries to that array)."""
    if isinstance(obj, Tracer):
        if functional:
            return _updated(obj, key, value)
        obj[key] = value  # (rebinds the Tracer object itself: tracer.py rebind)
        return obj
    if isinstance(obj, np.ndarray) and _traced(key, value):
        new = _updated(lift(obj), key, value)
        new._ctx.supersede(obj)
        return new
    obj[key] = value
    return obj


def _is_view_key(key: Any) -> bool:
    """numpy's ``x[key]`` is a view (basic indexing: ints, slices, None, Ellipsis; a traced 0-d
    integer stands for an int)."""
    parts = key if type(key) is tuple else (key,)
    return all(
        k is None
        or k is Ellipsis
        or isinstance(k, (int, np.integer, slice))
        or (isinstance(k, Tracer) and not k.shape and k.dtype.kind in "iu")
        for k in parts
    )


def assign(root: Any, steps: tuple, value: Any, op: str | None = None, rebind: bool = True) -> Any:
    """``root.a[k1][k2] = value`` (``op``: ``+=`` and the other augmented assignments), where
    ``steps`` is ``((is_attribute, name or key), ...)``; returns what ``root`` holds afterwards.
    Without traced values this is exactly the Python statement. With them, arrays are updated
    functionally: a numpy array becomes a Tracer, which is stored back into the attribute, dict or
    list it came from (``setattr``), or returned for the caller to rebind its name (the
    transformed code does ``x = assign(x, ...)``; ``rebind`` is False where it cannot)."""
    holders = [root]
    for is_attr, key in steps[:-1]:
        holders.append(getattr(holders[-1], key) if is_attr else getitem(holders[-1], key))
    _, key = steps[-1]
    parent = holders[-1]
    if not (_traced(key, value) or any(isinstance(h, Tracer) for h in holders)):
        if op is None:
            parent[key] = value
        else:
            parent[key] = _AUGMENTED[op](parent[key], value)
        return root
    if op is not None:
        current = getitem(parent, key)
        if isinstance(current, (np.ndarray, Tracer)):  # a new array, so that += does not write into a view
            current = fresh(lift(current))
        value = _AUGMENTED[op](current, value)
    functional = len(holders) > 1 and not steps[-2][0] and _is_array(holders[-2])
    new = _store(parent, key, value, functional)
    for i in range(len(holders) - 2, -1, -1):
        if new is holders[i + 1]:
            return root
        is_attr, key = steps[i]
        holder = holders[i]
        if is_attr:
            setattr(holder, key, new)
            return root
        if _is_array(holder) and not _is_view_key(key):
            return root  # x[idx][k] = v writes into a copy of x[idx] (numpy does nothing to x)
        functional = i > 0 and not steps[i - 1][0] and _is_array(holders[i - 1])
        new = _store(holder, key, new, functional)
    if new is not root and not rebind:
        raise TraceError(
            "writing traced values into a numpy array that is not a local variable (a global or a closure "
            "variable) cannot update it; assign it to a local name first (buf = BUF) and write into that",
            user_location(),
        )
    return new


_THIS_MODULE = sys.modules[__name__]  # what transformed code calls its helpers through
