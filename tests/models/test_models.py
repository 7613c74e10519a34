"""Every model in models/: the traced graph evaluates to what the numpy function returns."""

import importlib

import numpy as np
import pytest

import graphc
from tests.helpers import assert_same_pytree

CASES = [
    ("graphc.models.mlp", "mlp", "example_args"),
    ("graphc.models.mlp", "loss", "example_loss_args"),
    ("graphc.models.mlp", "accuracy", "example_loss_args"),
    ("graphc.models.gpt", "gpt", "example_args"),
    ("graphc.models.gpt", "lm_loss", "example_loss_args"),
    ("graphc.models.cnn", "cnn", "example_args"),
    ("graphc.models.cnn", "loss", "example_loss_args"),
    ("graphc.models.llama", "llama", "example_args"),
    ("graphc.models.llama", "loss", "example_loss_args"),
    ("graphc.models.gpt3", "loss", "example_loss_args"),
]


@pytest.mark.parametrize("module, func, example", CASES)
def test_traced_model_matches_numpy(module, func, example):
    mod = importlib.import_module(module)
    fn = getattr(mod, func)
    args, kwargs = getattr(mod, example)()
    graph = graphc.trace(fn, *args, **kwargs)
    graph.verify()
    assert_same_pytree(graphc.evaluate(graph, *args, **kwargs), fn(*args, **kwargs))


@pytest.mark.parametrize("module, func, example", CASES)
def test_model_graphs_keep_source_lines(module, func, example):
    mod = importlib.import_module(module)
    args, kwargs = getattr(mod, example)()
    graph = graphc.trace(getattr(mod, func), *args, **kwargs)
    files = {n.loc.file for n in graph.nodes if n.loc}
    assert files == {f"models/{module.split('.')[-1]}.py"}, files


def test_float64_models_match_tightly():
    from graphc.models import gpt

    rng = np.random.default_rng(1)
    params = gpt.init_params(rng, n_vocab=50, n_ctx=8, d=32, n_layer=2, dtype=np.float64)
    tokens = rng.integers(0, 50, size=(3, 8))
    graph = graphc.trace(gpt.gpt, params, tokens, n_head=4)
    got = graphc.evaluate(graph, params, tokens, n_head=4)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, gpt.gpt(params, tokens, 4), rtol=1e-6)


def test_one_graph_serves_new_data_of_the_same_shapes():
    from graphc.models import cnn

    (params, images), _ = cnn.example_args(seed=0)
    graph = graphc.trace(cnn.cnn, params, images)
    (params2, images2), _ = cnn.example_args(seed=5)
    np.testing.assert_allclose(
        graphc.evaluate(graph, params2, images2), cnn.cnn(params2, images2), rtol=1e-4, atol=1e-5
    )


def test_trace_with_array_specs_needs_no_data():
    from graphc.models import gpt

    (params, tokens), kwargs = gpt.example_args()
    specs = {k: v for k, v in params.items()}
    spec_params = graphc.core.pytree.unflatten(
        graphc.core.pytree.flatten(specs)[1],
        [graphc.ArraySpec(x.shape, x.dtype) for x in graphc.core.pytree.flatten(specs)[0]],
    )
    g1 = graphc.trace(gpt.gpt, spec_params, graphc.ArraySpec(tokens.shape, tokens.dtype), **kwargs)
    g2 = graphc.trace(gpt.gpt, params, tokens, **kwargs)
    assert str(g1) == str(g2)
