"""Reading the text form of the Graph IR back: a lark parser for what graphc/core/ir.py prints.

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

A ``.gir`` file is data: it is parsed and verified, never run. Bad input of any kind is a
``ParseError`` with its line and column (and the file, from ``load``); a string ends on the line it
starts, and a constant is decompressed only up to the bytes its type declares.
"""

from __future__ import annotations

import base64
import functools
import json
import sys
import zlib
from typing import Any

import numpy as np
from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from graphc.core import dtypes
from graphc.core.errors import ParseError, ShapeError, SourceLoc, VerifyError
from graphc.core.ir import PARTS, Graph, Node, Region, TensorType, Value, format_node, format_tree, print_graph  # noqa: F401  (the printer, re-exported)
from graphc.core.literals import SMALL_ARRAY, array_from_list, format_array, format_literal  # noqa: F401
from graphc.core.pytree import TreeDef
from graphc.ops import REGISTRY

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
STRING: /"[^"\\\n]*(?:\\.[^"\\\n]*)*"/
COMMENT: /#[^\n]*/

%import common.WS
%ignore WS
%ignore COMMENT
"""

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
                raise _error_at(
                    t,
                    "a value reference is not allowed here"
                    + (" (graph inputs need a type: %name : f32[...])" if role == "input" else ""),
                )
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
        ty, body = _children(t)
        tt = self.type(ty)
        if body.data == "literal" and body.children[0].type == "STRING":
            body = body.children[0]
            raw = _decompress_exactly(body, self.literal(body), tt)
            arr = np.frombuffer(raw, dtype=tt.dtype.newbyteorder("<")).astype(tt.dtype).reshape(tt.shape)
        else:
            data = self._nested_literal(body)
            try:
                arr = array_from_list(data, tt.dtype, tt.shape)
            except (ValueError, OverflowError, TypeError) as exc:
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
        name, *dims = _children(t)
        if str(name) not in dtypes.BY_SHORT_NAME:
            raise _error_at(name, f"unknown dtype {str(name)!r} (expected one of {', '.join(dtypes.BY_SHORT_NAME)})")
        for d in dims:
            if d is not None and int(d) < 0:
                raise _error_at(d, f"dimension {d} is negative (expected a size >= 0)")
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
                raise _error_at(
                    tok,
                    f"value %{name} is defined outside this region (regions take every value they use as an operand)",
                )
            raise _error_at(tok, f"value %{name} is used before it is defined")
        return self.env[name]

    def region(self, t: Tree) -> Region:
        self.outer.append(self.env)
        self.env = {}
        try:
            args = [c for c in t.children if isinstance(c, Tree) and c.data == "region_arg"]
            inputs = []
            for a in args:
                tok, ty = _children(a)
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
        inputs: list[Value] = []
        attrs: dict[str, Any] = {}
        for operand in operands:
            first = _children(operand)[0]
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
        except (KeyError, AttributeError, ArithmeticError) as exc:  # an op's rule meets attributes no trace makes
            raise _error_at(opname, f"{op.name}: invalid attributes ({type(exc).__name__}: {exc})") from None
        if tuple(types) != expected:
            raise _error_at(
                opname,
                f"{op.name} gives {', '.join(map(str, expected))}, "
                f"but the result types say {', '.join(map(str, types))}",
            )
        loc = None
        if loc_tree is not None:
            file_tok, line_tok = _children(loc_tree)
            loc = SourceLoc(self.literal(file_tok), int(line_tok))
        part = None
        if part_tree is not None:
            part = str(part_tree.children[0])
            if part not in PARTS:
                raise _error_at(part_tree.children[0], f"part must be one of {', '.join(PARTS)}, got {part!r}")
        node = Node(op, inputs, attrs, types, loc, part, regions)
        for tok, out in zip(results, node.outputs):
            self.define(tok, out)
        return node


def _decompress_exactly(tok: Token, text: str, tt: TensorType) -> bytes:
    """The bytes of a constant of type ``tt`` from its zlib-compressed base64 ``text``. At most
    ``tt.nbytes`` (plus one, to see that there is more) are decompressed, so a small declared type
    cannot make a large allocation (a decompression bomb); data of any other size is an error."""
    try:
        packed = base64.b64decode(text, validate=True)
    except ValueError as exc:
        raise _error_at(tok, f"bad array data: not base64 ({exc})") from None
    stream = zlib.decompressobj()
    try:
        # one byte more than declared shows there is more; a max_length of 0 would mean no limit
        raw = stream.decompress(packed, min(tt.nbytes + 1, sys.maxsize))
    except zlib.error as exc:
        raise _error_at(tok, f"bad array data: {exc}") from None
    if len(raw) > tt.nbytes:
        raise _error_at(tok, f"bad array data: it holds more than the {tt.nbytes} bytes {tt} needs")
    if not stream.eof:
        raise _error_at(tok, f"bad array data: the compressed data is truncated ({len(raw)} of {tt.nbytes} bytes)")
    if stream.unused_data:
        raise _error_at(tok, f"bad array data: {len(stream.unused_data)} bytes follow the compressed data")
    if len(raw) != tt.nbytes:
        raise _error_at(tok, f"bad array data: it holds {len(raw)} bytes, {tt} needs {tt.nbytes}")
    return raw


def _children(t: Tree) -> list[Any]:
    """A parse tree node's children: sub-trees and tokens, as the grammar says which is where."""
    return list(t.children)


def _end_position(text: str) -> tuple[int, int]:
    lines = text.split("\n")
    return len(lines), len(lines[-1]) + 1


def parse(text: str, source: str | None = None) -> Graph:
    """Parse the text IR and verify the graph. Malformed input of any kind raises ParseError with
    the line and column (after ``source``, the file the text came from, when given); a graph that
    parses but breaks an IR invariant raises VerifyError."""
    try:
        return _parse(text)
    except ParseError as exc:
        if source is None:
            raise
        raise ParseError(exc.message, exc.line, exc.column, source) from None
    except VerifyError as exc:
        if source is None:
            raise
        raise VerifyError(f"{source}: {exc}") from None
    except RecursionError:
        raise ParseError("brackets are nested too deeply", None, None, source) from None


def load(path: str) -> Graph:
    """The graph in the ``.gir`` file at ``path``: read as UTF-8, parsed and verified (never run).
    Errors name the file, and the line and column."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ParseError(f"cannot read the IR file ({exc.strerror})", None, None, path) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = _position(data, exc.start)
        raise ParseError(f"not UTF-8 text (byte 0x{data[exc.start]:02x})", line, column, path) from None
    return parse(text, path)


def _position(data: bytes, offset: int) -> tuple[int, int]:
    """Line and column (1-based, columns counted in bytes) of byte ``offset`` of ``data``."""
    line = data.count(b"\n", 0, offset) + 1
    return line, offset - (data.rfind(b"\n", 0, offset) + 1) + 1


def _parse(text: str) -> Graph:
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
        where = exc.pos_in_stream if exc.pos_in_stream is not None else len(text) - 1
        if text[where] == '"':
            raise ParseError(
                "unterminated string: a string ends on the line it starts (write a newline in it as \\n)",
                exc.line,
                exc.column,
            ) from None
        raise ParseError(f"unexpected character {text[where]!r}", exc.line, exc.column) from None
    except UnexpectedEOF as exc:
        line, column = _end_position(text)
        raise ParseError(
            f"unexpected end of input; expected {_describe_expected(parser, set(exc.expected))}", line, column
        ) from None
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
