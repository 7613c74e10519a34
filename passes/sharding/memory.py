"""The sharding problem's memory model: the bytes each device holds at every point of the program,
for an assignment of one strategy per item (``choice``).

Memory per device is the peak, over the program order, of the bytes of live tensors under their
chosen specs: graph inputs (parameters, optimizer state) and constants (each device program holds
its piece of every constant, runtime/executor.py) live throughout, every other value from
its producer to its last use, and every graph output from its output item to the end in the spec
it is returned in (a state gathered for its return is held whole). A value the runtime makes as a
view of another (``view_roots``) has no bytes of its own, nor has one that stays inside a fused
kernel (``fused_inside``). All meshes here split evenly, so every
device has the same peak.

With ZeRO (passes/sharding/zero.py) two things are counted as the lowering runs them: a gradient
goes through a fan-out item placed right after its producer, and lives in its producer's spec until
there, then in the fan-out's (a reduce-scatter into a shard frees the full partial sum at once); a
state input split along a data axis (ZeRO-3) is gathered afresh for every forward or backward node
that reads it, and the gathered copy lives at that node only (``transient_terms``). A recomputed
value (passes/recompute/choices.py) lives over two ranges (``RematRanges``).

Gradient buckets (passes/bucket.py) are counted with the redistribution buffers, per choice: the
deferred all-reduces that share a bucket are one buffer from its packing (right after its last
member is made) to its last member's last reader, and the partial sums packed into it are freed
at the packing (``redistribution_buffers``). The profile, which a limit bounds row by row, still
holds each partial sum until the update reads it: it over-counts there, never under.

    live_ranges()                   (value, item, first, last position) of every value, made once
    transient_terms()               ZeRO-3's gathered copies, made once
    profile(choice)                 bytes live at every position: what a memory limit bounds
    peak(choice)                    its maximum, and where
    redistribution_buffers(choice)  the buffers the plan's redistributions make
    held_peak(choice)               the peak with them: what the runtime holds
"""

from __future__ import annotations

import functools
import math
import operator
from collections import Counter
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from graphc.core.ir import Graph, TensorType, Value
from graphc.core.mesh import Mesh
from graphc.core.spec import P, R, local_shape
from graphc.core.traits import Constant, Elementwise, Reduction, ViewOf
from graphc.passes.bucket import fill_buckets
from graphc.passes.fuse import find_clusters
from graphc.passes.sharding.items import Edge, Item
from graphc.passes.sharding.redistribute import plan_steps


@dataclass(frozen=True)
class RematRanges:
    """A recomputation candidate item's live ranges when recomputed, in program-order positions,
    and, for a value a later segment's recomputation reads (a checkpoint, passes/recompute/
    segments.py), the position it is then kept until. An item may be either or both."""

    point: int
    ranges: dict[Value, tuple[tuple[int, int], tuple[int, int]]]  # per result: forward range, backward range
    needs: tuple[int, ...]  # items that must be recomputed when this one is
    conflicts: tuple[int, ...]  # items that must be kept when this one is recomputed
    keeps: tuple[int, ...] = ()  # items that must be kept as checkpoints when this one is recomputed
    checkpoint: dict[Value, int] = field(default_factory=dict)  # per result: kept at least until, as a checkpoint


@dataclass(frozen=True)
class _RangeTable:
    """Live ranges as arrays: per range its first and last position, producer item, and the
    offset in ``bytes`` of its bytes per strategy of that item (ranges of equal items share
    them); ``remat_free``: its item is not a recomputation candidate."""

    first: np.ndarray
    last: np.ndarray
    item: np.ndarray
    offset: np.ndarray
    bytes: np.ndarray
    remat_free: np.ndarray


class MemoryModel:
    """The bytes live on each device under a choice (module doc), for the items and edges of one
    problem. It reads the problem's lists, which are complete once the problem is built (the
    recomputation candidates in ``remat`` are added to in place until then); what it derives
    from them alone is made on first use and kept."""

    constants_all_run = True  # a device program holds its constants all run and between runs

    def __init__(
        self,
        graph: Graph,
        mesh: Mesh,
        items: list[Item],
        edges: list[Edge],
        order: list[int],
        remat: dict[int, RematRanges],
        gathers: list[tuple[int, int]],
        zero_axes: tuple[int, ...],
    ) -> None:
        self.graph, self.mesh, self.items, self.edges, self.order = graph, mesh, items, edges, order
        self.remat, self.gathers, self.zero_axes = remat, gathers, zero_axes
        self.mesh_shape = tuple(mesh.shape)
        # program position -> memory position: recomputed copies made right before a program
        # position each get a slot of their own before it (``set_slots``); None: the same
        self.grid: np.ndarray | None = None
        self._live: list[tuple[Value, int, int, int]] | None = None
        self._transients: list[tuple[int, int, np.ndarray]] | None = None
        # the gradient bucket size of the lowering (passes/bucket.py; 0: none): the runtime holds a
        # bucket's buffer until its last member is read (``_bucket_terms``)
        self.bucket_bytes = 0
        self.offloaded: frozenset[Value] = frozenset()  # in host memory: no bytes here (sharding/offload_terms.py)
        # stashed activations in host memory between two positions (sharding/offload_terms.py)
        self.away: dict[Value, tuple[int, int]] = {}
        self._last_profile: tuple | None = None  # (what it was asked for, the profile): the plan asks again
        self._last_buffers: tuple | None = None  # the same for ``redistribution_buffers``
        self._positions: dict[int, int] | None = None  # ``positions``
        # (the live ranges, the items' strategies, ``_range_table`` of them)
        self._ranges: tuple[list, list, _RangeTable] | None = None
        # ``strategy_bytes``: by (strategy tuple's id, kind, result, type), and by (type, distinct specs)
        self._strategy_bytes: dict[tuple, tuple[np.ndarray, tuple]] = {}
        self._spec_bytes: dict[tuple, np.ndarray] = {}
        self._roots: dict[Value, Value] | None = None  # ``roots``

    def roots(self) -> dict[Value, Value]:
        """``view_roots`` of the graph (made once; read-only): the live ranges and the
        recomputation candidates (passes/recompute/choices.py) both read them."""
        if self._roots is None:
            self._roots = view_roots(self.graph)
        return self._roots

    # --- what the problem gives -----------------------------------------------------------------
    def set_slots(self, before: dict[int, int]) -> np.ndarray:
        """Give ``before[p]`` memory positions to the recomputed copies made right before program
        position ``p`` (passes/recompute/choices.py), one each in the order they run, so a copy
        that only the next copy reads is dead by the one after it; returns the memory position of
        every program position. Call before anything measures memory."""
        extra = np.zeros(len(self.order), dtype=np.int64)
        for p, n in before.items():
            extra[p] = n
        self.grid = np.arange(len(self.order), dtype=np.int64) + np.cumsum(extra)
        self._live = self._transients = self._last_profile = self._last_buffers = self._positions = None
        return self.grid

    @property
    def size(self) -> int:
        """The number of memory positions (program positions and recomputation slots)."""
        return len(self.order) if self.grid is None or not len(self.grid) else int(self.grid[-1]) + 1

    def positions(self) -> dict[int, int]:
        """{item: its memory position} (made once: not to be changed)."""
        if self._positions is None:
            at = range(len(self.order)) if self.grid is None else self.grid.tolist()
            self._positions = dict(zip(self.order, at))
        return self._positions

    def item_at(self, at: int) -> int:
        """The item at memory position ``at`` (a recomputation slot: the item it runs before)."""
        if self.grid is None:
            return self.order[at]
        return self.order[int(np.searchsorted(self.grid, at))]

    def live_ranges(self) -> list[tuple[Value, int, int, int]]:
        """(value, producer item, first position, last position) over ``order`` positions. A
        value the runtime makes as a view of another (``view_roots``) has no bytes of its own:
        it is left out, and the value it looks into lives until the view's last use."""
        if self._live is None:
            self._live = self._live_ranges()
        return self._live

    def _last_uses(self, pos: dict[int, int], end: int) -> dict[Value, int]:
        """The last position that reads each value: its last reader, or just before its first
        output item (where each output is held in its output spec)."""
        last: dict[Value, int] = {}
        returned: dict[Value, int] = {}  # graph output -> the position of its first output item
        kinds = [it.kind for it in self.items]
        for e in self.edges:
            at = pos[e.dst]
            if kinds[e.dst] == "output":
                returned[e.value] = min(returned.get(e.value, end), at)
            elif last.get(e.value, -1) < at:
                last[e.value] = at
        for v, at in returned.items():
            last[v] = max(last.get(v, -1), at - 1)
        return last

    def _live_ranges(self) -> list[tuple[Value, int, int, int]]:
        pos = self.positions()
        end = self.size - 1
        last = self._last_uses(pos, end)
        hubs: dict[Value, int] = {}  # gradient -> its fan-out item
        for i, it in enumerate(self.items):
            if it.gradient:
                assert it.value is not None
                hubs[it.value] = i
        roots = self.roots()
        for view, root in roots.items():
            last[root] = max(last.get(root, -1), last.get(view, -1))
        viewed = set(roots.values())  # values some view looks into
        inside = fused_inside(self.graph) if self.remat else set()  # only with recomputation, for now
        out = []
        for i, item in enumerate(self.items):
            if item.kind == "input":
                assert item.value is not None  # an input item holds its graph input
                out.append((item.value, i, 0, end))
            elif item.kind == "node":
                assert item.node is not None  # a node item holds its node
                for o in item.node.outputs:
                    if o in roots or o in inside:
                        continue
                    hub = hubs.get(o)
                    if self.constants_all_run and item.node.op.has(Constant):  # the program holds them
                        out.append((o, i, 0, end))
                    elif hub is not None and o not in viewed:  # in the fan-out's spec after it
                        out.append((o, i, pos[i], pos[hub]))
                        out.append((o, hub, pos[hub], max(pos[hub], last.get(o, pos[hub]))))
                    else:
                        out.append((o, i, pos[i], max(pos[i], last.get(o, pos[i]))))
            elif item.kind == "output" and item.value is not None and item.value.producer is not None:
                out.append((item.value, i, pos[i], end))  # held as returned (a gathered state, say)
        return out

    def transient_terms(self) -> list[tuple[int, int, np.ndarray]]:
        """(state input item, program position, bytes per strategy of the input) of every gathered
        copy of a ZeRO-3 parameter: a state input split along a ZeRO data axis is gathered along it
        for each forward or backward node that reads it, and the copy lives at that node only (the
        lowering's ``regather``). Its size is the input's spec with the data axes unsplit."""
        if self._transients is None:
            pos = self.positions()
            sizes: dict[int, np.ndarray] = {}
            out = []
            for i, reader in self.gathers:
                if i not in sizes:
                    v = self.items[i].value
                    assert v is not None  # an input item holds its value
                    specs = [st.out_specs[0] for st in self.items[i].strategies]
                    whole = [gathered(sp, self.zero_axes) for sp in specs]
                    sizes[i] = np.array(
                        [local_nbytes(v.type, w, self.mesh_shape) if w != sp else 0 for sp, w in zip(specs, whole)],
                        dtype=np.float64,
                    )
                if sizes[i].any():
                    out.append((i, pos[reader], sizes[i]))
            self._transients = out
        return self._transients

    # --- under a choice --------------------------------------------------------------------------
    def value_bytes(self, v: Value, item: int, s: int) -> int:
        return local_nbytes(v.type, self.value_spec(v, item, s), self.mesh_shape)

    def strategy_bytes(self, v: Value, item: int) -> np.ndarray:
        """``value_bytes(v, item, s)`` for every strategy ``s`` of ``item``, as floats (read-only):
        made once per (the item's strategy tuple, its kind, the result, its type), which the items
        of repeated layers share, from the bytes of each distinct spec (``Strategies.specs``)."""
        it = self.items[item]
        kind = it.kind
        k = v.index if kind == "node" else 0
        strategies = it.strategies
        key = (id(strategies.as_tuple), kind, k, v.type)
        got = self._strategy_bytes.get(key)
        if got is None:
            ds = strategies.specs("in" if kind == "output" else "out", k)
            by_spec = self._spec_bytes.get((v.type, ds.specs))
            if by_spec is None:
                by_spec = np.array([local_nbytes(v.type, sp, self.mesh_shape) for sp in ds.specs], dtype=np.float64)
                self._spec_bytes[(v.type, ds.specs)] = by_spec
            per = by_spec[ds.index]
            per.setflags(write=False)
            got = self._strategy_bytes[key] = (per, strategies.as_tuple)  # the tuple kept: its id is the key
        return got[0]

    def value_spec(self, v: Value, item: int, s: int) -> tuple:
        """The spec ``v`` is held in when ``item`` (its producer, fan-out or output item) has
        strategy ``s``."""
        it = self.items[item]
        st = it.strategies[s]
        return st.in_specs[0] if it.kind == "output" else st.out_specs[v.index if it.kind == "node" else 0]

    def ranges_under(self, v: Value, item: int, s: int, a: int, b: int) -> tuple[tuple[int, int], ...]:
        """The live ranges of ``v`` (kept: ``(a, b)``) when ``item`` has strategy ``s``: two when
        the strategy recomputes it (passes/recompute/choices.py), one up to a later segment's
        recomputation when it keeps it as a checkpoint (passes/recompute/segments.py). Of the
        strategy it reads only those two flags (memrows.py asks once per pair of them)."""
        rr = self.remat.get(item)
        if rr is None:
            return ((a, b),)
        st = self.items[item].strategies[s]
        if st.recompute:
            return rr.ranges[v]
        if st.checkpoint and v in rr.checkpoint:
            return ((a, max(b, rr.checkpoint[v])),)
        return ((a, b),)

    def profile(self, choice: list[int], recompute: bool = True) -> np.ndarray:
        """Bytes live on each device at every program point; ``recompute=False``: as if every
        recomputed value were kept instead. Read-only: the last one is remembered (making a plan
        asks for its choice's profile three times)."""
        # offloaded and away are part of the question: offload_terms.py sets both after a solve
        asked = (tuple(choice), recompute, self.offloaded, tuple(self.away.items()))
        last = self._last_profile
        if last is not None and last[0] == asked:
            return last[1]
        prof = self._profile(choice, recompute)
        prof.setflags(write=False)
        self._last_profile = (asked, prof)
        return prof

    def _profile(self, choice: list[int], recompute: bool) -> np.ndarray:
        """The profile as arrays (``_range_table``): byte counts are integers, so the sums are
        exact in any order. The ranges of offloaded, stashed and (with ``recompute``) recomputable
        values are counted one by one, as they depend on more than the choice's bytes."""
        live = self.live_ranges()
        table = self._range_table(live)
        size = self.size
        choose = np.asarray(choice, dtype=np.int64)
        nb = table.bytes[table.offset + choose[table.item]]
        plain = table.remat_free if recompute else np.ones(len(live), dtype=bool)
        special = self.offloaded or self.away
        if special:
            plain = plain & np.array([v not in self.offloaded and v not in self.away for v, *_r in live], dtype=bool)
        delta = np.bincount(table.first[plain], nb[plain], size + 1) - np.bincount(
            table.last[plain] + 1, nb[plain], size + 1
        )
        for r in np.flatnonzero(~plain).tolist():
            v, i, a, b = live[r]
            if v in self.offloaded:
                continue
            n = float(nb[r])
            for first, last in self.ranges_under(v, i, choice[i], a, b) if recompute else ((a, b),):
                delta[first] += n
                delta[last + 1] -= n
            if v in self.away:  # copied to the host after its last forward use, back before its backward
                delta[self.away[v][0]] -= n
                delta[self.away[v][1] + 1] += n
        for i, at, sizes in self.transient_terms():
            delta[at] += sizes[choice[i]]
            delta[at + 1] -= sizes[choice[i]]
        return np.cumsum(delta[:-1])

    def _range_table(self, live: list[tuple[Value, int, int, int]]) -> _RangeTable:
        """``live`` as arrays (made once per list of live ranges and items' strategies)."""
        held = [it.strategies for it in self.items]
        got = self._ranges
        if got is not None and got[0] is live and all(map(operator.is_, got[1], held)):
            return got[2]
        arrays: dict[int, tuple[int, np.ndarray]] = {}  # id(bytes per strategy) -> (offset, it): items share them
        offset = []
        total = 0
        for v, i, _a, _b in live:
            per = self.strategy_bytes(v, i)
            at = arrays.get(id(per))
            if at is None:
                at = arrays[id(per)] = (total, per)
                total += len(per)
            offset.append(at[0])
        table = _RangeTable(
            first=np.array([a for _v, _i, a, _b in live], dtype=np.int64),
            last=np.array([b for _v, _i, _a, b in live], dtype=np.int64),
            item=np.array([i for _v, i, _a, _b in live], dtype=np.int64),
            offset=np.array(offset, dtype=np.int64),
            bytes=np.concatenate([x for _o, x in arrays.values()]) if arrays else np.zeros(0),
            remat_free=np.array([i not in self.remat for _v, i, _a, _b in live], dtype=bool),
        )
        self._ranges = (live, held, table)
        return table

    def peak(self, choice: list[int]) -> tuple[int, int]:
        """(the liveness peak per device, the position where it is): what a memory limit bounds."""
        prof = self.profile(choice)
        at = int(np.argmax(prof)) if len(prof) else 0
        return (int(prof[at]) if len(prof) else 0), at

    def redistribution_buffers(self, choice: list[int]) -> list[tuple[int, int, int]]:
        """(bytes, first position, last position) of the buffers ``choice``'s redistributions
        make on each device: one per value, spec it is read in other than its own, and read
        phase (a forward value's later readers redistribute it again, ``read_phase``), from the
        first reader that needs it to the last (the lowering redistributes at the first reader,
        passes/lower.py; a fan-out's at its first consumer, a gradient's at its fan-out, right
        after its producer: ZeRO's ``scatter_early``): a collective's result, a local slice's
        copy, a deferred all-reduce's result when it runs alone; the deferred all-reduces
        that share a gradient bucket (passes/bucket.py) count as the runtime holds them instead:
        one buffer from the bucket's packing to its last member's last reader, and their partial
        sums freed at the packing (``_bucket_terms``: negative terms, so the buffers may sum to
        less than nothing where the profile still holds a partial sum). A graph output's
        redistribution is not one: the profile holds each output in its output spec; the piece
        it is made from is one, at the output item only (held while the collective runs). Not
        counted, since ``profile`` holds them already: a
        gradient's reduction into its fan-out's spec (the fan-out's value) and the readers of that
        spec, and ZeRO-3's gathered copy for a reader (``transient_terms``); each was counted
        twice before (tests/passes/sharding/test_held_measured.py). The last one is remembered (a
        solve and its plan ask for the same choice's)."""
        asked = (tuple(choice), self.grid)
        last = self._last_buffers
        if last is not None and last[0][0] == asked[0] and last[0][1] is asked[1]:
            return list(last[1])
        out = self._redistribution_buffers(choice)
        self._last_buffers = (asked, out)
        return list(out)

    def _redistribution_buffers(self, choice: list[int]) -> list[tuple[int, int, int]]:
        pos = self.positions()
        spans: dict[tuple, list[int]] = {}
        hub_reads: list[tuple[tuple, int]] = []  # a fan-out's spec is read by each of its consumers
        items, size, mesh_shape = self.items, self.size, self.mesh_shape
        held = self._held_in_hub()
        regathered = set(self.gathers)
        bucketed = _Bucketed()  # the deferred all-reduces a gradient bucket may hold (``_bucket_terms``)
        kept, bucket = bucketed.kept, self.bucket_bytes
        chosen = [it.strategies[c] for it, c in zip(items, choice)]  # each item's strategy, once (not per edge)
        for e in self.edges:
            frm, to = items[e.src], items[e.dst]
            src = chosen[e.src].out_specs[e.src_out]
            dst = chosen[e.dst].in_specs[e.dst_in]
            if bucket:
                if src == dst and e.src not in held:  # ``see``'s whole work for an edge read as it is
                    if P in src and to.kind != "fanout":
                        kept.add(e.value)
                else:
                    bucketed.see(e, src, dst, held, self)
            if e.dst in held:
                continue  # the profile holds the gradient in its fan-out's spec: that is this buffer
            if (e.src, e.dst) in regathered and dst == gathered(src, self.zero_axes):
                continue  # ZeRO-3's gathered copy for this reader: ``transient_terms`` counts it
            if frm.kind == "fanout" and e.src not in held:
                hub_reads.append(((e.value, src, e.phase), pos[e.dst]))
            if src != dst and to.kind == "output":  # the output's spec is in the profile from here on;
                at = pos[e.dst]  # the piece it is made from lives while the collective runs
                spans.setdefault((e.value, src, "returned"), [local_nbytes(e.value.type, src, mesh_shape), at, at])
            if src == dst or to.kind == "output":
                continue
            key = (e.value, dst, e.phase)
            span = spans.get(key)
            if span is None:
                span = spans[key] = [local_nbytes(e.value.type, dst, mesh_shape), size, -1]
            if to.kind != "fanout" or to.gradient:  # a fan-out's spec is made at its first consumer (below)
                at = pos[e.dst]
                if at < span[1]:
                    span[1] = at
                if at > span[2]:
                    span[2] = at
        _widen(spans, hub_reads)
        extra = self._bucket_terms(choice, bucketed, spans) if len(bucketed.members) > 1 else []
        return [(nb, a, b) for nb, a, b in spans.values()] + extra

    def _bucket_terms(
        self, choice: list[int], seen: _Bucketed, spans: dict[tuple, list[int]]
    ) -> list[tuple[int, int, int]]:
        """The gradient buckets of ``choice`` as the runtime holds them (passes/bucket.py): the
        deferred all-reduces, in the order the lowering runs them (at their first reader), join
        the open bucket of their mesh axis and dtype while it holds at most ``bucket_bytes``; a
        bucket of two or more is packed right after its last member is made, and its one buffer
        lives until the last member's last reader (its members are views of it). Each member's
        own buffer (``spans``, from its first reader to its last) is dropped for it, and the
        partial sum it is made from, which the profile holds until the update reads it (or, with
        ZeRO, its fan-out's value), is freed at the pack: a negative term from there on. Returns
        the bucket buffers and those negative terms; ``spans`` loses the members' buffers."""
        pos = self.positions()
        members = sorted(
            seen.bucketable(self.items, self.edges).items(), key=lambda km: seen.first_read(km[0], km[1], spans)
        )
        buckets = fill_buckets(
            members, lambda km: (km[1].axis, km[1].dtype), lambda km: km[1].nbytes, self.bucket_bytes
        )
        ranges: dict[Value, list[tuple[int, int, int]]] = {m.value: [] for _k, m in members}
        for v, i, first, end in self.live_ranges():
            if v in ranges:
                ranges[v].append((i, first, end))
        out: list[tuple[int, int, int]] = []
        for group_members in buckets:
            if len(group_members) < 2:
                continue  # one all-reduce runs alone: its own buffer stays as counted
            nbytes = sum(m.nbytes for _k, m in group_members)
            packed = max(pos[m.producer] for _k, m in group_members)
            last = max(seen.last_read(k, m, spans) for k, m in group_members)
            out.append((nbytes, packed, last))
            for key, m in group_members:
                spans.pop(key, None)
                if m.value in seen.kept or m.value in self.offloaded:
                    continue  # a reader reads the partial sum itself: the runtime keeps it
                for i, first, end in ranges[m.value]:
                    if (i == m.producer or i == m.hub) and end > packed:
                        out.append((-int(self.strategy_bytes(m.value, i)[choice[i]]), max(first, packed + 1), end))
        return out

    def _held_in_hub(self) -> set[int]:
        """The gradient fan-out items whose value ``profile`` holds in the fan-out's spec from the
        fan-out on (``_live_ranges``): the redistribution into that spec makes the buffer the
        profile counts there, and the fan-out's readers read it as it is."""
        return {i for _v, i, _a, _b in self.live_ranges() if self.items[i].kind == "fanout"}

    def held_peak(self, choice: list[int]) -> int:
        """The peak of ``profile`` with the redistribution buffers added: what the runtime holds
        (``peak`` is what a memory limit bounds)."""
        prof = self.profile(choice)
        if not len(prof):
            return 0
        delta = np.zeros(len(prof) + 1, dtype=np.float64)
        for nb, a, b in self.redistribution_buffers(choice):
            delta[a] += nb
            delta[b + 1] -= nb
        return int((prof + np.cumsum(delta[:-1])).max())


@dataclass
class _Member:
    """A deferred all-reduce a gradient bucket may hold: its value, the item that makes the
    partial sum, its fan-out item when the profile holds the reduced value there (ZeRO's hub),
    the mesh axis and dtype (the bucket's key) and the bytes it adds to a bucket."""

    value: Value
    producer: int
    hub: int | None
    axis: int
    dtype: object
    nbytes: int


class _Bucketed:
    """What ``MemoryModel._bucket_terms`` needs of a choice's edges, gathered in one pass over
    them (``see``): the deferred all-reduces (by their buffer's key in ``spans``, or the held
    hub's ``("hub", item)``), the values some reader reads as a partial sum (``kept``), and the
    first and last reader of each held hub."""

    def __init__(self) -> None:
        self.members: dict[tuple, _Member] = {}
        self.kept: set[Value] = set()
        self.hub_reads: dict[int, list[int]] = {}  # held hub item -> [first reader, last reader]
        self.sliced: set[int] = set()  # held hubs some reader reads in another spec
        self.results: list[int] = []  # the items reading a deferred all-reduce's result

    def see(self, e: Edge, src: tuple, dst: tuple, held: set[int], model: MemoryModel) -> None:
        """Note edge ``e``, redistributed from ``src`` to ``dst``; ``held``: the fan-out items whose
        value the profile holds (``MemoryModel._held_in_hub``)."""
        items = model.items
        if e.src in held:
            at = model.positions()[e.dst]
            r = self.hub_reads.setdefault(e.src, [at, at])
            r[0], r[1] = min(r[0], at), max(r[1], at)
            if src != dst:
                self.sliced.add(e.src)  # the lowering reduces it into its readers' spec instead (ZeRO)
        if src == dst:
            if items[e.dst].kind != "fanout" and P in src:
                self.kept.add(e.value)  # read as the partial sum it is (a linear update op)
            return
        t = e.value.type
        steps = plan_steps(t.shape, t.dtype.itemsize, src, dst, model.mesh)
        if not (e.deferred and len(steps) == 1 and steps[0].kind == "all_reduce") or items[e.dst].kind == "output":
            if P in src:
                self.kept.add(e.value)  # some other collective reads the partial sum
            return
        frm = items[e.src]
        producer = frm.index if frm.kind == "fanout" else e.src
        hub = e.dst if e.dst in held else None
        key = ("hub", e.dst) if hub is not None else (e.value, dst, e.phase)
        self.members[key] = _Member(e.value, producer, hub, steps[0].axis, t.dtype, steps[0].local_bytes)
        self.results.append(e.dst)

    def bucketable(self, items: list[Item], edges: list[Edge]) -> dict[tuple, _Member]:
        """The members the lowering can put in a bucket: not a ZeRO hub whose readers take a
        piece of it (the lowering reduce-scatters into that piece at once, passes/lower.py
        ``scatter_early``), and not one whose partial sum is computed from a deferred
        all-reduce's result (passes/bucket.py runs it alone: its bucket could not wait for it;
        only a partial sum the update makes can be)."""
        members = {k: m for k, m in self.members.items() if m.hub not in self.sliced}
        made_in_update = [m.producer for m in members.values() if _part(items[m.producer]) == "update"]
        if not made_in_update:
            return members
        succ: dict[int, list[int]] = {}
        for e in edges:
            succ.setdefault(e.src, []).append(e.dst)
        tainted: set[int] = set()
        stack = list(self.results)
        while stack:
            i = stack.pop()
            if i not in tainted:
                tainted.add(i)
                stack += succ.get(i, [])
        return {k: m for k, m in members.items() if m.producer not in tainted}

    def first_read(self, key: tuple, m: _Member, spans: dict[tuple, list[int]]) -> int:
        """Where the lowering runs the member's all-reduce: its reduced value's first reader."""
        return self.hub_reads.get(m.hub, [0, 0])[0] if m.hub is not None else spans[key][1]

    def last_read(self, key: tuple, m: _Member, spans: dict[tuple, list[int]]) -> int:
        return self.hub_reads.get(m.hub, [0, 0])[1] if m.hub is not None else spans[key][2]


def _widen(spans: dict[tuple, list[int]], hub_reads: list[tuple[tuple, int]]) -> None:
    """A redistributed fan-out's buffer (in ``spans``) lives from its first reader to its last."""
    for key, at in hub_reads:
        span = spans.get(key)
        if span is not None:
            span[1], span[2] = min(span[1], at), max(span[2], at)


def _part(item: Item) -> str | None:
    return item.node.part if item.node is not None else None


def gathered(spec: tuple, axes: tuple[int, ...]) -> tuple:
    """``spec`` with its splits along ``axes`` undone (R there)."""
    return tuple(R if a in axes and p.is_split else p for a, p in enumerate(spec))


@functools.lru_cache(maxsize=1 << 16)
def local_nbytes(t: TensorType, spec, mesh_shape: tuple[int, ...]) -> int:
    """Bytes one device holds of a tensor of type ``t`` placed by ``spec`` (remembered: a memory
    profile asks for the same few thousand (type, spec) pairs for every value of every layer)."""
    return t.dtype.itemsize * math.prod(local_shape(t.shape, spec, mesh_shape))


def fused_inside(graph: Graph) -> set[Value]:
    """The backward values of ``graph``'s top-level nodes that the device passes' fusion
    (passes/fuse.py) keeps inside one kernel: made by a node of an elementwise cluster of the
    backward pass and read only by nodes of the same cluster, never returned. A kernel never
    writes them out, so they hold no memory. The peak of a training step under recomputation is
    in the backward pass, at a softmax's or layer norm's backward, whose kernel holds its inputs
    and results only: counting the unfused nodes' values there over-predicted a 4-layer GPT
    step's measured peak by 15% (3% without a limit). Forward and update clusters are counted as
    before (the update's kernels hold more than its unfused values: tests/passes/sharding/
    test_zero.py). For now only problems with recomputation choices use it (a memory limit with
    ``recompute`` "auto" or "on"): the sequence-parallel tests' limits were derived from the
    model without it (tests/passes/sharding/test_seqpar.py; docs/remat.md)."""
    nodes = graph.nodes
    # backward clusters are made of backward nodes only, so the nodes before the first of them are
    # left out: clustering the rest finds the same backward clusters (fuse.py ``_producer_index``);
    # clustering goes node by node and never adds a later part's node to a backward cluster, so
    # the nodes after the last backward one (the update's: most of the clusters) are left out too
    start = next((k for k, n in enumerate(nodes) if n.part == "backward"), len(nodes))
    end = next((k for k in range(len(nodes) - 1, start - 1, -1) if nodes[k].part == "backward"), start - 1) + 1
    nodes = nodes[start:]
    outputs = set(graph.outputs)
    # a value is read only inside its cluster when its reads there (an operand each) are all its
    # reads, the update's included: counted, not a list of readers per value of the graph
    reads = Counter(chain.from_iterable(map(_INPUTS, nodes)))
    inside: set[Value] = set()
    for cluster in find_clusters(nodes[: end - start]):
        if cluster.part != "backward":
            continue
        members = [nodes[k] for k in cluster.nodes]
        within = Counter(chain.from_iterable(map(_INPUTS, members)))
        for n in members:
            for o in n.outputs:
                if o not in outputs and reads[o] and within[o] == reads[o]:
                    inside.add(o)
    return inside


_INPUTS = operator.attrgetter("inputs")


def view_roots(graph: Graph) -> dict[Value, Value]:
    """{value: the value whose buffer it looks into} for the results of ``graph``'s top-level
    nodes whose op returns a view of an operand (the ViewOf trait, which the executor reads too):
    no new memory. A reshape of a strided view copies, as numpy's does; so does a reshape of an
    elementwise op's or a reduction's result over a strided operand, which numpy lays out as
    that operand (its ufuncs' ``order="K"``: ``np.add(1, a.T)`` is as transposed as ``a.T``),
    counted as strided whenever any operand is (never an under-count)."""
    roots: dict[Value, Value] = {}
    strided: set[Value] = set()  # values that may not be C-contiguous
    for node in graph.nodes:
        op = node.op
        view = op.trait(ViewOf)
        if view is None:
            # the op's result laid out as its operands are: strided when one of them is
            if (
                strided
                and not node.regions
                and (op.has(Elementwise) or op.has(Reduction))
                and not strided.isdisjoint(node.inputs)
            ):
                strided.update(node.outputs)
            continue
        if node.regions or not node.inputs:
            continue
        x = node.inputs[view.operand]
        if view.copies_strided and x in strided:
            continue  # numpy copies
        for out in node.outputs:
            roots[out] = roots.get(x, x)
            if x in strided or (view.strided is not None and view.strided(node)):
                strided.add(out)
    return roots


__all__ = ["MemoryModel", "RematRanges", "gathered", "local_nbytes", "view_roots"]
