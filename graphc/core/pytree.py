"""Pytrees: nested dict / list / tuple containers whose leaves are arrays or static Python values.

A TreeDef records the container structure. Array leaves (numpy arrays, numpy scalars, traced values,
``ArraySpec``) are *dynamic*: they become graph inputs or outputs. Every other leaf (int, float, bool,
str, None) is *static*: it is stored in the TreeDef itself, so it is part of what a graph was traced for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

STATIC_TYPES = (bool, int, float, str, type(None))
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
class TreeDef:
    """kind is one of "dict", "list", "tuple" (with children), "leaf" (dynamic) or "static" (value)."""

    kind: str
    children: tuple[TreeDef, ...] = ()
    keys: tuple[Any, ...] = ()
    value: Any = None

    @property
    def num_leaves(self) -> int:
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
    treedef = _flatten(tree, leaves, is_leaf, path or "argument")
    return leaves, treedef


def _flatten(x: Any, leaves: list, is_leaf, path: str) -> TreeDef:
    if is_dynamic_leaf(x, is_leaf):
        leaves.append(x)
        return LEAF
    if isinstance(x, dict):
        keys = tuple(x.keys())
        return TreeDef("dict", tuple(_flatten(x[k], leaves, is_leaf, f"{path}[{k!r}]") for k in keys), keys)
    if type(x) is list:
        return TreeDef("list", tuple(_flatten(v, leaves, is_leaf, f"{path}[{i}]") for i, v in enumerate(x)))
    if type(x) is tuple:
        return TreeDef("tuple", tuple(_flatten(v, leaves, is_leaf, f"{path}[{i}]") for i, v in enumerate(x)))
    if isinstance(x, STATIC_TYPES):
        return TreeDef("static", value=x)
    raise TypeError(
        f"{path} has type {type(x).__name__}; graphc accepts numpy arrays, numpy scalars, "
        "dict/list/tuple containers of them, and int/float/bool/str/None as static values"
    )


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
    return (t.kind, tuple(t.keys), tuple(_shape_of(c) for c in t.children))


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
