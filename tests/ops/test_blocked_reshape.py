"""Blocked splits through reshapes (graphc/ops/dims.py ``reshape_rule``): a dim of size 3*H*E
reshaped to [3, H, E] can be split on H inside each of the 3 blocks (``S(d, blocks=3)``), so a
transformer with a fused QKV projection gets the Megatron plan.

Differentially: every strategy the planner enumerates for a reshape, run piece by piece on every
device of a mesh, gives the device's piece of numpy's reshape; pinned as a plan, lowered and run on
the threaded runtime, it equals numpy; and a fused-QKV training step on tp=4 / tp=2 is split by
heads with one all-reduce of the activations, and computes what numpy and the interpreter do."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as hst

import graphc
from graphc.core.ir import TensorType
from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.core.spec import R, S, format_spec, shard
from graphc.ops.dims import MAX_BLOCKS, reshape_rule
from graphc.passes.partition import lower, optimize_for_planning, state_ties
from graphc.passes.sharding.local import run_local
from graphc.passes.sharding.roles import BATCH, SEQ, axis_roles
from graphc.passes.sharding.strategies import block_sets, get_rule, node_strategies, rules_of
from tests.helpers import assert_same_pytree, quick_share

PROFILE = MachineProfile.default()

# (source shape, result shape): splits, merges, both, size-1 dims, the fused QKV reshape both ways
RESHAPES = [
    ((6, 12), (6, 3, 4)),
    ((2, 3, 8), (2, 24)),
    ((4, 3, 2, 5), (4, 30)),
    ((24,), (2, 3, 4)),
    ((2, 3, 4), (24,)),
    ((4, 6), (2, 12)),
    ((4, 6), (3, 8)),
    ((2, 1, 6), (12,)),
    ((12,), (2, 1, 6)),
    ((6, 1, 4), (3, 8)),
    ((1, 12), (3, 4)),
    ((2, 4, 24), (2, 4, 3, 2, 4)),
    ((2, 4, 3, 2, 4), (2, 4, 24)),
    ((36,), (3, 12)),
    ((3, 6, 2), (18, 2)),
]
MESHES = [(2,), (3,), (2, 2)]


def _shape_id(pair) -> str:
    return "x".join(map(str, pair[0])) + "->" + "x".join(map(str, pair[1]))


def _reshape_node(src, dst):
    x = np.arange(math.prod(src), dtype=np.float32).reshape(src)
    graph = graphc.trace(lambda a: a.reshape(dst), x)
    (node,) = graph.nodes
    assert node.op.name == "reshape"
    return graph, node, x


def _every_block_count(node) -> dict:
    """Block sets letting every dim carry every block count that divides it: the strategies then
    combine the rule's block factors with blocks from elsewhere (S(d, b * f))."""
    sets = {}
    for v in list(node.inputs) + list(node.outputs):
        sets[v] = [{b for b in range(1, MAX_BLOCKS + 1) if n % b == 0} for n in v.type.shape]
    return sets


def _check_pieces(node, st, mesh_shape, x):
    """Each device's local reshape of its piece of x is its piece of numpy's result."""
    want = x.reshape(node.outputs[0].type.shape)
    for coord in itertools.product(*(range(n) for n in mesh_shape)):
        piece = shard(x, st.in_specs[0], mesh_shape, coord)
        (got,) = run_local(node, st, mesh_shape, coord, [piece])
        np.testing.assert_array_equal(
            got, shard(want, st.out_specs[0], mesh_shape, coord), err_msg=f"{st.describe()} at {coord}"
        )


def test_rule_offers_a_split_inside_the_blocks_of_the_leading_dims():
    t = lambda *s: TensorType(s, np.dtype(np.float32))  # noqa: E731
    rule = reshape_rule((t(2, 96),), (t(2, 3, 4, 8),))  # [b, 3*H*E] -> [b, 3, H, E]
    assert rule.inputs == (("r0", (("r1", 1), ("r1.0.1", 3), ("r1.0.2", 12))),)
    assert rule.outputs == (("r0", "r1", (None, ("r1.0.1", 1)), (None, ("r1.0.2", 1))),)
    # only the leading dims are the same dim (their primary label); H and E have none
    primary = {(side, d): lab for side, _i, d, lab, _f in rule.occurrences(primary_only=True)}
    assert primary == {("in", 0): "r0", ("out", 0): "r0", ("in", 1): "r1", ("out", 1): "r1"}
    # the merge direction is the mirror image
    back = reshape_rule((t(2, 3, 4, 8),), (t(2, 96),))
    assert back.outputs[0][1] == (("r1", 1), ("r1.1.0", 3), ("r1.2.0", 12))
    # several dims on both sides: [4, 6] -> [2, 12]
    both = reshape_rule((t(4, 6),), (t(2, 12),))
    assert both.inputs == (((("r0", 1), ("r0.0.1", 2)), (None, ("r0.1.1", 1))),)
    assert both.outputs == (("r0", (None, ("r0.0.1", 1), ("r0.1.1", 2))),)


@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda m: "x".join(map(str, m)))
@pytest.mark.parametrize("pair", RESHAPES, ids=_shape_id)
def test_every_reshape_strategy_gives_each_device_its_piece(pair, mesh_shape):
    graph, node, x = _reshape_node(*pair)
    mesh = Mesh({f"a{i}": n for i, n in enumerate(mesh_shape)}, profile=PROFILE)
    rule = get_rule(node)
    for sets in (block_sets(graph, {node: rule}), _every_block_count(node)):
        strategies = node_strategies(node, rule, mesh, sets)
        for st in strategies:
            _check_pieces(node, st, mesh_shape, x)


def test_the_fused_qkv_reshape_has_the_split_by_heads():
    _graph, node, _x = _reshape_node((2, 4, 24), (2, 4, 3, 2, 4))
    mesh = Mesh({"tp": 2}, profile=PROFILE)
    specs = {(st.in_specs[0], st.out_specs[0]) for st in node_strategies(node, get_rule(node), mesh, {})}
    assert ((S(2),), (S(2),)) not in specs  # the size-3 dim does not split in 2
    assert ((S(2, 3),), (S(3),)) in specs  # H inside each of q, k, v
    assert ((S(2, 6),), (S(4),)) in specs  # E inside each of the 3 * H blocks


def test_two_alternatives_of_one_dim_never_split_it_over_two_axes():
    _graph, node, x = _reshape_node((24,), (2, 3, 4))
    mesh = Mesh({"a": 2, "b": 2}, profile=PROFILE)
    strategies = node_strategies(node, get_rule(node), mesh, {})
    for st in strategies:
        dims = [p.dim for p in st.in_specs[0] if p.is_split]
        assert len(dims) == len(set(dims)), st.describe()
    # one axis on the 2 and one inside the 3 * 4 blocks would split the source dim twice
    assert not any(all(p.is_split for p in st.in_specs[0]) for st in strategies)
    assert {st.out_specs[0] for st in strategies} >= {(S(0), R), (R, S(2)), (S(2), R)}


@hst.composite
def _reshape_pairs(draw):
    """Two shapes of one size: a list of small factors (1s included) cut into runs two ways."""
    factors = draw(hst.lists(hst.sampled_from([1, 2, 2, 3, 4, 6]), min_size=1, max_size=5))

    def cut() -> tuple[int, ...]:
        dims, cur = [], factors[0]
        for f in factors[1:]:
            if draw(hst.booleans()):
                dims.append(cur)
                cur = f
            else:
                cur *= f
        return tuple(dims + [cur])

    return cut(), cut()


@settings(max_examples=120, deadline=None, derandomize=True)  # reproducible in CI
@given(_reshape_pairs(), hst.sampled_from(MESHES))
def test_random_reshapes_every_strategy_gives_each_device_its_piece(pair, mesh_shape):
    assume(pair[0] != pair[1])  # the tracer emits no reshape to the same shape
    graph, node, x = _reshape_node(*pair)
    mesh = Mesh({f"a{i}": n for i, n in enumerate(mesh_shape)}, profile=PROFILE)
    rule = get_rule(node)
    for st in node_strategies(node, rule, mesh, _every_block_count(node)):
        _check_pieces(node, st, mesh_shape, x)


# --- lowered and run on device threads ----------------------------------------------------------


@pytest.mark.parametrize("axes", [{"tp": 2}, {"tp": 3}, {"a": 2, "b": 2}], ids=["tp=2", "tp=3", "a=2,b=2"])
@pytest.mark.parametrize("pair", quick_share(RESHAPES[:6] + RESHAPES[11:], every=3), ids=_shape_id)
def test_every_reshape_strategy_lowers_and_runs(pair, axes):
    """Each strategy pinned through the reshape's operand and result: the planner picks it (no
    redistribution), and the device threads compute numpy's reshape."""
    src, dst = pair
    graph, node, x = _reshape_node(src, dst)
    mesh = Mesh(axes, profile=PROFILE)
    for st in node_strategies(node, get_rule(node), mesh, block_sets(graph, {node: get_rule(node)})):
        pf = graphc.parallelize(
            lambda a: a.reshape(dst),
            mesh=mesh,
            cache=False,
            in_specs=format_spec(st.in_specs[0]),
            out_specs=format_spec(st.out_specs[0]),
        )
        (choice,) = pf.plan(x).nodes
        assert (choice.in_specs, choice.out_specs) == (st.in_specs, st.out_specs), st.describe()
        np.testing.assert_array_equal(pf(x), x.reshape(dst), err_msg=st.describe())


@pytest.mark.parametrize(
    "src,dst",
    [
        ("[S(2, blocks=3)]", "[S(1)]"),
        ("[S(2)]", "[S(1, blocks=3)]"),
        ("[S(2, blocks=3)]", "[R]"),
        ("[R]", "[S(1, blocks=3)]"),
        ("[S(2, blocks=3)]", "[S(0)]"),
        ("[S(0)]", "[S(1, blocks=3)]"),
    ],
)
def test_blocked_specs_redistribute_on_device_threads(src, dst):
    """An elementwise op with its operand pinned to one spec and its result to another: the plan
    converts between them (gathers, slices and all-to-alls of blocks), priced and lowered. The
    reshape beside it lets the dim carry 3 blocks."""
    x = np.arange(4 * 12, dtype=np.float32).reshape(4, 1, 12)

    def f(a):
        return a.reshape(4, 12) * 2, a.reshape(4, 3, 4)

    mesh = Mesh({"tp": 2}, profile=PROFILE)
    pf = graphc.parallelize(f, mesh=mesh, cache=False, in_specs=src, out_specs=(dst, None))
    plan = pf.plan(x)
    assert plan.cost.comm_s > 0 and plan.collectives
    assert_same_pytree(pf(x), f(x))


def test_partial_sums_reduce_scatter_into_blocks():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 64)).astype(np.float32)
    b = rng.standard_normal((64, 48)).astype(np.float32)

    def f(p, q):
        y = p @ q
        return y, y.reshape(16, 3, 16)

    mesh = Mesh({"tp": 2}, profile=PROFILE)
    pins = {"in_specs": ("[S(1)]", "[S(0)]"), "out_specs": ("[S(1, blocks=3)]", None)}
    pf = graphc.parallelize(f, mesh=mesh, cache=False, **pins)
    plan = pf.plan(a, b)
    assert ("reduce_scatter", (S(1, 3),)) in [(c.kind, c.dst) for c in plan.collectives]
    assert {c.kind for c in plan.collectives} == {"reduce_scatter"}
    assert_same_pytree(pf(a, b), f(a, b))


# --- a transformer attention with a fused QKV projection ----------------------------------------


def attention(params, x, n_head):
    # [b, s, d] -> [b, s, d]: one projection for q, k and v, softmax attention per head, output projection
    b, s, d = x.shape
    e = d // n_head
    qkv = (x @ params["wqkv"]).reshape(b, s, 3, n_head, e)  # [b, s, 3d] -> [b, s, 3, H, E]
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # [b, s, H, E] each
    scores = np.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(e)  # [b, H, s, s]
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = weights / weights.sum(axis=-1, keepdims=True)
    out = np.einsum("bhqk,bkhe->bqhe", weights, v).reshape(b, s, d)  # [b, s, H, E] -> [b, s, d]
    return x + out @ params["wo"]


def loss(params, x, n_head):
    return np.mean(attention(params, x, n_head) ** 2)


def train_step(params, x, n_head, lr=0.1):
    value, grads = graphc.value_and_grad(loss)(params, x, n_head)
    return graphc.optim.sgd(params, grads, lr), value


def _attention_args(b=2, s=16, d=64):
    rng = np.random.default_rng(0)
    params = {
        "wqkv": (rng.standard_normal((d, 3 * d)) / math.sqrt(d)).astype(np.float32),
        "wo": (rng.standard_normal((d, d)) / math.sqrt(d)).astype(np.float32),
    }
    return params, rng.standard_normal((b, s, d)).astype(np.float32)


N_HEAD = 4


@pytest.mark.parametrize("tp", [4, 2])
def test_fused_qkv_training_step_gets_the_megatron_plan(tp):
    """wqkv split by heads inside each of q, k, v; wo by rows; the only communication is the
    all-reduce of the attention's output (and of the scalar loss): the Megatron bound."""
    params, x = _attention_args()
    pf = graphc.parallelize(
        train_step, mesh=Mesh({"tp": tp}, profile=PROFILE), cache=False, static_argnames=("n_head",)
    )
    plan, graph = pf.plan_and_graph(params, x, n_head=N_HEAD)
    specs = {t.name: t.spec for t in plan.inputs}
    assert specs["%params.wqkv"] == (S(1, blocks=3),)
    assert specs["%params.wo"] == (S(0),)
    moved = [c for c in plan.collectives if c.kind not in ("slice", "zero")]
    megatron = x.nbytes  # one all-reduce of the [b, s, d] activations in the forward pass
    assert [c.kind for c in moved if c.bytes > 4] == ["all_reduce"]
    assert sum(c.bytes for c in moved) <= megatron + 4
    # each device reshapes its [b, s, 3 * d / tp] piece to [b, s, 3, H / tp, E]
    device = lower(graph, plan).devices[0].graph
    shapes = {(n.inputs[0].type.shape, n.outputs[0].type.shape) for n in device.nodes if n.op.name == "reshape"}
    e = x.shape[2] // N_HEAD
    assert ((2, 16, 3 * 64 // tp), (2, 16, 3, N_HEAD // tp, e)) in shapes
    assert_same_pytree(pf(params, x, n_head=N_HEAD), train_step(params, x, N_HEAD))


def test_fused_qkv_on_dp_and_tp_is_data_parallel_and_megatron():
    # 8 sequences: on the default profile a batch of 2 or 4 no longer pays for splitting over dp
    # since the loss's own all-reduce is priced (it runs alone, outside the gradient buckets)
    params, x = _attention_args(b=8)
    pf = graphc.parallelize(
        train_step, mesh=Mesh({"dp": 2, "tp": 2}, profile=PROFILE), cache=False, static_argnames=("n_head",)
    )
    plan = pf.plan(params, x, n_head=N_HEAD)
    specs = {t.name: t.spec for t in plan.inputs}
    assert specs["%params.wqkv"] == (R, S(1, blocks=3))
    assert specs["%params.wo"] == (R, S(0))
    assert specs["%x"] == (S(0), R)
    assert_same_pytree(pf(params, x, n_head=N_HEAD), train_step(params, x, N_HEAD))


def test_alternative_labels_do_not_make_heads_batch_dims():
    """Axis roles unite dims through primary labels only: the batch and sequence dims of x reach
    the reshaped [b, s, 3, H, E], the dims split only as alternatives (H, E) stay neither, and
    [b * s] -> [b, s] leaves s out of the batch class."""
    params, x = _attention_args()
    graph = optimize_for_planning(graphc.trace(train_step, params, x, N_HEAD))
    roles = axis_roles(graph, Mesh("dp=2"), rules_of(graph), ties=state_ties(graph))
    qkv = next(n for n in graph.nodes if n.op.name == "reshape" and n.outputs[0].type.ndim == 5).outputs[0]
    assert roles.kinds(qkv) == (BATCH, SEQ, 0, 0, 0)

    def flat_rows(y):
        return (y.reshape(8, 16) * 2).reshape(2, 4, 16).sum(axis=1)  # [b*s, d] -> [b, s, d] -> [b, d]

    g2 = graphc.trace(flat_rows, np.ones((8, 16), np.float32))
    roles2 = axis_roles(g2, Mesh("dp=2"), rules_of(g2), ties=[])
    split = next(n for n in g2.nodes if n.op.name == "reshape" and n.outputs[0].type.ndim == 3).outputs[0]
    assert roles2.kinds(split)[0] == BATCH and not roles2.kinds(split)[1] & BATCH
