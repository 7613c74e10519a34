"""Autodiff: literature examples, every primitive's VJP/JVP against central finite differences and
against each other (<u, J v> = <J^T u, v>), higher order, and composition with tracing."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import graphc
from graphc.core.ir import walk
from graphc.frontend.entry import inline_graph
from graphc.ops import REGISTRY
from tests.graphgen import random_graphs
from tests.helpers import numeric_grad, quick_share, quiet

F64 = np.dtype(np.float64)


# --- the worked example of reverse and forward mode (Baydin et al., "AD in ML: a survey") ---------


def f_survey(x1, x2):
    return np.log(x1) + x1 * x2 - np.sin(x2)


def test_survey_example_by_grad():
    value, (d1, d2) = graphc.value_and_grad(f_survey, argnums=(0, 1))(2.0, 5.0)
    assert (round(float(value), 3), round(float(d1), 3), round(float(d2), 3)) == (11.652, 5.5, 1.716)


def test_survey_example_by_jvp():
    value, t1 = graphc.jvp(f_survey, (2.0, 5.0), (1.0, 0.0))
    _, t2 = graphc.jvp(f_survey, (2.0, 5.0), (0.0, 1.0))
    assert (round(float(value), 3), round(float(t1), 3), round(float(t2), 3)) == (11.652, 5.5, 1.716)


def test_survey_example_by_vjp():
    value, pullback = graphc.vjp(f_survey, 2.0, 5.0)
    d1, d2 = pullback(1.0)
    assert (round(float(value), 3), round(float(d1), 3), round(float(d2), 3)) == (11.652, 5.5, 1.716)


def logistic_l4(x):
    l = x  # l1 = x, l(n+1) = 4 l(n) (1 - l(n)), f = l4
    for _ in range(3):
        l = 4 * l * (1 - l)
    return l


def logistic_l4_derivative(x):
    a, b, c = 1 - x, 1 - 2 * x, 1 - 8 * x + 8 * x * x
    return 128 * x * a * (-8 + 16 * x) * b**2 * c + 64 * a * b**2 * c**2 - 64 * x * b**2 * c**2 - 256 * x * a * b * c**2


@pytest.mark.parametrize("x", [0.05, 0.2, 0.37, 0.5, 0.81])
def test_logistic_map_matches_closed_form(x):
    assert float(logistic_l4(x)) == pytest.approx(64 * x * (1 - x) * (1 - 2 * x) ** 2 * (1 - 8 * x + 8 * x * x) ** 2)
    assert float(graphc.grad(logistic_l4)(x)) == pytest.approx(logistic_l4_derivative(x), rel=1e-9, abs=1e-9)
    assert float(graphc.jvp(logistic_l4, (x,), (1.0,))[1]) == pytest.approx(
        logistic_l4_derivative(x), rel=1e-9, abs=1e-9
    )


# --- every primitive: finite differences and transposition ------------------------------------------


def _float_outputs(graph):
    return [i for i, v in enumerate(graph.outputs) if v.dtype.kind == "f"]


DIFFERENTIABLE = sorted(n for n, op in REGISTRY.items() if n not in ("constant",) and op.kind != "comm")


@pytest.mark.parametrize("name", quick_share(DIFFERENTIABLE))
def test_vjp_and_jvp_agree_with_finite_differences(name):
    op = REGISTRY[name]
    assert op.vjp is not None and op.jvp is not None, f"{name} misses an autodiff rule"

    @settings(max_examples=15, deadline=None)
    @given(random_graphs(max_nodes=2, ops=[name], input_dtypes=[F64], specials=False), st.integers(0, 2**31))
    def check(graph, seed):
        keep = _float_outputs(graph)
        assume(keep)
        rng = np.random.default_rng(seed)
        xs = [rng.uniform(0.5, 2.0, v.shape) for v in graph.inputs]  # positive: log, sqrt, pow are smooth
        vs = [rng.standard_normal(v.shape) for v in graph.inputs]

        def fn(*args):
            outs = inline_graph(graph, *args)
            return tuple(outs[i] for i in keep)

        def run(*args):
            outs = graphc.evaluate(graph, *args)
            return [np.asarray(outs[i], dtype=np.float64) for i in keep]

        base = quiet(run, *xs)
        assume(all(np.isfinite(b).all() for b in base))
        # float32 values anywhere (convert; a float64 result of convert(convert(x, f32), f64) too)
        single = any(o.dtype.kind == "f" and o.dtype != F64 for n in walk(graph.nodes) for o in n.outputs)
        eps, rtol, atol, exact = (1e-3, 1e-2, 1e-3, 1e-5) if single else (1e-6, 1e-4, 1e-5, 1e-9)
        plus = quiet(run, *[x + eps * v for x, v in zip(xs, vs)])
        minus = quiet(run, *[x - eps * v for x, v in zip(xs, vs)])
        fd = [(p - m) / (2 * eps) for p, m in zip(plus, minus)]
        assume(all(np.isfinite(f).all() for f in fd))

        _, tangents = quiet(graphc.jvp, fn, tuple(xs), tuple(vs))
        for t, f in zip(tangents, fd):
            np.testing.assert_allclose(np.asarray(t), f, rtol=rtol, atol=atol)

        us = [rng.standard_normal(np.shape(b)) for b in base]
        _, pullback = quiet(graphc.vjp, fn, *xs)
        try:
            cotangents = quiet(pullback, tuple(us))
        except graphc.TraceError as exc:  # reverse mode needs a trip count known when tracing
            assert name == "while_loop" and "trip count depends on data" in str(exc)
            return
        lhs = sum(float(np.sum(u * np.asarray(t))) for u, t in zip(us, tangents))
        rhs = sum(float(np.sum(np.asarray(c) * v)) for c, v in zip(cotangents, vs) if c is not None)
        assert lhs == pytest.approx(rhs, rel=exact, abs=exact)

    check()


# --- exact gradients for the cases the issue names ------------------------------------------------


GRAD_CASES = {
    "broadcast_add": lambda x: np.sum((x + np.arange(3.0)) ** 2),
    "broadcast_mul_keepdims": lambda x: np.sum(x * x.mean(axis=1, keepdims=True)),
    "reduce_max_keepdims": lambda x: np.sum(np.exp(x - x.max(axis=-1, keepdims=True))),
    "gather_repeated": lambda x: np.sum(x[np.array([0, 1, 1, 0, 1])] ** 3),
    "advanced_pairs": lambda x: np.sum(x[np.arange(2), np.array([2, 0])] * np.array([3.0, -1.0])),
    "where": lambda x: np.sum(np.where(x > 0.5, x * x, -x)),
    "maximum_relu": lambda x: np.sum(np.maximum(x, 0.7) ** 2),
    "concat_split": lambda x: np.sum(np.split(np.concatenate([x, 2 * x], axis=1), [2, 5], axis=1)[1] ** 2),
    "einsum": lambda x: np.sum(np.einsum("ij,kj->ik", x, x) ** 2),
    "einsum_summed_only_in_operand": lambda x: np.sum(np.einsum("ij->i", x) ** 2),
    "matmul_batch": lambda x: np.sum(np.matmul(np.stack([x, x * 2]), x.T) ** 2),
    "strided_slice": lambda x: np.sum(x[::-1, ::2] ** 2 * np.arange(2.0)),
    "pad": lambda x: np.sum(np.pad(x, ((1, 0), (0, 2)), constant_values=5.0) ** 2),
    "var_std": lambda x: np.var(x) + np.std(x, axis=0).sum(),
    "softmax_xent": lambda x: -np.log(np.exp(x[0]) / np.exp(x[0]).sum())[1],
}


@pytest.mark.parametrize("name", sorted(GRAD_CASES))
def test_gradients_of_numpy_idioms_match_finite_differences(name):
    f = GRAD_CASES[name]
    x = np.random.default_rng(3).uniform(0.1, 1.0, (2, 3))
    np.testing.assert_allclose(graphc.grad(f)(x), numeric_grad(f, x), rtol=1e-5, atol=1e-7)


def test_integer_and_bool_inputs_get_no_gradient():
    def loss(params, tokens):
        return np.sum(params["emb"][tokens] * params["scale"]) + np.sum(params["mask"] * 1.0)

    params = {
        "emb": np.ones((4, 2)),
        "scale": np.float64(3.0),
        "mask": np.array([True, False]),
        "ids": np.array([1, 2]),
    }
    g = graphc.grad(loss)(params, np.array([0, 0, 3]))
    assert g["mask"] is None and g["ids"] is None
    np.testing.assert_array_equal(g["emb"], [[6.0, 6.0], [0, 0], [0, 0], [3.0, 3.0]])
    assert float(g["scale"]) == 6.0


def test_gradient_has_the_argument_structure():
    def loss(p, x):
        return np.sum(p["a"][0] * x) + np.sum(p["b"]["c"] ** 2)

    p = {"a": [np.ones(3)], "b": {"c": np.full((2,), 2.0)}}
    g = graphc.grad(loss)(p, np.arange(3.0))
    assert set(g) == {"a", "b"} and isinstance(g["a"], list)
    np.testing.assert_array_equal(g["a"][0], np.arange(3.0))
    np.testing.assert_array_equal(g["b"]["c"], [4.0, 4.0])


def test_grad_requires_a_float_scalar():
    with pytest.raises(graphc.TraceError, match="returning a float scalar"):
        graphc.grad(lambda x: x * 2)(np.ones(3))


def test_float32_gradients_stay_float32():
    x = np.ones((2, 3), np.float32)
    g = graphc.grad(lambda x: np.sum(np.tanh(x) * 2.0))(x)
    assert g.dtype == np.float32


# --- higher order -----------------------------------------------------------------------------------

SECOND_DERIVATIVES = [
    (np.tanh, lambda x: -2 * np.tanh(x) * (1 - np.tanh(x) ** 2)),
    (np.sin, lambda x: -np.sin(x)),
    (np.exp, np.exp),
    (np.log, lambda x: -1 / x**2),
    (np.sqrt, lambda x: -0.25 * x**-1.5),
    (lambda x: 1 / (1 + np.exp(-x)), lambda x: (s := 1 / (1 + np.exp(-x))) * (1 - s) * (1 - 2 * s)),
    (lambda x: x**3 - 2 * x * x, lambda x: 6 * x - 4),
]


@pytest.mark.parametrize("f, d2f", SECOND_DERIVATIVES)
@pytest.mark.parametrize("x", [0.3, 1.7])
def test_grad_of_grad(f, d2f, x):
    assert float(graphc.grad(graphc.grad(f))(x)) == pytest.approx(float(d2f(x)), rel=1e-9)


def test_third_order_and_forward_over_reverse():
    f = lambda x: x**4  # noqa: E731
    assert float(graphc.grad(graphc.grad(graphc.grad(f)))(2.0)) == pytest.approx(48.0)
    _, t = graphc.jvp(graphc.grad(f), (2.0,), (1.0,))
    assert float(t) == pytest.approx(48.0)


def test_closure_over_the_differentiated_value_is_a_constant():
    x = 3.0

    def outer(y):
        return graphc.grad(lambda z: z * y)(y)  # d/dz (z * y) = y: y is a constant inside

    assert float(outer(x)) == 3.0
    assert float(graphc.grad(outer)(x)) == 1.0


# --- one graph for a training step ----------------------------------------------------------------------


def test_training_step_traces_to_one_tagged_graph():
    from graphc.models import mlp

    args, kwargs = mlp.example_train_args(batch=16, sizes=(12, 8, 4))
    graph = graphc.trace(mlp.train_step, *args, **kwargs)
    graph.verify()
    parts = {n.part for n in graph.nodes}
    assert parts == {"forward", "backward", "update"}
    text = str(graph)
    assert "part(forward)" in text and "part(backward)" in text and "part(update)" in text
    assert str(graphc.parse(text)) == text
    # backward nodes carry the source line of the forward node they differentiate
    assert all(n.loc and n.loc.file == "models/mlp.py" for n in graph.nodes if n.part == "backward")


def test_traced_step_equals_eager_step_repeatedly():
    from graphc.models import gpt

    args, kwargs = gpt.example_train_args(n_layer=1, d=32, seq=8)
    graph = graphc.trace(gpt.train_step, *args, **kwargs)
    params, state, tokens, targets = args
    eager_params, eager_state = params, state
    for _ in range(3):
        params, state, loss = graphc.evaluate(graph, params, state, tokens, targets, **kwargs)
        eager_params, eager_state, eager_loss = gpt.train_step(eager_params, eager_state, tokens, targets, **kwargs)
        assert float(loss) == pytest.approx(float(eager_loss), rel=1e-5)
    np.testing.assert_allclose(params["wte"], eager_params["wte"], rtol=1e-4, atol=1e-6)


def test_vjp_inside_a_trace_with_pytree_cotangents():
    def fn(x):
        out, pullback = graphc.vjp(lambda a: {"s": np.sin(a), "p": a * a}, x)
        return pullback({"s": np.ones_like(x), "p": 2 * np.ones_like(x)})[0]

    x = np.linspace(0.1, 1.0, 4)
    g = graphc.trace(fn, x)
    np.testing.assert_allclose(graphc.evaluate(g, x), np.cos(x) + 4 * x)
    assert math.isclose(float(fn(x)[2]), float(np.cos(x[2]) + 4 * x[2]))
