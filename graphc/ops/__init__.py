"""The op registry: every primitive is an ``OpDef`` declared once, with all of its rules beside it.

An OpDef carries
  * ``infer(in_types, **attrs) -> tuple[TensorType, ...]``: the shape/dtype rule, which also validates
    the attributes and raises ``ShapeError`` with a readable message;
  * ``impl(*arrays, **attrs)``: the numpy reference implementation used by ``graphc.evaluate``;
  * slots filled by later stages, declared here so that a test can walk the registry and find an op
    that misses one: ``vjp`` and ``jvp`` (autodiff), ``dim_rule`` (sharding), ``cost`` (flops/bytes).

The registry itself is ops/registry.py; the families live in their own modules (elementwise,
reduction, shape, indexing, update, linalg, constant, random, control, fused, comm, sharding), and importing this
package registers all of them. ops/dims.py has the dimension-rule vocabulary, ops/context.py what
an autodiff rule may call.
"""

from graphc.core.ir import OpDef
from graphc.ops import (
    comm,  # noqa: F401
    constant,  # noqa: F401
    control,  # noqa: F401
    elementwise,  # noqa: F401
    fused,  # noqa: F401
    indexing,  # noqa: F401
    linalg,  # noqa: F401
    random,  # noqa: F401
    reduction,  # noqa: F401
    shape,  # noqa: F401
    sharding,  # noqa: F401
    update,  # noqa: F401
)
from graphc.ops.registry import REGISTRY, check_axes, check_axis, check_shape, get_op, register, same_dtype


class _Ops:
    """Every registered op as an attribute, for identity checks in passes' patterns:
    ``p.op is OPS.transpose`` (an unknown name raises AttributeError, so a typo fails where it
    is written). What kind of op something is (a view, a reduction, a collective) is asked of
    its traits instead (graphc/core/traits.py). An op found is kept as an attribute: a name is
    registered once and never replaced (registry.register), and the passes ask per node."""

    def __getattr__(self, name: str) -> OpDef:
        try:
            op = REGISTRY[name.rstrip("_")]
        except KeyError:
            raise AttributeError(f"no op named {name!r}") from None
        setattr(self, name, op)
        return op


OPS = _Ops()

__all__ = ["OPS", "REGISTRY", "OpDef", "check_axes", "check_axis", "check_shape", "get_op", "register", "same_dtype"]
