"""The user's entry points above the compiler: ``jit`` (api/jit.py) and ``parallelize`` / ``shard``
(api/parallel.py). ``import graphc`` exposes them lazily (graphc/__init__.py)."""
