"""The redistributions a solved problem's plan makes: which collectives, in program order, at what
cost, and what each device sends.

The ILP's objective (passes/sharding/problem.py: ``Problem.evaluate``) prices every edge on its
own. The plan does less: a tensor that several consumers need in the same spec is redistributed
once, and once more for the later parts' readers of a forward value (``read_phase``), and a
ZeRO-3 parameter once per reader (``regathered``). So the objective's redistribution is an upper
bound of the plan's: ``redistribution_steps`` is the plan's count, the one the predicted step,
``collectives_of`` and the explanation of a plan's alternatives (passes/sharding/alternatives.py)
all use.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from graphc.passes.sharding.items import Edge
from graphc.passes.sharding.problem import Problem
from graphc.passes.sharding.records import Collective
from graphc.passes.sharding.redistribute import Step, bucketed_step_time, plan_steps


def redistribution_steps(
    problem: Problem,
    choice: list[int],
    edges: Iterable[Edge],
    share_bytes: int,
    regathered: set[tuple[int, int]] | None = None,
) -> Iterator[tuple[Edge, Step, float]]:
    """(edge, step, seconds) of every redistribution step the plan of ``choice`` makes for
    ``edges``, in program order: of edges of one value read in one spec and phase only the first
    that moves data pays (so ``edges`` must hold every such edge to count as the plan does), and
    a ZeRO-3 regather pays each time. A deferred all-reduce rides in a gradient bucket of
    ``share_bytes`` (0: none). ``regathered``: ``set(problem.gathers)``, for callers that ask
    many times."""
    done: set = set()
    if regathered is None:
        regathered = set(problem.gathers)  # a ZeRO-3 parameter is gathered for each reader (zero.py)
    for e in edges:
        src = problem.items[e.src].strategies[choice[e.src]].out_specs[e.src_out]
        dst = problem.items[e.dst].strategies[choice[e.dst]].in_specs[e.dst_in]
        if src == dst:
            continue
        key = (id(e.value), dst, e.phase)
        if key in done and not ((e.src, e.dst) in regathered and any(src[a].is_split for a in problem.zero_axes)):
            continue
        done.add(key)
        t = e.value.type
        for st in plan_steps(t.shape, t.dtype.itemsize, src, dst, problem.mesh):
            yield e, st, bucketed_step_time(st, problem.mesh, share_bytes) if e.deferred else st.time_s


def collectives_of(problem: Problem, choice: list[int], names: dict | None = None) -> list[Collective]:
    """The redistributions the plan of ``choice`` needs, in program order (``redistribution_steps``
    with the buckets the problem's share prices), each named by its tensor and first reader
    (``names``: the graph's ``value_names()``, if the caller has them)."""
    names = problem.graph.value_names() if names is None else names
    reader: dict[int, int] = {}
    for e in problem.edges:
        if problem.items[e.src].kind == "fanout":
            reader.setdefault(e.src, e.dst)
    out = []
    for e, st, seconds in redistribution_steps(problem, choice, problem.edges, problem.costs.bucket_share_bytes):
        consumer = problem.items[reader.get(e.dst, e.dst)]  # a fan-out reports its first reader
        node = consumer.node if consumer.kind == "node" else None
        part = node.part if node is not None else None
        producer = problem.items[e.src]
        if producer.kind == "fanout":
            producer = problem.items[producer.index]
        if part is None and producer.node is not None:
            part = producer.node.part
        out.append(
            Collective(
                kind=st.kind,
                axes=(problem.mesh.axis_names[st.axis],),
                bytes=e.value.type.nbytes,
                local_bytes=st.local_bytes,
                tensor=f"%{names[e.value]}",
                node=f"%{names[node.outputs[0]]}" if node is not None and node.outputs else f"output {consumer.index}",
                node_index=consumer.index if node is not None else None,
                op=node.op.name if node is not None else "output",
                loc=str(node.loc) if node is not None and node.loc else None,
                part=part,
                src=st.src,
                dst=st.dst,
                time_s=seconds,
                sent_bytes=st.sent_bytes,
            )
        )
    return out


__all__ = ["collectives_of", "redistribution_steps"]
