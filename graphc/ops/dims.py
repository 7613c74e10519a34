"""Dimension rules: how an op's tensor dimensions relate, which is all that sharding needs to know.

An op's ``dim_rule(in_types, out_types, **attrs) -> DimRule`` names every dimension of every operand
and result with a *label* (like an einsum equation). Splitting one label over a mesh axis splits
every dimension that carries it; an operand without the label is replicated along that axis; a
label that is summed away (``sums``) leaves each device with a partial sum of the result, the
placement ``P``. A dimension whose label is ``None`` cannot be split (a broadcast size-1 dim, a
sliced dim, the reduced dim of a max).

An occurrence may carry a *block factor* ``f``: written ``(label, f)``, it says that dimension is
made of ``f`` equal pieces that correspond, piece by piece, to the other occurrences of the label
(``split(x, 3)``: the input's axis is 3 blocks, one per output). Splitting the label with block
count ``b`` gives that dimension the placement ``S(d, blocks=b*f)``: each device holds its share of
every one of the ``b*f`` blocks. This is how the fused QKV projection of GPT-2 can be split by
heads: ``x @ W_qkv`` with ``W_qkv`` placed ``S(1, blocks=3)`` yields ``q``, ``k`` and ``v`` each
split by columns, without moving data.

A dimension may carry *alternative* labels, written as a tuple of ``(label, factor)`` entries
(``(("r0", 1), ("r0.0.1", 3))``): splitting any one of them splits that dimension, and a strategy
uses at most one of them per dimension. A reshape that splits a dim of size ``3*H*E`` into
``[3, H, E]`` gives that dim three alternatives: split the ``3`` (factor 1), split ``H`` inside
each of the 3 blocks (factor 3), or split ``E`` inside each of the ``3*H`` blocks (factor 3H).
The first alternative is the dimension's *primary* label: the one it is identified with when
dims are grouped into classes (fused regions, axis roles); the others only say how it can be cut.
A tuple that starts with None has no primary label (the ``H`` and ``E`` dims above: splitting
them cuts the source dim, but they are not the same dim as it).

``masked`` labels are split by *ranges of an index space* (a row-split embedding table): the local
op must offset and mask indices (lowering reads this); ``sums`` then says the masked result is
partial.

``partial_inputs`` names operands the op is linear in, which take the placement ``P`` when a
``sums`` label is split: ``scatter_add(x, i, u)`` with the indices split adds each device's share
of the updates into its partial copy of ``x``.

An op's ``cost(in_types, out_types, **attrs) -> (flops, bytes)`` gives the work of the whole op on
one device; the planner divides it by the number of pieces a strategy splits it into.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from graphc.core.traits import LinearIn

Occurrence = "str | tuple[str, int] | tuple[str | tuple[str, int], ...] | None"

MAX_BLOCKS = 16  # the largest block count a split carries (strategies enumerate no more)


@dataclass(frozen=True)
class DimRule:
    inputs: tuple[tuple, ...]  # per operand, one entry per dim: label, (label, factor), alternatives or None
    outputs: tuple[tuple, ...]  # per result, the same
    sums: frozenset = frozenset()  # labels summed away: splitting them makes the results partial (P)
    masked: frozenset = frozenset()  # labels split as index ranges (local op masks indices)
    partial_inputs: frozenset = frozenset()  # operands that take P when a ``sums`` label is split
    notes: dict = field(default_factory=dict, compare=False)

    def occurrences(self, primary_only: bool = False) -> tuple[tuple[str, int, int, str, int], ...]:
        """(side, index, dim, label, factor) for every label of every dimension, alternatives
        included (only each dimension's primary label with ``primary_only``). Computed once per
        rule: the planner asks for them many times over on every node."""
        key = "_primary" if primary_only else "_all"
        hit = self.__dict__.get(key)
        if hit is None:
            hit = tuple(self._occurrences(primary_only))
            object.__setattr__(self, key, hit)  # a cache on a frozen value
        return hit

    def _occurrences(self, primary_only: bool):
        for side, tensors in (("in", self.inputs), ("out", self.outputs)):
            for i, dims in enumerate(tensors):
                for d, entry in enumerate(dims):
                    first = norm(entry)
                    found = ((first,) if first else ()) if primary_only else alternatives(entry)
                    for label, factor in found:
                        yield side, i, d, label, factor

    def labels(self) -> list[str]:
        """The splittable labels, in first-seen order: a label must appear at most once per tensor,
        and either in a result or in ``sums``. Computed once per rule, like ``occurrences``."""
        hit = self.__dict__.get("_labels")
        if hit is None:
            hit = self._labels()
            object.__setattr__(self, "_labels", hit)  # a cache on a frozen value
        return list(hit)

    def _labels(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        per_tensor: dict[tuple, int] = {}
        for side, i, _d, label, _f in self.occurrences():
            seen.setdefault(label)
            per_tensor[(side, i, label)] = per_tensor.get((side, i, label), 0) + 1
        bad = {lab for (_s, _i, lab), n in per_tensor.items() if n > 1}
        in_out = {lab for side, _i, _d, lab, _f in self.occurrences() if side == "out"}
        return tuple(lab for lab in seen if lab not in bad and (lab in in_out or lab in self.sums))


def alternatives(entry) -> tuple[tuple[str, int], ...]:
    """The (label, factor) alternatives of a rule entry, the primary one (if any) first; () for
    None. A tuple of alternatives may start with None: the dimension has no primary label."""
    if entry is None:
        return ()
    if isinstance(entry, str):
        return ((entry, 1),)
    if isinstance(entry[0], str):
        return ((entry[0], int(entry[1])),)
    return tuple(alt for e in entry for alt in alternatives(e))


def norm(entry):
    """(label, factor) of a rule entry's primary label, or None."""
    if entry is None:
        return None
    if isinstance(entry, str) or isinstance(entry[0], str):
        return alternatives(entry)[0]
    return norm(entry[0])  # a tuple of alternatives: its first, None when it has no primary


def elementwise_rule(in_types, out_types) -> DimRule:
    """numpy broadcasting: dims align from the right; a size-1 operand dim under a larger result dim
    is broadcast (label None, the operand is replicated along any split of it)."""
    out = out_types[0]
    labels = tuple(f"e{d}" for d in range(out.ndim))
    ins = []
    for t in in_types:
        offset = out.ndim - t.ndim
        ins.append(
            tuple(
                None if (t.shape[d] == 1 and out.shape[offset + d] != 1) else labels[offset + d] for d in range(t.ndim)
            )
        )
    return DimRule(tuple(ins), tuple(labels for _ in out_types))


def reshape_groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[list[int], list[int]]] | None:
    """Split two shapes of equal size into the shortest runs of dims with equal products:
    [(src dims, dst dims), ...]; a size-1 dim on one side only is a run of its own. None when the
    shapes hold zero elements or do not match."""
    if 0 in src or 0 in dst:
        return None
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        if i < len(src) and src[i] == 1 and (j >= len(dst) or dst[j] != 1):
            groups.append(([i], []))
            i += 1
            continue
        if j < len(dst) and dst[j] == 1 and (i >= len(src) or src[i] != 1):
            groups.append(([], [j]))
            j += 1
            continue
        if i >= len(src) or j >= len(dst):
            return None
        gi, gj, pi, pj = [i], [j], src[i], dst[j]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj and i < len(src):
                pi, i = pi * src[i], i + 1
                gi.append(i - 1)
            elif pj < pi and j < len(dst):
                pj, j = pj * dst[j], j + 1
                gj.append(j - 1)
            else:
                return None
        groups.append((gi, gj))
    return groups


def reshape_rule(in_types, out_types) -> DimRule:
    """A reshape relates the dims of each run it merges or splits (``reshape_groups``) through the
    flat range the run covers. Splitting dim i of a run in ``f`` blocks over n devices gives each
    device its n-th of each of ``B_i * f`` equal flat blocks, where ``B_i`` is the product of the
    run's dims before i; a dim on the other side with ``B'_j * g == B_i * f`` holds exactly the
    same elements. So every pair (i, j) of dims across a run is a label, with the smallest block
    factors that make the counts meet: ``K = lcm(B_i, B'_j)``, source factor ``K / B_i``, result
    factor ``K / B'_j`` (``[3*H*E] -> [3, H, E]``: splitting H is ``S(0, blocks=3)`` of the
    source; the leading pair has K = 1, no blocks). The leading dims are each other's primary
    label (the same dim, as before alternatives existed); the other dims have no primary label.
    A device's piece holds the same flat elements in the same (row-major) order on both sides, so
    the local op is a reshape to the local shape."""
    src, dst = in_types[0].shape, out_types[0].shape
    ins: list = [None] * len(src)
    outs: list = [None] * len(dst)
    groups = reshape_groups(src, dst) or []
    for k, (gi, gj) in enumerate(groups):
        if not (gi and gj and src[gi[0]] > 1 and dst[gj[0]] > 1):
            continue
        src_alts: dict[int, list] = {i: [] for i in gi}
        dst_alts: dict[int, list] = {j: [] for j in gj}
        for a, i in enumerate(gi):
            for b, j in enumerate(gj):
                pair = _run_pair(src, gi[:a], i, dst, gj[:b], j)
                if pair is None:
                    continue
                label = f"r{k}" if a == b == 0 else f"r{k}.{a}.{b}"
                src_alts[i].append((label, pair[0]))
                dst_alts[j].append((label, pair[1]))
        for i in gi:
            ins[i] = _alternatives_entry(src_alts[i], leading=i == gi[0])
        for j in gj:
            outs[j] = _alternatives_entry(dst_alts[j], leading=j == gj[0])
    return DimRule((tuple(ins),), (tuple(outs),))


def _run_pair(src, src_before, i, dst, dst_before, j) -> tuple[int, int] | None:
    """(source factor, result factor) that make a split of ``src[i]`` and one of ``dst[j]`` hold
    the same flat elements of their run (the dims before them: ``*_before``), or None when either
    dim is 1, cannot hold its blocks, or would need more than MAX_BLOCKS of them."""
    if src[i] == 1 or dst[j] == 1:
        return None
    before_src = math.prod(src[d] for d in src_before)
    before_dst = math.prod(dst[d] for d in dst_before)
    k = math.lcm(before_src, before_dst)
    f_src, f_dst = k // before_src, k // before_dst
    if max(f_src, f_dst) > MAX_BLOCKS or src[i] % f_src or dst[j] % f_dst:
        return None
    return f_src, f_dst


def _alternatives_entry(alts: list, leading: bool):
    """A rule entry from a dim's (label, factor) alternatives: the first is primary for a leading
    dim of a run; a plain label when it is the only one and factor 1."""
    if not alts:
        return None
    if leading and len(alts) == 1 and alts[0][1] == 1:
        return alts[0][0]
    return tuple(alts) if leading else (None, *alts)


def identity_rule(in_types, out_types, **_attrs) -> DimRule:
    """Every dim of the (single) operand is the same dim of the result."""
    labels = tuple(f"e{d}" for d in range(out_types[0].ndim))
    return DimRule((labels,), (labels,))


def io_bytes(in_types, out_types) -> int:
    return sum(t.nbytes for t in in_types) + sum(t.nbytes for t in out_types)


def default_cost(in_types, out_types, **_attrs) -> tuple[float, int]:
    """One flop per result element; every operand read once and every result written once."""
    return float(sum(t.size for t in out_types)), io_bytes(in_types, out_types)


def view_cost(in_types, out_types, **_attrs) -> tuple[float, int]:
    """A view (reshape, broadcast, constraint): no work of its own."""
    return 0.0, 0


def copy_cost(in_types, out_types, **_attrs) -> tuple[float, int]:
    """A data movement (transpose, slice, pad, concatenate): its results are written once and the
    elements they come from read once."""
    out = sum(t.nbytes for t in out_types)
    return 0.0, 2 * out


DimKey = tuple[int, int]  # (id(value), dim): one dimension of one value inside a region


class _DimClasses:
    """Union-find over the dimensions of a region's values: dims some inner node relates end up in
    one class, named by its root key."""

    def __init__(self) -> None:
        self.parent: dict[DimKey, DimKey] = {}

    def find(self, x: DimKey) -> DimKey:
        """The root of ``x``'s class (``x`` joins as a class of its own when new)."""
        parent = self.parent
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: DimKey, b: DimKey) -> None:
        """Merge the classes of ``a`` and ``b`` (the root with the smaller repr stays the root)."""
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb, key=repr)] = min(ra, rb, key=repr)


def region_rule(region) -> DimRule | None:
    """The rule of a region (a fused cluster) composed from the rules of its nodes.

    Dimensions that some inner node relates are unified (union-find over (value, dim)). A class
    can be split when, at every inner node it touches, it is exactly the set of dims of one
    splittable label of that node's rule, present in all of the node's results, not summed and
    not masked: then each device runs the whole region on its slices. Everything else is None."""
    classes = _DimClasses()
    inner = [(node, _inner_rule(node)) for node in region.nodes]
    for node, rule in inner:
        if rule is not None:
            _unify_labelled_dims(classes, node, rule)
    for v in list(region.inputs) + list(region.outputs):
        for d in range(v.type.ndim):
            classes.find((id(v), d))
    bad: set[DimKey] = set()
    for node, rule in inner:
        bad.update(_unsplittable_classes(classes, node, rule))
    return _label_region_dims(classes, bad, region)


def _inner_rule(node) -> DimRule | None:
    """The dim rule of an inner node, or None when its op has none (or the node has regions)."""
    fn = node.op.dim_rule
    if fn is None or node.regions:
        return None
    return fn(tuple(v.type for v in node.inputs), tuple(o.type for o in node.outputs), **node.attrs)


def _unify_labelled_dims(classes: _DimClasses, node, rule: DimRule) -> None:
    """Put every dim of the node's operands and results that carries the same label as its primary
    label in one class (an alternative relates dims without making them one dim)."""
    first: dict[str, DimKey] = {}
    for side, i, d, label, _f in rule.occurrences(primary_only=True):
        v = node.inputs[i] if side == "in" else node.outputs[i]
        key = (id(v), d)
        classes.find(key)
        if label in first:
            classes.union(first[label], key)
        else:
            first[label] = key


def _touched_dims(classes: _DimClasses, node) -> dict[DimKey, set[tuple[str, int, int]]]:
    """For each class the node touches, the (side, index, dim) of the node's dims in it."""
    values = [(("in", i), v) for i, v in enumerate(node.inputs)] + [(("out", i), v) for i, v in enumerate(node.outputs)]
    touched: dict[DimKey, set[tuple[str, int, int]]] = {}
    for (side, i), v in values:
        for d in range(v.type.ndim):
            touched.setdefault(classes.find((id(v), d)), set()).add((side, i, d))
    return touched


def _splittable_label_dims(node, rule: DimRule) -> list[set[tuple[str, int, int]]]:
    """The (side, index, dim) sets of the labels the node can be split along: splittable by its
    rule, not summed, not masked, without block factors, and present in every result."""
    ok_labels = set(rule.labels()) - set(rule.sums) - set(rule.masked)
    n_out = len(node.outputs)
    by_label: dict[str, set[tuple[str, int, int]]] = {}
    factors: dict[str, set[int]] = {}
    for side, i, d, label, f in rule.occurrences():
        by_label.setdefault(label, set()).add((side, i, d))
        factors.setdefault(label, set()).add(f)
    return [
        occ
        for label, occ in by_label.items()
        if label in ok_labels and factors[label] == {1} and len({i for s, i, _d in occ if s == "out"}) == n_out
    ]


def _unsplittable_classes(classes: _DimClasses, node, rule: DimRule | None) -> set[DimKey]:
    """The classes touched by the node that cannot be split at it: all of them when the node has no
    rule, else those that are not exactly the dims of one of its splittable labels."""
    touched = _touched_dims(classes, node)
    if rule is None:
        return set(touched)
    splittable = _splittable_label_dims(node, rule)
    return {cls for cls, dims in touched.items() if dims not in splittable}


def _label_region_dims(classes: _DimClasses, bad: set[DimKey], region) -> DimRule:
    """The region's rule: each splittable class gets a label f0, f1, ... (in order of first use by
    the region's inputs, then outputs); dims of unsplittable classes get None."""
    names: dict[DimKey, str] = {}

    def entry(v, d) -> str | None:
        cls = classes.find((id(v), d))
        if cls in bad:
            return None
        return names.setdefault(cls, f"f{len(names)}")

    ins = tuple(tuple(entry(v, d) for d in range(v.type.ndim)) for v in region.inputs)
    outs = tuple(tuple(entry(v, d) for d in range(v.type.ndim)) for v in region.outputs)
    return DimRule(ins, outs)


def region_cost(region, in_types, out_types) -> tuple[float, int]:
    """Flops of the region's nodes; bytes of the fused node's operands and results only (the
    intermediates stay in registers / cache: the point of fusing)."""
    flops = 0.0
    for node in region.nodes:
        fn = node.op.cost or default_cost
        # a nested control-flow or fused node's cost reads its regions, as at the top level
        attrs = {**node.attrs, "regions": node.regions} if node.regions else node.attrs
        flops += fn(tuple(v.type for v in node.inputs), tuple(o.type for o in node.outputs), **attrs)[0]
    return flops, io_bytes(in_types, out_types)


# --- linearity ---------------------------------------------------------------------------------


def linear_operands(node) -> tuple[frozenset, ...]:
    """The operand sets ``node`` is (jointly) linear in: its op's LinearIn trait (graphc/core/traits.py),
    () for an op that is linear in none."""
    linear = node.op.trait(LinearIn)
    return linear.operand_sets(node) if linear is not None else ()
