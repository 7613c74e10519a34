"""Session-wide checks."""

import sys


def pytest_sessionfinish(session, exitstatus):
    """graphc's folders passes/, runtime/ and models/ are installed as graphc.passes, graphc.runtime
    and graphc.models; importing them under their bare names would load a second copy of every
    module (two op registries, two caches). No test may do it."""
    bare = sorted(name for name in ("passes", "runtime", "models") if name in sys.modules)
    if bare:
        raise RuntimeError(f"modules imported under their bare names: {bare}; import graphc.{bare[0]} instead")
