"""The frontend: numpy code -> Graph.

tracer.py            Tracer (a traced array), TraceContext, bind / lift; where numpy's protocols dispatch
ufuncs.py            numpy ufuncs on traced arrays (numpy's own type resolution)
functions.py         numpy functions: reductions, contractions, elementwise helpers
shape_functions.py   numpy functions that move data: reshape, concatenate, pad, ...
index_functions.py   nanargmax / nanargmin, unravel_index (run-time guards where numpy raises)
scan_sort.py         cumsum / cumprod / prod, sort / argsort, isin on static shapes
linalg.py            np.linalg.inv / solve for small matrices (unrolled elimination)
scipy_table.py       scipy functions model code calls, mapped to the handlers (never imports scipy)
einops_backend.py    einops' backend for traced arrays, defined when the program imports einops
indexing.py          basic and advanced indexing
control.py           cond / while_loop / fori_loop nodes from Python functions
autograph.py         the source transform of Python control flow (syntax only)
autograph_runtime.py the helpers transformed code calls, and convert(fn)
entry.py             trace(fn, *args) -> Graph, and the public control-flow functions
"""

from graphc.frontend.entry import cond, fori_loop, inline_graph, trace, while_loop
from graphc.frontend.tracer import Tracer

__all__ = ["Tracer", "cond", "fori_loop", "inline_graph", "trace", "while_loop"]
