"""Where a float32 model became float64: numpy's own promotion, named by the line that did it.

numpy promotes a float32 array combined with a float64 *array or numpy scalar* to float64
(NEP 50): ``np.sqrt(2 / np.pi) * x`` is float64 for a float32 ``x``, because ``np.sqrt`` of a
Python float returns a ``np.float64``. graphc keeps numpy's dtypes exactly; users coming from
JAX, which would stay in float32 there, get these sites named instead: ``graphc.jit`` warns once
per function (``PromotionWarning``) and ``graphc ir FILE:FUNC --explain-dtypes`` lists them all.
A traced graph shows each promotion as a ``convert`` from a narrower float to float64 of a value
that is not a constant; the user's own ``astype(np.float64)`` is one too, and is listed as well.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graphc.core.errors import SourceLoc
from graphc.core.ir import Graph, Value, walk
from graphc.core.traits import Constant
from graphc.ops import OPS


@dataclass(frozen=True)
class Promotion:
    loc: SourceLoc | None
    source: str  # the narrower dtype, e.g. "float32"
    target: str  # "float64"
    shape: tuple[int, ...]

    def __str__(self) -> str:
        where = str(self.loc) if self.loc is not None else "(no source line)"
        return f"{where}: a {self.source}{list(self.shape)} value became {self.target}"


def promotions(graph: Graph) -> list[Promotion]:
    """The promotions of model values to float64 in ``graph`` that reach one of its results,
    one per source line, in order. (A library that computes in float64 and casts back, as
    graphc's erf does, promotes nothing the user sees.)"""
    sites: list[Promotion] = []
    index: dict[str, int] = {}
    carries: dict[Value, frozenset[int]] = {}  # value -> the sites whose float64 values flow into it
    for node in walk(graph.nodes):
        flowing = frozenset().union(*(carries.get(v, frozenset()) for v in node.inputs))
        if node.op is OPS.convert:
            (x,) = node.inputs
            out = node.outputs[0]
            if out.dtype != np.float64:
                flowing = frozenset()  # cast back down: the float64 values end here
            elif x.dtype.kind == "f" and x.dtype.itemsize < 8 and _not_constant(x):
                key = str(node.loc)
                if key not in index:
                    index[key] = len(sites)
                    sites.append(Promotion(node.loc, x.dtype.name, out.dtype.name, x.shape))
                flowing = flowing | {index[key]}
        if flowing:
            for o in node.outputs:
                if o.dtype == np.float64:
                    carries[o] = flowing
    seen = frozenset().union(*(carries.get(v, frozenset()) for v in graph.outputs))
    return [site for k, site in enumerate(sites) if k in seen]


def _not_constant(x: Value) -> bool:
    return x.producer is None or not x.producer.op.has(Constant)


def promotion_message(fn_name: str, sites: list[Promotion]) -> str:
    first = sites[0]
    more = f" (and {len(sites) - 1} more lines: graphc ir FILE:FUNC --explain-dtypes)" if len(sites) > 1 else ""
    return (
        f"{fn_name}: {first}{more}. graphc keeps numpy's dtypes: a float64 array or numpy "
        "scalar (np.sqrt(2 / np.pi), np.float64(...), np.pi * np.ones(...)) makes float32 values float64. "
        "Use a Python float (math.sqrt) or cast to float32 to stay in float32"
    )
