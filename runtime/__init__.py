"""Executors, collectives and kernels. Until they land, ``graphc.evaluate`` (the reference
interpreter in ``graphc/interpreter.py``) is the only way to run a graph."""
