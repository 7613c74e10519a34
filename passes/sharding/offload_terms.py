"""Optimizer-state offload as a choice of the fixed-mesh sharding ILP (issue 30 item 3).

On a profile with a host tier (graphc/core/profiles.py ``host_tier``: the GPU presets), every
parameter whose update keeps optimizer state (a ``ParamGroup`` of passes/sharding/zero.py with a
parameter and some state) is a *candidate*: one binary ``o[c]`` moves its state to host memory,
as ZeRO-Offload does (passes/offload.py has the model and its source). Each item the choice
touches gets ``w[s] <= x[g, s]``, ``sum_s w[s] = o[c]`` (the tight linearization of
``o[c] x[g, s]``; ``o[c]`` itself when its group has one strategy; one ``w`` per class of the
group's strategies that give every term below the same coefficient, ``OffloadTerms._shares``),
and when ``o[c] = 1``:

* memory: the state inputs, the update's values of that parameter and the updated state
  (everything the update of that parameter makes but the updated parameter, which comes back)
  are never on the device: every memory row subtracts their bytes under the item's strategy
  where the memory model has them live. The gradient stays on the device until it is copied
  (conservative, as in the block search).
* time, priced as ``offload_costs`` prices it, with the device's share of the update (its shard
  of the state, from the state's chosen spec: ZeRO and tensor parallelism both shrink it): the
  parameters' copy back and the CPU Adam, ``P/link + (2 S + 3 P)/host DRAM``; the gradients'
  copy ``P/link``, of which only ``e >= latency u + sum P/link - overlap x backward`` waits
  (``u >= o[c]``: one transfer each way; ``backward`` the backward's compute under the chosen
  strategies, ``overlap`` the profile's ``ClusterFigures.dp_overlap``, as the block search hides
  it); less the device's own update of the parameter, which no longer runs. Objective +=
  ``e + latency u + host time - device update``.
* the host holds the state and a copy of the parameters: ``sum (S + P) <= host memory`` (only
  when the candidates could exceed it).

So the objective's offload part is ``offload_costs``' step minus the device update it replaces,
exactly, and the memory rows count the saving the plan gets.

**When.** Offload is chosen only to fit or when it is faster. A plain solve (``every`` false)
gives columns only to the candidates whose offload could make some plan's step shorter
(``_may_be_faster``); ``every`` gives them to all: passes/partition.py ``solve_problem`` solves
again so when no plan fits the memory limit without offload (``solve_offloading``). The screen is
exact without a memory limit: offloading a set ``S`` of candidates adds to a plan's objective
``latency u + e + sum_S (host_c - device_c)``, ``u = 1``, ``e >= 0`` (the exposed copy) and
``host_c - device_c`` a sum over the groups its items are in of a term fixed by that group's
strategy, so at least ``g_c``, the sum of each group's least (``_least_gain``); and keeping
everything on the device (``u = e = 0``) stays feasible with no memory row. So dropping a
candidate with ``g_c >= 0`` from ``S`` never makes the objective larger, nor dropping all of
``S`` when ``latency + sum`` of the negative ``g_c`` is ``>= 0``: an optimum offloads only
candidates that pass, and none when none does (tests/passes/sharding/test_offload_screen.py). Under
a limit a plain solve likewise weighs only those candidates (offloading one that cannot be
faster only to fit a faster plan is not weighed; as before, when no candidate passed, none was).
Otherwise the ILP is the one without offload: a plan that fits keeps its state, its solve time
and its ties between equal plans. (So a plan that fits only by recomputing or by ZeRO does not
weigh offloading some state instead; the block search, passes/scale.py, does.) A profile without
a host tier has no candidate.

**Activations.** When ``every`` is "activations" (``solve_offloading``, a third solve: moving the
optimizer state fitted nothing either; moving activations only costs time), every forward value
a backward node reads is a ``Stash``: one binary ``a[v]`` (with its ``w[s]`` as above) keeps it in
host memory from just after its last forward use to just before its first backward use
(``Stash.away``), where every memory row subtracts its bytes under the chosen strategy, as
recomputation's terms move a value's range. Its two copies, ``latency a + sum w bytes/link``
each, are priced by passes/offload.py's overlap rule over all stashes together: ``e_out >= sum
copies - forward``, ``e_back >= sum copies - backward`` (the forward's and the backward's compute
under the chosen strategies), objective ``+= e_out + e_back``; the host holds them too.
Recomputed values (``p.remat``), views and constants are not stashes. (In one solve with the state's
columns, on the SP test model at 70% the stash columns made the solve take 15% longer and, through
the lazy held-buffer rows that depend on the order plans come in, end at a plan 2% slower than
the state alone gives: docs/remat.md.)

**Cover rows.** The memory rows alone make a weak LP relaxation: a fraction of a large
candidate frees what the limit asks at a fraction of its price (on the SP test model of docs/remat.md
at 85% of its free peak, the root bound was 277.1 us against the optimum 310.3). So each memory
row at a position ``t`` with room ``L`` (``ilp._Model.add_memory_point``, ``memrows.add_lp_rows``)
brings rows every plan that meets it satisfies. Even each group at its smallest bytes there counts
``F`` (``memrows.smallest_bytes``); when ``D = F - L > 0``, the plan must move ``D`` off ``t``, and
candidate or stash ``c`` moves at most ``A_c`` there (its ranges live at ``t``, each at its largest
over the strategies), so ``sum A_c b_c >= D`` over their binaries ``b``. Its rounding for binaries,
``sum min(1, A_c / D) b_c >= 1``, is added, and, when the smallest ``A_c`` together stay under ``D``,
``sum b_c >= 1`` over the others (one of them is needed). When only optimizer state can move there,
``u >= 1``: some transfer's latency is paid. Every such row follows from its memory row and
integrality, so the optimum is the same (tests/passes/sharding/test_offload_cover.py); the root bound
at 85% became 304.1 us, at 84% 316.0 against 323.6 (277.1 and 310.9 before).

**Tied layers.** The candidates of the same parameter in identical layers, whose items shrink ties
into the same groups (passes/sharding/groups.py: one strategy variable for the layers), share one
binary and its ``w`` columns: each sum counts every layer's terms. So the layers' optimizer state
moves to the host together, as their sharding, ZeRO stage and recomputation are chosen together
(the block search, passes/scale.py, prices one layer for all, too). A plan offloading some of
identical layers only is not weighed unless shrinking is off (``--no-shrink``: a group per item).
The problem's offload columns then stay those of one layer: on the GPT-3 175B slice of
``graphc bench plantime`` (dp=8,tp=8) the 4-layer solve had 18 candidates and 1,318 offload
columns, the 12-layer one 50 and 3,654; both now have 442.

The chosen values are dropped from the memory model (``MemoryModel.offloaded``), so every peak
measured after solving (the lazy memory rows, the plan's peak, its alternatives) sees them
moved; the plan records them as an ``OffloadRecord`` (passes/offload.py) and the lowering
refuses to run it (passes/partition.py ``lower``: the runtime here has no host tier).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from graphc.core.errors import PlanError
from graphc.core.ir import Value
from graphc.core.profiles import cluster_figures, host_tier
from graphc.core.traits import Constant
from graphc.passes.offload import OffloadCost, OffloadRecord, activation_costs, offload_costs
from graphc.passes.sharding.problem import Problem
from graphc.passes.sharding.zero import problem_groups, problem_update, state_positions

T = TypeVar("T")

# Whether memory rows bring their cover rows (module doc, "Cover rows"; tests turn it off to compare optima).
COVER = True
# Whether a group's strategies with the same offload coefficients share a w column (``OffloadTerms._shares``;
# tests turn it off to compare optima).
SHARE_CLASSES = True
# Whether tied layers' candidates share one binary (module doc, "Tied layers"; tests turn it off to compare).
TIE_LAYERS = True
# A cover row asks this much less than its memory row's deficit: a plan HiGHS takes as meeting the memory
# row (within its feasibility tolerance, 1e-7 on rows in MiB) meets its cover rows too.
TOLERANCE_MIB = 1e-6


@dataclass(frozen=True)
class Candidate:
    """A parameter whose optimizer state may live in host memory."""

    param: int  # graph input position of the parameter
    states: tuple[int, ...]  # graph input positions of its optimizer state
    state_items: tuple[int, ...]  # their input items
    param_nbytes: int  # the whole parameter's bytes (the device's share: its state's share)
    update_items: tuple[int, ...]  # the node items of its update (they run on the host)
    entries: tuple[tuple[Value, int, int, int], ...]  # live ranges (MemoryModel) that move to the host
    values: frozenset[Value]  # their values


@dataclass(frozen=True)
class Stash:
    """A forward value the backward reads, which may wait in host memory (module doc)."""

    value: Value
    item: int  # its producer's item
    away: tuple[
        int, int
    ]  # the memory positions it is off the device: after its last forward use, before its first backward use


def stashes(p: Problem) -> list[Stash]:
    """The stashed activations of ``p`` that may be offloaded (module doc); none without a host tier."""
    if host_tier(p.mesh.profile) is None:
        return []
    pos = p.memory.positions()
    forward_last: dict[Value, int] = {}  # the last reader that is not a backward node
    backward_first: dict[Value, int] = {}
    for e in p.edges:
        dst = p.items[e.dst]
        if dst.kind == "node" and dst.node is not None and dst.node.part == "backward":
            backward_first[e.value] = min(backward_first.get(e.value, pos[e.dst]), pos[e.dst])
        else:
            forward_last[e.value] = max(forward_last.get(e.value, -1), pos[e.dst])
    viewed = set(p.memory.roots().values())
    out = []
    for v, i, a, _b in p.memory.live_ranges():
        it = p.items[i]
        if it.kind != "node" or it.node is None or it.node.part != "forward" or i in p.remat or v in viewed:
            continue
        if v not in backward_first or it.gradient or it.node.op.has(Constant):  # a program holds its constants
            continue
        first, last = max(a, forward_last.get(v, a)) + 1, backward_first[v] - 1
        if first <= last and p.memory.strategy_bytes(v, i).any():
            out.append(Stash(v, i, (first, last)))
    return out


def may_offload(p: Problem) -> bool:
    """Whether any optimizer state or stashed activation of ``p`` may live in host memory."""
    return bool(candidates(p) or stashes(p))


def solve_offloading(p: Problem, failed: PlanError, solve: Callable[[bool | str], T], progress=None) -> T:
    """After ``failed`` (no plan fits keeping everything on the device): ``solve(True)``, the ILP
    with the optimizer state's columns, and when that fits nothing either, ``solve("activations")``,
    with the stashes' as well (module doc, "When"). Re-raises the last failure when nothing is
    left to move."""
    steps = (["state"] if candidates(p) else []) + (["activations"] if stashes(p) else [])
    if failed.min_memory_bytes is None or not steps:
        raise failed
    for step in steps:
        if progress:
            progress(
                f"ILP: no plan fits keeping the {'optimizer state' if step == 'state' else 'activations'} on the device; solving again with offload"
            )
        try:
            return solve(True if step == "state" else "activations")
        except PlanError as exc:
            if exc.min_memory_bytes is None:
                raise
            failed = exc
    raise failed


def candidates(p: Problem) -> list[Candidate]:
    """The parameters of ``p`` whose state may be offloaded (module doc); none without a host tier."""
    if host_tier(p.mesh.profile) is None:
        return []
    state = state_positions(p)
    if not state:
        return []
    graph = p.graph
    update = problem_update(p)
    input_item = {it.index: i for i, it in enumerate(p.items) if it.kind == "input"}
    node_item = {it.node: i for i, it in enumerate(p.items) if it.kind == "node"}
    tied = dict(p.ties)  # input item -> output item
    groups = [  # (its parameter's input position, the group)
        (pg.param, pg) for pg in problem_groups(p) if pg.param is not None and pg.states and pg.param in input_item
    ]
    # program order: a node joins a group when it reads one of the group's values (its
    # parameter, state, gradients, or what an earlier node of the group made), all groups in one pass
    owners: dict[Value, set[int]] = {}
    for gi, (k_param, pg) in enumerate(groups):
        for v in (graph.inputs[k_param], *(graph.inputs[k] for k in pg.states), *pg.gradients):
            owners.setdefault(v, set()).add(gi)
    joined: list[list] = [[] for _ in groups]
    for node in graph.nodes:
        if node not in update or not node.outputs:
            continue
        shape = node.outputs[0].type.shape
        reading = {gi for v in node.inputs for gi in owners.get(v, ())}
        for gi in sorted(gi for gi in reading if graph.inputs[groups[gi][0]].type.shape == shape):
            joined[gi].append(node)
            for o in node.outputs:
                owners.setdefault(o, set()).add(gi)
    moved_of = []  # per group: the values it moves
    for (k_param, pg), nodes in zip(groups, joined):
        back = tied.get(input_item[k_param])
        returned = p.items[back].value if back is not None else None  # the updated parameter: comes back
        moved = {graph.inputs[k] for k in pg.states} | {o for n in nodes for o in n.outputs}
        if returned is not None:
            moved.discard(returned)
        moved_of.append(moved)
    live = p.memory.live_ranges()
    wanted = set().union(*moved_of)
    ranges_of: dict[Value, list[int]] = {}  # a moved value -> its entries' positions in ``live``
    for k, entry in enumerate(live):
        if entry[0] in wanted:
            ranges_of.setdefault(entry[0], []).append(k)
    out = []
    for (k_param, pg), nodes, moved in zip(groups, joined, moved_of):
        param = graph.inputs[k_param]
        at = sorted(k for v in moved for k in ranges_of.get(v, ()))
        entries = tuple(e for e in (live[k] for k in at) if e[1] not in p.remat)
        out.append(
            Candidate(
                param=k_param,
                states=pg.states,
                state_items=tuple(input_item[k] for k in pg.states),
                param_nbytes=param.type.nbytes,
                update_items=tuple(node_item[n] for n in nodes if n in node_item),
                entries=entries,
                values=frozenset(e[0] for e in entries),
            )
        )
    return out


# --- per-strategy figures of a candidate ---------------------------------------------------------------


def _state_bytes(p: Problem, c: Candidate, item: int) -> np.ndarray:
    v = p.items[item].value
    assert v is not None  # an input item holds its value
    return p.memory.strategy_bytes(v, item)


def _param_bytes(p: Problem, c: Candidate) -> np.ndarray:
    """The parameter bytes this device updates, per strategy of the first state item: the share of
    the state its spec leaves each device."""
    rep = c.state_items[0]
    v = p.items[rep].value
    assert v is not None  # an input item holds its value
    return _state_bytes(p, c, rep) / max(v.type.nbytes, 1) * c.param_nbytes


def _part_items(p: Problem, part: str) -> list[int]:
    """The node items of the pass ``part`` ("forward", "backward")."""
    return [i for i, it in enumerate(p.items) if it.kind == "node" and it.node is not None and it.node.part == part]


def _stash_bytes(p: Problem, st: Stash) -> np.ndarray:
    return p.memory.strategy_bytes(st.value, st.item)


class OffloadTerms:
    """The offload columns and rows of one ILP model (passes/sharding/ilp.py ``_Model``: its
    ``milp``, ``x``, ``of``, ``maps``, ``SCALE`` and ``MIB``). ``priced=False`` leaves the time
    out (the smallest-peak ILP, ``min_memory``). Empty without candidates."""

    def __init__(self, model, priced: bool = True, every: bool | str = False) -> None:
        # the model holds these terms: a weak link back keeps the two out of a cycle, so a solve's
        # model (its rows, tens of thousands of tuples) is freed when the solve returns, not by the
        # cycle collector
        self.model, self.p, self.priced = weakref.proxy(model), model.p, priced
        self.cands = candidates(self.p)
        self.stashes = stashes(self.p) if every == "activations" else []
        self.o = np.zeros(0, dtype=np.int64)
        self.a = np.zeros(0, dtype=np.int64)  # per stash: in host memory
        self.saved: list[list[dict[int, float]]] = []  # per candidate, per entry: -MiB saved, by column
        self.away: list[dict[int, float]] = []  # per stash: -MiB saved, by column
        self._shared: dict[tuple[int, int], list[int]] = {}  # (group, o) -> its w column by group strategy
        self._first: dict[tuple[int, int], list[int]] = {}  # (group, o) -> the first group strategy of each w column
        self._classes: dict[tuple, tuple] = {}  # ``_classes_of``, by group and terms' values
        self._times: dict[int, np.ndarray] = {}  # ``_compute_times``, by strategy tuple
        self.w: dict[int, list[tuple[int, int]]] = {}  # item -> (column, strategy) of the candidate being built
        self.u: int | None = None  # the state's transfers' latency column (``u >= o[c]``)
        self.forced = False  # whether a cover row has set ``u`` to 1 (``add_cover_rows``)
        if not every:  # a plain solve: only what could make the step shorter (module doc, "When")
            self.cands = self._may_be_faster(self.cands)
        if every or self.cands:
            self._build(keep_misvalued_start=bool(every))

    def _may_be_faster(self, cands: list[Candidate]) -> list[Candidate]:
        """The candidates whose offload could shorten the step of some plan (module doc, "When"):
        those whose ``_least_gain`` is negative, none when all of those together cannot pay the
        transfers' latency."""
        host = host_tier(self.p.mesh.profile)
        if host is None:  # no candidates
            return []
        known: dict[tuple, float] = {}  # ``_gain_key`` -> the least gain: tied layers' candidates share it
        least = []
        for c in cands:
            key = self._gain_key(c)
            gain = known.get(key)
            if gain is None:
                gain = known[key] = self._least_gain(c)
            least.append((c, gain))
        out = [(c, g) for c, g in least if g < 0]
        return [c for c, _g in out] if host.link.latency_s + sum(g for _c, g in out) < 0 else []

    def _gain_key(self, c: Candidate) -> tuple:
        """What ``_least_gain`` reads of ``c``, by object (the arrays are the memory model's and
        ``_compute_times``', one per strategy tuple, alive while solving): the parameter's bytes,
        and per state and update item its group, map and bytes or compute times. Equal keys, equal
        gains."""
        p, model = self.p, self.model
        rep = p.items[c.state_items[0]].value
        assert rep is not None  # an input item holds its value
        return (
            c.param_nbytes,
            rep.type.nbytes,
            tuple((model.of[i], id(model.maps[i]), id(_state_bytes(p, c, i))) for i in c.state_items),
            tuple((model.of[i], id(model.maps[i]), id(self._compute_times(i))) for i in c.update_items),
        )

    def _least_gain(self, c: Candidate) -> float:
        """A lower bound, over every plan, of what offloading ``c`` adds to the step's objective
        apart from the shared latency and exposed gradient copy (``u``, ``e``, both >= 0): its
        host side (copy back, CPU Adam) less its device update, each item at the strategy its
        group's strategy gives it, at its least per group (module doc, "When")."""
        p, model = self.p, self.model
        host = host_tier(p.mesh.profile)
        assert host is not None  # candidates exist only with a host tier
        dram = host.memory_bandwidth
        terms = [(c.state_items[0], _param_bytes(p, c) * (1 / host.link.bandwidth + 3 / dram))]
        terms += [(i, 2 * _state_bytes(p, c, i) / dram) for i in c.state_items]
        terms += [(i, -self._compute_times(i)) for i in c.update_items]
        by_group: dict[int, np.ndarray] = {}
        for item, per_strategy in terms:
            g, mp = model.of[item], model.maps[item]
            vals = np.asarray(per_strategy, float)[mp if model.x[g] is not None else mp[:1]]
            by_group[g] = by_group[g] + vals if g in by_group else vals
        return sum(float(v.min()) for v in by_group.values())

    def _build(self, keep_misvalued_start: bool) -> None:
        host = host_tier(self.p.mesh.profile)
        if host is None:
            return
        host_row: dict[int, float] = {}
        if self.cands:
            self._build_state(host_row)
        if self.stashes:
            self._build_stashes(host_row)
        # measured on the solves that offload because nothing fits (milp.py): a plain solve whose
        # screen (_may_be_faster) let a large parameter's columns in keeps presolve and drops the start
        self.model.milp.keep_misvalued_start = keep_misvalued_start
        if keep_misvalued_start:  # nothing fits without offload: a solve from a start probes the binaries (milp.py)
            self.model.milp.probe = np.unique(np.concatenate([self.o, self.a])).astype(np.int64)
        if sum(max(0.0, v) for v in host_row.values()) > host.memory_bytes / self.model.MIB:  # the host can run out
            self.model.milp.add_row(
                list(host_row), list(host_row.values()), -np.inf, host.memory_bytes / self.model.MIB
            )

    def _build_state(self, host_row: dict[int, float]) -> None:
        model, priced = self.model, self.priced
        p, m, us = self.p, model.milp, model.SCALE
        host = host_tier(p.mesh.profile)
        assert host is not None  # candidates exist only with a host tier
        link, dram = host.link, host.memory_bandwidth
        # by array: tied layers' items share their compute times (``_compute_times``) and bytes
        # (``MemoryModel.strategy_bytes``), so these too
        in_us: dict[int, np.ndarray] = {}
        off_mib: dict[int, np.ndarray] = {}

        def time_us(i: int) -> np.ndarray:
            t = self._compute_times(i)
            got = in_us.get(id(t))
            if got is None:
                got = in_us[id(t)] = t * us
            return got

        def saved_mib(v: Value, i: int) -> np.ndarray:
            b = p.memory.strategy_bytes(v, i)
            got = off_mib.get(id(b))
            if got is None:
                got = off_mib[id(b)] = b / -model.MIB
            return got

        terms_of = []  # per candidate: its items and every sum of w-terms it enters
        for c in self.cands:
            pb = _param_bytes(p, c)
            sb = [(i, _state_bytes(p, c, i)) for i in c.state_items]
            rep = c.state_items[0]
            # the copy back and the CPU Adam; the device's update of the parameter, which no longer
            # runs; the gradients' copy; the host's bytes; per entry, the MiB it takes off the device
            host_terms = [(rep, pb * (1 / link.bandwidth + 3 / dram) * us)] + [(i, 2 * b / dram * us) for i, b in sb]
            device_terms = [(i, time_us(i)) for i in c.update_items]
            copy_terms = [(rep, -pb / link.bandwidth * us)]
            host_mib = [(rep, pb / model.MIB)] + [(i, b / model.MIB) for i, b in sb]
            saved = [[(item, saved_mib(v, item))] for v, item, _a, _b in c.entries]
            items = {*c.state_items, *c.update_items, *(entry[1] for entry in c.entries)}
            terms_of.append((items, [host_terms, device_terms, copy_terms, host_mib, *saved]))
        # tied layers' candidates share one binary (module doc, "Tied layers")
        seen: dict[tuple[int, bool], bytes] = {}  # ``_tie_key``'s bytes of each array
        keys = [self._tie_key(exprs, seen) if TIE_LAYERS else (k,) for k, (_items, exprs) in enumerate(terms_of)]
        first: dict[tuple, int] = {}  # key -> its binary's number, in first-seen order
        index = [first.setdefault(key, len(first)) for key in keys]
        binary = m.add_vars(np.zeros(len(first)), integer=True)
        self.o = np.asarray(binary, dtype=np.int64)[index]
        u = m.add_vars([link.latency_s * us if priced else 0.0], integer=False)[0]
        self.u = int(u)
        e = m.add_vars([1.0 if priced else 0.0], integer=False, upper=1e30)[0]
        overlap = cluster_figures(p.mesh.profile).dp_overlap
        bconst, bcoef = self._compute_expr(_part_items(p, "backward"))
        e_row = {e: 1.0, u: -link.latency_s * us, **{col: overlap * v for col, v in bcoef.items()}}
        host_s: dict[int, float] = {}  # the copy back and the CPU Adam
        device_s: dict[int, float] = {}  # the device's update, which no longer runs
        for o in binary.tolist():
            m.add_row([int(o), u], [1.0, -1.0], -np.inf, 0.0)  # u >= o: the latency of one transfer each way
        # tied candidates' sums: equal terms of the same groups and maps, on the same binary, so
        # the same w columns and coefficients: made once per binary, added once per candidate
        made: dict[int, tuple] = {}
        for o, (items, exprs) in zip(self.o.tolist(), terms_of):
            sums = made.get(o)
            if sums is None:
                self.w = self._shares(o, items, exprs)
                sums = made[o] = tuple(self._w_expr(terms) for terms in exprs[:4]) + (
                    [self._w_expr(terms) for terms in exprs[4:]],
                )
            host_c, device_c, copy_c, mib_c, saved_c = sums
            _add(host_s, host_c)
            _add(device_s, device_c)
            _add(e_row, copy_c)
            _add(host_row, mib_c)
            self.saved.append(saved_c)
        for sign, terms in ((1.0, host_s), (-1.0, device_s)):  # a column each, equal to its sum, priced
            total = m.add_vars([sign if priced else 0.0], integer=False, upper=1e30)[0]
            m.add_row([total, *terms], [1.0, *(-v for v in terms.values())], 0.0, 0.0)
        m.add_row(list(e_row), list(e_row.values()), -overlap * bconst, np.inf)

    def _tie_key(self, exprs, seen: dict[tuple[int, bool], bytes]) -> tuple:
        """What makes two candidates' terms the same: per term, its sum, its item's group and map
        (``model.of``, ``model.maps``) and its values; equal for the same parameter of tied layers,
        whose items shrink put in the same groups (groups.py), and for nothing else. ``seen``: the
        bytes of each (array, as values) met so far: the maps and tied layers' values repeat (the
        arrays are alive while the keys are made)."""
        model = self.model

        def raw(a, values: bool) -> bytes:
            got = seen.get((id(a), values))
            if got is None:
                got = seen[(id(a), values)] = (np.asarray(a, float) if values else np.asarray(a)).tobytes()
            return got

        return tuple(
            (k, model.of[item], raw(model.maps[item], False), raw(v, True))
            for k, terms in enumerate(exprs)
            for item, v in terms
        )

    def _build_stashes(self, host_row: dict[int, float]) -> None:
        """The stashes' columns: memory off the device while away, the copies by the overlap rule."""
        model, p, m, us = self.model, self.p, self.model.milp, self.model.SCALE
        host = host_tier(p.mesh.profile)
        assert host is not None  # stashes exist only with a host tier
        link = host.link
        self.a = m.add_vars(np.zeros(len(self.stashes)), integer=True)
        copies: dict[int, float] = {}  # one way, in microseconds: both ways are the same bytes
        for st, a in zip(self.stashes, (int(a) for a in self.a)):
            self.w = {st.item: self._share(st.item, a)}
            nb = _stash_bytes(p, st)
            self.away.append(self._w_expr([(st.item, -nb / model.MIB)]))
            _add(copies, {a: link.latency_s * us})
            _add(copies, self._w_expr([(st.item, nb / link.bandwidth * us)]))
            _add(host_row, self._w_expr([(st.item, nb / model.MIB)]))
        for part in ("forward", "backward"):  # e >= copies - that pass's compute
            e = m.add_vars([1.0 if self.priced else 0.0], integer=False, upper=1e30)[0]
            const, coef = self._compute_expr(_part_items(p, part))
            row = {e: 1.0, **{c: -v for c, v in copies.items()}}
            _add(row, coef)
            m.add_row(list(row), list(row.values()), -const, np.inf)

    def _share(self, item: int, o: int) -> list[tuple[int, int]]:
        """(column, item strategy) pairs whose sum is 1 when ``o`` is and the item has that strategy:
        ``w[s] <= x[g, s]``, ``sum_s w[s] = o`` (the tight linearization of ``o x[g, s]``); ``o``
        itself for an item whose group has one strategy."""
        return self._shares(o, {item}, [])[item]

    def _shares(self, o: int, items, exprs: Sequence[Sequence[tuple[int, Any]]]) -> dict[int, list[tuple[int, int]]]:
        """Per item of ``items``, (column, item strategy) pairs of the linearized product of ``o``
        and its group's strategy, one pair per class: a group's strategies whose coefficients are
        equal in every sum of ``exprs`` (lists of ``(item, value per item strategy)``, each summed
        by ``_w_expr``) share one column, ``w[a] <= sum of x[g, s] over the s in class a``,
        ``sum_a w[a] = o``. The tight linearization still (as ``ilp._Model._add_pair`` merges the
        equal rows of a pair's costs): a plan has ``w[a] = o`` for its strategy's class and every
        sum counts the value every strategy of the class has; an LP point's ``w[s]`` add up to
        ``w[a]`` and back in proportion to ``x[g, s]``, at the same cost. So the optimum, and the
        relaxation's, are the ones with a column per strategy (tests/passes/sharding/
        test_offload_classes.py), with fewer columns: on the GPT-3 175B slice of ``graphc bench
        plantime`` (dp=8,tp=8) a group's 6-16 strategies fall in 3-6 classes, 9,050 ``w`` columns
        become 3,600 at 12 layers. Each sum's coefficient of a class column is its value at the
        class's first strategy (``_w_expr`` takes one pair per column)."""
        model, m = self.model, self.model.milp
        by_group: dict[int, list[int]] = {}
        for item in items:
            by_group.setdefault(model.of[item], []).append(item)
        in_group: dict[int, list[tuple[int, int, Any]]] = {}  # group -> (sum, item, values) of its items' terms
        for k, terms in enumerate(exprs):
            for item, per_strategy in terms:
                in_group.setdefault(model.of[item], []).append((k, item, per_strategy))
        out: dict[int, list[tuple[int, int]]] = {}
        for g, members in by_group.items():
            xs = model.x[g]
            if xs is None:
                for item in members:
                    out[item] = [(o, int(model.maps[item][0]))]
                continue
            key = (g, o)
            if key not in self._shared:
                classes, first, rows = self._classes_of(g, xs, len(exprs), in_group.get(g, []))
                w = m.add_vars(np.zeros(len(first)), integer=False)
                for a, (in_a, coef) in enumerate(rows):  # w[a] <= the x of class a
                    m.add_row(np.concatenate((w[a : a + 1], in_a)), coef, -np.inf, 0.0)
                m.add_row(np.append(w, o), np.append(np.ones(len(w)), -1.0), 0.0, 0.0)
                self._shared[key] = w[classes].tolist()
                self._first[key] = first
            cols, first_s = self._shared[key], self._first[key]
            for item in members:
                mp = model.maps[item]
                out[item] = [(cols[s], int(mp[s])) for s in first_s]
        return out

    def _classes_of(self, g: int, xs: np.ndarray, sums: int, terms: list[tuple[int, int, Any]]):
        """(``_strategy_classes``, the first strategy of each class, per class its ``x`` columns
        and the coefficients of its row ``w[a] - sum x <= 0``) of group ``g`` with these terms:
        made once per group and terms' values (the candidates of repeated layers repeat them)."""
        key = (g, sums, tuple((k, id(self.model.maps[item]), np.asarray(v, float).tobytes()) for k, item, v in terms))
        got = self._classes.get(key)
        if got is None:
            classes = _strategy_classes(self.model, len(xs), sums, terms)
            at = {int(a): s for s, a in reversed(list(enumerate(classes)))}
            first = [at[a] for a in range(len(at))]
            rows = []
            for a in range(len(first)):
                in_a = xs[classes == a]
                rows.append((in_a, np.concatenate(([1.0], -np.ones(len(in_a))))))
            got = self._classes[key] = (classes, first, rows)
        return got

    def shares(self) -> Iterator[tuple[int, int, list[int]]]:
        """(group, ``o`` column, its ``w`` columns by group strategy) of every linearized product."""
        for (g, o), w in self._shared.items():
            yield g, o, w

    def _w_expr(self, terms) -> dict[int, float]:
        """{column: coefficient} of the sum over ``(item, value per item strategy)`` of the value at
        the item's strategy when its candidate is offloaded (0 when not)."""
        coef: dict[int, float] = {}
        for item, per_strategy in terms:
            vals = np.asarray(per_strategy, float)
            for col, s in self.w[item]:
                if vals[s]:
                    coef[col] = coef.get(col, 0.0) + float(vals[s])
        return coef

    def _compute_times(self, item: int) -> np.ndarray:
        """The compute time of every strategy of ``item`` (read-only), one array per strategy tuple:
        the items of tied layers share it."""
        tup = self.p.items[item].strategies.as_tuple
        got = self._times.get(id(tup))
        if got is None:
            got = self._times[id(tup)] = self.p.costs.compute_times(item)
        return got

    def _compute_expr(self, items: list[int]) -> tuple[float, dict[int, float]]:
        """(constant, {column: coefficient}) of the sum of the compute times of ``items`` at the
        strategies chosen, in microseconds: a group of one strategy adds to the constant, the others
        each strategy's time to its column; a column's terms summed in the items' order (``np.add.at``,
        one by one as a loop over them would)."""
        model, us = self.model, self.model.SCALE
        const = 0.0
        arrays, picks, cols = [], [], []
        for i in items:
            mp, xs = model.maps[i], model.x[model.of[i]]
            t = self._compute_times(i)
            if xs is None:
                const += float(t[mp[0]] * us)
                continue
            arrays.append(t)
            picks.append(mp)
            cols.append(xs)
        if not arrays:
            return const, {}
        sizes = np.array([len(t) for t in arrays], dtype=np.int64)
        lengths = np.array([len(mp) for mp in picks], dtype=np.int64)
        at = np.concatenate(picks) + np.repeat(np.cumsum(sizes) - sizes, lengths)
        vals = np.concatenate(arrays)[at] * us
        col = np.concatenate(cols)
        nonzero = vals != 0
        vals, col = vals[nonzero], col[nonzero]
        unique, first, inverse = np.unique(col, return_index=True, return_inverse=True)
        sums = np.zeros(len(unique))
        np.add.at(sums, inverse, vals)
        order = np.argsort(first, kind="stable")  # the columns in the order first met
        return const, dict(zip(unique[order].tolist(), sums[order].tolist()))

    def ranges(self) -> Iterator[tuple[int, int, dict[int, float]]]:
        """(first position, last position, MiB saved by column) of every offloaded value's live
        range: what the offload takes off each memory row it spans (negative coefficients)."""
        for c, per_entry in zip(self.cands, self.saved):
            for coef, (_v, _i, a, b) in zip(per_entry, c.entries):
                yield a, b, coef
        for st, coef in zip(self.stashes, self.away):
            yield st.away[0], st.away[1], coef

    def savings_at(self, at: int) -> list[tuple[int, float]]:
        """(binary column, the most MiB its candidate or stash can take off position ``at``, under
        any strategies) of every candidate and stash that takes some off there."""
        by_column: dict[int, float] = {}  # tied candidates share their binary (module doc, "Tied layers")
        for o, c, per_entry in zip(self.o, self.cands, self.saved):
            most = sum(-min(coef.values(), default=0.0) for coef, e in zip(per_entry, c.entries) if e[2] <= at <= e[3])
            by_column[int(o)] = by_column.get(int(o), 0.0) + most
        out = list(by_column.items())
        for a, st, coef in zip(self.a, self.stashes, self.away):
            out.append((int(a), -min(coef.values(), default=0.0) if st.away[0] <= at <= st.away[1] else 0.0))
        return [(col, v) for col, v in out if v > 0]

    def add_cover_rows(self, at: int, deficit_mib: float) -> None:
        """Rows true of every plan whose memory at position ``at`` fits, when even each group's
        smallest bytes there leave ``deficit_mib`` over the limit (module doc, "Cover rows")."""
        deficit_mib -= TOLERANCE_MIB
        if not COVER or deficit_mib <= 0 or (not len(self.o) and not len(self.a)):
            return
        save = sorted((v, col) for col, v in self.savings_at(at))
        if not save:  # nothing moves off there: the memory row alone rules every plan out
            return
        m = self.model.milp
        if self.u is not None and not self.forced and not set(c for _, c in save) & set(map(int, self.a)):
            m.add_row([self.u], [1.0], 1.0, np.inf)  # some state is offloaded: its latency is paid
            self.forced = True
        m.add_row([c for _, c in save], [min(1.0, v / deficit_mib) for v, _ in save], 1.0, np.inf)
        small, total = 0, 0.0  # the smallest savings that together cannot cover D: one of the others is needed
        while small < len(save) and total + save[small][0] < deficit_mib:
            total += save[small][0]
            small += 1
        if 0 < small < len(save):
            m.add_row([c for _, c in save[small:]], np.ones(len(save) - small), 1.0, np.inf)

    def memory_terms(self, at: int) -> tuple[list[int], list[float]]:
        """(columns, MiB coefficients) the offload adds to the memory row at position ``at``."""
        row: dict[int, float] = {}
        for a, b, coef in self.ranges():
            if a <= at <= b:
                _add(row, coef)
        return list(row), list(row.values())

    def chosen(self, x: np.ndarray) -> tuple[Candidate | Stash, ...]:
        """The candidates and stashes the solution ``x`` offloads; the memory model drops their
        values from now on (module doc)."""
        out: tuple[Candidate | Stash, ...] = tuple(c for c, o in zip(self.cands, self.o) if x[o] > 0.5)
        out += tuple(st for st, a in zip(self.stashes, self.a) if x[a] > 0.5)
        use(self.p, out)
        return out


def _strategy_classes(model, size: int, sums: int, terms: list[tuple[int, int, Any]]) -> np.ndarray:
    """Per strategy of a group of ``size`` strategies, its class (numbered in order of first
    strategy): strategies with equal coefficients in every one of ``sums`` sums
    (``OffloadTerms._shares``), whose terms on the group's items are ``terms`` (sum, item, value
    per item strategy), in order; each its own class when ``SHARE_CLASSES`` is off."""
    if not SHARE_CLASSES or not sums:
        return np.arange(size)
    sig = np.zeros((size, sums))
    for k, item, per_strategy in terms:
        sig[:, k] += np.asarray(per_strategy, float)[model.maps[item]]
    number: dict[tuple, int] = {}
    return np.array([number.setdefault(row, len(number)) for row in map(tuple, sig.tolist())], dtype=np.int64)


def _add(into: dict[int, float], coef: dict[int, float]) -> None:
    for col, val in coef.items():
        into[col] = into.get(col, 0.0) + val


def use(p: Problem, chosen: tuple[Candidate | Stash, ...]) -> None:
    """Make ``p``'s memory model drop the values of the ``chosen`` candidates, and the chosen
    stashes while they are away (none: keep all)."""
    p.memory.offloaded = frozenset(v for c in chosen if isinstance(c, Candidate) for v in c.values)
    p.memory.away = {st.value: st.away for st in chosen if isinstance(st, Stash)}


def record(
    p: Problem, choice: list[int], chosen: tuple[Candidate | Stash, ...], limit: int | None
) -> OffloadRecord | None:
    """The ``OffloadRecord`` of offloading ``chosen`` under ``choice`` (None for none): the state's
    bytes, transfers and CPU update priced by ``offload_costs``, the device update it replaces,
    the stashes' copies priced by ``activation_costs``, the peak with everything kept and whether
    the offload was needed to fit ``limit``."""
    if not chosen:
        return None
    host = host_tier(p.mesh.profile)
    assert host is not None  # candidates exist only with a host tier
    names = p.graph.value_names()
    state = tuple(c for c in chosen if isinstance(c, Candidate))
    away = tuple(st for st in chosen if isinstance(st, Stash))
    state_bytes = sum(float(_state_bytes(p, c, i)[choice[i]]) for c in state for i in c.state_items)
    params = sum(float(_param_bytes(p, c)[choice[c.state_items[0]]]) for c in state)
    backward = sum(float(p.costs.compute_times(i)[choice[i]]) for i in _part_items(p, "backward"))
    device = sum(float(p.costs.compute_times(i)[choice[i]]) for c in state for i in c.update_items)
    overlap = cluster_figures(p.mesh.profile).dp_overlap
    off = offload_costs(host, state_bytes, params, backward, overlap) if state else OffloadCost(0, 0, 0, 0, 0, 0)
    acts = None
    if away:
        forward = sum(float(p.costs.compute_times(i)[choice[i]]) for i in _part_items(p, "forward"))
        nbytes = tuple(float(_stash_bytes(p, st)[choice[st.item]]) for st in away)
        acts = activation_costs(host.link, nbytes, forward, backward, values=tuple(names[st.value] for st in away))
    use(p, ())
    kept = p.memory.peak(choice)[0]
    use(p, chosen)
    return OffloadRecord(
        values=tuple(names[p.graph.inputs[k]] for c in state for k in c.states),
        params=tuple(names[p.graph.inputs[c.param]] for c in state),
        state_bytes=off.state_bytes,
        param_bytes=off.param_bytes,
        backward_s=backward,
        overlap=overlap,
        d2h_s=off.d2h_s,
        d2h_exposed_s=off.d2h_exposed_s,
        host_update_s=off.host_update_s,
        h2d_s=off.h2d_s,
        device_update_s=device,
        kept_peak_bytes=int(kept),
        reason="fit" if limit is not None and kept > limit else "faster",
        activations=acts,
    )


__all__ = [
    "Candidate",
    "OffloadTerms",
    "Stash",
    "candidates",
    "may_offload",
    "record",
    "solve_offloading",
    "stashes",
    "use",
]
