"""Shrinking the auto-sharding problem: items put into *groups* that share one ILP strategy
variable, each member mapping the group's strategy index to its own (passes/sharding/ilp.py's
module doc: tying repeated structure by Weisfeiler-Lehman refinement, and followers)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graphc.core.collector import collector_paused
from graphc.core.traits import Constant, FollowsProducer, stream_position
from graphc.passes.blocks import KEYED_LAYER
from graphc.passes.sharding.items import Edge, Item
from graphc.passes.sharding.problem import SHAPE_DTYPE, ArrayTokens, Problem


@dataclass
class Group:
    members: list[tuple[int, np.ndarray]]  # (item index, group strategy -> item strategy)
    size: int


def _attr_key(v, dtype_texts: dict | None = None, arrays: ArrayTokens | None = None):
    """An attribute's value as a label part: an array by its shape, dtype and contents (a token
    of ``arrays``, or a digest), anything else by its repr (a dtype's, made in Python, once per
    dtype object: ``dtype_texts`` holds (the object, its repr) by dtype)."""
    if isinstance(v, np.ndarray):
        if arrays is not None:
            return ("array", *arrays(v))
        return (
            "array",
            v.shape,
            v.dtype.str,
            hashlib.blake2b(np.ascontiguousarray(v).tobytes(), digest_size=8).hexdigest(),
        )
    if dtype_texts is not None and isinstance(v, np.dtype):
        known = dtype_texts.get(v)
        if known is None or known[0] is not v:
            known = dtype_texts[v] = (v, repr(v))
        return known[1]
    return repr(v)


class _AttrKeys:
    """``_attr_key`` of one problem's attributes: each dtype object's repr made once, arrays as
    ``ArrayTokens`` (no digest of a large constant: its bytes are compared, if at all, only with
    those of arrays of its shape and dtype)."""

    def __init__(self) -> None:
        self.dtype_texts: dict = {}
        self.arrays = ArrayTokens()

    def __call__(self, v):
        return _attr_key(v, self.dtype_texts, self.arrays)


_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")  # list positions in pytree paths: blocks.3.attn


def _layer_names(p: Problem) -> dict[str, str]:
    """Each input's name with its layer's number replaced by ``#``: list positions
    (``blocks.3.attn``), and in a name with none, the number of a dict key of a name and a number
    holding a layer's arrays (``h.layer3.attn``) when at least 3 inputs' keys of that name differ
    in it: layers kept in a dict, as passes/blocks.py ``find_layers`` reads them (a key holding
    one array, ``params.w1``, is no layer)."""
    names = {it.value.name or "" for it in p.items if it.kind == "input" and it.value is not None}
    matches = {name: None if _INDEX.search(name) else KEYED_LAYER.match(name) for name in names}
    keyed: dict[str, set[int]] = {}
    for m in matches.values():
        if m:
            keyed.setdefault(m.group(1), set()).add(int(m.group(2)))
    return {
        name: f"{m.group(1)}#.{m.group(3)}" if m and len(keyed[m.group(1)]) >= 3 else _INDEX.sub("#", name)
        for name, m in matches.items()
    }


class _Interner(dict):
    """Equal keys get equal small ints (in first-seen order): a class label that hashes fast."""

    def __call__(self, key) -> int:
        got = self.get(key)
        if got is None:
            got = self[key] = len(self)
        return got


def _item_label(
    it: Item, intern: _Interner, strategy_labels: dict, names: dict[str, str], attr_key: Callable = _attr_key
) -> int:
    """The label of what tells an item apart on its own: a node's op, attributes (not a random
    draw's stream position: layers' dropout masks tie), types, source line and part, an input's or output's type (and an input's name without list positions),
    and the strategies and pin of either. (A type enters as its shape and dtype, a source line
    as its file and line: equal exactly when the type or the printed line is, and compared
    without a call into Python.)"""
    strat = strategy_labels.get(id(it.strategies.as_tuple))
    if strat is None:  # items of repeated layers share their strategy tuples (the items hold them)
        strat = strategy_labels[id(it.strategies.as_tuple)] = intern(
            tuple((s.in_specs, s.out_specs, s.recompute, s.checkpoint) for s in it.strategies)
        )
    if it.kind == "node":
        n = it.node
        assert n is not None  # a node item holds its node
        attrs: tuple = ()
        if n.attrs:
            skip = stream_position(n)
            attrs = tuple(sorted([(k, attr_key(v)) for k, v in n.attrs.items() if k not in skip]))
        loc = n.loc
        key: tuple = (
            "node",
            n.op.name,
            attrs,
            tuple(map(SHAPE_DTYPE, n.inputs)),
            tuple(map(SHAPE_DTYPE, n.outputs)),
            None if loc is None else (loc.file, loc.line),
            n.part,
            strat,
            it.pinned,
        )
    else:
        v = it.value
        assert v is not None  # an input, output or fan-out item holds its value
        name = names[v.name or ""] if it.kind == "input" else ""
        key = (it.kind, SHAPE_DTYPE(v), name, strat, it.pinned)
    got = intern.get(key)  # a repeated layer's label is mostly known: no call to number it
    return intern(key) if got is None else got


def structure_classes(p: Problem, rounds: int = 3) -> list[int]:
    """Every item's class after ``rounds`` of Weisfeiler-Lehman refinement: items with equal
    labels are indistinguishable (the same layer of a repeated block). A round gives two items
    one label when they had one label and their in-edges (operand position, result index, the
    source's label, by operand position) and their out-edges (result index, operand position, the
    reader's label, as a multiset) are equal: exact, as interning those tuples would be, done on
    integer arrays a row per item (``_refine``). Only the partition means something: labels
    are small integers, not in any particular order."""
    intern = _Interner()
    strategy_labels: dict = {}
    names = _layer_names(p)
    attr_key = _AttrKeys()
    label = np.array([_item_label(it, intern, strategy_labels, names, attr_key) for it in p.items], dtype=np.int64)
    edges = p.edges
    src = np.array([e.src for e in edges], dtype=np.int64)
    src_out = np.array([e.src_out for e in edges], dtype=np.int64)
    dst = np.array([e.dst for e in edges], dtype=np.int64)
    dst_in = np.array([e.dst_in for e in edges], dtype=np.int64)
    n = len(label)
    ins = _Side(dst, np.lexsort((src, src_out, dst_in, dst)), n)  # by operand position, as a sequence
    outs = _Side(src, np.lexsort((dst, dst_in, src_out, src)), n)  # sorted again each round: a multiset
    for _ in range(rounds):
        label = _refine(label, ins, dst_in, src_out, src, outs, src_out, dst_in, dst)
    return label.tolist()


class _Side:
    """The in- or out-edges of every item: ``order`` sorts the edges by ``owner`` (then as that
    side wants), ``degree`` and ``start`` place each item's edges in it."""

    def __init__(self, owner: np.ndarray, order: np.ndarray, n: int) -> None:
        self.order = order
        self.degree = np.bincount(owner, minlength=n)
        self.start = np.cumsum(self.degree) - self.degree


def _refine(
    label: np.ndarray,
    ins: _Side,
    in_a: np.ndarray,
    in_b: np.ndarray,
    in_other: np.ndarray,
    outs: _Side,
    out_a: np.ndarray,
    out_b: np.ndarray,
    out_other: np.ndarray,
) -> np.ndarray:
    """One round of ``structure_classes``: items of one in- and out-degree are rows of (label,
    in-edges in order, out-edges sorted), equal rows one new label."""
    n = len(label)
    in_rows = np.stack([in_a, in_b, label[in_other]], axis=1)[ins.order]
    out_rows = np.stack([out_a, out_b, label[out_other]], axis=1)[outs.order]
    owner = np.repeat(np.arange(n), outs.degree)  # the owner of each row, in that order
    out_rows = out_rows[np.lexsort((out_rows[:, 2], out_rows[:, 1], out_rows[:, 0], owner))]
    new = np.empty(n, dtype=np.int64)
    degrees = ins.degree * (int(outs.degree.max(initial=0)) + 1) + outs.degree
    kinds, kind_of = np.unique(degrees, return_inverse=True)
    offset = 0
    for k in range(len(kinds)):
        items = np.flatnonzero(kind_of == k)
        d_in, d_out = int(ins.degree[items[0]]), int(outs.degree[items[0]])
        cols = [label[items][:, None]]
        if d_in:
            cols.append(in_rows[ins.start[items][:, None] + np.arange(d_in)].reshape(len(items), -1))
        if d_out:
            cols.append(out_rows[outs.start[items][:, None] + np.arange(d_out)].reshape(len(items), -1))
        rows = np.ascontiguousarray(np.concatenate(cols, axis=1))
        whole = rows.view(np.dtype((np.void, rows.itemsize * rows.shape[1]))).reshape(-1)  # a row: one bytes value
        inverse = np.unique(whole, return_inverse=True)[1].reshape(-1)
        new[items] = offset + inverse
        offset += int(inverse.max()) + 1
    return new


FOLLOW_ABOVE_GROUPS = 2000  # following loses up to ~10% (GPT on tp=2: 4.86 against 4.32 ms tied only)


@collector_paused()
def shrink_groups(p: Problem, tie: bool = True, follow: bool | None = None) -> tuple[list[Group], list[int]]:
    """Groups of items sharing a strategy variable, and each item's group index. ``follow=None``:
    merge followers only when there are more than FOLLOW_ABOVE_GROUPS groups."""
    groups, of = _tied_groups(p) if tie else _single_groups(p)
    if follow or (follow is None and len(groups) > FOLLOW_ABOVE_GROUPS):
        groups, of = _merge_followers(p, groups, of)
    return groups, of


def _single_groups(p: Problem) -> tuple[list[Group], list[int]]:
    """One group per item (no tying)."""
    groups = [Group([(i, np.arange(len(it.strategies)))], len(it.strategies)) for i, it in enumerate(p.items)]
    return groups, list(range(len(p.items)))


def _tied_groups(p: Problem) -> tuple[list[Group], list[int]]:
    """One group per structure class (``structure_classes``), its members in item order and
    mapping the group's strategies to their own one to one."""
    labels = structure_classes(p)
    classes: dict[int, list[int]] = {}
    for i, lab in enumerate(labels):
        classes.setdefault(lab, []).append(i)
    number = {lab: g for g, lab in enumerate(classes)}  # groups in the order of their first items
    groups: list[Group] = []
    for members in classes.values():
        k = len(p.items[members[0]].strategies)
        same = np.arange(k)  # one map object for all members: objective_terms counts repeats by it
        groups.append(Group([(i, same) for i in members], k))
    return groups, [number[lab] for lab in labels]


def _merge_followers(p: Problem, groups: list[Group], of: list[int]) -> tuple[list[Group], list[int]]:
    """Move every group that can follow (``_follow``) into the group it follows, in the order of
    the groups' first items, then drop the emptied groups."""
    in_edges: list[list[Edge]] = [[] for _ in p.items]
    for e in p.edges:
        in_edges[e.dst].append(e)
    mapping = {i: m for g in groups for i, m in g.members}  # item -> (its group's strategy -> its own)
    for gi in sorted(range(len(groups)), key=lambda g: min(i for i, _ in groups[g].members)):
        g = groups[gi]
        if not g.members:
            continue
        follow = _follow(p, g, gi, of, mapping, in_edges)
        if follow is None:
            continue
        target, maps = follow
        for i, m in maps:
            groups[target].members.append((i, m))
            mapping[i] = m
            of[i] = target
        g.members = []
    return _renumber(groups, of)


def _follow(
    p: Problem,
    g: Group,
    gi: int,
    of: list[int],
    mapping: dict[int, np.ndarray],
    in_edges: list[list[Edge]],
) -> tuple[int, list[tuple[int, np.ndarray]]] | None:
    """The group that group ``gi`` follows and each member's map from that group's strategies to
    its own, or None: every member must follow (``_followed_operand``) a value produced by one
    and the same other group, and read it as produced under each of that group's strategies."""
    target: int | None = None
    maps: list[tuple[int, np.ndarray]] = []
    for i, _m in g.members:
        main = _followed_operand(p, i, in_edges[i])
        if main is None:
            return None
        tg = of[main.src]
        if tg == gi or (target is not None and tg != target):
            return None
        target = tg
        m = _follow_map(p, main, mapping[main.src])
        if m is None:
            return None
        maps.append((i, m))
    if target is None:
        return None
    return target, maps


def _followed_operand(p: Problem, i: int, in_edges: list[Edge]) -> Edge | None:
    """The edge item ``i`` would follow: the largest non-constant operand (the first of equal
    size) of an unpinned elementwise / shape / fused node; None for any other item."""
    it = p.items[i]
    if it.kind != "node" or it.node is None or it.pinned or not it.node.op.has(FollowsProducer) or not in_edges:
        return None
    cand = [e for e in in_edges if not _is_constant(p.items[e.src])]
    if not cand:
        return None
    return max(cand, key=lambda e: (e.value.type.size, -e.dst_in))


def _is_constant(it: Item) -> bool:
    """A constant node (never followed: the 0 of a relu says nothing about the placement)."""
    return it.kind == "node" and it.node is not None and it.node.op.has(Constant)


def _follow_map(p: Problem, main: Edge, src_map: np.ndarray) -> np.ndarray | None:
    """For each strategy of the producer's group: the consumer's cheapest strategy (the first of
    equal cost) that reads ``main`` in the spec the producer leaves it in; None if some producer
    strategy has no such consumer strategy."""
    producer = p.items[main.src]
    consumer = p.items[main.dst]
    new_map = []
    for s in src_map:
        spec = producer.strategies[s].out_specs[main.src_out]
        if any(q.kind == "P" for q in spec):
            return None  # a partial sum may be carried on or reduced here: the ILP decides
        best = _cheapest_reading(consumer, main.dst_in, spec)
        if best is None:
            return None
        new_map.append(best)
    return np.array(new_map, dtype=np.int64)


def _cheapest_reading(it: Item, k: int, spec: tuple) -> int | None:
    """The index of the item's cheapest strategy (the first of equal cost) whose operand ``k`` has
    spec ``spec``, or None."""
    best: int | None = None
    for s, st in enumerate(it.strategies):
        if st.in_specs[k] == spec and (best is None or st.compute_s < it.strategies[best].compute_s):
            best = s
    return best


def _renumber(groups: list[Group], of: list[int]) -> tuple[list[Group], list[int]]:
    """Drop the empty groups; renumber the others (and every item's group index) in order."""
    keep = [gi for gi, g in enumerate(groups) if g.members]
    renum = {gi: k for k, gi in enumerate(keep)}
    return [groups[gi] for gi in keep], [renum[g] for g in of]


__all__ = ["FOLLOW_ABOVE_GROUPS", "Group", "shrink_groups", "structure_classes"]
