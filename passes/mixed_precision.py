"""The float32 copies a GPU training stack keeps of low-precision parameters, as the block search
(passes/scale.py ``compose``) prices them on a profile whose cluster figures name them
(graphc/core/profiles.py ``ClusterFigures.main_bytes``, Megatron-LM's mixed precision):

    main_copies(layout, ...)   the state layout with, for each parameter narrower than
                               ``main_bytes``, its gradient accumulated and reduced in a buffer of
                               ``main_bytes`` an element (``main_grad``) and a master copy of
                               ``main_bytes`` an element held with its optimizer state
    gather_bytes(layout)       the parameters as the update leaves them (their own dtype, the
                               update's layout on tp): what ZeRO's all-gather after the update moves
    update_bytes(layout, ...)  the memory traffic those copies add to the update: per element
                               updated, the master read and written and the main gradient read
                               twice (the gradient-norm clip, the update) against the parameter
                               and gradient of the step as written; per gradient element held,
                               the buffer zeroed once a step

A parameter of S bytes an element, with main copies of M bytes: the step as written reads the
parameter and its gradient and writes the parameter, 3 S bytes an element; Megatron-LM's update
reads the main gradient twice (``clip_grad_norm`` and the Adam step), reads and writes the master,
and writes the parameter back: 4 M + S. The difference, 4 M - 2 S (12 bytes for bfloat16 with
float32 copies), is what ``update_bytes`` adds per updated element. The step's own optimizer state
(Adam's moments) is priced by the step itself. A step that keeps its own float32 master copy in
its optimizer state is not told apart: its copy would be counted twice (docs/scale.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from graphc.passes.state_layout import ParamLayout, StateLayout


def _widened(p: ParamLayout, itemsize: int, main_bytes: int) -> ParamLayout:
    if not main_bytes or itemsize >= main_bytes or not p.grad_nbytes:
        return p  # no copies: already as wide, or not trained
    elements = p.nbytes // itemsize
    return dataclasses.replace(
        p, grad_nbytes=elements * main_bytes, state_nbytes=p.state_nbytes + elements * main_bytes
    )


def main_copies(layout: StateLayout, itemsizes: Mapping[str, int], itemsize: int, main_bytes: int) -> StateLayout:
    """``layout`` with the main gradient and master copy of each parameter narrower than
    ``main_bytes`` (module doc); ``itemsizes`` by parameter name, ``itemsize`` for a layout read
    from no plan (``StateLayout.even``: its parameters' bytes, gradients in their dtype)."""
    if not main_bytes:
        return layout
    if layout.params:
        params = [_widened(p, itemsizes.get(p.name, main_bytes), main_bytes) for p in layout.params]
        return StateLayout.of(params)
    if itemsize >= main_bytes:
        return layout
    elements = layout.param_bytes / itemsize
    return dataclasses.replace(
        layout, grad_bytes=elements * main_bytes, state_bytes=layout.state_bytes + elements * main_bytes
    )


def gather_bytes(layout: StateLayout) -> float:
    """Bytes per device of the parameters in the update's layout on tp, in their own dtype: what
    the all-gather after a ZeRO update moves (Megatron-LM's distributed optimizer gathers the
    bfloat16 parameters, not the float32 master)."""
    if not layout.params:
        return layout.param_bytes
    return sum(p.nbytes / p.update for p in layout.params)


def update_bytes(
    layout: StateLayout, itemsizes: Mapping[str, int], itemsize: int, main_bytes: int
) -> tuple[float, float]:
    """(bytes per device the update adds per element it updates, summed over the layout's
    parameters in the update's layout; bytes of zeroing the main gradients held, in the gradient's
    layout): module doc. ``layout`` is the step's own (before ``main_copies``)."""
    if not main_bytes:
        return 0.0, 0.0
    if not layout.params:
        if itemsize >= main_bytes:
            return 0.0, 0.0
        elements = layout.param_bytes / itemsize
        return elements * (4 * main_bytes - 2 * itemsize), elements * main_bytes
    updated = zeroed = 0.0
    for p in layout.params:
        s = itemsizes.get(p.name, main_bytes)
        if s >= main_bytes or not p.grad_nbytes:
            continue
        elements = p.nbytes // s
        updated += elements / p.update * (4 * main_bytes - 2 * s)
        zeroed += elements / p.grad * main_bytes
    return updated, zeroed


__all__ = ["gather_bytes", "main_copies", "update_bytes"]
