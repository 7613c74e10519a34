"""Session-wide checks and the hypothesis profiles (the ``fuzz`` and ``slow`` markers: pyproject.toml)."""

import sys

from hypothesis import HealthCheck, settings

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
