"""A plan's alternatives priced when first read (passes/sharding/build.py, records.py).

Pricing every item's alternatives (passes/sharding/alternatives.py) is most of making a plan,
and only an explanation (``ShardingPlan.explain``) or the plan's JSON reads them: a plan just
made holds ``LazyAlternatives``, one per item, which price all of them (``Pending``) the first
time one is read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Generic, TypeVar, overload

A = TypeVar("A")  # an alternative (records.py ``Alternative``; records.py imports this module)


class Pending(Generic[A]):
    """Every item's alternatives, priced by ``price()`` when one is first read (``LazyAlternatives``):
    pricing them is most of making a plan, and only an explanation or the plan's JSON reads them.
    ``price`` (and the solved problem it holds) is dropped once called."""

    def __init__(self, price: Callable[[], Mapping[int, tuple[A, ...]]]) -> None:
        self._price: Callable[[], Mapping[int, tuple[A, ...]]] | None = price
        self._priced: Mapping[int, tuple[A, ...]] | None = None
        self._lock = threading.Lock()

    @property
    def priced(self) -> bool:
        return self._priced is not None

    def get(self, item: int) -> tuple[A, ...]:
        """The alternatives of ``item`` (every item's priced on the first call)."""
        if self._priced is None:
            with self._lock:
                if self._priced is None:
                    assert self._price is not None  # dropped only once priced
                    self._priced = self._price()
                    self._price = None
        return self._priced.get(item, ())


class LazyAlternatives(Sequence[A]):
    """One item's alternatives in a plan just made: a sequence equal to the tuple ``Pending``
    prices for it, read on first use. It pickles and copies as that tuple."""

    __slots__ = ("_pending", "_item")

    def __init__(self, pending: Pending, item: int) -> None:
        self._pending = pending
        self._item = item

    def _alternatives(self) -> tuple[A, ...]:
        return self._pending.get(self._item)

    @overload
    def __getitem__(self, k: int) -> A: ...

    @overload
    def __getitem__(self, k: slice) -> tuple[A, ...]: ...

    def __getitem__(self, k: int | slice) -> A | tuple[A, ...]:
        return self._alternatives()[k]

    def __len__(self) -> int:
        return len(self._alternatives())

    def __iter__(self) -> Iterator[A]:
        return iter(self._alternatives())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyAlternatives):
            other = other._alternatives()
        return isinstance(other, tuple) and self._alternatives() == other

    def __hash__(self) -> int:
        return hash(self._alternatives())

    def __repr__(self) -> str:
        return repr(self._alternatives())

    def __reduce__(self) -> tuple:
        return (tuple, (self._alternatives(),))


__all__ = ["LazyAlternatives", "Pending"]
