"""models/gpt3.py's dropout (Megatron-LM's, on the embeddings, attention probabilities and both
branches): the mask against numpy's Philox stream, traced from a Generator keyword (never a
constant), and layers whose draws differ only in their stream position still stamp as one block."""

import numpy as np
import pytest

import graphc
from graphc.api.parallel import Parallelized
from graphc.core.pytree import static_argnames
from graphc.models import gpt3
from graphc.passes.blocks import cut_segments, find_layers


@pytest.mark.parametrize("shape", [(0, 3), (1,), (4, 33)])
def test_dropout_keeps_the_elements_whose_float32_draw_is_at_least_p(shape):
    p, key = 0.25, 7
    x = np.arange(1, 1 + int(np.prod(shape)), dtype=np.float32).reshape(shape)
    got = graphc.jit(gpt3.dropout, static_argnames=("p",))(x, np.random.Generator(np.random.Philox(key)), p)
    # graphc's float32 draw is the top 24 of the 53 bits of numpy's float64 one (docs/random.md)
    u = np.random.Generator(np.random.Philox(key)).random(x.size).reshape(shape)
    keep = np.floor(u * 2**24) / 2**24 >= p
    np.testing.assert_array_equal(got, np.where(keep, x * np.float32(1 / (1 - p)), np.float32(0)))
    assert got.dtype == np.float32


def test_no_generator_or_no_probability_is_no_dropout():
    x = np.ones((2, 3), np.float32)
    assert gpt3.dropout(x, None, 0.1) is x
    assert gpt3.dropout(x, np.random.default_rng(0), 0.0) is x


def test_a_generator_keyword_is_traced_not_static():
    # a static Generator would draw numpy's numbers once, as constants the size of the activations
    args, kw = gpt3.example_train_specs(n_layer=3, d=32, n_head=4, seq=8, n_vocab=64, batch=4)
    assert isinstance(kw["rng"], np.random.Generator) and kw["dropout_p"] == 0.1
    assert static_argnames(kw) == ("n_head", "lr", "dropout_p")


def test_dropout_layers_are_one_repeated_block():
    args, kw = gpt3.example_train_specs(n_layer=4, d=32, n_head=4, seq=8, n_vocab=64, batch=4)
    pf = Parallelized(gpt3.train_step, {"dp": 1}, static_argnames=static_argnames(kw))
    g = pf.trace_optimized(*args, **kw)[1]
    draws = [n for n in g.nodes if n.op.name == "philox"]
    assert len(draws) == 1 + 3 * 4  # the embeddings, then per layer the probabilities and two branches
    assert len({n.attrs["offset"] for n in draws}) == len(draws)  # each at its own stream position
    layers = find_layers(g)
    assert layers is not None and layers.count == 4
    assert cut_segments(g, layers) is not None  # the same computation at different positions


def test_the_fixed_mesh_planner_ties_layers_whose_draws_differ_only_in_stream_position():
    """The ILP ties repeated layers by structure (sharding/groups.py structure_classes); a philox
    draw's ``offset`` (its stream position, the Random trait's ``stream_position``) differs per
    layer and must not split them: two more layers add as many groups with dropout as without
    (one, the optimizer's step count). The tie is exact: philox's strategies and cost do not read
    the offset (graphc/ops/random.py)."""
    from graphc.bench.plantime import Case, plan_case

    def sizes(n_layer, p):
        def spec():
            return gpt3.example_train_specs(n_layer=n_layer, d=32, n_head=2, seq=8, n_vocab=64, batch=4, dropout_p=p)

        t = plan_case(Case(f"{n_layer} layers", gpt3.train_step, spec, {"dp": 2, "tp": 2}), "highs")
        assert t.status == "optimal"
        return t.sizes["groups"], t.objective_s

    (g2, _), (g4, o4) = sizes(2, 0.1), sizes(4, 0.1)
    (h2, _), (h4, _) = sizes(2, 0.0), sizes(4, 0.0)
    assert g4 - g2 == h4 - h2
    assert g2 > h2 and o4 > 0
