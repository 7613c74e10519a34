"""Pytrees: nested containers and objects whose leaves are arrays or static Python values.

A TreeDef records the structure. Array leaves (numpy arrays, numpy scalars, traced values,
``ArraySpec``) are *dynamic*: they become graph inputs or outputs. Every other leaf (int, float, bool,
str, None; also functions, classes, dtypes, enums, random generators and other standard-library
objects such as a logger or a lock, which must be hashable) is *static*: it is stored in the
TreeDef itself, so it is part of what a graph was traced for.

Containers are dicts, lists and tuples. Objects are pytrees too, as in JAX:

* a NamedTuple: its fields, rebuilt as the same NamedTuple type;
* a dataclass (frozen or not) and any plain object with a ``__dict__`` (a model whose attributes
  hold its weights, a list of layer objects): its attributes (``vars(obj)``), rebuilt as the same
  class without calling ``__init__`` (``cls.__new__`` and the attributes set back);
* a class given to ``register_pytree(cls, flatten, unflatten)``: what its ``flatten`` returns.

An object's TreeDef is a "dict" of its attributes (or, for a registered class, a "tuple" of its
children) with ``node`` saying how to rebuild it, so everything that only walks trees (the text
IR, checkpoint manifests, the planner's argument roles) sees an ordinary dict or tuple. A class
with neither a ``__dict__`` nor a registration (``__slots__`` only) is a TypeError that says to
register it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

STATIC_TYPES = (bool, int, float, str, type(None))
# static leaves too, compared by == (functions and generators: by identity); and see _standard_library
OPAQUE_STATIC_TYPES: tuple[type, ...] = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    functools.partial,
    type,
    types.ModuleType,
    np.ufunc,
    np.dtype,
    enum.Enum,
    complex,
    bytes,
    range,
    frozenset,
    np.random.Generator,
    np.random.RandomState,
    np.random.BitGenerator,
    np.random.SeedSequence,
)
ARRAY_TYPES: tuple[type, ...] = (np.ndarray, np.generic)  # and the types given to register_array_type


def register_array_type(cls: type) -> None:
    """Treat instances of ``cls`` as array leaves (the tracer registers its traced arrays)."""
    global ARRAY_TYPES
    if cls not in ARRAY_TYPES:
        ARRAY_TYPES = ARRAY_TYPES + (cls,)


@dataclass(frozen=True)
class ArraySpec:
    """Shape and dtype standing in for an array when only its type matters (like jax.ShapeDtypeStruct)."""

    shape: tuple[int, ...]
    dtype: Any

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)


@dataclass(frozen=True)
class WeakScalar(ArraySpec):
    """A Python ``int`` or ``float`` argument traced as a 0-d value of a *weak* type, as JAX traces
    Python scalars: in numpy's promotion (NEP 50) it counts like the Python number it stands for,
    so ``x_f32 * lr`` stays float32. The graph input is int64 / float64; ``graphc.jit`` and
    ``graphc.parallelize`` pass the number itself in every call (``WeakScalar.of(3.5)``)."""

    @staticmethod
    def of(value: int | float) -> WeakScalar:
        return WeakScalar((), np.float64 if type(value) is float else np.int64)


@dataclass(frozen=True)
class NodeType:
    """How an object's TreeDef is rebuilt: its class, how its children were taken ("fields": the
    attributes in ``vars(obj)``; "slots": a slotted dataclass's fields; "namedtuple"; "registered":
    ``register_pytree``'s functions), and for a registered class the ``aux`` its flatten returned."""

    cls: type
    how: str
    aux: Any = None

    @property
    def name(self) -> str:
        return self.cls.__name__

    @property
    def attributes(self) -> bool:
        """Children are attributes the object's methods may set (a frozen dataclass's may not)."""
        if self.how not in ("fields", "slots"):
            return False
        params = getattr(self.cls, "__dataclass_params__", None)
        return not (params is not None and params.frozen)


@dataclass(frozen=True)
class TreeDef:
    """kind is one of "dict", "list", "tuple" (with children), "leaf" (dynamic) or "static" (value).
    ``node``: the dict or tuple is an object (see NodeType), rebuilt as one by ``unflatten``."""

    kind: str
    children: tuple[TreeDef, ...] = ()
    keys: tuple[Any, ...] = ()
    value: Any = None
    node: NodeType | None = None

    @functools.cached_property
    def num_leaves(self) -> int:  # counted once per tree (the printer and the planner ask per subtree)
        if self.kind == "leaf":
            return 1
        return sum(c.num_leaves for c in self.children)

    def __repr__(self) -> str:
        return f"TreeDef({render(self, lambda i: '*')})"


LEAF = TreeDef("leaf")


def is_dynamic_leaf(x: Any, is_leaf: Callable[[Any], bool] | None = None) -> bool:
    if is_leaf is not None and is_leaf(x):
        return True
    return isinstance(x, ARRAY_TYPES) or isinstance(x, ArraySpec)


def flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None, path: str = "") -> tuple[list[Any], TreeDef]:
    """Flatten ``tree`` into its dynamic leaves (in order) and a TreeDef. Raises TypeError on unknown leaves."""
    leaves: list[Any] = []
    treedef = _flatten(tree, leaves, is_leaf, path or "argument", ())
    return leaves, treedef


def _flatten(x: Any, leaves: list, is_leaf, path: str, active: tuple[int, ...]) -> TreeDef:
    if is_dynamic_leaf(x, is_leaf):
        leaves.append(x)
        return LEAF
    if isinstance(x, dict) and type(x) not in _REGISTERED:
        keys = tuple(x.keys())
        return TreeDef("dict", tuple(_flatten(x[k], leaves, is_leaf, f"{path}[{k!r}]", active) for k in keys), keys)
    if type(x) is list:
        return TreeDef("list", tuple(_flatten(v, leaves, is_leaf, f"{path}[{i}]", active) for i, v in enumerate(x)))
    if type(x) is tuple:
        return TreeDef("tuple", tuple(_flatten(v, leaves, is_leaf, f"{path}[{i}]", active) for i, v in enumerate(x)))
    if isinstance(x, STATIC_TYPES) and type(x) not in _REGISTERED:
        return TreeDef("static", value=x)
    node, keys, children = node_parts(x, path)
    if node is None:  # a function, a dtype, a generator, a logger...: static, so part of the cache key
        try:
            hash(x)
        except TypeError:
            raise TypeError(
                f"{path} is a {type(x).__name__}, a static value that is not hashable; graphc keys compiled "
                "graphs by static values (register its class with graphc.register_pytree to say what it holds)"
            ) from None
        return TreeDef("static", value=x)
    if id(x) in active:
        raise TypeError(f"{path} is an object that holds itself (a cycle through its attributes)")
    inner = (*active, id(x))
    named = node.how != "registered"
    kids = tuple(
        _flatten(c, leaves, is_leaf, f"{path}.{k}" if named else f"{path}[{k}]", inner) for k, c in zip(keys, children)
    )
    return TreeDef("dict" if named else "tuple", kids, keys if named else (), node=node)


# --- objects as pytree nodes -------------------------------------------------------------------------

_REGISTERED: dict[type, tuple[Callable[[Any], tuple[Iterable[Any], Any]], Callable[[Any, list[Any]], Any]]] = {}


def register_pytree(
    cls: type,
    flatten: Callable[[Any], tuple[Iterable[Any], Any]],
    unflatten: Callable[[Any, list[Any]], Any],
) -> type:
    """Make instances of ``cls`` pytree nodes, as JAX's ``register_pytree_node`` does.

    ``flatten(obj) -> (children, aux)``: ``children`` is a sequence of pytrees (their arrays become
    graph inputs / outputs, their ints and strings static values), ``aux`` the static rest: it must
    be hashable and comparable with ``==``, and is part of what a graph was traced for (a new
    ``aux`` traces again). ``unflatten(aux, children) -> obj`` rebuilds an object from ``aux`` and
    a list of children in ``flatten``'s order; the children may be traced values, numpy results or
    gradients (None where an input has no gradient), so it should only store them.

    Exact type match (a subclass is registered on its own). Registered classes take precedence over
    the built-in handling of dataclasses, NamedTuples and plain objects; their state is not written
    back after a call (graphc cannot set it). To keep an object static as a whole (a tokenizer, a
    handle: compared with ``==``, by identity unless its class says otherwise), register
    ``lambda obj: ((), obj)`` and ``lambda obj, children: obj``. Returns ``cls``."""
    if not isinstance(cls, type):
        raise TypeError(f"register_pytree: expected a class, got {cls!r}")
    if not callable(flatten) or not callable(unflatten):
        raise TypeError("register_pytree: flatten and unflatten must be functions")
    _REGISTERED[cls] = (flatten, unflatten)
    _HOW.pop(cls, None)
    return cls


_HOW: dict[type, str | None] = {}  # class -> how its instances are taken apart (None: a static value)


def _how(cls: type, x: Any) -> str | None:
    how = _HOW.get(cls, "?")
    if how != "?":
        return how
    if cls in _REGISTERED:
        how = "registered"
    elif issubclass(cls, tuple) and hasattr(cls, "_fields") and hasattr(cls, "_make"):
        how = "namedtuple"
    elif issubclass(cls, OPAQUE_STATIC_TYPES):
        how = None
    elif issubclass(cls, (list, tuple, set)):  # a subclass's __dict__ would not hold its items
        how = "unknown"
    elif _standard_library(cls) and not _namespace(cls):  # a logger, a lock, a path
        how = None
    elif dataclasses.is_dataclass(cls):
        how = "fields" if isinstance(getattr(x, "__dict__", None), dict) else "slots"
    elif isinstance(getattr(x, "__dict__", None), dict):
        how = "fields"
    else:
        how = "unknown"
    _HOW[cls] = how
    return how


def _namespace(cls: type) -> bool:
    """types.SimpleNamespace, argparse.Namespace: standard-library classes that are objects of fields
    (argparse is looked up, not imported: without it there is no Namespace)."""
    argparse = sys.modules.get("argparse")
    return issubclass(cls, types.SimpleNamespace) or (argparse is not None and issubclass(cls, argparse.Namespace))


def _standard_library(cls: type) -> bool:
    """A class of Python's standard library (not a builtin type): its instances are static values,
    not looked inside."""
    top = cls.__module__.split(".")[0]
    return top != "builtins" and (top in sys.stdlib_module_names or top.lstrip("_") in sys.stdlib_module_names)


def node_parts(x: Any, path: str = "argument") -> tuple[NodeType | None, tuple[Any, ...], list[Any]]:
    """(NodeType, child keys, children) of an object; (None, (), []) for a static value (a function,
    a dtype...). TypeError for a class graphc cannot look inside."""
    cls = type(x)
    how = _how(cls, x)
    if how is None:
        return None, (), []
    if how == "fields":
        attrs = vars(x)
        return _node_type(cls, how), tuple(attrs), list(attrs.values())
    if how == "namedtuple":
        return _node_type(cls, how), tuple(cls._fields), list(x)
    if how == "slots":
        names = tuple(f.name for f in dataclasses.fields(x))
        return _node_type(cls, how), names, [getattr(x, n) for n in names]
    if how == "registered":
        children, aux = _REGISTERED[cls][0](x)
        children = list(children)
        try:
            hash(aux)
        except TypeError:
            raise TypeError(
                f"{path}: the flatten registered for {cls.__name__} returned an unhashable aux "
                f"({type(aux).__name__}); aux is part of the cache key and must be hashable"
            ) from None
        return NodeType(cls, how, aux), tuple(range(len(children))), children
    raise TypeError(
        f"{path} has type {cls.__name__}, which graphc cannot look inside: it is not a numpy array, a "
        "dict/list/tuple, a dataclass, a NamedTuple or an object with a __dict__ (int/float/bool/str/None are "
        f"static values); register it with graphc.register_pytree({cls.__name__}, flatten, unflatten), "
        "flatten(obj) -> (children, aux) and unflatten(aux, children) -> obj"
    )


_NODE_TYPES: dict[type, NodeType] = {}


def _node_type(cls: type, how: str) -> NodeType:
    """The NodeType of a class without aux (one per class: flattening a model each call is cheaper)."""
    node = _NODE_TYPES.get(cls)
    if node is None:
        node = _NODE_TYPES[cls] = NodeType(cls, how)
    return node


def _new(cls: type) -> Any:
    """An instance of ``cls`` made without running its ``__init__`` (its attributes are set next)."""
    new: Any = cls.__new__
    return object.__new__(cls) if new is object.__new__ else new(cls)


def rebuild(node: NodeType, keys: tuple[Any, ...], children: list[Any]) -> Any:
    """The object ``node`` describes, with these children (the inverse of ``node_parts``)."""
    if node.how == "registered":
        return _REGISTERED[node.cls][1](node.aux, list(children))
    if node.how == "namedtuple":
        namedtuple: Any = node.cls
        return namedtuple._make(children)
    obj = _new(node.cls)
    if node.how == "fields":
        obj.__dict__.update(zip(keys, children))
    else:
        for k, v in zip(keys, children):
            object.__setattr__(obj, k, v)
    return obj


def unflatten(treedef: TreeDef, leaves: list[Any] | Iterator[Any]) -> Any:
    it = iter(leaves)
    out = _unflatten(treedef, it)
    rest = list(it)
    if rest:
        raise ValueError(f"unflatten: {len(rest)} leaves left over")
    return out


def _unflatten(t: TreeDef, it: Iterator[Any]) -> Any:
    if t.kind == "leaf":
        return next(it)
    if t.kind == "static":
        return t.value
    children = [_unflatten(c, it) for c in t.children]
    if t.node is not None:
        return rebuild(t.node, t.keys, children)
    if t.kind == "dict":
        return dict(zip(t.keys, children))
    if t.kind == "list":
        return children
    return tuple(children)


def flatten_as(tree: Any, treedef: TreeDef, path: str = "argument") -> list[Any]:
    """Flatten ``tree`` following ``treedef``; raise ValueError naming the first place they differ.

    Dict keys are matched by name, so key order does not matter. Static leaves must be equal. A
    Python int or float where the treedef has an array is taken as it is (a ``WeakScalar`` input:
    the graph binds it as a 0-d array).
    """
    leaves: list[Any] = []
    _flatten_as(tree, treedef, leaves, path)
    return leaves


def _flatten_as(x: Any, t: TreeDef, leaves: list, path: str) -> None:
    if t.kind == "leaf":
        if not (is_dynamic_leaf(x) or type(x) in (int, float)):  # a Python number: a weakly typed input
            raise ValueError(f"{path}: expected an array, got {type(x).__name__}")
        leaves.append(x)
        return
    if t.kind == "static":
        # floats by bits: a graph traced with 0.0 is not the one for -0.0 (which Python calls equal)
        if (
            is_dynamic_leaf(x)
            or type(x) is not type(t.value)
            or x != t.value
            or (type(x) is float and x.hex() != t.value.hex())
        ):
            if not (isinstance(x, float) and isinstance(t.value, float) and x != x and t.value != t.value):
                raise ValueError(f"{path}: the graph was traced with the static value {t.value!r}, got {x!r}")
        return
    if t.node is not None:
        _flatten_node_as(x, t, leaves, path)
        return
    if t.kind == "dict":
        if not isinstance(x, dict) or set(x.keys()) != set(t.keys):
            got = _keys_text(x.keys()) if isinstance(x, dict) else type(x).__name__
            raise ValueError(f"{path}: expected a dict with keys {_keys_text(t.keys)}, got {got}")
        for k, c in zip(t.keys, t.children):
            _flatten_as(x[k], c, leaves, f"{path}[{k!r}]")
        return
    want = list if t.kind == "list" else tuple
    if type(x) is not want or len(x) != len(t.children):
        got = f"{type(x).__name__} of length {len(x)}" if isinstance(x, (list, tuple)) else type(x).__name__
        raise ValueError(f"{path}: expected a {t.kind} of length {len(t.children)}, got {got}")
    for i, (v, c) in enumerate(zip(x, t.children)):
        _flatten_as(v, c, leaves, f"{path}[{i}]")


def _flatten_node_as(x: Any, t: TreeDef, leaves: list, path: str) -> None:
    node = t.node
    assert node is not None
    if type(x) is not node.cls:
        raise ValueError(f"{path}: expected a {node.name}, got {type(x).__name__}")
    try:
        got, keys, children = node_parts(x, path)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    assert got is not None
    if got.aux != node.aux:
        raise ValueError(
            f"{path}: the graph was traced with a {node.name} of static data {node.aux!r}, got {got.aux!r}"
        )
    if node.how == "fields" and set(keys) != set(t.keys):
        raise ValueError(f"{path}: expected a {node.name} with attributes {_keys_text(t.keys)}, got {_keys_text(keys)}")
    if len(children) != len(t.children):
        raise ValueError(f"{path}: expected a {node.name} of {len(t.children)} children, got {len(children)}")
    by_key = dict(zip(keys, children))
    named = node.how != "registered"
    for k, c in zip(t.keys if named else range(len(t.children)), t.children):
        _flatten_as(by_key[k], c, leaves, f"{path}.{k}" if named else f"{path}[{k}]")


def _keys_text(keys) -> str:
    return "[" + ", ".join(sorted(map(repr, keys))) + "]"


def leaf_paths(treedef: TreeDef, prefix: tuple = ()) -> list[tuple]:
    """The key path (tuple of dict keys / indices) of every dynamic leaf, in flatten order."""
    if treedef.kind == "leaf":
        return [prefix]
    if treedef.kind == "static":
        return []
    keys = treedef.keys if treedef.kind == "dict" else range(len(treedef.children))
    out: list[tuple] = []
    for k, c in zip(keys, treedef.children):
        out.extend(leaf_paths(c, prefix + (k,)))
    return out


def render(treedef: TreeDef, leaf: Callable[[int], str], static: Callable[[Any], str] = repr) -> str:
    """One-line rendering, leaf(i) giving the text of the i-th dynamic leaf."""
    counter = iter(range(treedef.num_leaves))

    def go(t: TreeDef) -> str:
        if t.kind == "leaf":
            return leaf(next(counter))
        if t.kind == "static":
            return static(t.value)
        parts = [go(c) for c in t.children]
        if t.node is not None and t.kind == "dict":
            return t.node.name + "(" + ", ".join(f"{k}={p}" for k, p in zip(t.keys, parts)) + ")"
        if t.node is not None:
            return t.node.name + "(" + ", ".join(parts) + ")"
        if t.kind == "dict":
            return "{" + ", ".join(f"{static(k)}: {p}" for k, p in zip(t.keys, parts)) + "}"
        if t.kind == "list":
            return "[" + ", ".join(parts) + "]"
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"

    return go(treedef)


def tree_map(fn: Callable, tree: Any, *rest: Any) -> Any:
    """Apply ``fn`` to corresponding array leaves of ``tree`` and ``rest`` (same structure); static
    leaves of ``tree`` are kept, and a None leaf in any of the trees (no gradient) stays None."""
    leaves, treedef = flatten(tree, is_leaf=lambda x: x is None)
    others = [_flatten_like(r, treedef) for r in rest]
    out = []
    for i, leaf in enumerate(leaves):
        args = [leaf] + [o[i] for o in others]
        out.append(None if any(a is None for a in args) else fn(*args))
    return unflatten(treedef, out)


def _flatten_like(tree: Any, treedef: TreeDef) -> list[Any]:
    leaves, other = flatten(tree, is_leaf=lambda x: x is None)
    if _shape_of(other) != _shape_of(treedef):
        raise ValueError(f"tree_map: trees differ in structure: {treedef} vs {other}")
    return leaves


def _shape_of(t: TreeDef) -> Any:
    if t.kind in ("leaf", "static"):
        return "*"
    return (t.kind, tuple(t.keys), tuple(_shape_of(c) for c in t.children), t.node)


def call_arguments(in_tree: TreeDef) -> list[tuple[TreeDef, int]]:
    """A traced call's arguments, each with the index of its first leaf: the positional ones, then
    the keyword ones (``in_tree`` is the tree of ``(args, kwargs)``)."""
    if in_tree.kind != "tuple" or not in_tree.children:
        return [(in_tree, 0)]
    args_tree = in_tree.children[0]
    args = top_level(args_tree)
    if len(in_tree.children) > 1:
        first = args_tree.num_leaves
        for c in in_tree.children[1].children:
            args.append((c, first))
            first += c.num_leaves
    return args


def top_level(t: TreeDef) -> list[tuple[TreeDef, int]]:
    """The elements of a tuple or list tree, each with the index of its first leaf (a tree of
    another kind is one element): a function's positional arguments, a step's results."""
    if t.kind not in ("tuple", "list"):
        return [(t, 0)]
    out, first = [], 0
    for c in t.children:
        out.append((c, first))
        first += c.num_leaves
    return out


# --- state written into argument objects ---------------------------------------------------------


@dataclass(frozen=True)
class StatePlace:
    """One place a traced function wrote into an argument object: ``path`` from the call's
    ``(args, kwargs)`` (0 or 1, then argument index or keyword name, then attribute names, list
    indices and dict keys), the graph input the place held when the call began (None if it held
    a static value, or nothing), and whether that array was written in place (``x[i] = v``: the
    new value is copied into the caller's array, which other names may share) rather than replaced."""

    path: tuple[Any, ...]
    input_leaf: int | None = None
    in_place: bool = False

    def text(self, names: list[str] | None = None) -> str:
        head = self.path[1] if names is None or self.path[0] != 0 or self.path[1] >= len(names) else names[self.path[1]]
        return str(head) + "".join(f".{k}" if isinstance(k, str) else f"[{k!r}]" for k in self.path[2:])


class StateUpdate:
    """What a graph returns when its function wrote into its argument objects (``self.cache[...] =
    k``, ``self.state = ...``): the function's ``result`` and the new ``values`` of the ``places``
    it wrote. ``apply(*args, **kwargs)`` stores them into the objects of that call, as numpy's
    writes would have changed them; graphc.jit and graphc.parallelize do so after every call and
    return only the result."""

    __slots__ = ("places", "result", "values")

    def __init__(self, result: Any, values: list[Any], places: tuple[StatePlace, ...]):
        self.result = result
        self.values = list(values)
        self.places = places

    def apply(self, *args: Any, **kwargs: Any) -> Any:
        """Store the new values into the call's argument objects; returns the result."""
        return self.apply_to(args, kwargs)

    def apply_to(self, args: tuple, kwargs: dict) -> Any:
        root = (args, kwargs)
        for place, value in zip(self.places, self.values):
            store_at(root, place.path, value, place.in_place)
        return self.result

    def __repr__(self) -> str:
        return f"StateUpdate(result={self.result!r}, writes={[p.text() for p in self.places]})"


def _child(x: Any, key: Any) -> Any:
    if isinstance(x, (dict, list)) or type(x) is tuple:
        return x[key]
    return getattr(x, key)


def store_at(root: Any, path: tuple[Any, ...], value: Any, in_place: bool = False) -> None:
    """Set the place ``path`` leads to from ``root``: an attribute, a list item or a dict entry;
    ``in_place``: copy ``value`` into the array there (when it is a writable one of its shape and
    dtype), as numpy's ``x[i] = v`` changes the array every name of it sees."""
    parent = root
    for key in path[:-1]:
        parent = _child(parent, key)
    if in_place and isinstance(value, (np.ndarray, np.generic)):  # (a ShardedArray kept on the devices is set)
        current = _child(parent, path[-1])
        if (
            type(current) is np.ndarray
            and current.flags.writeable
            and current.shape == np.shape(value)
            and current.dtype == np.asarray(value).dtype
        ):
            np.copyto(current, value)
            return
    if isinstance(value, np.ndarray) and not value.flags.writeable:  # a constant of the graph
        value = value.copy()
    if isinstance(parent, (dict, list)):
        parent[path[-1]] = value
    else:
        setattr(parent, path[-1], value)


register_pytree(
    StateUpdate,
    lambda u: ((u.result, *u.values), u.places),
    lambda places, children: StateUpdate(children[0], children[1:], places),
)


def static_argnames(kwargs: dict) -> tuple[str, ...]:
    """Keyword arguments of an example that hold no arrays (numbers, strings, None): static to jit
    and parallelize (the CLI's examples, the cluster benchmark's). A numpy Generator is not
    static: jit and parallelize pass its state as an array (graphc/frontend/random.py), where a
    static one would draw numpy's numbers once, as constants of the graph."""
    return tuple(k for k, v in kwargs.items() if not _has_arrays(v))


def _has_arrays(v: Any) -> bool:
    if isinstance(v, np.random.Generator):
        return True
    try:
        leaves, _ = flatten(v)
    except TypeError:
        return False
    return bool(leaves)
