"""Differential fuzzing of graphc against numpy (docs/fuzzing_numpy.md)."""
