"""Optimization and partitioning passes over the Graph IR (each a function Graph -> Graph).

``optimize(graph)`` runs the default pipeline (passes/manager.py); the passes are
fold_constants, simplify, cse and dce.
"""

from graphc.passes.manager import DEFAULT_PIPELINE, PASSES, optimize, run_pipeline

__all__ = ["DEFAULT_PIPELINE", "PASSES", "optimize", "run_pipeline"]
