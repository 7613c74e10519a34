"""The text form of the Graph IR: ``print_graph(g)`` (also ``str(g)``).

    graph @mlp(
      {"b1": %params.b1 : f32[128], "w1": %params.w1 : f32[784,128]},
      %x : f32[32,784],
      training=false,
    ) {
      %0 = matmul(%x, %params.w1) : f32[32,128] loc("models/mlp.py":12)
      %1 = add(%0, %params.b1) : f32[32,128] loc("models/mlp.py":12)
      return {"logits": %1}
    }

The header is the traced function's signature: positional arguments, then ``name=`` keyword
arguments, each a pytree whose array leaves declare the graph inputs (``%name : type``) and whose
other leaves are the static values it was traced with. ``return`` gives the result pytree.
Attributes follow the operands as ``name=value``. Constants are bit-exact: small finite arrays as
nested lists, others as zlib-compressed base64 of their little-endian bytes. The grammar that reads
this text back is in graphc/textir.py; ``str(parse(str(g))) == str(g)`` for every graph.
"""

from __future__ import annotations

import base64
import json
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np

from graphc.core import dtypes
from graphc.core.pytree import TreeDef

if TYPE_CHECKING:
    from graphc.core.ir import Graph, Node, Value

SMALL_ARRAY = 16  # constants with at most this many finite elements print as nested lists

def format_float(x: float) -> str:
    if x != x:
        return "nan"
    if x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return repr(float(x))


def format_literal(v: Any) -> str:
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return format_float(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, np.dtype):
        return dtypes.short_name(v)
    if isinstance(v, np.ndarray):
        return format_array(v)
    if isinstance(v, tuple):
        inner = ", ".join(format_literal(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    raise TypeError(f"cannot print attribute value of type {type(v).__name__}")


def _scalar_text(x: np.generic) -> str:
    if x.dtype.kind == "b":
        return "true" if x else "false"
    if x.dtype.kind in "iu":
        return str(int(x))
    text = str(x) if x.dtype != np.float64 else repr(float(x))
    return text if any(c in text for c in ".en") else text + ".0"


def _nested(a: np.ndarray) -> str:
    if a.ndim == 0:
        return _scalar_text(a[()])
    return "[" + ", ".join(_nested(x) for x in a) + "]"


def _small_form(a: np.ndarray) -> str | None:
    if a.size > SMALL_ARRAY or (a.dtype.kind == "f" and not np.isfinite(a).all()):
        return None
    text = _nested(a)
    back = _array_from_list(json.loads(text.replace("true", "1").replace("false", "0")), a.dtype, a.shape)
    return text if back.tobytes() == a.tobytes() else None


def format_array(a: np.ndarray) -> str:
    head = f"array<{dtypes.short_name(dtypes.canonical(a.dtype))}[{','.join(map(str, a.shape))}]>"
    small = _small_form(a)
    if small is not None:
        return head + small
    raw = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()
    return head + '"' + base64.b64encode(zlib.compress(raw, 6)).decode("ascii") + '"'


def _array_from_list(data: Any, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    arr = np.array(data, dtype=dtype)
    if arr.size == 0 and 0 in shape:  # "[]" says nothing about the other dims of an empty array
        arr = arr.reshape(shape)
    if arr.shape != shape:
        raise ValueError(f"array literal has shape {arr.shape}, its type says {shape}")
    return arr


def format_tree(t: TreeDef, leaf, indent: str, width: int = 96) -> str:
    """Pretty-print a pytree, ``leaf(i)`` giving the text of the i-th dynamic leaf: one line if it
    fits in ``width``, else one child per line."""
    leaves = [leaf(i) for i in range(t.num_leaves)]

    def one_line(t: TreeDef, first: int) -> str:
        if t.kind == "leaf":
            return leaves[first]
        if t.kind == "static":
            return format_literal(t.value)
        parts = []
        for c in t.children:
            parts.append(one_line(c, first))
            first += c.num_leaves
        if t.kind == "dict":
            return "{" + ", ".join(f"{format_literal(k)}: {p}" for k, p in zip(t.keys, parts)) + "}"
        if t.kind == "list":
            return "[" + ", ".join(parts) + "]"
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"

    def go(t: TreeDef, first: int, ind: str) -> str:
        text = one_line(t, first)
        if len(ind) + len(text) <= width or not t.children:
            return text
        inner = ind + "  "
        keys = t.keys if t.kind == "dict" else [None] * len(t.children)
        parts = []
        for k, c in zip(keys, t.children):
            label = f"{format_literal(k)}: " if t.kind == "dict" else ""
            parts.append(f"{inner}{label}{go(c, first, inner)},\n")
            first += c.num_leaves
        open_, close = {"dict": "{}", "list": "[]", "tuple": "()"}[t.kind]
        return open_ + "\n" + "".join(parts) + ind + close

    return go(t, 0, indent)


def print_graph(g: Graph) -> str:
    names = g.value_names()
    args_t, kwargs_t = g.in_tree.children
    lines = [f"graph @{g.name}("]
    offset = 0

    def leaf_printer(base: int):
        return lambda i: f"%{names[g.inputs[base + i]]} : {g.inputs[base + i].type}"

    for child in args_t.children:
        lines.append("  " + format_tree(child, leaf_printer(offset), "  ") + ",")
        offset += child.num_leaves
    for key, child in zip(kwargs_t.keys, kwargs_t.children):
        lines.append(f"  {key}=" + format_tree(child, leaf_printer(offset), "  ") + ",")
        offset += child.num_leaves
    if len(lines) == 1:
        lines[0] += ") {"
    else:
        lines.append(") {")
    for node in g.nodes:
        lines.extend(format_node(node, names, "  "))
    ret = format_tree(g.out_tree, lambda i: "%" + names[g.outputs[i]], "  ")
    lines.append(f"  return {ret}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def format_node(node: Node, names: dict[Value, str], indent: str = "") -> list[str]:
    """The node's line, followed by its regions (indented) if it has any."""
    results = ", ".join("%" + names[o] for o in node.outputs)
    operands = ["%" + names[v] for v in node.inputs]
    operands += [f"{k}={format_literal(v)}" for k, v in node.attrs.items()]
    types = ", ".join(str(o.type) for o in node.outputs) or "()"
    loc = f' loc({json.dumps(node.loc.file)}:{node.loc.line})' if node.loc else ""
    part = f" part({node.part})" if node.part else ""
    head = f"{results} = " if node.outputs else ""
    line = f"{indent}{head}{node.op.name}({', '.join(operands)}) : {types}{loc}{part}"
    if not node.regions:
        return [line]
    lines = [line + " {"]
    for region in node.regions:
        args = ", ".join(f"%{names[v]} : {v.type}" for v in region.inputs)
        lines.append(f"{indent}  ({args}) {{")
        for inner in region.nodes:
            lines.extend(format_node(inner, names, indent + "    "))
        outs = ", ".join("%" + names[v] for v in region.outputs)
        lines.append(f"{indent}    yield {outs}".rstrip())
        lines.append(f"{indent}  }}")
    lines.append(f"{indent}}}")
    return lines
