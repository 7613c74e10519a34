"""state_ties pairs a step's new state with its old by structure: a dict is the same dict in any
key order, so a step that rebuilds its parameters' dict in another order still has its state
tied (and the block search still sees its gradients and optimizer state)."""

import time
import warnings

import numpy as np
import pytest

import graphc
from graphc.api.parallel import Parallelized
from graphc.core.errors import PlanWarning
from graphc.core.profiles import get_profile
from graphc.core.pytree import static_argnames
from graphc.models import gpt3
from graphc.passes.options import PlanOptions
from graphc.passes.partition import state_ties
from graphc.passes.scale import Layout, layered_model, plan_layout
from graphc.passes.search import step_batch

SHAPES = {"a": (2, 3), "b": (3,), "c": (4, 1), "d": (1, 5)}  # one shape per key: a tie's types name its key


def _sgd_step(reorder):
    def step(params, x):
        def loss(p):
            return sum(np.sum(v) for v in p.values()) * np.sum(x)

        grads = graphc.grad(loss)(params)
        return reorder({k: params[k] - 0.1 * grads[k] for k in params}), np.sum(x)

    return step


def _tie_keys(reorder):
    params = {k: graphc.ArraySpec(s, np.float32) for k, s in SHAPES.items()}
    g = graphc.trace(_sgd_step(reorder), params, graphc.ArraySpec((2,), np.float32))
    ties = state_ties(g)
    for i, o in ties:
        assert g.inputs[i].type == g.outputs[o].type
    return sorted(g.inputs[i].name for i, _o in ties)


def test_new_parameters_in_another_key_order_are_tied_by_key():
    names = ["params." + k for k in SHAPES]
    assert _tie_keys(lambda d: d) == names
    assert _tie_keys(lambda d: dict(reversed(d.items()))) == names
    assert _tie_keys(lambda d: dict(sorted(d.items(), key=lambda kv: -len(kv[0]) * ord(kv[0])))) == names


def test_a_dict_of_other_keys_or_shapes_is_not_tied():
    assert _tie_keys(lambda d: {**d, "e": d["a"]}) == []  # an extra key: another structure
    assert _tie_keys(lambda d: {**d, "b": d["b"][:2]}) == []  # another shape under one key


def _reordered(tree):
    if isinstance(tree, dict):
        return {k: _reordered(tree[k]) for k in sorted(tree, reverse=True)}
    if isinstance(tree, list):
        return [_reordered(x) for x in tree]
    return tree


def _reordered_train_step(params, opt_state, tokens, targets, n_head, lr=6e-5, rng=None, dropout_p=0.0):
    params, opt_state, value = gpt3.train_step(params, opt_state, tokens, targets, n_head, lr, rng, dropout_p)
    return _reordered(params), _reordered(opt_state), value


def test_the_block_search_prices_a_reordered_steps_state_as_the_same_step():
    args, kw = gpt3.example_train_specs(n_layer=4, d=64, n_head=4, seq=16, n_vocab=128, batch=16)
    profile = get_profile("a100-sxm")
    lo = Layout(2, 2, 1, 2, 4, 1, "off")  # ZeRO 1: the gathered parameters after the update are exposed
    preds = []
    for fn in (gpt3.train_step, _reordered_train_step):
        g = Parallelized(fn, {"dp": 1}, static_argnames=static_argnames(kw)).trace_optimized(*args, **kw)[1]
        model = layered_model(g, step_batch(g), profile)
        plan = plan_layout(model, lo, PlanOptions(), profile, time.perf_counter() + 600)
        preds.append((plan.predicted, plan.memory_bytes))
    assert preds[0][0]["dp_s"] > 0 and preds[0][0]["update_s"] > 0
    assert preds[1] == preds[0]


def _listed_train_step(params, opt_state, tokens, targets, n_head, lr=6e-5, rng=None, dropout_p=0.0):
    # returns the new layers' parameters under another key: no longer the argument's structure
    params, opt_state, value = gpt3.train_step(params, opt_state, tokens, targets, n_head, lr, rng, dropout_p)
    blocks = params.pop("blocks")
    return {**params, "layers": blocks}, opt_state, value


def test_a_step_returning_its_parameters_in_another_structure_is_warned():
    args, kw = gpt3.example_train_specs(n_layer=4, d=64, n_head=4, seq=16, n_vocab=128, batch=16)
    profile = get_profile("a100-sxm")
    ok = Parallelized(gpt3.train_step, {"dp": 1}, static_argnames=static_argnames(kw)).trace_optimized(*args, **kw)[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)
        layered_model(ok, step_batch(ok), profile)  # tied: no warning
    g = Parallelized(_listed_train_step, {"dp": 1}, static_argnames=static_argnames(kw)).trace_optimized(*args, **kw)[1]
    with pytest.warns(
        PlanWarning, match=r"gpt3\.py:\d+: _listed_train_step: .*params\.blocks\.0\..*planned as constants"
    ):
        layered_model(g, step_batch(g), profile)


def _frozen_train_step(params, opt_state, tokens, targets, n_head, lr=6e-5, rng=None, dropout_p=0.0):
    # trains everything but returns only the new embeddings and final norm: the layers are frozen
    params, opt_state, value = gpt3.train_step(params, opt_state, tokens, targets, n_head, lr, rng, dropout_p)
    return {k: v for k, v in params.items() if k != "blocks"}, value


def test_a_step_not_returning_its_layers_is_not_warned():
    args, kw = gpt3.example_train_specs(n_layer=4, d=64, n_head=4, seq=16, n_vocab=128, batch=16)
    g = Parallelized(_frozen_train_step, {"dp": 1}, static_argnames=static_argnames(kw)).trace_optimized(*args, **kw)[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanWarning)
        layered_model(g, step_batch(g), get_profile("a100-sxm"))
