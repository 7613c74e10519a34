"""Frontend: numpy code -> Graph IR by tracing."""

from graphc.frontend import functions, shape_functions  # noqa: F401  (registers the numpy handlers)
from graphc.frontend.tracer import Tracer, trace

__all__ = ["Tracer", "trace"]
