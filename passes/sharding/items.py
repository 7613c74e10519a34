"""What the sharding problem is made of (passes/sharding/problem.py): *items*, each of which gets
one strategy, and *edges*, each carrying one value from a producer item's result to a consumer
item's operand. The cost model (costs.py) and the memory model (memory.py) read these records.

    item kinds   "input"   a graph input: the spec each device is given
                 "node"    a node of the graph: how its work is split
                 "output"  a graph output: the spec it is returned in
                 "fanout"  a value read by several consumers (or a gradient): the one spec it is
                           redistributed to, from which the consumers read it
"""

from __future__ import annotations

from dataclasses import dataclass

from graphc.core.ir import Node, Value
from graphc.passes.sharding.strategies import Strategies


@dataclass(slots=True, kw_only=True)
class Item:
    kind: str  # "input", "node", "output" or "fanout" (module doc)
    index: int  # graph input / node / output position; a fan-out's: the item whose value it spreads
    strategies: Strategies
    node: Node | None = None  # nodes
    value: Value | None = None  # inputs, outputs and fan-outs
    pinned: str | None = None  # why the strategies were restricted (a user pin)
    warning: str | None = None
    gradient: bool = False  # a fan-out of a gradient: its value lives in the fan-out's spec after it


# not frozen (hashable all the same): a frozen dataclass takes twice as long to make, and the
# problem makes about two per edge of the graph (problem.py ``add_nodes``, ``add_fanouts``)
@dataclass(slots=True, kw_only=True, unsafe_hash=True)
class Edge:
    src: int  # item index
    src_out: int
    dst: int
    dst_in: int
    value: Value
    deferred: bool = False  # an all-reduce here can wait for the update: it joins a gradient bucket
    phase: str = ""  # which redistributed copy the reader shares (redistribute.read_phase)


__all__ = ["Edge", "Item"]
