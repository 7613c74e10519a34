"""Text form of the Graph IR: a printer and a lark parser over one grammar.

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
nested lists, others as zlib-compressed base64 of their little-endian bytes.
``str(parse(str(g))) == str(g)`` for every graph.
"""

from __future__ import annotations

import base64
import functools
import json
import zlib
from typing import Any

import numpy as np
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from graphc import dtypes
from graphc.errors import ParseError, ShapeError, SourceLoc
from graphc.ir import PARTS, Graph, Node, Region, TensorType, Value
from graphc.ops import REGISTRY
from graphc.pytree import TreeDef

GRAMMAR = r"""
start: "graph" GRAPH_NAME "(" [arg ("," arg)* [","]] ")" "{" node* "return" tree "}"

arg: tree | IDENT "=" tree

node: [VALUE ("," VALUE)* "="] IDENT "(" [operand ("," operand)*] ")" ":" types [loc] [part] [regions]
types: type ("," type)* | "(" ")"
regions: "{" region+ "}"
region: "(" [region_arg ("," region_arg)*] ")" "{" node* "yield" [VALUE ("," VALUE)*] "}"
region_arg: VALUE ":" type
operand: VALUE | IDENT "=" tree
loc: "loc" "(" STRING ":" INT ")"
part: "part" "(" IDENT ")"
type: IDENT "[" [INT ("," INT)*] "]"

?tree: dict | list | tuple | input | ref | literal | array
dict: "{" [pair ("," pair)* [","]] "}"
pair: literal ":" tree
list: "[" [tree ("," tree)* [","]] "]"
tuple: "(" ")" | "(" tree "," [tree ("," tree)* [","]] ")"
input: VALUE ":" type
ref: VALUE
literal: STRING | INT | FLOAT | IDENT
array: "array" "<" type ">" (list | literal)

GRAPH_NAME: /@[A-Za-z_][A-Za-z0-9_.]*/
VALUE: /%[A-Za-z0-9_.]+/
IDENT: /[A-Za-z_][A-Za-z0-9_]*/
FLOAT.2: /-?(\d+\.\d*([eE][+-]?\d+)?|\d+[eE][+-]?\d+)/ | /-(inf|nan)\b/
INT: /-?\d+/
STRING: /"(\\.|[^"\\])*"/
COMMENT: /#[^\n]*/

%import common.WS
%ignore WS
%ignore COMMENT
"""

SMALL_ARRAY = 16  # constants with at most this many finite elements print as nested lists

# --- printing ------------------------------------------------------------------------------------


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
    head = f"array<{TensorType(a.shape, a.dtype)}>"
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


# --- parsing -------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    return Lark(GRAMMAR, parser="lalr", propagate_positions=True, maybe_placeholders=True)


_TOKEN_NAMES = {
    "VALUE": "a value (%name)",
    "IDENT": "a name",
    "INT": "an integer",
    "FLOAT": "a float",
    "STRING": "a string",
    "GRAPH_NAME": "a graph name (@name)",
    "$END": "end of input",
}


def _describe_expected(parser: Lark, names: set[str]) -> str:
    out = []
    for name in sorted(names):
        if name in _TOKEN_NAMES:
            out.append(_TOKEN_NAMES[name])
            continue
        term = next((t for t in parser.terminals if t.name == name), None)
        if term is not None and term.pattern.type == "str":
            out.append(repr(term.pattern.value))
        else:
            out.append(name)
    return ", ".join(out)


def _error_at(item: Any, message: str) -> ParseError:
    line = getattr(item, "line", None)
    column = getattr(item, "column", None)
    if isinstance(item, Tree) and item.meta and not item.meta.empty:
        line, column = item.meta.line, item.meta.column
    return ParseError(message, line, column)


class _Builder:
    """Walks the parse tree in order, defining values and building nodes."""

    def __init__(self):
        self.env: dict[str, Value] = {}  # the values visible in the current block
        self.defined: set[str] = set()  # every name defined anywhere (names are unique)
        self.outer: list[dict[str, Value]] = []  # enclosing blocks' scopes (for error messages)
        self.inputs: list[Value] = []

    # trees of the signature / results / attributes
    def tree(self, t: Any, role: str) -> tuple[TreeDef, list[Value]]:
        """role: 'input' (signature: leaves declare inputs), 'ref' (return: leaves use values),
        'attr' (no values at all). Returns the TreeDef and the dynamic leaves."""
        leaves: list[Value] = []
        treedef = self._tree(t, role, leaves)
        return treedef, leaves

    def _tree(self, t: Any, role: str, leaves: list[Value]) -> TreeDef:
        kind = t.data
        if kind == "literal":
            return TreeDef("static", value=self.literal(t.children[0]))
        if kind == "input":
            if role != "input":
                raise _error_at(t, "a typed value declaration is only allowed in the graph signature")
            tok, ty = t.children
            v = Value(self.type(ty), None, 0, str(tok)[1:])
            self.define(tok, v)
            self.inputs.append(v)
            leaves.append(v)
            return TreeDef("leaf")
        if kind == "ref":
            if role != "ref":
                raise _error_at(t, "a value reference is not allowed here" + (
                    " (graph inputs need a type: %name : f32[...])" if role == "input" else ""))
            leaves.append(self.value(t.children[0]))
            return TreeDef("leaf")
        if kind == "array":
            raise _error_at(t, "array literals are only allowed as attributes")
        if kind == "dict":
            pairs = [c for c in t.children if c is not None]
            keys = tuple(self.literal(p.children[0].children[0]) for p in pairs)
            if len(set(keys)) != len(keys):
                raise _error_at(t, "duplicate dict key")
            return TreeDef("dict", tuple(self._tree(p.children[1], role, leaves) for p in pairs), keys)
        kids = tuple(self._tree(c, role, leaves) for c in t.children if c is not None)
        return TreeDef("list" if kind == "list" else "tuple", kids)

    def literal(self, tok: Token) -> Any:
        text = str(tok)
        if tok.type == "INT":
            return int(text)
        if tok.type == "FLOAT":
            return float(text)
        if tok.type == "STRING":
            try:
                return json.loads(text)
            except json.JSONDecodeError as exc:
                raise _error_at(tok, f"bad string literal: {exc.msg}") from None
        special = {"true": True, "false": False, "none": None, "inf": float("inf"), "nan": float("nan")}
        if text in special:
            return special[text]
        if text in dtypes.BY_SHORT_NAME:
            return dtypes.BY_SHORT_NAME[text]
        raise _error_at(tok, f"unknown literal {text!r} (expected a number, string, true, false, none or a dtype)")

    def attr(self, t: Any) -> Any:
        if isinstance(t, Token):
            return self.literal(t)
        if t.data == "literal":
            return self.literal(t.children[0])
        if t.data == "array":
            return self.array(t)
        if t.data in ("tuple", "list"):
            return tuple(self.attr(c) for c in t.children if c is not None)
        raise _error_at(t, f"{t.data} is not allowed as an attribute value")

    def array(self, t: Tree) -> np.ndarray:
        ty, body = t.children
        tt = self.type(ty)
        if body.data == "literal" and body.children[0].type == "STRING":
            body = body.children[0]
            try:
                raw = zlib.decompress(base64.b64decode(json.loads(str(body)), validate=True))
            except (ValueError, zlib.error) as exc:
                raise _error_at(body, f"bad array data: {exc}") from None
            if len(raw) != tt.nbytes:
                raise _error_at(body, f"array data has {len(raw)} bytes, {tt} needs {tt.nbytes}")
            arr = np.frombuffer(raw, dtype=tt.dtype.newbyteorder("<")).astype(tt.dtype).reshape(tt.shape)
        else:
            data = self._nested_literal(body)
            try:
                arr = _array_from_list(data, tt.dtype, tt.shape)
            except (ValueError, OverflowError) as exc:
                raise _error_at(body, f"array literal does not match {tt}: {exc}") from None
        arr = arr.copy()
        arr.setflags(write=False)
        return arr

    def _nested_literal(self, t: Any) -> Any:
        if t.data == "literal":
            return self.literal(t.children[0])
        if t.data == "list":
            return [self._nested_literal(c) for c in t.children if c is not None]
        raise _error_at(t, "array literal elements must be numbers or nested lists")

    def type(self, t: Tree) -> TensorType:
        name, *dims = t.children
        if str(name) not in dtypes.BY_SHORT_NAME:
            raise _error_at(name, f"unknown dtype {str(name)!r} (expected one of {', '.join(dtypes.BY_SHORT_NAME)})")
        return TensorType(tuple(int(d) for d in dims if d is not None), dtypes.BY_SHORT_NAME[str(name)])

    def define(self, tok: Token, value: Value) -> None:
        name = str(tok)[1:]
        if name in self.defined:
            raise _error_at(tok, f"value %{name} is defined twice")
        self.defined.add(name)
        self.env[name] = value

    def value(self, tok: Token) -> Value:
        name = str(tok)[1:]
        if name not in self.env:
            if any(name in scope for scope in self.outer):
                raise _error_at(tok, f"value %{name} is defined outside this region "
                                     "(regions take every value they use as an operand)")
            raise _error_at(tok, f"value %{name} is used before it is defined")
        return self.env[name]

    def region(self, t: Tree) -> Region:
        self.outer.append(self.env)
        self.env = {}
        try:
            args = [c for c in t.children if isinstance(c, Tree) and c.data == "region_arg"]
            inputs = []
            for a in args:
                tok, ty = a.children
                v = Value(self.type(ty), None, 0, None)
                self.define(tok, v)
                inputs.append(v)
            nodes = [self.node(c) for c in t.children if isinstance(c, Tree) and c.data == "node"]
            outputs = [self.value(c) for c in t.children if isinstance(c, Token) and c.type == "VALUE"]
            return Region(inputs, nodes, outputs)
        finally:
            self.env = self.outer.pop()

    def node(self, t: Tree) -> Node:
        results = [c for c in t.children if isinstance(c, Token) and c.type == "VALUE"]
        opname = next(c for c in t.children if isinstance(c, Token) and c.type == "IDENT")
        operands = [c for c in t.children if isinstance(c, Tree) and c.data == "operand"]
        types_t = next(c for c in t.children if isinstance(c, Tree) and c.data == "types")
        types = [self.type(c) for c in types_t.children if isinstance(c, Tree)]
        regions_t = next((c for c in t.children if isinstance(c, Tree) and c.data == "regions"), None)
        regions = [self.region(r) for r in regions_t.children] if regions_t is not None else []
        loc_tree = next((c for c in t.children if isinstance(c, Tree) and c.data == "loc"), None)
        part_tree = next((c for c in t.children if isinstance(c, Tree) and c.data == "part"), None)
        op = REGISTRY.get(str(opname))
        if op is None:
            raise _error_at(opname, f"unknown op {str(opname)!r}")
        inputs, attrs = [], {}
        for operand in operands:
            first = operand.children[0]
            if first.type == "VALUE":
                if attrs:
                    raise _error_at(first, "operands must come before attributes")
                inputs.append(self.value(first))
            else:
                if str(first) in attrs:
                    raise _error_at(first, f"attribute {first} given twice")
                attrs[str(first)] = self.attr(operand.children[1])
        if len(results) != len(types):
            raise _error_at(t, f"{len(results)} results but {len(types)} result types")
        try:
            expected = op.infer_types(tuple(v.type for v in inputs), attrs, tuple(regions))
        except ShapeError as exc:
            raise _error_at(opname, str(exc)) from None
        if tuple(types) != expected:
            raise _error_at(opname, f"{op.name} gives {', '.join(map(str, expected))}, "
                                    f"but the result types say {', '.join(map(str, types))}")
        loc = None
        if loc_tree is not None:
            file_tok, line_tok = loc_tree.children
            loc = SourceLoc(json.loads(str(file_tok)), int(line_tok))
        part = None
        if part_tree is not None:
            part = str(part_tree.children[0])
            if part not in PARTS:
                raise _error_at(part_tree.children[0], f"part must be one of {', '.join(PARTS)}, got {part!r}")
        node = Node(op, inputs, attrs, types, loc, part, regions)
        for tok, out in zip(results, node.outputs):
            self.define(tok, out)
        return node


def _end_position(text: str) -> tuple[int, int]:
    lines = text.split("\n")
    return len(lines), len(lines[-1]) + 1


def parse(text: str) -> Graph:
    """Parse the text IR. Raises ParseError with line and column on malformed input."""
    parser = _parser()
    try:
        tree = parser.parse(text)
    except UnexpectedToken as exc:
        expected = _describe_expected(parser, set(getattr(exc, "accepts", None) or exc.expected))
        if exc.token.type == "$END":
            line, column = _end_position(text)
            raise ParseError(f"unexpected end of input; expected {expected}", line, column) from None
        raise ParseError(f"unexpected {str(exc.token)!r}; expected {expected}", exc.line, exc.column) from None
    except UnexpectedCharacters as exc:
        raise ParseError(f"unexpected character {text[exc.pos_in_stream]!r}", exc.line, exc.column) from None
    except UnexpectedEOF as exc:
        line, column = _end_position(text)
        raise ParseError(f"unexpected end of input; expected {_describe_expected(parser, set(exc.expected))}",
                         line, column) from None
    except UnexpectedInput as exc:  # pragma: no cover - other lark errors
        raise ParseError(str(exc), exc.line, exc.column) from None

    children = [c for c in tree.children if c is not None]
    name_tok = children[0]
    args = [c for c in children if isinstance(c, Tree) and c.data == "arg"]
    nodes_t = [c for c in children if isinstance(c, Tree) and c.data == "node"]
    ret_t = children[-1]
    b = _Builder()
    pos_trees, kw_trees, kw_keys = [], [], []
    for arg in args:
        if len(arg.children) == 2:
            key, sub = arg.children
            if str(key) in kw_keys:
                raise _error_at(key, f"keyword argument {key} given twice")
            kw_keys.append(str(key))
            kw_trees.append(b.tree(sub, "input")[0])
        else:
            if kw_keys:
                raise _error_at(arg, "positional argument after keyword arguments")
            pos_trees.append(b.tree(arg.children[0], "input")[0])
    in_tree = TreeDef("tuple", (TreeDef("tuple", tuple(pos_trees)), TreeDef("dict", tuple(kw_trees), tuple(kw_keys))))
    nodes = [b.node(t) for t in nodes_t]
    out_tree, outputs = b.tree(ret_t, "ref")
    graph = Graph(str(name_tok)[1:], b.inputs, nodes, outputs, in_tree, out_tree)
    return graph.verify()
