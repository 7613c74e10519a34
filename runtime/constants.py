"""A device's shared constants (runtime/executor.py ``Program``, runtime/pipeline.py)."""

from __future__ import annotations

import hashlib

import numpy as np


class ConstantTable:
    """One device's constants, one read-only array per distinct value (dtype, shape and bytes):
    the programs a device runs one after the other (a pipeline's forward and backward task of
    every micro-batch, its update) each read the same array rather than holding their own copy
    (runtime/pipeline.py, which counts them once for the step)."""

    def __init__(self):
        self._by_key: dict[tuple[str, tuple[int, ...], bytes], list[np.ndarray]] = {}

    def get(self, value: np.ndarray) -> np.ndarray:
        """The device's array equal to ``value`` (bytewise: NaNs and signed zeros kept apart),
        ``value`` itself (read-only) the first time."""
        data = np.ascontiguousarray(value).tobytes()
        key = (value.dtype.str, value.shape, hashlib.blake2b(data, digest_size=16).digest())
        same = self._by_key.setdefault(key, [])
        for x in same:  # a digest collision must not swap one constant for another
            if np.ascontiguousarray(x).tobytes() == data:
                return x
        if value.flags.writeable:  # a kernel must never write into a shared constant
            value = value.copy()
            value.flags.writeable = False
        same.append(value)
        return value

    def arrays(self) -> list[np.ndarray]:
        """Every distinct constant, once."""
        return [x for same in self._by_key.values() for x in same]


__all__ = ["ConstantTable"]
