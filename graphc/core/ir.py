"""Graph IR: a Graph of Nodes in SSA form.

* A ``Value`` is defined exactly once: as a graph input, or as an output of one Node. It has a
  ``TensorType`` (shape, dtype).
* A ``Node`` applies an ``OpDef`` (from the op registry, not a string) to input Values with frozen
  attributes, produces typed output Values, and remembers the user's source line (``SourceLoc``).
* A ``Graph`` holds its inputs, its nodes in a topological order, and its outputs; ``in_tree`` and
  ``out_tree`` (pytree TreeDefs) give the calling convention of the function it was traced from, so
  ``graphc.evaluate(graph, *args, **kwargs)`` takes the same arguments as that function.

Stage machine (each later pass says which stage it needs): traced -> optimized -> partitioned -> lowered.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from graphc.core import dtypes
from graphc.core.errors import ShapeError, SourceLoc, VerifyError
from graphc.core.literals import format_literal, is_int_tuple
from graphc.core.pytree import TreeDef
from graphc.core.traits import Trait

T = TypeVar("T", bound=Trait)

_TYPE_TEXT = re.compile(r"^\s*(\w+)\[([0-9,\s]*)\]\s*$")


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: np.dtype

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", dtypes.canonical(self.dtype))
        if any(d < 0 for d in self.shape):
            raise ShapeError(f"negative dimension in shape {self.shape}")

    def __hash__(self) -> int:
        # computed once: the planner keys its caches by types, tens of thousands of times a compile
        try:
            return self._hash  # type: ignore[attr-defined]
        except AttributeError:
            h = hash((self.shape, self.dtype))
            object.__setattr__(self, "_hash", h)
            return h

    def __getstate__(self) -> dict:
        return {"shape": self.shape, "dtype": self.dtype}  # a hash is recomputed in each process

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __str__(self) -> str:
        try:
            return self._text  # type: ignore[attr-defined]  # made once: the printer asks per value of every node
        except AttributeError:
            text = f"{dtypes.short_name(self.dtype)}[{','.join(map(str, self.shape))}]"
            object.__setattr__(self, "_text", text)
            return text

    @classmethod
    def parse(cls, text: str) -> TensorType:
        """The type ``str`` printed: ``f32[4,8]``, ``i64[]``."""
        m = _TYPE_TEXT.match(text)
        if m is None or m.group(1) not in dtypes.BY_SHORT_NAME:
            raise ShapeError(f"not a tensor type: {text!r} (expected e.g. f32[4,8])")
        dims = tuple(int(d) for d in m.group(2).split(",") if d)
        return cls(dims, dtypes.BY_SHORT_NAME[m.group(1)])


KINDS = ("elementwise", "reduction", "shape", "index", "contraction", "constant", "control", "fused", "comm")


@dataclass(eq=False)
class OpDef:
    """A primitive: its shape/dtype rule (``infer``), numpy reference (``impl``), and the rules later
    stages read, all declared once where the op is defined (graphc/ops/)."""

    name: str
    kind: str
    infer: Callable[..., tuple[TensorType, ...]]
    impl: Callable[..., Any]
    attrs: tuple[str, ...] = ()
    num_inputs: int | None = 1  # None: variadic (at least ``min_inputs``)
    min_inputs: int = 1
    num_regions: int = 0  # control-flow ops: infer(in_types, regions, **attrs)
    doc: str = ""
    # What the op is (graphc/core/traits.py): every layer asks these, never the op's name.
    traits: tuple[Trait, ...] = ()
    # Filled in by later stages, next to the op's definition.
    vjp: Callable | None = None
    jvp: Callable | None = None
    dim_rule: Callable | None = None
    cost: Callable | None = None

    def __repr__(self) -> str:
        return f"OpDef({self.name})"

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "traits":  # (also set after the op's definition, next to its rules: graphc/ops/)
            self.__dict__.pop("_kinds", None)  # made again from the new traits when next asked

    @functools.cached_property
    def _kinds(self) -> dict[type[Trait], Trait]:
        """Each class of the op's traits and its base classes, with the first trait that is an
        instance of it: what ``has`` and ``trait`` look up (the passes and the planner ask
        millions of times a compile)."""
        kinds: dict[type[Trait], Trait] = {}
        for t in self.traits:
            for cls in type(t).__mro__:
                kinds.setdefault(cls, t)
        return kinds

    def has(self, kind: type[Trait]) -> bool:
        """Whether the op declares a trait of class ``kind``."""
        return kind in self._kinds

    def trait(self, kind: type[T]) -> T | None:
        """The op's trait of class ``kind``, or None."""
        return self._kinds.get(kind)  # type: ignore[return-value]  # (a trait of class kind: _kinds)

    def infer_types(
        self, in_types: tuple[TensorType, ...], attrs: dict[str, Any], regions: tuple = ()
    ) -> tuple[TensorType, ...]:
        key = None if regions else in_types if not attrs else _attrs_key(in_types, attrs)
        if key is not None:
            # an op without regions whose attributes are plain values: its result types depend on the
            # operand types and those values alone, so they are remembered (per ``infer`` function)
            # and shared by the nodes that read the same types with the same attributes
            known: tuple[Callable, dict] | None = self.__dict__.get("_inferred")
            if known is None or known[0] is not self.infer:
                known = self.__dict__["_inferred"] = (self.infer, {})
            got = known[1].get(key)
            if got is None:
                got = bounded_put(known[1], key, self._infer_types(in_types, attrs, regions))
            return got
        return self._infer_types(in_types, attrs, regions)

    def _infer_types(
        self, in_types: tuple[TensorType, ...], attrs: dict[str, Any], regions: tuple
    ) -> tuple[TensorType, ...]:
        if self.num_inputs is not None and len(in_types) != self.num_inputs:
            raise ShapeError(f"{self.name} takes {self.num_inputs} operand(s), got {len(in_types)}")
        if self.num_inputs is None and len(in_types) < self.min_inputs:
            raise ShapeError(f"{self.name} takes at least {self.min_inputs} operand(s), got {len(in_types)}")
        missing = [a for a in self.attrs if a not in attrs]
        unknown = [a for a in attrs if a not in self.attrs]
        if missing or unknown:
            raise ShapeError(
                f"{self.name} expects attributes ({', '.join(self.attrs) or 'none'})"
                + (f"; missing {', '.join(missing)}" if missing else "")
                + (f"; unknown {', '.join(unknown)}" if unknown else "")
            )
        if len(regions) != self.num_regions:
            raise ShapeError(f"{self.name} needs {self.num_regions} region(s), got {len(regions)}")
        try:
            if self.num_regions:
                return tuple(self.infer(in_types, regions, **attrs))
            return tuple(self.infer(in_types, **attrs))
        except ShapeError:
            raise
        except (TypeError, ValueError, IndexError) as exc:
            raise ShapeError(f"{self.name}: invalid attributes {attrs}: {exc}") from None

    def evaluate(self, *arrays: np.ndarray, **attrs: Any) -> tuple[np.ndarray, ...]:
        out = self.impl(*arrays, **attrs)
        if isinstance(out, tuple):
            return tuple(np.asarray(o) for o in out)
        return (np.asarray(out),)


def _attrs_key(in_types: tuple[TensorType, ...], attrs: dict[str, Any]) -> tuple | None:
    """A key for ``infer_types``' table when every attribute is a plain value (an int, str, bool,
    None, dtype, or a tuple of ints and such tuples), each with its type; None otherwise."""
    items = []
    for k, v in attrs.items():
        if not (type(v) in _KEYED or isinstance(v, np.dtype) or type(v) is tuple and _int_tuple(v)):
            return None
        items.append((k, type(v), v))
    return (in_types, tuple(items))


_KEYED = (int, str, bool, type(None))


def _int_tuple(v: tuple) -> bool:
    return all([type(x) is int or type(x) is tuple and _int_tuple(x) for x in v])


class Value:
    """An SSA value. ``producer`` is None for graph inputs."""

    __slots__ = ("type", "producer", "index", "name")

    def __init__(self, type: TensorType, producer: Node | None = None, index: int = 0, name: str | None = None):
        self.type = type
        self.producer = producer
        self.index = index
        self.name = name  # a name hint; graph inputs keep theirs in the text IR

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> np.dtype:
        return self.type.dtype

    @property
    def ndim(self) -> int:
        return len(self.type.shape)

    def __repr__(self) -> str:
        return f"Value({self.name or hex(id(self))}: {self.type})"


def freeze_attr(v: Any) -> Any:
    """Attributes are immutable: lists become tuples, arrays become read-only."""
    if type(v) in _FROZEN or type(v) is tuple and all([type(x) in _FROZEN for x in v]):
        return v  # (a tuple of such values, a shape or axes, is frozen as it is)
    if isinstance(v, (list, tuple)):
        return tuple(freeze_attr(x) for x in v)
    if isinstance(v, np.ndarray):
        if v.flags.writeable:
            v = v.copy()
            v.setflags(write=False)
        return v
    if isinstance(v, np.dtype):
        return dtypes.canonical(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


_FROZEN = (int, float, str, bool, type(None))  # attribute values frozen already, the common ones


def _frozen_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``attrs`` with each value frozen (``freeze_attr``)."""
    frozen = {}
    for k, v in attrs.items():  # (a loop: a shape, axes or a dtype, most values, without a call)
        frozen[k] = v if type(v) in _FROZEN else freeze_attr(v)
    return frozen


# Tables of shared immutable objects (result types here, source locations in the frontend): equal
# objects made once, so a large graph keeps fewer objects for the collector to walk. A table holds
# at most INTERN_LIMIT entries and starts afresh when full (what it handed out stays valid; only
# the sharing across the reset is lost), so a long-running process that traces many shapes does
# not keep every type it ever met.
INTERN_LIMIT = 1 << 16

_TYPES: dict[TensorType, TensorType] = {}  # each result type met, once (types are immutable)


def bounded_put(table: dict, key: Any, value: Any) -> Any:
    """``table[key] = value``, first emptying ``table`` when it holds ``INTERN_LIMIT`` entries;
    returns ``value``."""
    if len(table) >= INTERN_LIMIT:
        table.clear()
    table[key] = value
    return value


PARTS = ("forward", "backward", "update", "recompute")  # recompute: a forward node run again (passes/lower.py)


class Node:
    """One operation. ``attrs`` is a dict that must not be mutated after construction."""

    __slots__ = ("op", "inputs", "attrs", "outputs", "loc", "part", "regions")

    def __init__(
        self,
        op: OpDef,
        inputs: Iterable[Value],
        attrs: dict[str, Any],
        output_types: Iterable[TensorType],
        loc: SourceLoc | None = None,
        part: str | None = None,
        regions: Iterable[Region] = (),
    ):
        self.op = op
        self.regions = tuple(regions)
        self.inputs = tuple(inputs)
        self.attrs = _frozen_attrs(attrs) if attrs else {}
        known = _TYPES.get  # equal result types shared (INTERN_LIMIT)
        types = output_types if type(output_types) is tuple else tuple(output_types)
        if len(types) == 1:  # (nearly every node: one result)
            t = types[0]
            self.outputs: tuple[Value, ...] = (Value(known(t) or bounded_put(_TYPES, t, t), self),)
        else:
            self.outputs = tuple([Value(known(t) or bounded_put(_TYPES, t, t), self, i) for i, t in enumerate(types)])
        self.loc = loc
        if part is not None and part not in PARTS:
            raise ValueError(f"part must be one of {PARTS}, got {part!r}")
        self.part = part  # which part of a training step: forward / backward / update (None: untagged)

    def with_operands(self, inputs: Iterable[Value], regions: Iterable[Region] | None = None) -> Node:
        """A node like this one (op, attributes, result types, location, part) reading ``inputs``
        (and ``regions``, if given), with results of its own: what a pass keeps when an operand
        was rewritten. The attributes are this node's (frozen already, never mutated)."""
        new = Node.__new__(Node)
        new.op = self.op
        new.regions = self.regions if regions is None else tuple(regions)
        new.inputs = tuple(inputs)
        new.attrs = self.attrs
        outs = self.outputs
        new.outputs = (
            (Value(outs[0].type, new),) if len(outs) == 1 else tuple(Value(o.type, new, i) for i, o in enumerate(outs))
        )
        new.loc = self.loc
        new.part = self.part
        return new

    @property
    def output(self) -> Value:
        if len(self.outputs) != 1:
            raise ValueError(f"{self.op.name} has {len(self.outputs)} outputs")
        return self.outputs[0]

    def __repr__(self) -> str:
        return f"Node({self.op.name}, loc={self.loc})"


class Region:
    """A nested block of a control-flow node: its own inputs (block arguments), nodes and outputs.

    Regions are isolated from above: their nodes use only the region's inputs and values defined
    inside it, so every value a branch or loop body needs is an explicit operand of the node (the
    tracer adds captured outer values as operands automatically)."""

    def __init__(self, inputs: list[Value], nodes: list[Node], outputs: list[Value]):
        self.inputs = inputs
        self.nodes = nodes
        self.outputs = outputs

    @property
    def in_types(self) -> tuple[TensorType, ...]:
        return tuple(v.type for v in self.inputs)

    @property
    def out_types(self) -> tuple[TensorType, ...]:
        return tuple(v.type for v in self.outputs)

    def __repr__(self) -> str:
        return f"<Region: {len(self.inputs)} inputs, {len(self.nodes)} nodes, {len(self.outputs)} outputs>"


def clone_region(region: Region) -> Region:
    """A deep copy with new Values and Nodes (a region may appear only once in a graph)."""
    env: dict[Value, Value] = {}
    inputs = []
    for v in region.inputs:
        env[v] = Value(v.type, None, 0, v.name)
        inputs.append(env[v])
    nodes = []
    for node in region.nodes:
        copy = Node(
            node.op,
            [env[v] for v in node.inputs],
            node.attrs,
            [o.type for o in node.outputs],
            node.loc,
            node.part,
            tuple(clone_region(r) for r in node.regions),
        )
        env.update(zip(node.outputs, copy.outputs))
        nodes.append(copy)
    return Region(inputs, nodes, [env[v] for v in region.outputs])


def walk(nodes: Iterable[Node]):
    """Every node, including those inside regions (a node before the nodes of its regions)."""
    for node in nodes:
        yield node
        for region in node.regions:
            yield from walk(region.nodes)


def uses_low_floats(graph: Graph) -> bool:
    """Whether any input or node result of ``graph`` (regions included) is bfloat16 or float16."""
    values = [*graph.inputs, *(o for node in walk(graph.nodes) for o in node.outputs)]
    return any(v.type.dtype in dtypes.LOW_FLOATS for v in values)


_NAME_OK = re.compile(r"[^A-Za-z0-9_.]")


class Graph:
    # The inputs the traced function wrote into in place (``x[i] = v``, ``self.w -= g``), each with
    # the source line of its last write: a call whose argument arrays overlap one of them is refused
    # (core/buffers.py: written_overlap). Set by the tracer on the graph it makes; a pass's new
    # graph has none, and passes/manager.py ``optimize`` gives it the traced graph's.
    written_inputs: tuple[tuple[int, SourceLoc | None], ...] = ()
    # The arrays the traced functions read from their globals and closures, compiled as constants
    # (core/captured.py: GlobalRead): a call after their values changed is refused. As above.
    global_reads: tuple[Any, ...] = ()

    def __init__(
        self,
        name: str,
        inputs: list[Value],
        nodes: list[Node],
        outputs: list[Value],
        in_tree: TreeDef,
        out_tree: TreeDef,
    ):
        self.name = name
        self.inputs = inputs
        self.nodes = nodes
        self.outputs = outputs
        self.in_tree = in_tree
        self.out_tree = out_tree

    def __str__(self) -> str:
        return print_graph(self)

    def __repr__(self) -> str:
        return f"<Graph @{self.name}: {len(self.inputs)} inputs, {len(self.nodes)} nodes, {len(self.outputs)} outputs>"

    def value_names(self) -> dict[Value, str]:
        """Names used by the text IR and by error messages: inputs keep their (sanitized, unique)
        names, node results are numbered %0, %1, ... in node order."""
        names: dict[Value, str] = {}
        taken: set[str] = set()
        for i, v in enumerate(self.inputs):
            base = _NAME_OK.sub("_", v.name or f"arg{i}") or f"arg{i}"
            if base[0].isdigit() or base[0] == ".":
                base = "in" + base
            name, k = base, 1
            while name in taken:
                name, k = f"{base}_{k}", k + 1
            taken.add(name)
            names[v] = name
        counter = 0

        def number(nodes: list[Node]) -> None:
            nonlocal counter
            for node in nodes:
                for out in node.outputs:
                    if out not in names:
                        names[out] = str(counter)
                        counter += 1
                for region in node.regions:
                    for arg in region.inputs:
                        if arg not in names:
                            names[arg] = str(counter)
                            counter += 1
                    number(region.nodes)

        number(self.nodes)
        return names

    def verify(self) -> Graph:
        """Check SSA (each value defined once, before use, so the graph is acyclic), every node's
        attributes and output types against its op's rule, regions (isolated: they use only their
        own inputs and values), and the signature. Returns self."""
        names = self.value_names()
        if len(set(self.inputs)) != len(self.inputs):
            raise VerifyError(f"graph @{self.name}: an input value is listed twice")
        if self.in_tree.num_leaves != len(self.inputs):
            raise VerifyError(
                f"graph @{self.name}: signature has {self.in_tree.num_leaves} array leaves "
                f"but the graph has {len(self.inputs)} inputs"
            )
        for v in self.inputs:
            if v.producer is not None:
                raise VerifyError(f"graph @{self.name}: input %{names[v]} is produced by a node")
        seen_nodes: set[int] = set()
        everywhere: set[Value] = set()
        _verify_block(self.inputs, self.nodes, self.outputs, names, f"graph @{self.name}", seen_nodes, everywhere)
        if self.out_tree.num_leaves != len(self.outputs):
            raise VerifyError(
                f"graph @{self.name}: result structure has {self.out_tree.num_leaves} array leaves "
                f"but the graph returns {len(self.outputs)} values"
            )
        return self

    def users(self) -> dict[Value, list[Node]]:
        out: dict[Value, list[Node]] = {v: [] for v in self.inputs}
        for node in self.nodes:
            for o in node.outputs:
                out[o] = []
            for v in node.inputs:
                users = out.get(v)  # (defined above in a verified graph: no new list per operand)
                if users is None:
                    users = out[v] = []
                users.append(node)
        return out

    def to_networkx(self):
        """A networkx DiGraph of node indices (edges producer -> consumer), for analyses."""
        import networkx as nx

        g = nx.DiGraph()
        index = {id(n): i for i, n in enumerate(self.nodes)}
        for i, node in enumerate(self.nodes):
            g.add_node(i, op=node.op.name)
            for v in node.inputs:
                if v.producer is not None:
                    g.add_edge(index[id(v.producer)], i)
        return g


def describe_node(node: Node, names: dict[Value, str]) -> str:
    res = ", ".join("%" + names.get(o, "?") for o in node.outputs)
    where = f" at {node.loc}" if node.loc else ""
    return f"node {res} = {node.op.name}(...){where}"


def _verify_block(
    inputs: list[Value],
    nodes: list[Node],
    outputs: list[Value],
    names: dict[Value, str],
    where: str,
    seen_nodes: set[int],
    everywhere: set[Value],
) -> None:
    """Verify one block (the graph body or a region) in its own scope."""
    defined: set[Value] = set()
    _define_block_inputs(inputs, names, where, defined, everywhere)
    for node in nodes:
        _verify_node(node, names, seen_nodes, defined, everywhere)
    _verify_block_outputs(outputs, where, defined)


def _define_block_inputs(
    inputs: list[Value], names: dict[Value, str], where: str, defined: set[Value], everywhere: set[Value]
) -> None:
    """Step 1 of a block: its inputs come into scope (each defined once in the whole graph)."""
    for v in inputs:
        if v in everywhere:
            raise VerifyError(f"{where}: input %{names.get(v, '?')} is defined twice")
        defined.add(v)
        everywhere.add(v)


def _verify_node(
    node: Node, names: dict[Value, str], seen_nodes: set[int], defined: set[Value], everywhere: set[Value]
) -> None:
    """Step 2, for each node in order: it is listed once, its operands are in scope, its outputs are
    new and point back to it, its regions verify, its result types follow the op's rule; then its
    outputs come into scope."""
    describe = describe_node(node, names)
    if id(node) in seen_nodes:
        raise VerifyError(f"{describe} appears twice in the node list")
    seen_nodes.add(id(node))
    _verify_operands(node, describe, names, defined, everywhere)
    _verify_node_outputs(node, describe, everywhere)
    _verify_regions(node, describe, names, seen_nodes, everywhere)
    _verify_result_types(node, describe)
    defined.update(node.outputs)
    everywhere.update(node.outputs)


def _verify_operands(
    node: Node, describe: str, names: dict[Value, str], defined: set[Value], everywhere: set[Value]
) -> None:
    """Every operand is a Value defined earlier in this block; the error says why one is not."""
    for i, v in enumerate(node.inputs):
        if not isinstance(v, Value):
            raise VerifyError(f"{describe}: operand {i} is {type(v).__name__}, not a Value")
        if v in defined:
            continue
        if v in everywhere:
            why = "is defined outside this region (regions take every value they use as an operand)"
        elif v in names:
            why = "is defined later (cycle or misordered nodes)"
        else:
            why = "is not defined in this graph"
        raise VerifyError(f"{describe}: operand {i} (%{names.get(v, '?')}) {why}")


def _verify_node_outputs(node: Node, describe: str, everywhere: set[Value]) -> None:
    """Every output points back to its node and position, and is not defined anywhere else."""
    for i, out in enumerate(node.outputs):
        if out.producer is not node or out.index != i:
            raise VerifyError(f"{describe}: output {i} does not point back to its node")
        if out in everywhere:
            raise VerifyError(f"{describe}: output {i} is defined twice")


def _verify_regions(
    node: Node, describe: str, names: dict[Value, str], seen_nodes: set[int], everywhere: set[Value]
) -> None:
    """The node has as many regions as its op needs, and each verifies as a block of its own."""
    if len(node.regions) != node.op.num_regions:
        raise VerifyError(f"{describe}: {node.op.name} needs {node.op.num_regions} region(s), has {len(node.regions)}")
    for k, region in enumerate(node.regions):
        _verify_block(
            region.inputs, region.nodes, region.outputs, names, f"{describe}, region {k}", seen_nodes, everywhere
        )


def _verify_result_types(node: Node, describe: str) -> None:
    """The node's attributes are valid and its declared result types are the ones its op's rule gives."""
    try:
        expected = node.op.infer_types(tuple(v.type for v in node.inputs), node.attrs, node.regions)
    except ShapeError as exc:
        raise VerifyError(f"{describe}: {exc}") from None
    got = tuple(o.type for o in node.outputs)
    if expected != got:
        raise VerifyError(
            f"{describe}: declared result types {', '.join(map(str, got))} "
            f"but the op's rule gives {', '.join(map(str, expected))}"
        )


def _verify_block_outputs(outputs: list[Value], where: str, defined: set[Value]) -> None:
    """Step 3 of a block: everything it returns is defined in it."""
    for i, v in enumerate(outputs):
        if v not in defined:
            raise VerifyError(
                f"{where}: output {i} is not defined in this {'graph' if where.startswith('graph') else 'region'}"
            )


# --- the text form ---------------------------------------------------------------------------------
#     graph @mlp(
#       {"b1": %params.b1 : f32[128], "w1": %params.w1 : f32[784,128]},
#       %x : f32[32,784],
#       training=false,
#     ) {
#       %0 = matmul(%x, %params.w1) : f32[32,128] loc("models/mlp.py":12)
#       %1 = add(%0, %params.b1) : f32[32,128] loc("models/mlp.py":12)
#       return {"logits": %1}
#     }
# The header is the traced function's signature: positional arguments, then ``name=`` keyword
# arguments, each a pytree whose array leaves declare the graph inputs (``%name : type``) and whose
# other leaves are the static values it was traced with. ``return`` gives the result pytree.
# Attributes follow the operands as ``name=value`` (core/literals.py). graphc/textir.py parses it
# back: ``str(parse(str(g))) == str(g)`` for every graph.


def static_text(v: Any) -> str:
    """A static leaf of a signature: its literal, or for a value that has none (a function, a class,
    a generator held by an argument object) a string naming it, the same in every run."""
    try:
        return format_literal(v)
    except TypeError:
        pass
    name = getattr(v, "__qualname__", None)
    if isinstance(name, str):
        text = f"{getattr(v, '__module__', None) or ''}.{name}".lstrip(".")
    else:
        text = repr(v) if " at 0x" not in repr(v) else ""
    return json.dumps(f"<{type(v).__name__} {text}>" if text else f"<{type(v).__name__}>")


def format_tree(t: TreeDef, leaf, indent: str, width: int = 96) -> str:
    """Pretty-print a pytree, ``leaf(i)`` giving the text of the i-th dynamic leaf: one line if it
    fits in ``width``, else one child per line."""
    leaves = [leaf(i) for i in range(t.num_leaves)]
    texts: dict[tuple[int, int], str] = {}  # (id(subtree), its first leaf) -> its one line, made once
    return _tree_lines(t, 0, indent, width, leaves, texts)


# (functions of the module, not closures that call themselves: each would be a cycle for the collector)
def _tree_line(t: TreeDef, first: int, leaves: list[str], texts: dict[tuple[int, int], str]) -> str:
    if t.kind == "leaf":
        return leaves[first]
    if t.kind == "static":
        return static_text(t.value)
    known = texts.get((id(t), first))
    if known is not None:
        return known
    parts = []
    at = first
    for c in t.children:
        parts.append(_tree_line(c, at, leaves, texts))
        at += c.num_leaves
    if t.kind == "dict":
        text = "{" + ", ".join(f"{format_literal(k)}: {p}" for k, p in zip(t.keys, parts)) + "}"
    elif t.kind == "list":
        text = "[" + ", ".join(parts) + "]"
    else:
        text = "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    texts[(id(t), first)] = text
    return text


def _tree_lines(
    t: TreeDef, first: int, ind: str, width: int, leaves: list[str], texts: dict[tuple[int, int], str]
) -> str:
    text = _tree_line(t, first, leaves, texts)
    if len(ind) + len(text) <= width or not t.children:
        return text
    inner = ind + "  "
    keys = t.keys if t.kind == "dict" else [None] * len(t.children)
    parts = []
    for k, c in zip(keys, t.children):
        label = f"{format_literal(k)}: " if t.kind == "dict" else ""
        parts.append(f"{inner}{label}{_tree_lines(c, first, inner, width, leaves, texts)},\n")
        first += c.num_leaves
    open_, close = {"dict": ("{", "}"), "list": ("[", "]"), "tuple": ("(", ")")}[t.kind]
    return open_ + "\n" + "".join(parts) + ind + close


def print_graph(g: Graph, names: dict[Value, str] | None = None) -> str:
    """The text IR of ``g``; ``names``: ``g.value_names()``, if the caller has them."""
    names = g.value_names() if names is None else names
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
    printer = _NodePrinter(names)  # one for the graph: what it remembers is shared by the nodes
    for node in g.nodes:
        lines.extend(printer.lines(node, "  "))
    ret = format_tree(g.out_tree, lambda i: "%" + names[g.outputs[i]], "  ")
    lines.append(f"  return {ret}")
    lines.append("}")
    return "\n".join(lines) + "\n"


@functools.lru_cache(maxsize=4096)
def _file_text(file: str) -> str:
    """A location's file as the text IR quotes it (made once per file: the printer asks per node)."""
    return json.dumps(file)


def format_node(node: Node, names: dict[Value, str], indent: str = "") -> list[str]:
    """The node's line, followed by its regions (indented) if it has any."""
    return _NodePrinter(names).lines(node, indent)


class _NodePrinter:
    """``format_node`` for the nodes of one graph, remembering the texts that repeat from node to
    node: of each location, and of each attribute whose value is a str, an int, a bool, None, a
    dtype or a tuple of ints (keyed with its type: ``1`` and ``True`` print apart; floats are not
    remembered, 0.0 and -0.0 are equal keys)."""

    def __init__(self, names: dict[Value, str]):
        self.names = names
        self.attr_texts: dict[tuple, str] = {}
        self.loc_texts: dict[int, str] = {}  # id of a SourceLoc (held by a node while printing) -> " loc(...)"

    def lines(self, node: Node, indent: str) -> list[str]:
        """The node's line, followed by its regions (indented) if it has any."""
        names = self.names
        made = node.outputs
        if len(made) == 1:  # (nearly every node: one result)
            results, types = "%" + names[made[0]], str(made[0].type)
        else:
            results, types = ", ".join(["%" + names[o] for o in made]), ", ".join([str(o.type) for o in made]) or "()"
        operands = ["%" + names[v] for v in node.inputs]
        if node.attrs:
            texts = self.attr_texts
            for k, v in node.attrs.items():
                kind = type(v)
                if kind in _REMEMBERED_ATTRS or isinstance(v, np.dtype) or is_int_tuple(v):
                    key = (k, kind, v)
                    text = texts.get(key)
                    if text is None:
                        text = texts[key] = f"{k}={format_literal(v)}"
                    operands.append(text)
                else:
                    operands.append(f"{k}={format_literal(v)}")
        loc = ""
        if node.loc:
            loc = self.loc_texts.get(id(node.loc), "")
            if not loc:
                loc = self.loc_texts[id(node.loc)] = f" loc({_file_text(node.loc.file)}:{node.loc.line})"
        part = f" part({node.part})" if node.part else ""
        head = f"{results} = " if made else ""
        line = f"{indent}{head}{node.op.name}({', '.join(operands)}) : {types}{loc}{part}"
        if not node.regions:
            return [line]
        lines = [line + " {"]
        for region in node.regions:
            args = ", ".join(f"%{names[v]} : {v.type}" for v in region.inputs)
            lines.append(f"{indent}  ({args}) {{")
            for inner in region.nodes:
                lines.extend(self.lines(inner, indent + "    "))
            outs = ", ".join("%" + names[v] for v in region.outputs)
            lines.append(f"{indent}    yield {outs}".rstrip())
            lines.append(f"{indent}  }}")
        lines.append(f"{indent}}}")
        return lines


_REMEMBERED_ATTRS = {str, int, bool, type(None)}
