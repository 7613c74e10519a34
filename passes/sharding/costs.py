"""The sharding problem's cost model: seconds, for an assignment of one strategy per item (``choice``).

The objective of an assignment is

    sum of items' compute time + sum of edges' redistribution time

(a sequential model: no overlap of compute and communication). An item's compute time per
strategy is its strategies' own table (``Strategies.compute_times``, passes/sharding/strategies.py);
an edge costs the redistribution of its value from the producer's result spec to the consumer's
operand spec (passes/sharding/redistribute.py). A deferred edge (a gradient into the update)
all-reduces in a gradient bucket: each all-reduce pays the fixed cost of a collective in
proportion to its share of ``bucket_share_bytes`` (passes/bucket.py). A returned value's (the
loss's) runs alone and pays it whole.

    compute_times(item)        seconds per strategy of the item
    edge_table(e)              the edge's seconds between the distinct specs of its ends: one table
                               per (value type, spec lists, deferred), shared by repeated layers
    edge_time(e, s, t)         one entry of it
    evaluate(choice)           compute and redistribution of an assignment: the ILP's objective
    rebucket(choice)           price the buckets at the bytes ``choice``'s all-reduces fill
    snapshot()                 the model as it prices now, kept from a later rebucket
"""

from __future__ import annotations

import copy

import numpy as np

from graphc.core.mesh import Mesh
from graphc.passes.sharding.items import Edge, Item
from graphc.passes.sharding.redistribute import bucketed_time, plan_steps, redistribution_time
from graphc.passes.sharding.strategies import DistinctSpecs


class CostModel:
    """The seconds of the module doc, for the items and edges of one problem. An edge's table is
    made once per (value type, the spec lists of its two ends, deferred) and kept until the
    bucket share changes (``rebucket``)."""

    def __init__(
        self, mesh: Mesh, items: list[Item], edges: list[Edge], bucket_share_bytes: int = 0, bucket_limit: int = 0
    ) -> None:
        self.mesh, self.items, self.edges = mesh, items, edges
        # deferred edges share buckets of this many bytes (0: no bucketing); at most bucket_limit
        self.bucket_share_bytes = bucket_share_bytes
        self.bucket_limit = bucket_limit
        # edge tables by (type, the two DistinctSpecs objects, deferred), and by their specs' values
        self._tables: dict[tuple, np.ndarray] = {}
        self._tables_by_value: dict[tuple, np.ndarray] = {}
        # (table, producer indices, consumer indices) by what an edge's table depends on: its ends'
        # Strategies objects (a pin, tie or ZeRO stage gives an item a new one), the result and
        # operand it joins, its value's type, deferred; repeated layers' edges share an entry
        self._by_ends: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    # --- compute -------------------------------------------------------------------------------
    def compute_times(self, item: int) -> np.ndarray:
        """The compute time of every strategy of ``item``."""
        return self.items[item].strategies.compute_times

    # --- redistribution ------------------------------------------------------------------------
    def edge_time(self, e: Edge, s_src: int, s_dst: int) -> float:
        """The redistribution of ``e`` with its producer at strategy ``s_src``, its consumer at ``s_dst``."""
        src = self.items[e.src].strategies[s_src].out_specs[e.src_out]
        dst = self.items[e.dst].strategies[s_dst].in_specs[e.dst_in]
        return self.time(e, src, dst)

    def time(self, e: Edge, src, dst) -> float:
        """The redistribution of ``e``'s value from spec ``src`` to ``dst`` (a deferred all-reduce
        in a bucket)."""
        t = e.value.type
        if e.deferred and self.bucket_share_bytes:
            return bucketed_time(t.shape, t.dtype.itemsize, src, dst, self.mesh, self.bucket_share_bytes)
        return redistribution_time(t.shape, t.dtype.itemsize, src, dst, self.mesh)

    def ends(self, e: Edge) -> tuple[DistinctSpecs, DistinctSpecs]:
        """The distinct specs of the producer's result and of the consumer's operand of ``e``."""
        return self.items[e.src].strategies.specs("out", e.src_out), self.items[e.dst].strategies.specs("in", e.dst_in)

    def edge_table(self, e: Edge) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(times between the distinct specs, producer index per strategy, consumer index per
        strategy): one table per distinct (type, specs, deferred) combination."""
        ends = (
            self.items[e.src].strategies,
            e.src_out,
            self.items[e.dst].strategies,
            e.dst_in,
            e.value.type,
            e.deferred,
        )
        got = self._by_ends.get(ends)
        if got is not None:
            return got
        us, vs = self.ends(e)
        key = (e.value.type, us, vs, e.deferred)
        table = self._tables.get(key)
        if table is None:
            by_value = (e.value.type, us.specs, vs.specs, e.deferred)
            table = self._tables_by_value.get(by_value)
            if table is None:
                table = np.array([[self.time(e, a, b) for b in vs.specs] for a in us.specs])
                self._tables_by_value[by_value] = table
            self._tables[key] = table
        got = self._by_ends[ends] = (table, us.index, vs.index)
        return got

    def edge_times_at(self, e: Edge, item: int, choice: list[int]) -> np.ndarray:
        """The edge's time for every strategy of ``item`` (one of its ends), the other end as
        ``choice`` has it: a row or column of the edge's table."""
        table, ui, vi = self.edge_table(e)
        return table[ui, vi[choice[e.dst]]] if item == e.src else table[ui[choice[e.src]], vi]

    # --- an assignment -------------------------------------------------------------------------
    def evaluate(self, choice: list[int]) -> dict[str, float]:
        """{"compute_s", "comm_s", "total_s"} of ``choice``: every item's compute and every edge's
        redistribution, each edge on its own (the ILP's objective)."""
        compute = sum(self.items[i].strategies[s].compute_s for i, s in enumerate(choice))
        comm = sum(self.edge_time(e, choice[e.src], choice[e.dst]) for e in self.edges)
        return {"compute_s": compute, "comm_s": comm, "total_s": compute + comm}

    def filled_bucket_bytes(self, choice: list[int]) -> int:
        """The bucket share of the deferred all-reduces ``choice`` makes: the bytes they move, at
        most the bucket size (0 without buckets, or when ``choice`` all-reduces nothing)."""
        if not self.bucket_share_bytes:
            return 0
        moved: dict[tuple, int] = {}
        for e in self.edges:
            if not e.deferred:
                continue
            src = self.items[e.src].strategies[choice[e.src]].out_specs[e.src_out]
            dst = self.items[e.dst].strategies[choice[e.dst]].in_specs[e.dst_in]
            t = e.value.type
            for st in plan_steps(t.shape, t.dtype.itemsize, src, dst, self.mesh) if src != dst else ():
                if st.kind == "all_reduce":
                    moved[(e.value, dst, st.axis)] = st.local_bytes
        total = sum(moved.values())
        return max(1, min(self.bucket_limit, total)) if total else 0

    def rebucket(self, choice: list[int], filled: int | None = None) -> None:
        """Share the fixed cost over the bytes the deferred all-reduces of ``choice`` really move
        (the estimate the problem starts from counts every tensor that might); ``filled``: what
        ``filled_bucket_bytes(choice)`` returned, if the caller asked already."""
        if filled is None:
            filled = self.filled_bucket_bytes(choice)
        if filled:
            self.bucket_share_bytes = filled
            # the times change (which specs an edge joins does not): new tables, the old ones left
            # to a ``snapshot`` taken before
            self._tables, self._tables_by_value, self._by_ends = {}, {}, {}

    def snapshot(self) -> CostModel:
        """This model as it prices now (its bucket share), unchanged by a later ``rebucket``: what
        a plan's alternatives, priced after the plan is made, are priced with. It shares the
        tables made so far."""
        return copy.copy(self)


__all__ = ["CostModel"]
