"""Optimization and partitioning passes over the Graph IR (each a function Graph -> Graph).

Empty until the pass manager lands; the traced IR is the only stage so far.
"""
