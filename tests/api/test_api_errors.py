"""graphc.trace, graphc.jit and graphc.parallelize raise the same error for the same bad function:
a GraphcError subclass (also numpy's or Python's class where Python would raise one), carrying the
user's file:line. An exception the user's own code raises passes through unchanged in all three."""

import numpy as np
import pytest

import graphc
from tests.helpers import line_of

X = np.ones((4, 4), np.float32)


class Config:  # no __dict__ and not registered: not a pytree (an object with a __dict__ is one)
    __slots__ = ()


def unsupported(x):
    return np.fft.rfft(x, axis=0)  # <unsupported>


def misaligned(x):
    return x @ np.ones((3, 3), np.float32)  # <misaligned>


def concrete(x):
    return float(x.sum())  # <concrete>


def assigns(x):
    rows = np.broadcast_to(x[0], (2, *x.shape[1:]))  # a read-only view
    rows[0] = 1.0  # <assigns>
    return x


def masked(x):
    return x[x > 0]  # <masked>


def returns_an_object(x):  # <returns-object>
    return Config()


def yields(x):  # <yields>
    yield x


def takes_one(x):  # <takes-one>
    return x


def takes_config(x, cfg):  # <takes-config>
    return x


def raises_its_own(x):
    raise KeyError("the user's own error")


# (function, arguments, the GraphcError class, also an instance of, the line marker, text in the message)
CASES = [
    (unsupported, (X,), graphc.TraceError, None, "<unsupported>", "numpy.fft.rfft is not supported"),
    (misaligned, (X,), graphc.TraceError, None, "<misaligned>", "not aligned"),
    (concrete, (X,), graphc.TraceError, None, "<concrete>", "float() of a traced array"),
    (assigns, (X,), graphc.TraceError, None, "<assigns>", "assignment destination is read-only"),
    (masked, (X,), graphc.TraceError, None, "<masked>", "data-dependent shape"),
    (returns_an_object, (X,), graphc.TraceError, None, "<returns-object>", "result has type Config"),
    (yields, (X,), graphc.TraceError, None, "<yields>", "generator function"),
    (takes_one, (X, X), graphc.TraceError, TypeError, "<takes-one>", "cannot trace takes_one: too many"),
    (takes_one, (), graphc.TraceError, TypeError, "<takes-one>", "missing a required argument: 'x'"),
    (takes_config, (X, Config()), graphc.TraceError, TypeError, "<takes-config>", "argument[0][1] has type Config"),
    (takes_one, (np.ones(3, np.complex64),), graphc.TraceError, None, "<takes-one>", "dtype complex64"),
]


def _through(api: str, fn, args):
    if api == "trace":
        return graphc.trace(fn, *args)
    if api == "jit":
        return graphc.jit(fn)(*args)
    return graphc.parallelize(fn, mesh="dp=2", cache=False)(*args)


@pytest.mark.parametrize("fn, args, kind, also, marker, text", CASES, ids=[f"{c[0].__name__}-{c[4]}" for c in CASES])
def test_the_same_error_from_trace_jit_and_parallelize(fn, args, kind, also, marker, text):
    errors = {}
    for api in ("trace", "jit", "parallelize"):
        with pytest.raises(graphc.GraphcError) as info:
            _through(api, fn, args)
        errors[api] = info.value
    classes = {api: type(e) for api, e in errors.items()}
    assert len(set(classes.values())) == 1, classes
    err = errors["trace"]
    assert isinstance(err, kind) and (also is None or isinstance(err, also))
    for api, e in errors.items():
        assert e.loc is not None and e.lineno == line_of(marker), (api, str(e))
        assert e.filename.endswith("test_api_errors.py"), (api, str(e))
        assert str(e).startswith(f"{e.filename}:{e.lineno}: ") and text in str(e), (api, str(e))


def test_an_exception_of_the_users_own_code_passes_through_unchanged():
    for api in ("trace", "jit", "parallelize"):
        with pytest.raises(KeyError, match="the user's own error") as info:
            _through(api, raises_its_own, (X,))
        assert type(info.value) is KeyError


def test_static_argnames_errors_are_graphc_errors_too():
    with pytest.raises(graphc.GraphcError, match=r"static_argnames: takes_one has no parameter 'n'"):
        graphc.jit(takes_one, static_argnames=("n",))
    with pytest.raises(graphc.GraphcError, match=r"static_argnames: takes_one has no parameter 'n'"):
        graphc.parallelize(takes_one, mesh="dp=2", static_argnames=("n",))
    with pytest.raises(graphc.TraceError, match="too many positional arguments") as info:
        graphc.jit(takes_config, static_argnames=("cfg",))(X, 1, 2)
    assert isinstance(info.value, TypeError) and info.value.lineno == line_of("<takes-config>")
    with pytest.raises(graphc.GraphcError, match="static argument 'cfg' must be hashable, got list"):
        graphc.jit(takes_config, static_argnames=("cfg",))(X, [1])
