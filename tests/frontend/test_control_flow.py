"""Data-dependent control flow: the source transform, regions in the IR, autodiff through them,
and the errors of what cannot become graph control flow."""

import numpy as np
import pytest

import graphc
from graphc.builder import GraphBuilder
from graphc.core.ir import Region, TensorType
from tests.helpers import assert_same_pytree, line_of, numeric_grad


def ops_of(graph):
    from graphc.core.ir import walk

    return [n.op.name for n in walk(graph.nodes)]


# --- models with data-dependent branches and loops ----------------------------------------------


def clipped_sgd(params, grads, lr=0.1, max_norm=1.0):
    norm = np.sqrt(sum(np.sum(g * g) for g in grads.values()))
    if norm > max_norm:
        grads = {k: g * (max_norm / norm) for k, g in grads.items()}
    return {k: params[k] - lr * grads[k] for k in params}


def fixed_point(x, tol=1e-8):
    err = np.float64(1.0)
    while err > tol:
        y = np.cos(x)
        err = np.abs(y - x).max()
        x = y
    return x


def decay_steps(x, n_steps):
    for i in range(n_steps):
        x = 0.9 * x + 0.1 * np.tanh(x + i)
    return x


def piecewise(x):
    s = x.sum()
    if s > 1.0:
        y = x * 2.0
    elif s > -1.0:
        y = x - 1.0
    else:
        y = -x
    return y


def cond_in_loop(x, n):
    total = np.zeros_like(x)
    i = 0  # a Python int, carried as an int64 array once the loop condition is traced
    while i < n:
        if (x * i).sum() > 3.0:
            total = total + x
        else:
            total = total - 0.5 * x
        i = i + 1
    return total


RNG = np.random.default_rng(0)
PARAMS = {"w": RNG.standard_normal((3, 2)), "b": RNG.standard_normal(2)}


@pytest.mark.parametrize(
    "fn, args, op",
    [
        (clipped_sgd, (PARAMS, {"w": 3 * np.ones((3, 2)), "b": np.ones(2)}), "cond"),
        (clipped_sgd, (PARAMS, {"w": 0.01 * np.ones((3, 2)), "b": np.zeros(2)}), "cond"),
        (fixed_point, (np.array([0.1, 2.0, -1.0]),), "while_loop"),
        (fixed_point, (np.array([0.7390851332151607]),), "while_loop"),
        (decay_steps, (np.array([0.5, -0.3]), np.int64(5)), "fori_loop"),
        (decay_steps, (np.array([0.5, -0.3]), np.int64(0)), "fori_loop"),
        (piecewise, (np.array([1.0, 2.0]),), "cond"),
        (piecewise, (np.array([0.1, 0.2]),), "cond"),
        (piecewise, (np.array([-1.0, -2.0]),), "cond"),
        (cond_in_loop, (np.array([1.0, 2.0]), np.int64(4)), "while_loop"),
    ],
)
def test_data_dependent_control_flow_matches_numpy(fn, args, op):
    graph = graphc.trace(fn, *args)
    assert op in ops_of(graph)
    graph.verify()
    assert_same_pytree(graphc.evaluate(graph, *args), fn(*args))


def test_one_graph_serves_every_branch():
    graph = graphc.trace(piecewise, np.zeros(2))
    for x in ([1.0, 2.0], [0.1, 0.2], [-1.0, -2.0]):
        x = np.array(x)
        np.testing.assert_array_equal(graphc.evaluate(graph, x), piecewise(x))


def test_static_control_flow_is_unchanged():
    def model(params, x, training=True, n_layers=2):
        for i in range(n_layers):  # static: unrolled
            x = np.tanh(x @ params[i])
        heads = [x[:, j] for j in range(x.shape[1])]  # list comprehension over a static range
        if training:  # static flag
            x = x * 0.5
        return x, len(heads)

    params = [np.eye(3), np.eye(3)]
    graph = graphc.trace(model, params, np.ones((2, 3)))
    assert not {"cond", "while_loop", "fori_loop"} & set(ops_of(graph))
    assert_same_pytree(graphc.evaluate(graph, params, np.ones((2, 3))), model(params, np.ones((2, 3))))


# --- the IR: nested regions print, parse, verify -------------------------------------------------


def test_nested_regions_round_trip():
    graph = graphc.trace(cond_in_loop, np.array([1.0, 2.0]), np.int64(4))
    text = str(graph)
    assert "while_loop(" in text and "cond(" in text and "yield" in text
    parsed = graphc.parse(text)
    assert str(parsed) == text
    x, n = np.array([1.0, 2.0]), np.int64(4)
    assert_same_pytree(graphc.evaluate(parsed, x, n), cond_in_loop(x, n))


def _cond_graph(false_out_type=None, use_outer=False):
    b = GraphBuilder("g")
    x = b.input(TensorType((3,), np.float64), "x")
    p = b.op(
        "compare",
        b.op("reduce_sum", x, axes=(0,), keepdims=False),
        b.op("constant", value=np.zeros((), np.float64)),
        direction="gt",
    )
    tb = GraphBuilder("t")
    ta = tb.input(TensorType((3,), np.float64))
    true_r = Region(tb.inputs, tb.nodes, [tb.op("neg", ta)])
    fb = GraphBuilder("f")
    fa = fb.input(TensorType((3,), np.float64))
    out = fb.op("exp", x if use_outer else fa)
    if false_out_type is not None:
        out = fb.op("convert", out, dtype=false_out_type)
    false_r = Region(fb.inputs, fb.nodes, [out])
    from graphc.core.ir import Node
    from graphc.ops import get_op

    cond = get_op("cond")
    node = Node(cond, [p, x], {}, [TensorType((3,), np.float64)], None, None, (true_r, false_r))
    b.nodes.append(node)
    return b.build([node.outputs[0]])


def test_verifier_accepts_a_well_formed_cond():
    _cond_graph().verify()


def test_verifier_rejects_region_type_mismatch_naming_the_node():
    with pytest.raises(
        graphc.VerifyError,
        match=r"node %\d+ = cond\(\.\.\.\): cond: the false region returns \(f32\[3\]\), expected \(f64\[3\]\)",
    ):
        _cond_graph(false_out_type=np.float32).verify()


def test_verifier_rejects_a_region_using_an_outer_value():
    with pytest.raises(
        graphc.VerifyError, match=r"node %\d+ = exp\(\.\.\.\): operand 0 \(%x\) is defined outside this region"
    ):
        _cond_graph(use_outer=True).verify()


def test_parser_rejects_a_region_using_an_outer_value():
    text = str(_cond_graph()).replace("exp(%", "exp(%x) : f64[3]  # ").split("\n")
    bad = "\n".join(line if "exp(" not in line else line.split("exp(")[0] + "exp(%x) : f64[3]" for line in text)
    with pytest.raises(graphc.ParseError, match=r"value %x is defined outside this region"):
        graphc.parse(bad)


# --- autodiff through control flow ---------------------------------------------------------------


def branchy_loss(x):
    if x.sum() > 0.0:
        y = np.sin(x) * x
    else:
        y = np.exp(x) - x * x
    return np.sum(y * y)


@pytest.mark.parametrize("x", [np.array([0.3, 0.8, -0.2]), np.array([-0.3, -0.8, 0.2])])
def test_grad_through_cond_matches_finite_differences(x):
    np.testing.assert_allclose(graphc.grad(branchy_loss)(x), numeric_grad(branchy_loss, x), rtol=1e-6)
    v = np.array([1.0, -2.0, 0.5])
    _, t = graphc.jvp(branchy_loss, (x,), (v,))
    assert float(t) == pytest.approx(float(numeric_grad(branchy_loss, x) @ v), rel=1e-6)


def counted_loss(x):
    (y,) = graphc.fori_loop(0, 4, lambda i, h: [np.tanh(h * 1.5 + 0.1 * i)], [x])
    return np.sum(y * y)


def test_grad_through_counted_loop_matches_finite_differences():
    x = np.array([0.2, -0.4, 0.9])
    np.testing.assert_allclose(graphc.grad(counted_loss)(x), numeric_grad(counted_loss, x), rtol=1e-6)
    v = np.array([0.5, 1.0, -1.0])
    _, t = graphc.jvp(counted_loss, (x,), (v,))
    assert float(t) == pytest.approx(float(numeric_grad(counted_loss, x) @ v), rel=1e-6)


def test_jvp_through_a_data_dependent_while_loop():
    def f(x):
        y = x
        while np.sum(y * y) < 10.0:
            y = y * 1.5
        return np.sum(y)

    x = np.array([0.5, 1.0])
    _, t = graphc.jvp(f, (x,), (np.array([1.0, 0.0]),))
    assert float(t) == pytest.approx(1.5**3)  # three iterations: 1.25 * 2.25**3 >= 10


def test_reverse_mode_through_data_dependent_while_suggests_a_bounded_loop():
    def f(x):
        y = x
        while np.sum(y * y) < 10.0:  # <while-grad>
            y = y * 1.5
        return np.sum(y)

    with pytest.raises(graphc.TraceError, match="trip count depends on data.*bounded loop") as info:
        graphc.grad(f)(np.array([0.5, 1.0]))
    assert info.value.lineno == line_of("<while-grad>")


def test_training_step_with_clipping_is_one_graph():
    from graphc.models import mlp

    def step(params, x, labels, lr=0.1, max_norm=0.5):
        loss, grads = graphc.value_and_grad(mlp.loss)(params, x, labels)
        norm = np.sqrt(sum(np.sum(g * g) for layer in grads["layers"] for g in layer.values()))
        if norm > max_norm:
            lr = lr * max_norm / norm
        return graphc.optim.sgd(params, grads, lr), loss

    args, _ = mlp.example_loss_args(batch=8, sizes=(6, 5, 3))
    graph = graphc.trace(step, *args)
    assert "cond" in ops_of(graph)
    assert_same_pytree(graphc.evaluate(graph, *args), step(*args))


# --- errors ----------------------------------------------------------------------------------------


def trace_error(fn, *args):
    with pytest.raises(graphc.TraceError) as info:
        graphc.trace(fn, *args)
    return info.value


X = np.array([1.0, -2.0, 3.0])


def test_break_in_traced_loop():
    def f(x):
        while x.sum() < 10.0:
            x = x + 1.0
            if x.max() > 2.0:
                break  # <break>
        return x

    err = trace_error(f, X)
    assert err.lineno == line_of("<break>")
    assert "`break` inside an if/while whose condition is a traced value" in str(err)


def test_continue_in_traced_range_loop():
    def f(x, n):
        for i in range(n):
            if i == 2:
                continue  # <continue-line>
            x = x + i
        return x

    err = trace_error(f, X, np.int64(3))
    assert err.lineno == line_of("for i in range(n):")
    assert "`continue` in its body is not supported" in str(err)


def test_return_in_traced_branch():
    def f(x):
        if x.max() > 0:
            return x  # <return>
        return -x

    err = trace_error(f, X)
    assert err.lineno == line_of("<return>")


def test_shape_change_between_branches_names_the_variable():
    def f(x):
        if x.sum() > 0:  # <shape-if>
            y = x[:2]
        else:
            y = x
        return y

    err = trace_error(f, X)
    assert err.lineno == line_of("<shape-if>")
    assert "variable 'y' is an array f64[2] in the true branch and an array f64[3] in the false branch" in str(err)


def test_variable_assigned_in_one_branch_only():
    def f(x):
        if x.sum() > 0:  # <one-branch>
            z = x * 2  # noqa: F841  (assigned in one branch only: the point of the test)
        return x

    err = trace_error(f, X)
    assert err.lineno == line_of("<one-branch>")
    assert "variable 'z' is assigned in only one branch" in str(err)


def test_loop_variable_changing_shape():
    def f(x):
        while x.sum() < 100.0:  # <grow>
            x = np.concatenate([x, x])
        return x

    err = trace_error(f, X)
    assert err.lineno == line_of("<grow>")
    assert "loop variable x is f64[3] before an iteration and f64[6] after it" in str(err)


def test_generator_function_is_rejected():
    def gen(x):
        yield x * 2

    err = trace_error(gen, X)
    assert "generator function" in str(err)


def test_traced_if_inside_a_generator():
    def gen(x):
        if x.sum() > 0:  # <gen-if>
            yield x

    err = trace_error(lambda x: list(gen(x)), X)
    assert err.lineno == line_of("<gen-if>")
    assert "it is a generator" in str(err)


def test_no_source_falls_back_to_plain_tracing():
    namespace = {"np": np}
    exec("def f(x):\n    return np.tanh(x) * 2\n", namespace)  # noqa: S102
    graph = graphc.trace(namespace["f"], X)
    np.testing.assert_allclose(graphc.evaluate(graph, X), np.tanh(X) * 2)


def test_no_source_with_traced_if_says_why():
    namespace = {"np": np}
    exec("def f(x):\n    if x.sum() > 0:\n        return x\n    return -x\n", namespace)  # noqa: S102
    err = trace_error(namespace["f"], X)
    assert err.lineno == 2
    assert "source could not be read" in str(err)


# --- the source-transform cache -------------------------------------------------------------------

_SAME_TEXT = """import numpy as np

SCALE = {scale}


def f(x):
    if np.sum(x) > 0:
        y = x * SCALE
    else:
        y = x - SCALE
    return y


def g(x):
    return x * SCALE
"""


def _module_from(path, name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_same_function_text_in_two_files_keeps_each_files_globals(tmp_path):
    """Code objects compare equal across files (the file name is not part of code equality): two
    modules with the same function text at the same line must each run with their own globals."""
    a_path, b_path = tmp_path / "gc_same_a.py", tmp_path / "gc_same_b.py"
    a_path.write_text(_SAME_TEXT.format(scale=2))
    b_path.write_text(_SAME_TEXT.format(scale=3))
    a, b = _module_from(a_path, "gc_same_a"), _module_from(b_path, "gc_same_b")
    assert a.f.__code__ == b.f.__code__ and a.g.__code__ == b.g.__code__  # the premise
    x = np.arange(1.0, 4.0)
    for fn_a, fn_b in ((a.f, b.f), (a.g, b.g)):
        np.testing.assert_array_equal(graphc.jit(fn_a)(x), x * 2)
        np.testing.assert_array_equal(graphc.jit(fn_b)(x), x * 3)
        for fn in (fn_b, fn_a):  # traced the other way round too
            np.testing.assert_array_equal(graphc.evaluate(graphc.trace(fn, -x), -x), fn(-x))
    np.testing.assert_array_equal(b.f(-x), -x - 3)
    # a module re-executed into fresh globals (importlib.reload) gets the new values
    b_path.write_text(_SAME_TEXT.format(scale=5))
    b2 = _module_from(b_path, "gc_same_b")
    np.testing.assert_array_equal(graphc.jit(b2.f)(x), x * 5)


# --- static values that Python calls equal -------------------------------------------------------


def _signed_zero_by_branch(x):
    if np.sum(x) > 0:
        s = 0.0
    else:
        s = -0.0
    return x * s


def _int_or_bool_by_branch(x):
    if np.sum(x) > 0:
        s = 1
    else:
        s = True
    return x + s


def _nested_signed_zero_by_branch(x):
    if np.sum(x) > 0:
        d = {"s": 0.0}
    else:
        d = {"s": -0.0}
    return x * d["s"]


def test_branches_giving_equal_comparing_static_numbers_are_not_merged():
    """0.0 == -0.0 and 1 == True in Python, but a branch that gives -0.0 (or True) does not give
    the other value: a top-level variable becomes a traced value, a nested one is an error; never
    the true branch's value for both."""
    for x in (np.array([-1.0, 2.0]), np.array([-3.0, 1.0])):
        for fn in (_signed_zero_by_branch, _int_or_bool_by_branch):
            got, want = graphc.jit(fn)(x), fn(x)
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    with pytest.raises(graphc.TraceError, match="different structures"):
        graphc.trace(_nested_signed_zero_by_branch, np.ones(2))


def test_a_graph_traced_with_a_static_float_is_not_run_with_another_that_compares_equal():
    graph = graphc.trace(lambda x, s: x * s, np.ones(2), -0.0)
    np.testing.assert_array_equal(np.signbit(graphc.evaluate(graph, -np.ones(2), -0.0)), [False, False])
    with pytest.raises(graphc.EvaluationError, match="static value -0.0, got 0.0"):
        graphc.evaluate(graph, np.ones(2), 0.0)
