"""Primitives that move data without arithmetic: reshape, transpose, broadcast_to, slice, pad,
concatenate, split. numpy's expand_dims / squeeze / swapaxes / stack / hstack / flip / repeat
decompose onto these."""

from __future__ import annotations

import numpy as np

from graphc.core.errors import ShapeError
from graphc.core.ir import OpDef, TensorType
from graphc.core.traits import FollowsProducer, FreshResult, LinearIn, LocalAttrs, ViewOf
from graphc.ops.dims import DimRule, copy_cost, reshape_rule, view_cost
from graphc.ops.registry import check_axis, check_shape, register, same_dtype


def _reshape_infer(in_types, shape):
    (x,) = in_types
    check_shape(shape)
    if int(np.prod(shape, dtype=np.int64)) != x.size:
        raise ShapeError(f"cannot reshape array of shape {x.shape} (size {x.size}) into shape {shape}")
    return (TensorType(shape, x.dtype),)


reshape = register(
    OpDef(
        "reshape",
        "shape",
        _reshape_infer,
        lambda x, shape: np.reshape(x, shape),
        attrs=("shape",),
        doc="row-major reshape to a fully specified shape",
    )
)


def _transpose_infer(in_types, perm):
    (x,) = in_types
    if not isinstance(perm, tuple) or sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"perm {perm!r} is not a permutation of the {x.ndim} axes of {x}")
    return (TensorType(tuple(x.shape[p] for p in perm), x.dtype),)


transpose = register(
    OpDef(
        "transpose",
        "shape",
        _transpose_infer,
        lambda x, perm: np.transpose(x, perm),
        attrs=("perm",),
        doc="output axis i is input axis perm[i]",
    )
)


def _broadcast_infer(in_types, shape):
    (x,) = in_types
    check_shape(shape)
    ok = len(shape) >= x.ndim and all(d == s or d == 1 for d, s in zip(reversed(x.shape), reversed(shape)))
    if not ok:
        raise ShapeError(f"cannot broadcast shape {x.shape} to {shape}")
    return (TensorType(shape, x.dtype),)


broadcast_to = register(
    OpDef(
        "broadcast_to",
        "shape",
        _broadcast_infer,
        lambda x, shape: np.broadcast_to(x, shape),
        attrs=("shape",),
        doc="numpy broadcasting (leading dims added, size-1 dims stretched)",
    )
)


def slice_length(start: int, stop: int, step: int) -> int:
    """Length of x[start:stop:step] for normalized bounds; stop == -1 with a negative step means
    'through index 0' (Python range semantics)."""
    return len(range(start, stop, step))


def normalize_slice(s: slice, n: int) -> tuple[int, int, int]:
    """The normalized (start, stop, step) of ``s`` on a dim of size n, as the slice op stores it."""
    a, b, step = s.indices(n)
    if step < 0 and b < 0:
        b = -1
    if len(range(a, b, step)) == 0:
        return 0, 0, 1
    return a, b, step


def _slice_infer(in_types, starts, stops, steps):
    (x,) = in_types
    if not (isinstance(starts, tuple) and isinstance(stops, tuple) and isinstance(steps, tuple)):
        raise ShapeError("slice: starts, stops and steps must be tuples")
    if not len(starts) == len(stops) == len(steps) == x.ndim:
        raise ShapeError(f"slice: need one start/stop/step per dimension of {x}")
    out = []
    for d, (a, b, s, n) in enumerate(zip(starts, stops, steps, x.shape)):
        if s == 0:
            raise ShapeError(f"slice: step of dim {d} is 0")
        lo_ok = 0 <= a <= n if s > 0 else (0 <= a < n or (n == 0 and a == -1))
        hi_ok = 0 <= b <= n if s > 0 else -1 <= b < max(n, 1)
        if not (lo_ok and hi_ok):
            raise ShapeError(f"slice: bounds {a}:{b}:{s} are not normalized for dim {d} of size {n}")
        out.append(slice_length(a, b, s))
    return (TensorType(tuple(out), x.dtype),)


def _py_slice(a: int, b: int, s: int) -> slice:
    return slice(a, None if (s < 0 and b < 0) else b, s)


def slice_index(starts, stops, steps) -> tuple:
    """The Python index of a slice node's attributes (``x[slice_index(...)]`` is the op); of a 0-d
    operand ``...``, whose result is a 0-d view as every slice's is (``x[()]`` is a numpy scalar)."""
    return tuple(_py_slice(a, b, s) for a, b, s in zip(starts, stops, steps)) or (Ellipsis,)


def _slice_impl(x, starts, stops, steps):
    return x[slice_index(starts, stops, steps)]


slice_ = register(
    OpDef(
        "slice",
        "shape",
        _slice_infer,
        _slice_impl,
        attrs=("starts", "stops", "steps"),
        doc="x[start:stop:step] per dim, bounds normalized like range(); stop -1 with step < 0 means through 0",
    )
)


def _pad_infer(in_types, widths, value):
    (x,) = in_types
    if not isinstance(widths, tuple) or len(widths) != x.ndim:
        raise ShapeError(f"pad: need one (before, after) pair per dimension of {x}")
    for w in widths:
        if not (isinstance(w, tuple) and len(w) == 2 and all(isinstance(v, int) and v >= 0 for v in w)):
            raise ShapeError(f"pad: widths must be non-negative (before, after) pairs, got {widths}")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ShapeError(f"pad: value must be a number, got {value!r}")
    return (TensorType(tuple(n + lo + hi for n, (lo, hi) in zip(x.shape, widths)), x.dtype),)


def _pad_impl(x, widths, value):
    # a filled array and one slice assignment: np.pad's Python overhead is more than a small
    # array's copy (docs/measurements.md#pad)
    out = np.full(tuple(n + lo + hi for n, (lo, hi) in zip(x.shape, widths)), value, dtype=x.dtype)
    out[tuple(slice(lo, lo + n) for n, (lo, _hi) in zip(x.shape, widths))] = x
    return out


pad = register(
    OpDef(
        "pad",
        "shape",
        _pad_infer,
        _pad_impl,
        attrs=("widths", "value"),
        doc="constant padding, (before, after) per dim",
    )
)


def _concat_infer(in_types, axis):
    dt = same_dtype(in_types, "concatenate")
    first = in_types[0]
    check_axis(axis, first.ndim)
    for t in in_types[1:]:
        if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != axis):
            raise ShapeError(
                f"concatenate along axis {axis}: shapes {', '.join(str(u.shape) for u in in_types)} differ off that axis"
            )
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in in_types)
    return (TensorType(tuple(shape), dt),)


concatenate = register(
    OpDef(
        "concatenate",
        "shape",
        _concat_infer,
        lambda *xs, axis: np.concatenate(xs, axis=axis),
        attrs=("axis",),
        num_inputs=None,
        doc="join along axis",
    )
)


def _split_infer(in_types, indices, axis):
    (x,) = in_types
    check_axis(axis, x.ndim)
    n = x.shape[axis]
    if not isinstance(indices, tuple) or list(indices) != sorted(indices) or any(not 0 <= i <= n for i in indices):
        raise ShapeError(f"split: indices must be sorted within [0, {n}], got {indices!r}")
    bounds = (0, *indices, n)
    outs = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        shape = list(x.shape)
        shape[axis] = hi - lo
        outs.append(TensorType(tuple(shape), x.dtype))
    return tuple(outs)


split = register(
    OpDef(
        "split",
        "shape",
        _split_infer,
        lambda x, indices, axis: tuple(np.split(x, indices, axis=axis)),
        attrs=("indices", "axis"),
        doc="split at sorted indices along axis; len(indices)+1 results",
    )
)


# --- autodiff rules (see graphc/autodiff.py) --------------------------------------------------
# These ops are linear: the JVP applies the op to the tangent, the VJP is the transposed op.


def _linear_jvp(opname: str):
    def jvp(ad, *tangents):
        if all(t is None for t in tangents):
            return None
        ts = [ad.instantiate(t, x) for t, x in zip(tangents, ad.inputs)]
        return ad.bind_any(opname, *ts, **ad.attrs)

    return jvp


reshape.vjp = lambda ad, g: [g.reshape(ad.inputs[0].shape)]
transpose.vjp = lambda ad, g: [g.transpose(tuple(np.argsort(ad.attrs["perm"])))]
broadcast_to.vjp = lambda ad, g: [ad.unbroadcast(g, ad.inputs[0].shape)]
for _op in (reshape, transpose, broadcast_to, slice_, concatenate, split):
    _op.jvp = _linear_jvp(_op.name)


def _pad_jvp(ad, t):
    return None if t is None else ad.bind("pad", t, widths=ad.attrs["widths"], value=0 if t.dtype.kind in "iu" else 0.0)


def _pad_vjp(ad, g):  # the cotangent of the interior; the padding value is a constant
    (x,) = ad.inputs
    widths = ad.attrs["widths"]
    return [
        ad.bind(
            "slice",
            g,
            starts=tuple(lo for lo, _ in widths),
            stops=tuple(lo + n for (lo, _), n in zip(widths, x.shape)),
            steps=(1,) * x.ndim,
        )
    ]


pad.vjp, pad.jvp = _pad_vjp, _pad_jvp


def _slice_vjp(ad, g):
    """Scatter g back to the sliced positions, one dim at a time: flip negative steps, spread
    strided elements apart with zeros (reshape + pad + reshape), then pad to the full size."""
    (x,) = ad.inputs
    starts, stops, steps = ad.attrs["starts"], ad.attrs["stops"], ad.attrs["steps"]
    for d, (a, b, s, n) in enumerate(zip(starts, stops, steps, x.shape)):
        picked = range(a, b, s)
        count = len(picked)
        if count == 0:
            return [ad.zeros(x)]
        lo, step = min(picked[0], picked[-1]), abs(s)
        shape = list(g.shape)
        if s < 0:
            g = ad.bind(
                "slice",
                g,
                starts=tuple(count - 1 if i == d else 0 for i in range(g.ndim)),
                stops=tuple(-1 if i == d else k for i, k in enumerate(shape)),
                steps=tuple(-1 if i == d else 1 for i in range(g.ndim)),
            )
        if step > 1 and count > 1:
            spread = g.reshape(tuple(shape[: d + 1]) + (1,) + tuple(shape[d + 1 :]))
            spread = ad.bind(
                "pad",
                spread,
                widths=tuple((0, step - 1) if i == d + 1 else (0, 0) for i in range(g.ndim + 1)),
                value=0.0,
            )
            shape[d] = count * step
            g = ad.bind(
                "slice",
                spread.reshape(tuple(shape)),
                starts=(0,) * g.ndim,
                stops=tuple((count - 1) * step + 1 if i == d else k for i, k in enumerate(shape)),
                steps=(1,) * g.ndim,
            )
        covered = g.shape[d]
        g = ad.bind(
            "pad", g, widths=tuple((lo, n - lo - covered) if i == d else (0, 0) for i in range(g.ndim)), value=0.0
        )
    return [g]


slice_.vjp = _slice_vjp


def _concat_vjp(ad, g):
    axis = ad.attrs["axis"]
    bounds = np.cumsum([x.shape[axis] for x in ad.inputs])[:-1]
    parts = ad.bind_any("split", g, indices=tuple(int(b) for b in bounds), axis=axis)
    return list(parts) if isinstance(parts, tuple) else [parts]


concatenate.vjp = _concat_vjp


def _split_vjp(ad, *gs):
    parts = [ad.instantiate(g, y) for g, y in zip(gs, ad.outputs)]
    return [parts[0] if len(parts) == 1 else ad.bind("concatenate", *parts, axis=ad.attrs["axis"])]


split.vjp = _split_vjp


# --- sharding rules (see graphc/ops/dims.py) --------------------------------------------------


def _transpose_dim_rule(in_types, out_types, perm):
    labels = tuple(f"t{d}" for d in range(len(perm)))
    return DimRule((labels,), (tuple(labels[p] for p in perm),))


def _broadcast_dim_rule(in_types, out_types, shape):
    """New leading dims and broadcast size-1 dims exist only in the result: a split of them leaves
    the operand replicated and each device broadcasts to its slice."""
    (x,) = in_types
    off = len(shape) - x.ndim
    outs = tuple(f"e{d}" for d in range(len(shape)))
    ins = tuple(None if (x.shape[d] == 1 and shape[off + d] != 1) else outs[off + d] for d in range(x.ndim))
    return DimRule((ins,), (outs,))


def _slice_dim_rule(in_types, out_types, starts, stops, steps):
    (x,) = in_types
    labels = tuple(
        f"e{d}" if (a, b, s) == (0, n, 1) else None for d, (a, b, s, n) in enumerate(zip(starts, stops, steps, x.shape))
    )
    return DimRule((labels,), (labels,))


def _pad_dim_rule(in_types, out_types, widths, value):
    labels = tuple(f"e{d}" if tuple(w) == (0, 0) else None for d, w in enumerate(widths))
    return DimRule((labels,), (labels,))


def _concat_dim_rule(in_types, out_types, axis):
    """Off the axis every dim is shared. Along it, k pieces of equal size make the result a k-block
    dim: each device's share of every piece, concatenated, is its share of each block."""
    nd = out_types[0].ndim
    base = [f"e{d}" for d in range(nd)]
    sizes = {t.shape[axis] for t in in_types}
    along = "c" if len(sizes) == 1 and 0 not in sizes else None
    ins = tuple(tuple(along if d == axis else base[d] for d in range(nd)) for _ in in_types)
    out = tuple(((along, len(in_types)) if along else None) if d == axis else base[d] for d in range(nd))
    return DimRule(ins, (out,))


def _split_dim_rule(in_types, out_types, indices, axis):
    nd = in_types[0].ndim
    base = [f"e{d}" for d in range(nd)]
    sizes = {t.shape[axis] for t in out_types}
    along = "c" if len(sizes) == 1 and 0 not in sizes else None
    inp = tuple(((along, len(out_types)) if along else None) if d == axis else base[d] for d in range(nd))
    outs = tuple(tuple(along if d == axis else base[d] for d in range(nd)) for _ in out_types)
    return DimRule((inp,), outs)


reshape.dim_rule, reshape.cost = (lambda in_types, out_types, shape: reshape_rule(in_types, out_types)), view_cost
transpose.dim_rule, transpose.cost = _transpose_dim_rule, copy_cost
broadcast_to.dim_rule, broadcast_to.cost = _broadcast_dim_rule, view_cost
slice_.dim_rule, slice_.cost = _slice_dim_rule, copy_cost
pad.dim_rule, pad.cost = _pad_dim_rule, copy_cost
concatenate.dim_rule, concatenate.cost = _concat_dim_rule, copy_cost
split.dim_rule, split.cost = _split_dim_rule, copy_cost


# --- traits (graphc/core/traits.py) ------------------------------------------------------------
# numpy returns views from reshape, transpose, broadcast_to, slicing and split; whether such a
# view is C-contiguous decides whether a reshape of it copies (numpy's rule), which the planner's
# memory model and the executor both read from ViewOf.


def _transpose_strided(node) -> bool:
    perm = tuple(node.attrs["perm"])
    return perm != tuple(sorted(perm))


def _broadcast_strided(node) -> bool:
    return node.inputs[0].type.size != node.outputs[0].type.size


def _slice_strided(node) -> bool:
    """Contiguous only when it cuts the first dim it changes, with step 1."""
    shape_in, shape_out = node.inputs[0].type.shape, node.outputs[0].type.shape
    cut = [d for d, (m, n) in enumerate(zip(shape_in, shape_out)) if m != n]
    outer = all(n == 1 for n in shape_out[: cut[0]]) if cut else True
    return not cut or len(cut) > 1 or not outer or any(st != 1 for st in node.attrs["steps"])


def _split_strided(node) -> bool:
    """Pieces along the first dim that is not 1 are contiguous."""
    shape = node.inputs[0].type.shape
    return any(n != 1 for n in shape[: node.attrs["axis"]])


def _local_shape(node, ins, outs, specs, mesh_shape, coord) -> dict:
    """reshape / broadcast_to on a device: to its piece's shape."""
    return {**node.attrs, "shape": outs[0].shape}


def _local_stops(node, ins, outs, specs, mesh_shape, coord) -> dict:
    """A slice on a device: the dims it does not cut end where the local operand does."""
    a = node.attrs
    full = node.inputs[0].type.shape
    stops = tuple(
        ins[0].shape[d] if (start, stop, step) == (0, n, 1) else stop
        for d, (start, stop, step, n) in enumerate(zip(a["starts"], a["stops"], a["steps"], full))
    )
    return {**a, "stops": stops}


def _local_split(node, ins, outs, specs, mesh_shape, coord) -> dict:
    """A split on a device: at the local pieces' boundaries."""
    axis = node.attrs["axis"]
    bounds = np.cumsum([o.shape[axis] for o in outs])[:-1]
    return {**node.attrs, "indices": tuple(int(b) for b in bounds)}


_ONE = (frozenset({0}),)
reshape.traits = (
    ViewOf(copies_strided=True),
    FollowsProducer(),
    LinearIn(_ONE, on_meshes=True),
    LocalAttrs(_local_shape),
)
transpose.traits = (ViewOf(strided=_transpose_strided), FollowsProducer(), LinearIn(_ONE, on_meshes=True))
broadcast_to.traits = (
    ViewOf(strided=_broadcast_strided, writeable=False),
    FollowsProducer(),
    LinearIn(_ONE),
    LocalAttrs(_local_shape),
)
slice_.traits = (ViewOf(strided=_slice_strided), FollowsProducer(), LinearIn(_ONE), LocalAttrs(_local_stops))
split.traits = (ViewOf(strided=_split_strided), FollowsProducer(), LocalAttrs(_local_split))
pad.traits = (FreshResult(), FollowsProducer())
concatenate.traits = (
    FreshResult(),
    FollowsProducer(),
    LinearIn(of_node=lambda node: (frozenset(range(len(node.inputs))),)),
)
