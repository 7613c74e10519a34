"""graphc.jit does not recompile for a new Python float (it is traced as a weakly typed value, as
JAX does), keeps at most 64 specializations per function, and says which argument keeps
changing when a function is compiled again and again."""

import warnings

import numpy as np
import pytest

import graphc
from graphc.api.jit import MAX_SPECIALIZATIONS, RECOMPILE_WARNING_AFTER

RecompileWarning = graphc.RecompileWarning


def counted(fn):
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)

    wrapper.__wrapped__ = fn  # the source transform and the signature follow the function
    return wrapper, calls


def step(w, g, lr):
    return w - lr * g


W = np.linspace(-1, 1, 8, dtype=np.float32)
G = np.linspace(0, 2, 8, dtype=np.float32)


def test_a_python_float_is_traced_once_and_keeps_numpys_dtype():
    calls = []

    def f(w, g, lr):
        calls.append(1)
        return w - lr * g

    jitted = graphc.jit(f)
    for lr in (0.1, 0.01, 1e-3, 0.5, -2.0, 1e30):
        got = jitted(W, G, lr)
        want = f(W, G, lr)
        assert got.dtype == want.dtype == np.float32  # NEP 50: a Python float does not promote float32
        np.testing.assert_array_equal(got, want)
    assert len(calls) - 6 == 1  # traced once (the other calls are the eager ones)
    graph = jitted.compile(W, G, 0.1).traced
    assert [str(v.type) for v in graph.inputs][-1] == "f64[]"  # lr is an input, not a constant


def test_floats_inside_containers_and_as_keywords_are_traced_too():
    calls = []

    def f(x, hp):
        calls.append(1)
        return x * hp["scale"] + hp["shift"]

    jitted = graphc.jit(f)
    for s in (1.0, 2.0, 3.5):
        np.testing.assert_array_equal(jitted(W, hp={"scale": s, "shift": -s}), W * s - s)
    assert len(calls) == 1


def test_static_argnames_keeps_a_float_a_compile_time_constant():
    calls = []

    def f(w, g, lr):
        calls.append(1)
        return w - lr * g

    jitted = graphc.jit(f, static_argnames=("lr",))
    for lr in (0.1, 0.2, 0.1):
        np.testing.assert_array_equal(jitted(W, G, lr), f(W, G, lr))
    assert len(calls) == 2 + 3  # one compile per distinct value, plus the eager calls
    graph = jitted.compile(W, G, lr=0.3).traced
    assert len(graph.inputs) == 2


def test_a_numpy_float64_scalar_is_strong_as_in_numpy():
    jitted = graphc.jit(step)
    got = jitted(W, G, np.float64(0.5))
    assert got.dtype == step(W, G, np.float64(0.5)).dtype == np.float64


def test_a_float_needed_as_a_python_number_is_a_trace_error_naming_it():
    def f(x, frac):
        return x[: int(frac * 8)]  # <int-of-frac>

    with pytest.raises(graphc.TraceError, match=r"if 'frac' must be a Python number here, name it in static_argnames"):
        graphc.jit(f)(W, 0.5)
    np.testing.assert_array_equal(graphc.jit(f, static_argnames="frac")(W, 0.5), W[:4])


def test_the_cache_keeps_the_64_most_recently_used_specializations():
    calls = []

    def f(x):
        calls.append(1)
        return x + 1

    jitted = graphc.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RecompileWarning)
        for n in range(1, MAX_SPECIALIZATIONS + 6):
            jitted(np.ones(n, np.float32))
        assert len(jitted._cache) == MAX_SPECIALIZATIONS
        assert len(calls) == MAX_SPECIALIZATIONS + 5
        jitted(np.ones(MAX_SPECIALIZATIONS + 5, np.float32))  # the most recent: kept
        jitted(np.ones(10, np.float32))  # used recently enough: kept
        assert len(calls) == MAX_SPECIALIZATIONS + 5
        jitted(np.ones(10, np.float32))
        jitted(np.ones(1, np.float32))  # the oldest was dropped: compiled again
        assert len(calls) == MAX_SPECIALIZATIONS + 6
    assert len(jitted._cache) == MAX_SPECIALIZATIONS


def test_a_warning_names_the_argument_after_the_8th_recompile():
    def f(x, mode):
        return x * 2 if mode else x

    jitted = graphc.jit(f)
    x = np.ones(3, np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for k in range(RECOMPILE_WARNING_AFTER):  # the first compile and 7 recompiles: no warning
            jitted(x, k)
        assert not [w for w in caught if issubclass(w.category, RecompileWarning)]
        jitted(x, RECOMPILE_WARNING_AFTER)  # the 8th recompile
        jitted(x, RECOMPILE_WARNING_AFTER + 1)  # once per function
    got = [w for w in caught if issubclass(w.category, RecompileWarning)]
    assert len(got) == 1
    text = str(got[0].message)
    assert text.startswith("f was compiled 9 times (8 recompiles")
    assert "'mode' changed in 8 of them (0 (static), 1 (static), 2 (static), ...)" in text
    assert "'x'" not in text
    assert got[0].filename == __file__  # pointed at the user's call
    assert issubclass(RecompileWarning, graphc.GraphcWarning) and issubclass(RecompileWarning, UserWarning)


def test_the_warning_names_a_changing_shape():
    jitted = graphc.jit(lambda x, y: x + y)
    with pytest.warns(RecompileWarning, match=r"'y' changed in 8 of them \(float32\[1\], float32\[2\]"):
        for n in range(1, RECOMPILE_WARNING_AFTER + 2):
            jitted(np.float32(1), np.ones(n, np.float32))


def test_parallelize_recompiles_are_bounded_and_named_too():
    pf = graphc.parallelize(lambda x, k: x[:k] * 2, mesh="dp=2", cache=False)  # k sets a shape: static
    with pytest.warns(RecompileWarning, match="'k' changed in 8 of them"):
        for k in range(RECOMPILE_WARNING_AFTER + 1):
            pf(np.ones(4, np.float32), k)
    assert len(pf._compiled) == RECOMPILE_WARNING_AFTER + 1


def test_warm_calls_with_positional_arrays_take_the_fast_path_and_stay_exact():
    """Jitted.__call__ keys calls of positional numpy arrays by (shape, dtype) alone: alternating
    shapes and dtypes, strided views and subclasses must still get their own specialization."""
    f = graphc.jit(lambda x, y: np.tanh(x * y) + x.sum(axis=0))
    a32 = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    a64 = a32.astype(np.float64)
    b = np.arange(20, dtype=np.float32).reshape(5, 4) / 9
    for _ in range(3):
        for x in (a32, a64, b, b[::2], np.asfortranarray(b), np.ma.masked_array(a32)):
            got = f(x, x)
            want = np.tanh(x * x) + x.sum(axis=0)
            assert got.dtype == np.asarray(want).dtype and got.shape == want.shape
            np.testing.assert_allclose(got, np.asarray(want), rtol=1e-6)
    assert len(f._cache) == 3  # f32[3,4] (a32, b[::2], the masked array), f64[3,4], f32[5,4]


# --- Python ints: traced once they change, if used only as data ---------------------------------


def test_an_int_used_only_as_data_is_traced_once_it_changes():
    """The first call specializes on the int; a second value traces it as a weak int64 (NEP 50:
    ``x_f32 * k`` stays float32) and that one compile serves every later value."""

    def f(x, k):
        return x * k + np.arange(3)[k % 3] + x[k - 1 : k + 1].sum()  # arithmetic, an index, a slice start

    fn, calls = counted(f)
    jitted = graphc.jit(fn)
    x = np.arange(6, dtype=np.float32)
    for k in (1, 2, 5, 3, 2, 4):
        got, want = jitted(x, k), f(x, k)
        assert got.dtype == want.dtype  # float64: the int64 scalar np.arange(3)[k % 3] is strong
        np.testing.assert_array_equal(got, want)
    assert len(calls) == 2 and jitted.static.traced_ints == {"k"}
    # k = 0 slices x[-1:1], empty in numpy: a traced start never wraps alone, it raises (not a wrong sum)
    with pytest.raises(IndexError):
        jitted(x, 0)
    scale = graphc.jit(lambda x, k: x * k)
    for k in (2, 3, 2**40):
        assert scale(x, k).dtype == np.float32  # a Python int is weak, traced or not
        np.testing.assert_array_equal(scale(x, k), x * k)


@pytest.mark.parametrize(
    "body",
    [
        lambda x, n: x[:n],  # a slice length
        lambda x, n: x.reshape(n, -1),  # a reshape size
        lambda x, n: sum(x[i] for i in range(n)),  # a Python loop count
        lambda x, n: np.zeros(n) + x.sum(),  # a shape
    ],
    ids=["slice-length", "reshape", "range", "shape"],
)
def test_an_int_that_sets_a_shape_or_a_loop_stays_static(body):
    x = np.arange(12.0)
    jitted = graphc.jit(body)
    for n in (2, 3, 4, 3):
        np.testing.assert_array_equal(jitted(x, n), body(x, n))
    assert jitted.static.static_ints == {"n"} and not jitted.static.traced_ints
    assert len(jitted._cache) == 3


def test_an_int_used_as_a_python_value_elsewhere_stays_static():
    """An int that names an attribute or keys a dict (any error of the traced attempt, not only
    graphc's) is static: each value its own specialization, numpy's results."""
    weights = {f"w{i}": np.full(3, float(i)) for i in range(4)}

    def pick(x, i):
        return x * weights[f"w{i}"] + i

    jitted = graphc.jit(pick)
    x = np.arange(3.0)
    for i in (0, 1, 3, 1):
        np.testing.assert_array_equal(jitted(x, i), pick(x, i))
    assert jitted.static.static_ints == {"i"} and len(jitted._cache) == 3


def test_an_int_that_decides_control_flow_stays_static():
    """``if k > 2`` on a traced int would be a cond; numpy code decides it in Python, so k stays
    static (and so does a loop bound it sets in converted code)."""

    def f(x, k):
        if k > 2:
            return x * 2
        return x - k

    def g(x, k):
        total = x
        i = 0
        while i < k:
            total = total + x
            i += 1
        return total

    x = np.arange(3.0)
    for fn in (f, g):
        jitted = graphc.jit(fn)
        for k in (1, 2, 3, 4):
            np.testing.assert_array_equal(jitted(x, k), fn(x, k))
        assert jitted.static.static_ints == {"k"} and len(jitted._cache) == 4


def test_ints_inside_containers_and_static_argnames_stay_static():
    jitted = graphc.jit(lambda x, cfg, k: x * cfg["scale"] + k, static_argnames=("k",))
    x = np.ones(2)
    for v in (1, 2, 3):
        np.testing.assert_array_equal(jitted(x, {"scale": v}, v), x * v + v)
    assert len(jitted._cache) == 3 and not jitted.static.traced_ints
