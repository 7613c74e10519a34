"""Optimization and partitioning passes over the Graph IR (each a function Graph -> Graph).

``optimize(graph)`` runs the default pipeline (passes/manager.py); the passes are
fold_constants, simplify, cse and dce.
"""

from graphc.passes.manager import DEFAULT_PASSES, PASSES, optimize, run_passes

__all__ = ["DEFAULT_PASSES", "PASSES", "optimize", "run_passes"]
