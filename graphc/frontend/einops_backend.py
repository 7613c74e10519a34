"""einops (``rearrange``, ``reduce``, ``repeat``, ``einsum``) on traced arrays.

einops picks a backend by the type of the array it is given (``einops/_backends.py``
``get_backend``): it tries the subclasses of its ``AbstractBackend`` whose ``framework_name`` is an
imported module, and raises "Tensor type unknown to einops" for a type none of them accepts. einops
has no public function to register a backend; its maintainer's advice for a new array type is
such a subclass defined in outside code (arogozhnikov/einops#120), which is what this module does:
``GraphcBackend`` is einops' numpy backend (its operations are numpy calls, which graphc traces),
chosen for graphc's Tracer. Its ``framework_name`` is "graphc", imported whenever a trace runs.

graphc does not import einops: ``register_if_imported`` defines the backend the first time a trace
starts, or a converted call is made, with einops already imported by the program (``sys.modules``).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from graphc.frontend.tracer import Tracer

_lock = threading.Lock()
_backend: type | None = None  # GraphcBackend, once defined


def register_if_imported() -> None:
    """Define graphc's einops backend (once) if the program has imported einops; else nothing."""
    if _backend is not None or "einops" not in sys.modules:
        return
    with _lock:
        if _backend is None:
            _define_backend()


def _define_backend() -> None:
    global _backend
    from einops import _backends  # einops' backend registry: no public one exists (module docstring)

    class GraphcBackend(_backends.NumpyBackend):
        """einops' numpy backend for graphc's traced arrays: reshape, transpose, reductions,
        np.tile for new axes, np.einsum; each a numpy call graphc traces."""

        framework_name = "graphc"

        def is_appropriate_type(self, tensor: Any) -> bool:
            return isinstance(tensor, Tracer)

    _backend = GraphcBackend
