"""Frontend: numpy code -> Graph IR by tracing."""

from graphc.frontend import control, functions, shape_functions  # noqa: F401  (registers handlers and rules)
from graphc.frontend.tracer import Tracer, trace

__all__ = ["Tracer", "trace"]
