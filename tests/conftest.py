"""Session-wide checks, the hypothesis profiles and the ``--long`` option (the ``fuzz``, ``slow``
and ``long`` markers: pyproject.toml)."""

import sys

import pytest
from hypothesis import HealthCheck, settings


def pytest_addoption(parser):
    parser.addoption(
        "--long",
        action="store_true",
        help="also run the tests marked long: searches that use a minute-long time limit, solves "
        "under tight limits, soaks under MPI, and costly cases of families the full run tests (docs/development.md)",
    )


def pytest_collection_modifyitems(config, items):
    """Tests marked ``long`` run only with ``--long``: each takes 10 s to a minute on two cores (more under load),
    and a faster test of its feature runs without it, so the full run (CI) leaves them out and says so in its
    summary of skips."""
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="a long run (10 s to a minute): pytest --long runs it")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


# ``pytest -m fuzz --hypothesis-profile long``: every fuzz target (tests.helpers.fuzz_settings) runs
# at least 10,000 random examples; docs/fuzzing.md records how long that takes and what it found.
settings.register_profile(
    "long",
    max_examples=10_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


def pytest_sessionfinish(session, exitstatus):
    """graphc's folders passes/, runtime/ and models/ are installed as graphc.passes, graphc.runtime
    and graphc.models; importing them under their bare names would load a second copy of every
    module (two op registries, two caches). No test may do it."""
    bare = sorted(name for name in ("passes", "runtime", "models") if name in sys.modules)
    if bare:
        raise RuntimeError(f"modules imported under their bare names: {bare}; import graphc.{bare[0]} instead")
