"""Memory rows of the sharding ILP found before it is solved, on its LP relaxation (issue 30).

A memory limit is a row per program position: the bytes live there, a sum over the strategy
columns of the values alive at it, at most the limit. There are thousands of positions, so
``ilp.solve`` adds rows lazily: solve the integer program, find where its plan's peak is over the
limit, add that position's row, solve again. Each round is a new integer solve, and the plan
moves its peak from one position to the next: the LLaMA-3-8B case of docs/remat.md took three
rounds of 5-11 s of HiGHS each, the sequence-parallel test model up to four.

Here the same separation runs on the LP relaxation first. Its fractional point has a
fractional profile (the same sum with the columns' values as weights), so the positions over
the limit are read off it exactly, their rows added, and the LP re-solved warm from its last
basis: a few pivots per row. When the relaxation fits everywhere, the plan its point rounds to
(each group's largest column, ``rounded``) is measured the same way and its runs over the limit
get their rows too, until both fit: the integer plans near the LP point peak where the
fractional one does not (the lazy rounds found them one integer solve each). The integer
program then gets all those rows at once. Every row is "the bytes live at this position are at
most the limit", true of every plan that fits, so the optimum is the same; the integral plan is
still measured after the solve, and lazy rounds still add what the relaxation did not need.

    MemoryRows(model)          every live range under every column, as arrays
    MemoryRows.profile(x)      bytes live at every position under column values x
    MemoryRows.row(at)         (constant bytes, columns, bytes) of the row at position ``at``
    rounded(model, x)          the columns of the plan an LP point rounds to
    lp_memory_points(...)      the positions whose rows the LP relaxation (and its rounding) needs
    add_lp_rows(...)           ... added to the integer program before its first solve
    lp_start(model, s)         without a limit: the relaxation's optimum and rounded plan only
    add_run_rows(...)          a lazy round's rows: the peak of every run over the limit
    repaired(model, z, s)      the last round's plan changed to meet its new rows: the next start
    held_over(p, choice, lim)  the peaks over the limit with the redistribution buffers the runtime holds
"""

from __future__ import annotations

import time

import numpy as np

from graphc.passes.sharding.milp import LpRelaxation, solve_milp

# Rows added per LP round: the peak of each run of positions over the limit, largest first.
POINTS_PER_ROUND = 8
# LP rounds at most (each adds rows; the relaxation usually fits after a handful).
MAX_ROUNDS = 40
# The share of the solver's time the LP rounds may take at most.
TIME_SHARE = 0.25
# Solves without a memory limit start from the LP relaxation (``lp_start``); False: as before.
LP_FIRST = True
# Whether the LP rounds also add the rows where the plan the relaxation's point rounds to is over the
# limit (``rounded``), once the relaxation fits: the integer solve then starts with the rows its
# first plans would have needed (tests turn it off to compare optima).
ROUNDED = True
# The share of a round's time ``repaired`` may take.
REPAIR_SHARE = 0.1
# ``repaired`` frees at most this share of the groups (more: about the whole problem again).
REPAIR_FREE = 0.5
# A position is over the limit when the LP's profile exceeds it by more than this many bytes
# (rows are in MiB, and HiGHS's feasibility tolerance is 1e-7: about 0.1 byte).
SLACK_BYTES = 64.0


class MemoryRows:
    """The memory model of ``model``'s problem as linear functions of ``model``'s columns
    (``ilp._Model``: ``x[group][s]``, its groups and maps): one entry per live range of a value
    under a group strategy, (first position, last position, column or -1 for a constant, bytes).
    The same terms as ``_Model.memory_expr`` plus the offload's (``OffloadTerms.ranges``:
    negative bytes on its columns), made once for all positions."""

    def __init__(self, model) -> None:
        p = model.p
        mem = p.memory
        remat = p.remat
        # Every live range's entries, laid out at once: a range takes its entries from a pooled
        # segment (tied layers' items share one: by bytes by item strategy, group map and group),
        # all under its own positions, or, recomputable, each entry under each range its
        # strategy's flags give (``MemoryModel.ranges_under``), the entries in order, each
        # entry's ranges in order: the order a loop over ranges, entries and ranges makes.
        pool_cols: list[int] = []
        pool_nbytes: list[float] = []
        pool_flag: list[int] = []  # a recomputable segment's entry: its flags' number in the segment
        seg_start: list[int] = []
        seg_len: list[int] = []
        terms: dict[tuple[int, int, int], int] = {}  # (bytes, map, group) -> its segment
        # the same with the strategies: (segment, a strategy per flags, in the flags' numbering)
        remat_terms: dict[tuple[int, int, int, int], tuple[int, list[int]]] = {}
        live = mem.live_ranges()
        seg: list[int] = []  # per live range: its segment
        lo_of = [a for _v, _i, a, _b in live]  # per live range: its positions (recomputable: unused)
        hi_of = [b for _v, _i, _a, b in live]
        slot_of = [-1] * len(live)  # per live range: where its flags' ranges start in ``slot_start`` (-1: plain)
        slot_start: list[int] = []  # per range's flags: its first range in ``flat_lo``, and how many
        slot_count: list[int] = []
        flat_lo: list[int] = []
        flat_hi: list[int] = []

        def segment(cols: list[int], nbs: list[float], flags: list[int]) -> int:
            seg_start.append(len(pool_cols))
            seg_len.append(len(cols))
            pool_cols.extend(cols)
            pool_nbytes.extend(nbs)
            pool_flag.extend(flags)
            return len(seg_start) - 1

        of, maps, x = model.of, model.maps, model.x
        for r, (v, i, a, b) in enumerate(live):
            g, m = of[i], maps[i]
            per = mem.strategy_bytes(v, i)
            if i in remat:  # kept or recomputed, by strategy: live over different ranges
                sts = p.items[i].strategies
                key = (id(per), id(m), g, id(sts.as_tuple))
                got = remat_terms.get(key)
                if got is None:  # (column, bytes, flags) per group strategy with bytes; a strategy per flags
                    entries, example = _remat_marks(per, m, x[g], sts)
                    number = {flags: k for k, flags in enumerate(example)}
                    k_seg = segment(
                        [c for c, _nb, _f in entries],
                        [nb for _c, nb, _f in entries],
                        [number[f] for _c, _nb, f in entries],
                    )
                    got = remat_terms[key] = (k_seg, list(example.values()))
                k_seg, strategies = got
                seg.append(k_seg)
                slot_of[r] = len(slot_start)
                for item_s in strategies:  # the ranges depend on the strategy's flags alone
                    rs = mem.ranges_under(v, i, item_s, a, b)
                    slot_start.append(len(flat_lo))
                    slot_count.append(len(rs))
                    for lo, hi in rs:
                        flat_lo.append(lo)
                        flat_hi.append(hi)
                continue
            known = terms.get((id(per), id(m), g))
            if known is None:
                xs = x[g]
                under = per[m[:1]] if xs is None else per[m]
                keep = np.flatnonzero(under)
                cols = [-1] * len(keep) if xs is None else xs[keep].tolist()
                known = terms[(id(per), id(m), g)] = segment(cols, under[keep].tolist(), [0] * len(cols))
            seg.append(known)
        first, last, col, nbytes = self._laid_out(
            (pool_cols, pool_nbytes, pool_flag, seg_start, seg_len),
            (seg, lo_of, hi_of, slot_of),
            (slot_start, slot_count, flat_lo, flat_hi),
        )
        tail_first: list[int] = []
        tail_last: list[int] = []
        tail_col: list[int] = []
        tail_nbytes: list[float] = []
        for i, at, per_strategy in mem.transient_terms():  # ZeRO-3's gathered copies
            g, m = model.of[i], model.maps[i]
            xs = model.x[g]
            for s in range(1 if xs is None else len(m)):
                nb = float(per_strategy[int(m[s])])
                if nb:
                    tail_first.append(at)
                    tail_last.append(at)
                    tail_col.append(-1 if xs is None else int(xs[s]))
                    tail_nbytes.append(nb)
        for a, b, coef in model.offload.ranges():  # offloaded state's bytes come off (offload_terms.py)
            for column, mib in coef.items():
                tail_first.append(a)
                tail_last.append(b)
                tail_col.append(int(column))
                tail_nbytes.append(mib * model.MIB)
        self.size = mem.size
        self.first = np.concatenate([first, np.array(tail_first, dtype=np.int64)])
        self.last = np.concatenate([last, np.array(tail_last, dtype=np.int64)])
        self.col = np.concatenate([col, np.array(tail_col, dtype=np.int64)])
        self.nbytes = np.concatenate([nbytes, np.array(tail_nbytes, dtype=np.float64)])

    @staticmethod
    def _laid_out(pool, ranges, slots) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(first, last, column, bytes) of every live range's entries, in the ranges' order (see
        ``__init__``): ``pool`` the segments' entries, ``ranges`` per live range its segment,
        positions and flags' slots, ``slots`` per slot its ranges."""
        pool_cols = np.array(pool[0], dtype=np.int64)
        pool_nbytes = np.array(pool[1], dtype=np.float64)
        pool_flag, seg_start, seg_len = (np.array(x, dtype=np.int64) for x in pool[2:])
        seg, lo_of, hi_of, slot_of = (np.array(x, dtype=np.int64) for x in ranges)
        slot_start, slot_count, flat_lo, flat_hi = (np.array(x, dtype=np.int64) for x in slots)
        length = seg_len[seg]  # entries per range, before its ranges
        entry = np.repeat(seg_start[seg], length) + _starts(length)  # every range's entries, in order
        owner = np.repeat(np.arange(len(seg)), length)
        recomputable = slot_of[owner] >= 0
        slot = np.where(recomputable, slot_of[owner] + pool_flag[entry], 0)
        times = np.where(recomputable, slot_count[slot] if len(slot_count) else 0, 1)  # ranges per entry
        at = np.repeat(entry, times)
        placed = np.repeat(np.where(recomputable, slot_start[slot] if len(slot_start) else 0, 0), times) + _starts(
            times
        )
        again = np.repeat(recomputable, times)
        who = np.repeat(owner, times)
        first = np.where(again, flat_lo[placed] if len(flat_lo) else 0, lo_of[who])
        last = np.where(again, flat_hi[placed] if len(flat_hi) else 0, hi_of[who])
        return first, last, pool_cols[at], pool_nbytes[at]

    def profile(self, x: np.ndarray) -> np.ndarray:
        """Bytes live at every position when column ``j`` has value ``x[j]`` (constants: 1)."""
        w = self.nbytes.copy()
        var = self.col >= 0
        w[var] *= x[self.col[var]]
        delta = np.bincount(self.first, w, self.size + 1) - np.bincount(self.last + 1, w, self.size + 1)
        return np.cumsum(delta[: self.size])

    def row(self, at: int) -> tuple[float, np.ndarray, np.ndarray]:
        """(constant bytes, columns, their bytes) live at position ``at``."""
        alive = (self.first <= at) & (at <= self.last)
        cols, nb = self.col[alive], self.nbytes[alive]
        const = float(nb[cols < 0].sum())
        var = cols >= 0
        idx, inv = np.unique(cols[var], return_inverse=True)
        return const, idx, np.bincount(inv, nb[var], len(idx))


def _starts(lengths: np.ndarray) -> np.ndarray:
    """Per entry of segments of these lengths laid end to end, its position in its segment."""
    return np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)


def _remat_marks(per: np.ndarray, m: np.ndarray, xs: np.ndarray | None, sts) -> tuple[list, dict]:
    """(column, bytes, (recompute, checkpoint)) of each group strategy whose item strategy has
    bytes (``per``: by item strategy; ``m``: the group's map; ``xs``: its columns, None: one fixed
    strategy), and an item strategy for each pair of flags met."""
    entries = []
    example: dict[tuple[bool, bool], int] = {}
    for s in range(1 if xs is None else len(m)):
        item_s = int(m[s])
        nb = float(per[item_s])
        if not nb:
            continue
        flags = (sts[item_s].recompute, sts[item_s].checkpoint)
        example.setdefault(flags, item_s)
        entries.append((-1 if xs is None else int(xs[s]), nb, flags))
    return entries, example


def runs_over(prof: np.ndarray, limit: float, at_most: int) -> list[int]:
    """The position of the peak of each maximal run of positions where ``prof`` exceeds
    ``limit``, largest first, at most ``at_most``."""
    over = prof > limit
    if not over.any():
        return []
    edges = np.flatnonzero(np.diff(np.concatenate([[0], over.astype(np.int8), [0]])))
    peaks = [a + int(np.argmax(prof[a:b])) for a, b in zip(edges[::2], edges[1::2])]
    return sorted(peaks, key=lambda at: -prof[at])[:at_most]


def lp_memory_points(
    model, limit: int, time_limit_s: float
) -> tuple[list[tuple[int, float, np.ndarray, np.ndarray]], np.ndarray | None]:
    """(position, constant bytes, columns, bytes) of the memory rows ``model``'s LP relaxation
    needs to fit ``limit`` at every position (module doc), within ``time_limit_s`` seconds, and the
    relaxation's last point. Empty when the relaxation fits without any, or has no point at all
    (then no plan fits, and the integer solve says so; the point is None)."""
    deadline = time.perf_counter() + time_limit_s
    rows = MemoryRows(model)
    lp = LpRelaxation(model.milp)
    found: list[tuple[int, float, np.ndarray, np.ndarray]] = []
    seen: set[int] = set()
    last = None
    for _round in range(MAX_ROUNDS):
        x = lp.solve(deadline - time.perf_counter())
        if x is None:
            break
        last = x
        new = [at for at in runs_over(rows.profile(x), limit + SLACK_BYTES, POINTS_PER_ROUND) if at not in seen]
        if not new and ROUNDED:  # the relaxation fits: where would the plan its point rounds to not?
            new = [at for at in runs_over(rows.profile(rounded(model, x)), limit, POINTS_PER_ROUND) if at not in seen]
        if not new:
            break
        for at in new:
            seen.add(at)
            const, idx, nb = rows.row(at)
            lp.add_row(idx, nb / model.MIB, -np.inf, (float(limit) - const) / model.MIB)
            found.append((at, const, idx, nb))
        if time.perf_counter() > deadline:
            break
    return found, last


def rounded(model, x: np.ndarray) -> np.ndarray:
    """The plan ``x`` rounds to, as column values: each group's largest column, the pair columns
    of the chosen strategies, each offload candidate or stash offloaded when its column is at
    least 1/2 (its ``w`` columns then follow the groups' choices)."""
    gchoice = [0 if xs is None else int(np.argmax(x[xs])) for xs in model.x]
    z = model.point(gchoice)
    for o in (*model.offload.o, *model.offload.a):  # optimizer state, stashed activations
        z[o] = float(x[o] >= 0.5)
    for g, o, w in model.offload.shares():
        z[w[gchoice[g]]] = z[o]
    return z


def repaired(model, z: np.ndarray, time_limit_s: float) -> np.ndarray | None:
    """A plan near ``z`` that meets every row of ``model``, or None: ``z`` is a plan's columns
    that break some rows (the last round's plan, and the rows that round added); the groups with
    a column in a broken row may take any strategy, every other group keeps its own, and that
    small integer program is solved within ``time_limit_s``. It seeds the next integer solve:
    with the last round's bound (``solve_milp``'s ``known_bound``) a repair as cheap as that
    bound ends the solve at once. Not tried when more than REPAIR_FREE of the groups are free."""
    m = model.milp
    broken = m.broken_rows(z)
    if not len(broken) or time_limit_s <= 0:
        return None
    cols = np.zeros(m.n, dtype=bool)
    for r in broken:
        cols[m.row_columns(int(r))] = True
    upper = m.upper
    groups = [xs for xs in model.x if xs is not None]
    fixed = [xs for xs in groups if not cols[xs].any()]
    if len(groups) - len(fixed) > REPAIR_FREE * len(groups):
        return None
    for xs in fixed:
        upper[xs] = z[xs]
    res = solve_milp(m.restricted(upper), "highs", time_limit_s)
    return res.x


def held_over(p, choice: list[int], limit: int, at_most: int = POINTS_PER_ROUND) -> list[tuple[int, int, int]]:
    """(held bytes, position, buffers' bytes there) at the peak of each run of positions where
    ``choice``'s values plus the redistribution buffers the runtime holds (what it measures) are
    over ``limit``, a run split where the buffers change, largest first, at most ``at_most``.
    ``ilp.solve`` bounds each by a row with those buffers taken off the limit, all in one round:
    the rows the rounds after would add one by one while this plan stood (docs/remat.md)."""
    prof = p.memory.profile(choice)
    if not len(prof):
        return []
    delta = np.zeros(len(prof) + 1, dtype=np.float64)
    for nb, a, b in p.memory.redistribution_buffers(choice):
        delta[a] += nb
        delta[b + 1] -= nb
    buffers = np.cumsum(delta[:-1])
    held = prof + buffers
    idx = np.flatnonzero(held > limit)
    if not len(idx):
        return []
    starts = np.flatnonzero(np.concatenate([[True], (np.diff(idx) > 1) | (np.diff(buffers[idx]) != 0)]))
    peaks = [int(run[np.argmax(held[run])]) for run in np.split(idx, starts[1:])]
    peaks.sort(key=lambda at: -held[at])
    return [(int(held[at]), at, int(buffers[at])) for at in peaks[:at_most]]


def add_lp_rows(model, limit: int, time_limit_s: float, points: list[int]) -> int:
    """Add to ``model`` the rows ``lp_memory_points`` finds, their positions to ``points``, and the
    plan the relaxation's point rounds to, ``repaired``, to the plans its first solve may start
    from (``model.found``); returns how many rows. (No limit: ``lp_start``.)"""
    found, x = lp_memory_points(model, limit, time_limit_s)
    if x is not None:  # an optimum of a relaxation with at most the integer program's rows: a lower bound
        model.lp_bound = float(model.milp.cost @ x) + model.milp.offset
    for at, const, idx, nb in found:
        points.append(at)
        model.milp.add_row(idx, nb / model.MIB, -np.inf, (float(limit) - const) / model.MIB)
        model.offload.add_cover_rows(at, (smallest_bytes(model, const, idx, nb) - limit) / model.MIB)
    if x is not None:
        z = rounded(model, x)
        start = repaired(model, z, REPAIR_SHARE * time_limit_s / TIME_SHARE) if len(model.milp.broken_rows(z)) else z
        if start is not None:
            model.found.append(start)
    return len(found)


def lp_start(model, time_limit_s: float) -> None:
    """Without a memory limit: the LP relaxation's optimum as ``model.lp_bound`` and the plan its
    point rounds to among the plans the first solve may start from; when that plan meets the
    bound it is optimal and no integer solve runs (milp.py ``solve_milp``)."""
    x = LpRelaxation(model.milp).solve(time_limit_s) if LP_FIRST else None
    if x is not None:
        model.lp_bound = float(model.milp.cost @ x) + model.milp.offset
        model.found.append(rounded(model, x))


def smallest_bytes(model, const: float, idx: np.ndarray, nb: np.ndarray) -> float:
    """The fewest bytes a row ``(const, columns, bytes)`` can count without offload: the constant
    and each group's smallest bytes over its strategies (its columns not in the row: 0)."""
    at_col = dict(zip(idx.tolist(), nb.tolist()))
    return const + sum(min(at_col.get(int(c), 0.0) for c in xs) for xs in model.x if xs is not None)


def add_run_rows(model, prof: np.ndarray, limit: int, points: list[int]) -> None:
    """Add to ``model`` the row at the peak of each run of positions where a plan's profile
    ``prof`` is over ``limit`` (``runs_over``) that ``points`` does not hold yet, and note it there:
    one lazy round then rules out every peak of that plan, not only its highest."""
    for at in runs_over(prof, limit, POINTS_PER_ROUND):
        if at not in points:
            points.append(at)
            model.add_memory_point(at, limit)


__all__ = [
    "MemoryRows",
    "add_lp_rows",
    "lp_start",
    "add_run_rows",
    "held_over",
    "lp_memory_points",
    "repaired",
    "rounded",
    "runs_over",
]
