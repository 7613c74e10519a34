"""The pass manager: named passes, the default pass list, IR dumps after every pass.

(A "pass list" is the sequence of passes that optimizes a graph; pipelines are pipeline
parallelism, passes/pipeline.py; a stage is a pipeline stage.)

    traced --fold_constants--> --simplify--> --cse--> --batch_projections--> --batch_products--> --batch_windows--> --cse--> --dce-->
           --recompute_cheap--> --fuse--> optimized

Each pass is a function Graph -> Graph that does not mutate its input and returns it unchanged
when it did nothing. ``optimize`` runs a pass list, verifying the graph after every pass when
``verify`` is on (tests, or GRAPHC_DEBUG=1) and writing ``NN-<pass>.gir`` files to ``dump_dir``
(the MLIR --print-ir-after-all habit).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain, repeat
from operator import attrgetter

from graphc.core.collector import collector_paused
from graphc.core.errors import GraphcError, VerifyError
from graphc.core.files import atomic_write
from graphc.core.ir import Graph
from graphc.passes.batching import batch_products, batch_projections
from graphc.passes.cse import cse
from graphc.passes.dce import dce
from graphc.passes.fold import fold_constants
from graphc.passes.fuse import fuse
from graphc.passes.recompute.cheap import recompute_cheap
from graphc.passes.simplify import simplify
from graphc.passes.windows import batch_windows

PASSES: dict[str, Callable[[Graph], Graph]] = {
    "fold_constants": fold_constants,
    "simplify": simplify,
    "cse": cse,
    "batch_projections": batch_projections,
    "batch_products": batch_products,
    "batch_windows": batch_windows,
    "dce": dce,
    "recompute_cheap": recompute_cheap,
    "fuse": fuse,
}

DEFAULT_PASSES = (
    "fold_constants",
    "simplify",
    "cse",
    "batch_projections",
    "batch_products",
    "batch_windows",
    "cse",
    "dce",
    "recompute_cheap",
    "fuse",
)


@dataclass
class Snapshot:
    """The graph after one pass (``name`` "traced": the input), and the pass's seconds."""

    name: str
    graph: Graph
    seconds: float = 0.0


@dataclass
class PassTrace:
    """The snapshots of a run of a pass list, the input first."""

    snapshots: list[Snapshot] = field(default_factory=list)

    @property
    def graph(self) -> Graph:
        return self.snapshots[-1].graph

    def after(self, name: str) -> Graph:
        """The graph after the named pass ("traced" is the input, "optimized" the output; a pass
        that runs twice: after its first run)."""
        if name == "optimized":
            return self.graph
        for s in self.snapshots:
            if s.name == name:
                return s.graph
        names = ", ".join(dict.fromkeys(s.name for s in self.snapshots))
        raise GraphcError(f"no pass {name!r} in the pass list; the IR can be shown after: {names}, optimized")


def _debug() -> bool:
    return os.environ.get("GRAPHC_DEBUG", "") not in ("", "0")


@collector_paused()
def run_passes(
    graph: Graph,
    passes: list[str] | tuple[str, ...] | None = None,
    verify: bool | None = None,
    dump_dir: str | None = None,
) -> PassTrace:
    names = list(DEFAULT_PASSES if passes is None else passes)
    unknown = [n for n in names if n not in PASSES]
    if unknown:
        raise GraphcError(f"unknown pass {unknown[0]!r}; passes: {', '.join(PASSES)}")
    verify = _debug() if verify is None else verify
    result = PassTrace([Snapshot("traced", graph)])
    if dump_dir:
        os.makedirs(dump_dir, exist_ok=True)
        _dump(dump_dir, 0, "traced", graph)
    for i, name in enumerate(names, 1):
        start = time.perf_counter()
        graph = PASSES[name](graph)
        elapsed = time.perf_counter() - start
        if verify:
            try:
                graph.verify()
            except VerifyError as exc:
                raise VerifyError(f"after pass {name}: {exc}") from None
        result.snapshots.append(Snapshot(name, graph, elapsed))
        if dump_dir:
            _dump(dump_dir, i, name, graph)
    return result


def _dump(folder: str, index: int, name: str, graph: Graph) -> None:
    atomic_write(os.path.join(folder, f"{index:02d}-{name}.gir"), str(graph))


def optimize(
    graph: Graph,
    passes: list[str] | tuple[str, ...] | None = None,
    verify: bool | None = None,
    dump_dir: str | None = None,
) -> Graph:
    """Run the default pass list (or the named passes) and return the optimized graph, which
    keeps ``graph``'s facts of the call (``Graph.written_inputs``, ``Graph.global_reads``: its
    inputs are the same): a call of it is checked as a call of the traced graph."""
    trace = run_passes(graph, passes, verify, dump_dir)
    out = trace.graph
    out.written_inputs, out.global_reads = graph.written_inputs, graph.global_reads
    release_dropped(trace)
    return out


def release_dropped(trace: PassTrace) -> None:
    """Unlink the results of the nodes the passes made and a later pass dropped (in no graph but
    the intermediate ones of ``trace``, which only ``optimize`` sees) from their producers: a node
    and its results hold each other, so each such node would be left for the cycle collector
    (thousands per compile: a rewritten node is rebuilt by every later pass that remaps one of its
    operands); unlinked, reference counting frees them with their graphs. The input graph and the
    output graph are left as they are, and so is every node of theirs."""
    snapshots = trace.snapshots
    if len(snapshots) >= 3:
        release_unshared([s.graph for s in snapshots[1:-1]], [snapshots[0].graph, snapshots[-1].graph])


def release_unshared(dropped_graphs: list[Graph], kept: list[Graph]) -> None:
    """Unlink the results of the top-level nodes of ``dropped_graphs`` that are in none of
    ``kept`` from their producers (``release_dropped``): for graphs no one will read again, such
    as the traced graph once the optimized one (which shares its unchanged nodes) is made and
    only that one is kept (api/parallel.py ``plan_and_graph``)."""
    dropped = set().union(*[g.nodes for g in dropped_graphs])  # (set operations: in C)
    dropped.difference_update(*[g.nodes for g in kept])
    results = chain.from_iterable(map(attrgetter("outputs"), dropped))
    deque(map(setattr, results, repeat("producer"), repeat(None)), maxlen=0)
