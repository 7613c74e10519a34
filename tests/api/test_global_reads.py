"""numpy arrays a compiled function reads from globals or closures (wrong29). graphc compiles
their values into the graph as constants; numpy reads them at every call. min-char-rnn's
``lossFun`` reads its weights as globals that the training loop updates in place, and graphc went
on with the first values silently. A call after such an array changed is now a TraceError naming
the function that reads it and the name; unchanged arrays (NaN included), and a name rebound to
equal values, run as before (core/captured.py)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import graphc
from tests.helpers import line_of

RNG = np.random.default_rng(0)
H, V = 6, 4
Wxh = RNG.standard_normal((H, V)) * 0.1
Whh = RNG.standard_normal((H, H)) * 0.1
bh = np.zeros((H, 1))
TABLE = np.array([0.5, np.nan, 2.0])
params = {"w": np.ones(3)}


def rnn_step(x, h):  # <- rnn_step
    return np.tanh(Wxh @ x + Whh @ h + bh)


def helper(x):  # <- helper
    return x * TABLE[0] + params["w"]


def calls_helper(x):
    return helper(x) * 2


class Model:
    def __init__(self):
        self.w = np.arange(3.0)


MODEL = Model()


def reads_model(x):
    return x * MODEL.w


def compiled(fn, how):
    return graphc.jit(fn) if how == "jit" else graphc.parallelize(fn, mesh={"dp": 2}, cache=False)


def run(f, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", graphc.GraphcWarning)  # (a plan that replicates the work)
        return f(*args)


@pytest.mark.parametrize("how", ["jit", "dp2"])
def test_globals_updated_in_place_between_calls_are_refused(how):
    global Wxh, Whh
    saved = Wxh.copy(), Whh.copy()
    try:
        x, h = np.zeros((V, 1)), RNG.standard_normal((H, 1))
        x[1] = 1
        f = compiled(rnn_step, how)
        for _ in range(3):  # the first call, then warm calls: the globals did not change
            np.testing.assert_allclose(run(f, x, h), rnn_step(x, h), rtol=1e-12, atol=1e-15)
        for p in (Wxh, Whh):  # min-char-rnn's update
            p += -0.1 * np.ones_like(p)
        with pytest.raises(graphc.TraceError, match=r"rnn_step reads the global Whh, whose value changed") as err:
            run(f, x, h)
        assert err.value.lineno == line_of("# <- rnn_step")
        np.testing.assert_allclose(run(compiled(rnn_step, how), x, h), rnn_step(x, h), rtol=1e-12, atol=1e-15)
    finally:
        Wxh, Whh = saved


def test_a_callee_s_global_dict_item_replaced_is_refused():
    f = graphc.jit(calls_helper)
    x = np.ones(3)
    for _ in range(2):
        assert np.array_equal(f(x), calls_helper(x))
    old = params["w"]
    params["w"] = old * 2
    try:
        with pytest.raises(graphc.TraceError, match=r"helper reads the global params") as err:
            f(x)
        assert err.value.lineno == line_of("# <- helper")
    finally:
        params["w"] = old
    assert np.array_equal(f(x), calls_helper(x))  # (its values back: runs)


def test_a_global_rebound_to_equal_values_and_nan_values_run():
    global TABLE
    f = graphc.jit(calls_helper)
    x = np.ones(3)
    assert np.array_equal(f(x), calls_helper(x))
    saved = TABLE
    try:
        TABLE = TABLE.copy()  # a new array of the same values (NaN in it): nothing changed for numpy
        assert np.array_equal(f(x), calls_helper(x)) and np.array_equal(f(x), calls_helper(x))
    finally:
        TABLE = saved


def test_a_global_object_s_array_and_a_closure_s_array_changed_are_refused():
    f = graphc.jit(reads_model)
    x = np.ones(3)
    assert np.array_equal(f(x), reads_model(x))
    MODEL.w[0] = 7.0
    try:
        with pytest.raises(graphc.TraceError, match=r"reads_model reads the global MODEL"):
            f(x)
    finally:
        MODEL.w[0] = 0.0

    def make(w):
        def scaled(x):
            return x * w

        return scaled

    w = np.arange(3.0)
    g = graphc.jit(make(w))
    assert np.array_equal(g(x), w)
    w[:] = 5
    with pytest.raises(graphc.TraceError, match=r"scaled reads the closure variable w"):
        g(x)


BIG = np.zeros((200, 100))  # over COPY_BYTES: kept as a CRC-32


def reads_big(x):
    return x @ BIG[:, :3]


def test_a_large_global_changed_is_refused():
    from graphc.core.captured import COPY_BYTES

    assert BIG.nbytes > COPY_BYTES
    f = graphc.jit(reads_big)
    saved = BIG.copy()
    try:
        for _ in range(2):
            assert np.array_equal(f(np.ones((2, 200))), reads_big(np.ones((2, 200))))
        BIG[-1, -1] = np.nextafter(0.0, 1.0)  # one bit of one element, outside the columns read
        with pytest.raises(graphc.TraceError, match="reads_big reads the global BIG"):
            f(np.ones((2, 200)))
    finally:
        BIG[...] = saved


momentum = {"m": np.zeros(3)}
G = np.zeros(3)


class Box:
    pass


BOX = Box()
BOX.m = np.zeros(3)


def into_dict(g):  # <- into_dict
    momentum["m"] = 0.9 * momentum["m"] + g
    return momentum["m"]


def into_object(g):
    BOX.m = 0.9 * BOX.m + g
    return BOX.m


def rebinds_global(g):  # (a global statement: traced without the source transform)
    global G
    G = G + g
    return G


@pytest.mark.parametrize("fn, name", [(into_dict, "momentum"), (into_object, "BOX"), (rebinds_global, "G")])
def test_a_traced_value_stored_in_a_global_is_refused_and_put_back(fn, name):
    """numpy keeps the new value for the next call (1, 1.9, 2.71, ...); the compiled function
    returned the first call's value every time and left a traced value in the global."""
    before = {"momentum": momentum["m"], "BOX": BOX.m, "G": G}[name]
    with pytest.raises(graphc.TraceError, match=rf"stores a traced value in the global or closure variable '{name}'"):
        graphc.jit(fn)(np.ones(3))
    now = {"momentum": momentum["m"], "BOX": BOX.m, "G": G}[name]
    assert now is before  # (no traced value left there)


def scaled_by_table(x, k):
    return x * TABLE[k]


def test_static_arguments_keep_the_check():
    f = graphc.jit(scaled_by_table, static_argnames=("k",))
    x = np.ones(3)
    assert np.array_equal(f(x, 0), scaled_by_table(x, 0))
    saved = TABLE[0]
    TABLE[0] = 4.0
    try:
        with pytest.raises(graphc.TraceError, match="scaled_by_table reads the global TABLE"):
            f(x, 0)
    finally:
        TABLE[0] = saved


TEMPERATURE = 0.8


class Config:
    def __init__(self):
        self.top_k = 2


CONFIG = Config()


def scale(x):
    return x * 2.0


def sample_logits(x):
    return scale(x) / TEMPERATURE + CONFIG.top_k


def test_a_global_number_a_config_field_and_a_redefined_helper_changed_are_refused():
    """numpy reads them at every call (a temperature schedule, a config edited, a helper redefined
    in a notebook); graphc traced their first values and kept them silently."""
    global TEMPERATURE, scale
    x = np.ones(3)
    f = graphc.jit(sample_logits)
    assert np.array_equal(f(x), sample_logits(x))
    saved = TEMPERATURE, scale
    try:
        TEMPERATURE = float("0.8")  # an equal number: nothing changed for numpy
        assert np.array_equal(f(x), sample_logits(x))
        TEMPERATURE = 0.5
        with pytest.raises(graphc.TraceError, match="sample_logits reads the global TEMPERATURE, whose value changed"):
            f(x)
        TEMPERATURE = saved[0]
        CONFIG.top_k = 3
        with pytest.raises(graphc.TraceError, match="reads the global CONFIG"):
            f(x)
        CONFIG.top_k = 2

        def scale(x):  # noqa: F811  (redefined, as in a notebook)
            return x * 3.0

        with pytest.raises(graphc.TraceError, match="reads the global scale"):
            f(x)
    finally:
        TEMPERATURE, scale = saved
        CONFIG.top_k = 2
    assert np.array_equal(f(x), sample_logits(x))


DROPOUT_RNG = np.random.default_rng(0)


def dropout_from_global(x):  # <- dropout_from_global
    return x * (DROPOUT_RNG.random(x.shape) > 0.5)


def test_draws_from_a_global_generator_are_refused_and_its_state_put_back():
    """numpy draws a new mask at every call; graphc ran the Generator's C methods once, at the
    trace, and compiled that mask as a constant: the same mask at every call, silently."""
    before = DROPOUT_RNG.bit_generator.state
    with pytest.raises(graphc.TraceError, match="draws from the numpy random generator 'DROPOUT_RNG'") as err:
        graphc.jit(dropout_from_global)(np.ones(6))
    assert err.value.lineno == line_of("# <- dropout_from_global")
    assert DROPOUT_RNG.bit_generator.state == before  # (the trace's draws undone)


def stores_then_fails(g):
    momentum["m"] = momentum["m"] + g
    return g.reshape(7)  # (a shape error: the trace fails)


def test_a_failed_trace_leaves_no_traced_value_in_a_global():
    before = momentum["m"]
    with pytest.raises(graphc.TraceError):
        graphc.jit(stores_then_fails)(np.ones(3))
    assert momentum["m"] is before
