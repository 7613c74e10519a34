"""Result buffers lent to the caller of a jitted function, and taken back once the caller dropped them.

A call that returns a large fresh result pays for the new memory: the kernel faults every page of it
in, and the kernel zeroes each one first (a fresh 64 MiB result costs about as much as copying it:
docs/measurements.md#lent-results). A caller that drops each result before the next call (a loop
``y = f(x)``, a result only summed or printed) leaves memory the next call can write into instead.

So a result the executor made in its buffer pool leaves as a *new view* of that buffer, and the pool
keeps the buffer (``Lender.lend``). The caller owns the view: nothing in graphc writes into it while
anyone can see it. ``Lender.reclaim``, at the start of each run, gives a lent buffer back to the
pool's free buffers (which the run reuses for a result or a temporary of its shape, or drops to stay
within its liveness peak) only when nothing outside the pool refers to it: every numpy view of the result, every view of those, every memoryview or buffer
export holds a reference to the buffer (numpy views point at the array that owns the memory), so the
buffer's reference count says whether any of them is alive. An argument of the call that is the
previous result, or a view of it, is alive during the call: a result never shares memory with
anything the caller can still reach.

Only the buffers of the last ``KEEP_CALLS`` calls are kept (two: in ``y = f(y0)`` and in a loop
``y = f(x)`` the previous result is still bound while the call runs); older ones are let go, so the
pool holds at most two calls' results beyond what the caller holds.
"""

from __future__ import annotations

import sys

import numpy as np

KEEP_CALLS = 2


def _references(entry: list) -> int:
    """The reference count of ``entry[0]`` (the buffer of a lent entry) as seen from here."""
    return sys.getrefcount(entry[0])


# what _references counts for a buffer nothing but its entry refers to (measured, not assumed: the
# interpreter's own references on the call stack differ between Python versions)
_ONLY_THE_ENTRY = _references([np.empty(0), 0])


class Lender:
    """The result buffers lent out by one buffer pool. Not thread-safe: the pool calls it under its lock."""

    def __init__(self) -> None:
        self._lent: dict[tuple, list[list]] = {}  # (shape, dtype) -> [[buffer, call number], ...]
        self._call = 0
        self.bytes = 0  # bytes of the buffers lent and still kept
        self.taken_back = 0

    def lend(self, buffers: list[np.ndarray]) -> list[np.ndarray]:
        """Keep ``buffers`` (the pool's, one call's results, each a whole C-contiguous array owning
        its memory, no two the same) and return a new view of each for the caller. Let go of the
        buffers lent by calls more than KEEP_CALLS - 1 calls ago."""
        self._call += 1
        oldest = self._call - KEEP_CALLS + 1
        if self.bytes:
            for key, entries in list(self._lent.items()):
                kept = [e for e in entries if e[1] >= oldest]
                self.bytes -= sum(e[0].nbytes for e in entries) - sum(e[0].nbytes for e in kept)
                if kept:
                    self._lent[key] = kept
                else:
                    del self._lent[key]
        handed = []
        for buf in buffers:
            self._lent.setdefault((buf.shape, buf.dtype), []).append([buf, self._call])
            self.bytes += buf.nbytes
            handed.append(buf.view())
        return handed

    def reclaim(self) -> list[np.ndarray]:
        """The lent buffers that nothing outside the lender refers to any more, taken back."""
        back = []
        for key, entries in list(self._lent.items()):
            kept = []
            for entry in entries:
                if _references(entry) > _ONLY_THE_ENTRY:
                    kept.append(entry)
                else:
                    back.append(entry[0])
            if kept:
                self._lent[key] = kept
            else:
                del self._lent[key]
        self.bytes -= sum(b.nbytes for b in back)
        self.taken_back += len(back)
        return back

    def release(self) -> None:
        """Let go of every lent buffer (those the caller dropped are freed)."""
        self._lent = {}
        self.bytes = 0
