"""Segments of a forward pass: where a chain of recomputed values may start (issue 30).

A *cut* is a forward node after which no earlier forward value (constants aside: they are always
in memory) is read again in the forward pass:
everything the rest of the forward pass reads of what came before goes through the cut node's
results. In a transformer the residual stream makes one after each attention block and each MLP
block (``x = x + mha(...)``, ``x = x + ffn(...)``); in a chain of layers every layer output is one.
A *segment* is the run of forward nodes after one cut up to and including the next: a layer,
or half of one.

Recomputation chains live inside a segment. Every recomputed node of a segment has one static
point, the earliest that any recomputable node reading it (in the same segment) or its own
backward readers need it (``choices._Uses.points``), so whatever subset of a segment the solver
recomputes, producers are rebuilt before their consumers and held until the last of them: the
solver picks the subset freely, and needs only the ``needs`` rows of passes/recompute/choices.py.
A segment's chain starts from values that are in memory at its points: graph inputs, values the
backward pass keeps anyway, and the previous cut's results, which the solver may keep past their
last forward use for this (a *checkpoint*: ``Strategy.checkpoint``, ``RematRanges.checkpoint``).

Special cases: recompute a whole segment from its checkpoint (Megatron-LM's "full" recomputation,
Chen et al.'s segments of one layer), or only its attention core (the scores, the softmax:
Korthikanti et al.'s selective recomputation), or single values, as the memory limit needs;
the ILP prices each in compute time (passes/sharding/ilp.py).

Not modelled: a segment rebuilt from a checkpoint two or more segments back (Chen's sqrt(n)
segments of several layers): a cut value is kept or recomputed in its own segment's backward,
which runs after the later segments' (docs/remat.md).
"""

from __future__ import annotations

from graphc.core.ir import Graph, Value
from graphc.core.traits import Constant


def forward_segments(graph: Graph, roots: dict[Value, Value]) -> dict[int, int]:
    """{forward node index: its segment}, segments numbered from 0 in forward order. ``roots``
    maps every view to the value whose buffer it looks into: reading a view reads its root."""
    last_read: dict[Value, int] = {}  # forward value -> its last forward reader
    for k, n in enumerate(graph.nodes):
        if n.part != "forward":
            continue
        for v in n.inputs:
            v = roots.get(v, v)
            if v.producer is not None and v.producer.part == "forward" and not v.producer.op.has(Constant):
                last_read[v] = k
    segment: dict[int, int] = {}
    current = 0
    reach = -1  # the last forward reader of any value made before the node at hand
    for k, n in enumerate(graph.nodes):
        if n.part != "forward":
            continue
        segment[k] = current
        if reach <= k:  # nothing made before k is read after it: a cut
            current += 1
        for o in n.outputs:
            reach = max(reach, last_read.get(roots.get(o, o), -1))
    return segment


__all__ = ["forward_segments"]
