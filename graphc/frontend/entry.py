"""The frontend's entry points: ``trace(fn, *args) -> Graph``, and graph control flow from user
functions (``cond``, ``while_loop``, ``fori_loop``: their functions get the source transform).

Tracing runs the user's function on ``Tracer`` objects (frontend/tracer.py) after the source
transform (frontend/autograph.py, frontend/autograph_runtime.py), with the numpy handlers of
frontend/ufuncs.py, functions.py, shape_functions.py and indexing.py registered (importing this
module imports them) and with the numpy entry points that do not dispatch on their arguments
wrapped for the duration (``numpy_patches``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import threading
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from graphc.core import dtypes
from graphc.core.buffers import foreign_semantics
from graphc.core.captured import global_reads
from graphc.core.collector import collector_paused
from graphc.core.errors import GraphcWarning, ShapeError, SourceLoc, TraceError, numpy_error
from graphc.core.ir import Graph, Node, TensorType, Value
from graphc.core.pytree import (
    ArraySpec,
    NodeType,
    StatePlace,
    StateUpdate,
    TreeDef,
    WeakScalar,
    flatten,
    flatten_as,
    is_dynamic_leaf,
    leaf_paths,
    unflatten,
)
from graphc.frontend import (  # noqa: F401  (register handlers)
    control,
    einops_backend,
    functions,
    index_functions,
    indexing,
    linalg,
    scan_sort,
    scipy_table,
    shadows,
    shape_functions,
    ufuncs,
    views,
)
from graphc.frontend import random as traced_random
from graphc.frontend.autograph_runtime import convert, is_undefined
from graphc.frontend.locations import display_path
from graphc.frontend.tracer import (
    HANDLERS,
    TraceContext,
    Tracer,
    call_with_user_errors,
    contains_tracer,
    context_stack,
    current_context,
    emit_block,
    fresh,
    handle_function,
    lift,
    user_errors,
    user_location,
)
from graphc.interpreter import evaluate

_ARRAY_CONSTRUCTORS = ("asarray", "array", "asanyarray", "ascontiguousarray")
_patch_lock = threading.Lock()
_patch_depth = 0
_originals: list[tuple[Any, str, Callable]] = []


def _contains_tracer_anywhere(args: tuple, kwargs: dict) -> bool:
    for a in (*args, *kwargs.values()):  # (a loop: a traced first argument, the usual case, ends it)
        if type(a) is Tracer or contains_tracer(a):
            return True
    return False


def _constructor_patch(original: Callable) -> Callable:
    """``np.array`` and the other array constructors on traced values. np.array copies unless
    ``copy=False`` (or ``copy=None``, numpy's "only if needed"); np.asarray and the others return the
    array itself when no conversion is needed, as numpy does. (Which constructor this is is decided
    here: at call time ``np.array`` is this patched function.)"""
    copies_by_default = original.__name__ == "array"

    @functools.wraps(original)
    def patched(obj, *args, **kwargs):
        if current_context() is not None and contains_tracer(obj):
            dtype = kwargs.get("dtype", args[0] if args else None)
            copy = kwargs.get("copy", copies_by_default)
            result = call_with_user_errors(lift, obj, None if dtype is None else dtypes.canonical(dtype))
            # True copies; False, None ("only if needed") and numpy's _CopyMode.IF_NEEDED / NEVER do not
            copies = copy is True or getattr(copy, "name", None) == "ALWAYS"
            if result is obj and (copies or result._scalar):  # (np.asarray of a numpy scalar is a 0-d array)
                return fresh(result)
            return result
        return original(obj, *args, **kwargs)

    return patched


def _handler_patch(original: Callable) -> Callable:
    """numpy only dispatches on some arguments (not on the arrays inside a list passed to np.mean,
    nor on np.take's indices); route any call that holds a traced value to graphc's handler."""

    @functools.wraps(original)
    def patched(*args, **kwargs):
        if current_context() is not None and _contains_tracer_anywhere(args, kwargs):
            return call_with_user_errors(handle_function, original, args, kwargs)
        return original(*args, **kwargs)

    return patched


def _patch_targets() -> list[tuple[Any, str, Callable]]:
    targets = [(np, name, _constructor_patch(getattr(np, name))) for name in _ARRAY_CONSTRUCTORS]
    for func in HANDLERS.functions:
        for module in (np, np.linalg):
            if getattr(module, func.__name__, None) is func:
                targets.append((module, func.__name__, _handler_patch(func)))
    return targets + traced_random.patch_targets()  # np.random.* draw from traced generators


@contextlib.contextmanager
def numpy_patches():
    """While any thread traces, numpy entry points that do not dispatch on every argument are
    wrapped: ``np.asarray(tracer)``, ``np.array([tracer, ...])``, ``np.mean([t1, t2])``,
    ``np.take(table, traced_idx)`` reach graphc. Other threads, and calls without traced values,
    reach numpy unchanged."""
    global _patch_depth
    with _patch_lock:
        if _patch_depth == 0:
            for module, name, patched in _patch_targets():
                _originals.append((module, name, getattr(module, name)))
                setattr(module, name, patched)
        _patch_depth += 1
    try:
        yield
    finally:
        with _patch_lock:
            _patch_depth -= 1
            if _patch_depth == 0:
                while _originals:
                    module, name, original = _originals.pop()
                    setattr(module, name, original)


# --- trace ---------------------------------------------------------------------------------------


def _input_names(fn: Callable, args: tuple, kwargs: dict) -> list[str]:
    """A readable name per array leaf: the parameter name followed by the dict keys / indices."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    var_pos = next((p.name for p in params if p.kind == p.VAR_POSITIONAL), "args")
    _, treedef = flatten((args, kwargs))
    names = []
    for path in leaf_paths(treedef):
        top, first, *rest = path
        if top == 0:
            head = positional[first] if first < len(positional) else f"{var_pos}{first - len(positional)}"
        else:
            head = str(first)
        names.append(".".join([head, *map(str, rest)]))
    return names


def _input_type(leaf: Any, name: str) -> TensorType:
    foreign = foreign_semantics(leaf)
    if foreign is not None:
        raise TraceError(f"argument {name} is {foreign}")
    if isinstance(leaf, ArraySpec):
        shape, dt = leaf.shape, leaf.dtype
    else:
        arr = np.asarray(leaf)
        shape, dt = arr.shape, arr.dtype
    try:
        return TensorType(shape, dtypes.canonical(dt))
    except ShapeError as exc:
        raise TraceError(f"argument {name}: {exc}") from None


@collector_paused()
def trace(fn: Callable, *args: Any, **kwargs: Any) -> Graph:
    """Trace ``fn(*args, **kwargs)`` into a Graph.

    Array leaves of the argument pytrees (numpy arrays, numpy scalars, ``ArraySpec``) become graph
    inputs; every other leaf (int, float, bool, str, None) is static and recorded in the signature.
    A ``WeakScalar`` leaf is an input with a weak type (a Python number: graphc.jit passes them).
    Errors in the arguments or the result are TraceErrors at ``fn``'s definition.

    Objects among the arguments (dataclasses, NamedTuples, registered classes, plain objects: see
    core/pytree.py) reach ``fn`` as copies whose arrays are traced values, so nothing traced is
    left on the caller's objects. When ``fn`` sets an attribute of one (``self.cache = ...``, an
    in-place write into an array attribute, a list item held by an object) to a new array or
    static value, the graph returns a ``StateUpdate``: ``fn``'s result and the new values, which
    ``StateUpdate.apply(*args, **kwargs)`` stores (graphc.jit and graphc.parallelize do it after
    every call). A bound method's object (``trace(model.forward, x)``) is not an argument: its
    arrays are constants of the graph and what the method sets on it is dropped (pass the object
    as an argument, or use graphc.jit, to trace and keep it).
    """
    name = getattr(fn, "__name__", "fn")
    where = definition_location(fn)
    fn = on_a_copy(fn)
    args, kwargs, _ = traced_random.bind_generators(args, kwargs, ambient=False)  # a Generator: its state
    try:
        leaves, in_tree = flatten((args, kwargs))
        check_call(fn, args, {k: v for k, v in kwargs.items() if k != traced_random.AMBIENT_KWARG})
    except TypeError as exc:
        raise argument_error(fn, exc) from None
    ctx = TraceContext(name if name.isidentifier() else "fn")
    names = _input_names(fn, args, kwargs)
    try:
        tracers = [ctx.new_input(_input_type(leaf, n), n) for leaf, n in zip(leaves, names)]
    except TraceError as exc:
        raise TraceError(exc.message, where) from None
    for leaf, t in zip(leaves, tracers):
        t._weak = isinstance(leaf, WeakScalar)
    placed = traced_random.wrap_inputs(leaves, tracers)  # Generators: TracedGenerator
    targs, tkwargs = unflatten(in_tree, placed)
    ctx.read_function(fn)  # the trace reads its globals (core/captured.py)
    fn = convert(fn)
    einops_backend.register_if_imported()  # einops on Tracers, when the program uses einops
    stack = context_stack()
    stack.append(ctx)
    try:
        with numpy_patches(), traced_random.ambient_for_trace(tkwargs) as tkwargs:
            result = fn(*targs, **tkwargs)
            if inspect.isgenerator(result):
                raise TraceError(
                    f"{name} is a generator function (it yields); graphc traces functions that return arrays", where
                )
            undefined = _find_undefined(result)  # (an object itself, it would flatten as one)
            if undefined is not None:
                raise undefined.error()
            try:
                out_leaves, out_tree = flatten(result, is_leaf=lambda x: isinstance(x, Tracer), path="result")
            except TypeError as exc:
                raise TraceError(f"{name} returned something graphc cannot represent: {exc}", where) from None
            outputs = [user_errors(lift)(leaf)._value for leaf in out_leaves]
            for leaf in out_leaves:
                if isinstance(leaf, Tracer) and leaf._ctx is not ctx:
                    raise TraceError(f"{name} returned a traced value from another trace", where)
            writes = written_places(in_tree, (targs, tkwargs), placed, list(ctx.inputs))
            _warn_unsaved_writes(name, names, placed, list(ctx.inputs), writes, outputs, where)
            if writes:
                out_tree = _with_state(fn, ctx, writes, out_tree, outputs, where)
    except BaseException:  # (a failed trace leaves no traced value or draw in the user's globals)
        _put_back(ctx)
        for before in ctx.held_before:
            before.drew()
        raise
    finally:
        stack.pop()
    tag_parts(ctx.nodes)
    graph = Graph(ctx.name, ctx.inputs, ctx.nodes, outputs, in_tree, out_tree)
    graph.written_inputs = _written_inputs(placed, ctx.inputs, where)
    graph.global_reads = _global_reads(ctx, name)
    # the context and the tracers it made hold each other (a cycle, freed by the collector): it
    # gives the graph its node list, so that the nodes are not kept with it (a caller that drops
    # the graph, or some of its nodes, frees them by reference counting: passes/manager.py)
    ctx.nodes = []
    return graph


def _global_reads(ctx: TraceContext, name: str) -> tuple:
    """Graph.global_reads of the functions the trace converted; a TraceError if one of their
    globals or closure variables now holds a traced value: numpy would keep the new value there
    for the next call, the compiled function cannot store it."""
    converted = ((f, definition_location(f)) for f in ctx.functions.values())
    written = frozenset((id(h.holder), h.name) for h in ctx.held_before if h.modified())
    reads, stored = global_reads(converted, _traced, written)
    drawn = [before for before in ctx.held_before if before.drew()]  # (each put back)
    if stored:
        _put_back(ctx)
        function, loc, held = stored[0]
        raise TraceError(
            f"{function} stores a traced value in the global or closure variable {held!r} (an item, an "
            f"attribute or itself): graphc cannot store it there after each call as numpy would, so every "
            f"call would read its first value. Pass {held} as an argument to the function you compile (graphc "
            f"writes back what is stored into objects passed as arguments) or return the new value",
            loc,
        )
    if drawn:
        raise TraceError(
            f"{name} draws from the numpy random generator {drawn[0].name!r} it reads from a global or closure: "
            "numpy's own object, whose numbers graphc would compile as constants, the same at every call. Pass it "
            "as an argument (graphc then draws new numbers at every call; docs/random.md)",
            definition_location(next(iter(ctx.functions.values()))) if ctx.functions else None,
        )
    return reads


def _traced(x: Any) -> bool:
    return isinstance(x, Tracer)


def _put_back(ctx: TraceContext) -> None:
    """Put back what the traced functions' globals held where the trace stored a traced value."""
    for before in ctx.held_before:
        before.restore(_traced)


def _written_inputs(placed: list[Any], inputs: list[Value], where: SourceLoc | None) -> tuple:
    """The inputs whose Tracer now holds another value (written in place: ``x[i] = v``, ``x +=
    v``, ``out=x``, through a view), each with the line of its last write (Graph.written_inputs)."""
    out = []
    for i, (leaf, start) in enumerate(zip(placed, inputs)):
        if isinstance(leaf, Tracer) and leaf._value is not start:
            producer = leaf._value.producer
            out.append((i, (producer.loc if producer is not None else None) or where))
    return tuple(out)


def on_a_copy(fn: Callable) -> Callable:
    """A bound method (or a callable object) runs on a copy of its object that shares its arrays,
    so that what it sets on ``self`` while traced stays off the user's object (functions are
    returned as they are)."""
    obj = fn.__self__ if inspect.ismethod(fn) else fn
    if isinstance(obj, (type, types.ModuleType, functools.partial)) or inspect.isroutine(obj) or is_dynamic_leaf(obj):
        return fn
    if obj is fn and not isinstance(getattr(obj, "__dict__", None), dict):
        return fn
    try:
        leaves, tree = flatten(obj)
        twin = unflatten(tree, leaves)
    except TypeError:
        try:
            twin = copy.copy(obj)
        except Exception:  # an object that cannot be copied runs as it is
            return fn
    method: Any = fn
    return types.MethodType(method.__func__, twin) if obj is not fn else twin


# --- state written into argument objects ------------------------------------------------------------

_MISSING = object()


def written_places(in_tree: TreeDef, root: Any, start: list[Any], inputs: list[Value]) -> list[tuple[StatePlace, Any]]:
    """The places of the argument objects ``root`` (the traced call's ``(args, kwargs)``, built by
    ``unflatten(in_tree, start)``; ``inputs``: the graph inputs ``start`` stand for) that now hold
    something else than they started with, each with its new value: attributes of objects, and
    items of the lists and dicts objects hold. An array written in place (``self.cache[i] = k``:
    the same Tracer, a new value) is copied into the caller's array, as numpy writes it; an
    attribute set to a new value (``self.state = ...``) is set. Items of containers passed
    directly (not held by an object) are not followed: a function returns those."""
    out: list[tuple[StatePlace, Any]] = []
    _diff(in_tree, root, (start, inputs), 0, (), False, False, out)
    return out


def _diff(t: TreeDef, value: Any, start: tuple, first: int, path: tuple, writable: bool, inside: bool, out: list):
    """Compare the place ``path`` (started as ``t``, whose first leaf is input ``first``) with the
    ``value`` it holds now; ``writable``: a changed value is written back; ``inside``: held by an object."""
    placed, inputs = start
    if t.kind == "leaf":
        same = value is placed[first]
        if (
            writable
            and getattr(value, "_value", None) is not inputs[first]
            and not (same and not isinstance(value, Tracer))
        ):
            out.append((StatePlace(path, first, in_place=same), value))  # (the same Tracer: written in place)
        return
    if t.kind == "static":
        if writable and (is_dynamic_leaf(value) or not _same_static(value, t.value)):
            out.append((StatePlace(path), value))
        return
    node = t.node
    if node is not None and node.how == "registered":  # opaque: compared as a whole
        if writable and not _same_registered(t, value, start, first):
            out.append((StatePlace(path), value))
        return
    if not _same_container(t, value):
        if writable:
            out.append((StatePlace(path), value))
        return
    now = _children_now(t, value)
    keys = t.keys if t.kind == "dict" else range(len(t.children))
    held = inside or (node is not None and node.how in ("fields", "slots"))
    settable = node.attributes if node is not None else (held and t.kind in ("dict", "list"))
    for k, c in zip(keys, t.children):
        current = now.pop(k, _MISSING)
        if current is not _MISSING:  # (an attribute deleted is not written back)
            _diff(c, current, start, first, (*path, k), settable, held, out)
        first += c.num_leaves
    if settable and t.kind == "dict":  # new attributes / dict entries
        for k, current in now.items():
            out.append((StatePlace((*path, k)), current))


def _warn_unsaved_writes(
    name: str, names: list[str], placed: list[Any], inputs: list[Value], writes: list, outputs: list, where
) -> None:
    """One warning, at the last such write, naming the argument arrays written in place (``x[i] =
    v``, ``x += v``, ``out=x``) that are neither held by an object (written back) nor returned:
    numpy would have changed the caller's arrays, the compiled function does not."""
    kept = {place.input_leaf for place, _ in writes if place.in_place}
    returned = {id(v) for v in outputs}
    lost = [
        i
        for i, (leaf, start) in enumerate(zip(placed, inputs))
        if isinstance(leaf, Tracer) and leaf._value is not start and i not in kept and id(leaf._value) not in returned
    ]
    if not lost:
        return
    producer = placed[lost[-1]]._value.producer
    loc = (producer.loc if producer is not None else None) or where
    warnings.warn_explicit(
        f"{name} writes into its argument arrays {', '.join(names[i] for i in lost)} in place and does not "
        "return them: numpy would change the caller's arrays, graphc does not write into arrays passed as "
        "arguments. Return the new values (and assign them), or hold the arrays on an object (self.w -= ...), "
        "whose arrays graphc writes back after each call",
        GraphcWarning,
        loc.file if loc is not None else "<unknown>",
        loc.line if loc is not None else 0,
    )


def _same_static(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return a.hex() == b.hex() or (a != a and b != b)
    try:
        return bool(a == b)
    except Exception:  # an == that does not give a truth value: a new value
        return False


def _same_registered(t: TreeDef, value: Any, start: tuple, first: int) -> bool:
    try:
        leaves, now = flatten(value, is_leaf=lambda x: isinstance(x, Tracer))
    except TypeError:
        return False
    inputs = start[1][first : first + t.num_leaves]
    return now == t and all(getattr(a, "_value", None) is v for a, v in zip(leaves, inputs))


def _same_container(t: TreeDef, value: Any) -> bool:
    if t.node is not None:
        return type(value) is t.node.cls
    if t.kind == "dict":
        return isinstance(value, dict)
    return type(value) is (list if t.kind == "list" else tuple) and len(value) == len(t.children)


def _children_now(t: TreeDef, value: Any) -> dict[Any, Any]:
    node = t.node
    if node is not None and node.how == "fields":
        return dict(vars(value))
    if node is not None and node.how == "slots":
        return {k: getattr(value, k, _MISSING) for k in t.keys}
    if node is not None:  # a NamedTuple
        return dict(zip(t.keys, value))
    if t.kind == "dict":
        return dict(value)
    return dict(enumerate(value))


def _with_state(
    fn: Callable, ctx: TraceContext, writes: list[tuple[StatePlace, Any]], out_tree: TreeDef, outputs: list, where
) -> TreeDef:
    """The result tree of a function that wrote ``writes``: a StateUpdate of its result and the new
    values (whose leaves are appended to ``outputs``)."""
    names = _parameter_names(fn)
    trees = []
    for place, value in writes:
        what = place.text(names)
        try:
            leaves, tree = flatten(value, is_leaf=lambda x: isinstance(x, Tracer), path=what)
        except TypeError as exc:
            raise TraceError(
                f"{what} was set to a value graphc cannot write back after the call: {exc}", where
            ) from None
        for leaf in leaves:
            if isinstance(leaf, Tracer) and leaf._ctx is not ctx:
                raise TraceError(
                    f"{what} was set to a value traced inside a loop or branch body; set it outside, "
                    "from the loop's or branch's result",
                    where,
                )
        outputs.extend(user_errors(lift)(leaf)._value for leaf in leaves)
        trees.append(tree)
    node = NodeType(StateUpdate, "registered", tuple(place for place, _ in writes))
    return TreeDef("tuple", (out_tree, *trees), node=node)


def _parameter_names(fn: Callable) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def definition_location(fn: Callable) -> SourceLoc | None:
    """Where ``fn`` (or the function a partial or a wrapper holds) is defined."""
    fn = inspect.unwrap(fn)
    while isinstance(fn, functools.partial):
        fn = inspect.unwrap(fn.func)
    code = getattr(fn, "__code__", None)
    return SourceLoc(display_path(code.co_filename), code.co_firstlineno) if code is not None else None


def check_call(fn: Callable, args: tuple, kwargs: dict) -> None:
    """TypeError, as Python would raise it, if ``fn`` cannot be called with these arguments (a
    wrapper is taken as it is: a partial binding static arguments, a decorator's ``*args``)."""
    try:
        signature = inspect.signature(fn, follow_wrapped=False)
    except (TypeError, ValueError):  # a builtin without a signature: the call itself will tell
        return
    signature.bind(*args, **kwargs)


def argument_error(fn: Callable, exc: TypeError) -> TraceError:
    """The TraceError for arguments ``fn`` cannot be traced with (an unknown leaf type, a wrong
    count): also a TypeError, as Python's own; at ``fn``'s definition. graphc.jit and
    graphc.parallelize raise the same."""
    name = getattr(fn, "__name__", "fn")
    return numpy_error(TypeError(f"cannot trace {name}: {exc}"), TraceError, definition_location(fn))


def _find_undefined(tree: Any) -> Any:
    if is_undefined(tree) and tree.name:
        return tree
    children = tree.values() if isinstance(tree, dict) else tree if isinstance(tree, (list, tuple)) else ()
    for c in children:
        found = _find_undefined(c)
        if found is not None:
            return found
    return None


def tag_parts(nodes: list[Node]) -> None:
    """In a graph with backward nodes (from autodiff), tag the rest: nodes that use gradients are
    the update, all others the forward part. Graphs without gradients stay untagged."""
    if "backward" not in [n.part for n in nodes]:
        return
    uses_grads: set[Value] = set()
    for n in nodes:
        if n.part == "backward":
            uses_grads.update(n.outputs)
        elif not uses_grads.isdisjoint(n.inputs):
            n.part = "update"
            uses_grads.update(n.outputs)
        else:
            n.part = "forward"


def inline_graph(graph: Graph, *args: Any, **kwargs: Any) -> Any:
    """Call ``graph`` like the function it was traced from: inside a trace its nodes are emitted
    again on the given (traced or numpy) arguments; outside one it is evaluated."""
    ctx = current_context()
    if ctx is None:
        return evaluate(graph, *args, **kwargs)
    leaves = [lift(x) for x in _flat_arguments(graph, args, kwargs)]
    return unflatten(graph.out_tree, emit_block(ctx, graph.inputs, graph.nodes, graph.outputs, leaves))


def _flat_arguments(graph: Graph, args: tuple, kwargs: dict) -> list[Any]:
    leaves = flatten_as((tuple(args), dict(kwargs)), graph.in_tree, path="arguments")
    for leaf, v in zip(leaves, graph.inputs):
        dtype = leaf.dtype if isinstance(leaf, (Tracer, np.ndarray, np.generic)) else np.asarray(leaf).dtype
        if tuple(leaf.shape if isinstance(leaf, Tracer) else np.shape(leaf)) != v.type.shape or dtype != v.type.dtype:
            raise TraceError(f"graph @{graph.name}: input %{v.name} expects {v.type}", user_location())
    return leaves


# --- graph control flow from user functions -------------------------------------------------------


def cond(pred: Any, true_fn: Callable, false_fn: Callable, *operands: Any) -> Any:
    """``true_fn(*operands)`` if ``pred`` else ``false_fn(*operands)``; one graph op when ``pred``
    is traced (see frontend/control.py). Control flow inside the branches is transformed too."""
    return control.cond(pred, convert(true_fn), convert(false_fn), *operands)


def while_loop(cond_fn: Callable, body_fn: Callable, init: Sequence[Any]) -> list:
    """``while cond_fn(*carry): carry = body_fn(*carry)`` as one graph op; returns the final carry."""
    return control.while_loop(convert(cond_fn), convert(body_fn), init)


def fori_loop(lower: Any, upper: Any, body_fn: Callable, init: Sequence[Any], step: int = 1) -> list:
    """``for i in range(lower, upper, step): carry = body_fn(i, *carry)`` as one graph op."""
    return control.fori_loop(lower, upper, convert(body_fn), init, step=step)
