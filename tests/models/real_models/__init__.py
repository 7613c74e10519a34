"""Small numpy models written in the styles of public numpy model code, not for graphc.

Each module is plain numpy (no graphc import) in one style people write; tests/models/test_real_models.py
traces, jits, differentiates and shards each of them against numpy.
"""
