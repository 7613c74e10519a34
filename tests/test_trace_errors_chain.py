"""Errors point at the user's code: an unsupported call made inside a library function (scipy, an
installed helper package) is reported at the user's line that led there, with the library line
that failed and the chain of user frames; graphc.trace, graphc.jit and graphc.parallelize raise the
same TraceError."""

import sys
import textwrap

import numpy as np
import pytest

import graphc
from graphc.frontend import locations
from tests.helpers import line_of

X = np.ones((4, 4))


@pytest.fixture
def library(tmp_path, monkeypatch):
    """A helper package installed in a library root of its own (as site-packages is one)."""
    root = tmp_path / "site"
    (root / "helperlib").mkdir(parents=True)
    (root / "helperlib" / "__init__.py").write_text(
        textwrap.dedent(
            """\
            import numpy as np


            def spectrum(x):
                y = x * 2.0
                return _inner(y)


            def _inner(y):
                return np.fft.rfft(y, axis=0)  # <library-call>


            def scale(x):
                return x * 3.0


            def checked(x):
                return _check(x) * 2.0  # <checked-call>


            def _check(x):
                if not isinstance(x, np.ndarray):
                    raise ValueError("checked() needs a numpy array")  # <library-raise>
                return x
            """
        )
    )
    monkeypatch.setattr(locations, "_LIBRARY_ROOTS", (str(root) + "/", *locations._LIBRARY_ROOTS))
    locations.library_path.cache_clear()
    monkeypatch.syspath_prepend(str(root))
    import helperlib

    yield helperlib
    locations.library_path.cache_clear()
    sys.modules.pop("helperlib", None)


def model(x, lib):
    h = x + 1.0
    return features(h, lib)  # <user-outer>


def features(h, lib):
    return lib.spectrum(h)  # <user-inner>


def test_library_failure_names_the_user_line_and_the_library_line(library):
    with pytest.raises(graphc.TraceError) as info:
        graphc.trace(model, X, library)
    err = info.value
    assert (err.filename, err.lineno) == ("tests/test_trace_errors_chain.py", line_of("<user-inner>"))
    assert "numpy.fft.rfft is not supported by graphc" in str(err)
    chain = err.chain
    library_line = line_of("<library-call>", str(library.__file__))
    assert chain[-1] == f"helperlib/__init__.py:{library_line} in _inner (library)"
    assert chain[-2].startswith("helperlib/__init__.py:") and chain[-2].endswith("in spectrum (library)")
    user = [c for c in chain if "(library)" not in c]
    assert user[-2:] == [
        f"tests/test_trace_errors_chain.py:{line_of('<user-outer>')} in model",
        f"tests/test_trace_errors_chain.py:{line_of('<user-inner>')} in features",
    ]
    assert str(err).startswith(f"tests/test_trace_errors_chain.py:{line_of('<user-inner>')}: ")
    assert "call chain (outermost first)" in str(err) and chain[-1] in str(err)


def calls_checked(x, lib):
    y = x + 1.0
    return lib.checked(y)  # <calls-checked>


def test_a_library_raising_its_own_error_is_a_trace_error_at_the_user_line(library):
    with pytest.raises(ValueError) as info:  # (still the library's exception class)
        graphc.trace(calls_checked, X, library)
    err = info.value
    assert isinstance(err, graphc.TraceError)
    assert (err.filename, err.lineno) == ("tests/test_trace_errors_chain.py", line_of("<calls-checked>"))
    assert "a library function, failed on a traced array: ValueError: checked() needs a numpy array" in str(err)
    raise_line = line_of("<library-raise>", str(library.__file__))
    user_call = f"tests/test_trace_errors_chain.py:{line_of('<calls-checked>')} in calls_checked"
    assert err.chain[-1].startswith(f"helperlib/__init__.py:{raise_line} in ")
    assert err.chain[-1].endswith("(library, raised here)")
    library_part = err.chain[err.chain.index(user_call) + 1 :]
    checked_line = line_of("<checked-call>", str(library.__file__))
    assert library_part[0] == f"helperlib/__init__.py:{checked_line} in checked (library)"
    assert all("(library" in c for c in library_part)


def test_nodes_made_inside_a_library_carry_the_user_line(library):
    def uses_library(x):
        return library.scale(x)  # <scaled>

    graph = graphc.trace(uses_library, X)
    (mul,) = [n for n in graph.nodes if n.op.name == "mul"]
    assert mul.loc.line == line_of("<scaled>") and mul.loc.file == "tests/test_trace_errors_chain.py"


def test_errors_in_user_helper_modules_stay_at_their_line(tmp_path, monkeypatch):
    """A module of the user's own (not installed) is user code: the error is at its line, no chain."""
    (tmp_path / "own_helpers.py").write_text("import numpy as np\n\ndef f(x):\n    return np.fft.rfft(x)  # <own>\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import own_helpers

    try:
        with pytest.raises(graphc.TraceError) as info:
            graphc.trace(lambda x: own_helpers.f(x), X)
        assert info.value.lineno == 4 and info.value.filename.endswith("own_helpers.py")
        assert info.value.chain == ()
    finally:
        sys.modules.pop("own_helpers", None)


def entropy_model(p):
    return scipy_stats.entropy(p) * 2.0  # <entropy>


scipy_stats = None


def test_scipy_failure_points_at_the_user_line():
    global scipy_stats
    scipy_stats = pytest.importorskip("scipy.stats")
    with pytest.raises(graphc.TraceError) as info:
        graphc.trace(entropy_model, np.full(4, 0.25))
    err = info.value
    assert err.lineno == line_of("<entropy>") and err.filename == "tests/test_trace_errors_chain.py"
    assert err.chain[-1].startswith("scipy/") and err.chain[-1].endswith("(library)")
    assert f"tests/test_trace_errors_chain.py:{line_of('<entropy>')} in entropy_model" in err.chain


def test_jit_and_parallelize_raise_the_same_error(library):
    def run(x):
        return features(x, library)

    errors = []
    for call in (
        lambda: graphc.trace(run, X),
        lambda: graphc.jit(run)(X),
        lambda: graphc.parallelize(run, mesh={"dp": 2})(X),
    ):
        with pytest.raises(graphc.TraceError) as info:
            call()
        errors.append(info.value)
    first = errors[0]
    for err in errors[1:]:
        assert type(err) is type(first)
        assert (err.filename, err.lineno, err.message) == (first.filename, first.lineno, first.message)
        assert [c for c in err.chain if "test_trace_errors_chain" in c and "<lambda>" not in c][-2:] == [
            c for c in first.chain if "test_trace_errors_chain" in c and "<lambda>" not in c
        ][-2:]
        assert err.chain[-2:] == first.chain[-2:]


@pytest.mark.parametrize(
    "api",
    [
        lambda f, x: graphc.trace(f, x),
        lambda f, x: graphc.jit(f)(x),
        lambda f, x: graphc.parallelize(f, mesh={"dp": 2})(x),
    ],
    ids=["trace", "jit", "parallelize"],
)
def test_data_dependent_shape_error_is_the_same_everywhere(api):
    def f(x):
        return np.nonzero(x)  # <nonzero>

    with pytest.raises(graphc.TraceError, match="data-dependent") as info:
        api(f, X)
    assert info.value.lineno == line_of("<nonzero>") and info.value.chain == ()


def test_the_example_models_are_user_code(tmp_path):
    """graphc.models registers itself as user code (graphc.add_user_code): an error in a model
    names the model's line, though the file lives inside the graphc package; so does a folder a
    user registers."""
    from graphc.models import mlp

    (args, _kwargs) = mlp.example_train_args()
    with pytest.raises(graphc.TraceError) as info:
        graphc.trace(mlp.mlp, args[0], np.ones((3, 5), np.float32))  # 5 features for a 784-wide layer
    assert info.value.filename.endswith("mlp.py")
