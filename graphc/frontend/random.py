"""Random numbers in traced code: ``np.random`` calls become ``philox`` ops (graphc/ops/random.py)
on an explicit state, never constants frozen at trace time.

Where the state comes from:

* **A Generator argument.** ``f(rng, x)`` called with a ``np.random.Generator`` on a ``Philox``
  bit generator: under ``graphc.jit`` / ``graphc.parallelize`` its state (key, word position)
  is an input of the compiled function, and after each call graphc advances the object by the
  words the function drew, as numpy would have: successive calls draw new numbers, and the draws
  equal ``rng.random(...)`` etc. of numpy where docs/random.md says so. A generator on another bit
  generator (``np.random.default_rng()`` is PCG64, which is not counter-based) gives the call a
  fresh Philox key drawn from its own stream (two words per call), so its draws are reproducible
  from its seed, but are not numpy's.
* **A generator made inside.** ``np.random.default_rng(seed)`` with a static or traced integer
  seed is ``Generator(Philox(key=seed))`` (numpy's own ``default_rng`` would be PCG64: graphc's
  stream is the Philox one of the same number). Its state is part of the graph: each call
  draws the same numbers, as the same numpy code does. ``default_rng()`` without a seed draws its
  key from the ambient stream below.
* **The ambient stream, for the legacy functions** (``np.random.rand``, ``randn``, ``random``,
  ``random_sample``, ``uniform``, ``normal``, ``standard_normal``, ``randint``, ``permutation``,
  ``choice``): ``with graphc.rng_seed(seed):`` (or ``graphc.rng_seed(rng=generator)``) around the
  calls of a jitted or parallelized function (or around ``graphc.trace``). Like
  ``np.random.seed``: inside one ``with`` block successive calls draw new numbers (the stream's
  state is a hidden input of the compiled function, advanced after each call), and a new block
  with the same seed replays them. Under ``graphc.trace`` the ambient state is a constant of the
  graph. The legacy functions draw graphc's Philox stream, not numpy's MT19937 one.

What cannot be traced: an unsupported ``np.random`` function, or a legacy call without an
ambient stream, warns (``RandomWarning``, at the user's file:line) and gives numpy's own numbers
as a constant; an unsupported Generator method or argument is a TraceError at the line. A Generator
the function reads from a global or a closure (not an argument) is numpy's own object: its
methods are C code graphc does not see, so pass it as an argument; likewise a
``np.random.Generator(np.random.Philox(k))`` constructed inside (write ``default_rng(k)``).

Per-element positions: element ``i`` of a draw of ``n`` words starting at word ``p`` uses the
stream's word ``p + i`` (standard_normal: words ``p + i`` and ``p + n + i``), whatever device
computes it, so a sharded draw equals the unsharded one bit for bit. Draws inside a traced loop
or branch are not supported (the position would depend on the iteration): draw outside, for all
iterations at once.

The hooks: ``patch_targets`` (entry.numpy_patches wraps the module functions while tracing),
``bind_generators`` / ``advance_generators`` (graphc.jit and graphc.parallelize, around each
call), ``wrap_inputs`` (entry.trace: Generator arguments become ``TracedGenerator``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any, cast

import numpy as np

from graphc.core.errors import GraphcWarning, TraceError, user_stacklevel
from graphc.core.ir import Graph
from graphc.core.pytree import flatten
from graphc.frontend.tracer import Tracer, bind, current_context, lift, user_location
from graphc.ops.random import int_to_words, state_inputs, words_to_int

STATE_WORDS = 6  # key (2 words), then the 256-bit word position (4 words), little-endian
MAX_PERMUTATION = 4096  # permutation / choice rank by pairwise comparison: n**2 work
AMBIENT_KWARG = "__graphc_rng__"  # the hidden keyword argument carrying the ambient stream's state


class RandomWarning(GraphcWarning):
    """An ``np.random`` call in traced code that graphc could not trace: its numbers are numpy's,
    computed once at trace time (a constant of the graph). The message names the line."""


# --- states: numpy Generator <-> u64[6] --------------------------------------------------------------


class GeneratorState(np.ndarray):
    """A Generator's state as the u64[6] array graphc passes for it (key, word position); an
    ndarray subclass so every layer treats it as an array, and ``trace`` knows to hand the
    function a ``TracedGenerator`` for it."""


def philox_state(gen: np.random.Generator) -> np.ndarray:
    """u64[6] of a Generator on a Philox bit generator: key, then the position of its next word
    (numpy's ``counter`` with ``buffer_pos``: see graphc/ops/random.py)."""
    st = gen.bit_generator.state
    counter = words_to_int(st["state"]["counter"])
    position = 4 * counter if st["buffer_pos"] >= 4 else 4 * (counter - 1) + st["buffer_pos"]
    return np.concatenate([np.asarray(st["state"]["key"], np.uint64), int_to_words(position)])


def set_philox_state(gen: np.random.Generator, state: np.ndarray) -> None:
    """Put ``gen`` (Philox) at the word position of ``state``, with numpy's buffer filled as its
    own draws would have left it."""
    key, position = np.asarray(state[:2], np.uint64), words_to_int(state[2:])
    lane, counter = position % 4, position // 4
    st: dict[str, Any] = dict(gen.bit_generator.state)
    st["state"]["key"] = key
    if lane == 0:  # the buffer is used up: the next draw enciphers block counter + 1
        st["state"]["counter"], st["buffer_pos"] = int_to_words(counter), 4
    else:
        st["state"]["counter"], st["buffer_pos"] = int_to_words(counter + 1), int(lane)
        st["buffer"] = np.random.Philox(
            key=int(key[0]) | (int(key[1]) << 64), counter=int_to_words(counter)
        ).random_raw(4)
    st["has_uint32"], st["uinteger"] = 0, 0
    gen.bit_generator.state = st


def call_state(gen: np.random.Generator) -> GeneratorState:
    """The state a call of a compiled function gets for ``gen``: its own (Philox), or a fresh key
    from its stream (any other bit generator: two words, drawn now)."""
    if isinstance(gen.bit_generator, np.random.Philox):
        state = philox_state(gen)
    else:
        warnings.warn(
            f"a Generator on {type(gen.bit_generator).__name__} (np.random.default_rng's bit generator is PCG64) "
            "given to a compiled function draws from a fresh Philox key each call: its numbers are not numpy's "
            "(docs/random.md). np.random.Generator(np.random.Philox(seed)) draws numpy's numbers",
            RandomWarning,
            stacklevel=user_stacklevel(),
        )
        state = np.concatenate([gen.bit_generator.random_raw(2).astype(np.uint64), np.zeros(4, np.uint64)])
    return state.view(GeneratorState)


# --- the ambient stream: graphc.rng_seed -------------------------------------------------------------


class _Ambient(threading.local):
    def __init__(self) -> None:  # (runs once in each thread that uses it)
        self.stack: list[np.random.Generator] = []


_ambient = _Ambient()


def _ambient_stack() -> list[np.random.Generator]:
    return _ambient.stack


@contextlib.contextmanager
def rng_seed(seed: int | None = None, *, rng: np.random.Generator | None = None) -> Iterator[np.random.Generator]:
    """The stream the legacy ``np.random`` functions (``rand``, ``randn``, ``uniform``, ...) draw
    from in functions traced, jitted or parallelized inside the block: ``Generator(Philox(key=seed))``,
    or the Generator given as ``rng=``. Yields that Generator; its state advances with the calls.
    Per thread (each thread traces its own calls)."""
    if (seed is None) == (rng is None):
        raise TypeError("graphc.rng_seed takes a seed or rng=, and not both")
    gen = rng if rng is not None else np.random.Generator(np.random.Philox(key=int(seed)))  # type: ignore[arg-type]
    stack = _ambient_stack()
    stack.append(gen)
    try:
        yield gen
    finally:
        stack.pop()


# --- around a compiled call: graphc.jit and graphc.parallelize --------------------------------------


def ambient_active() -> bool:
    """Whether a ``graphc.rng_seed`` block is active on this thread (its calls carry its state)."""
    return bool(_ambient_stack())


def bind_generators(
    args: tuple, kwargs: dict, ambient: bool = True
) -> tuple[tuple, dict, list[tuple[np.random.Generator, GeneratorState]]]:
    """The call's arguments with each Generator (at the top level or in a dict/list/tuple) replaced
    by its ``GeneratorState``, plus (with ``ambient``) the ambient stream's state as the hidden
    keyword argument when a ``rng_seed`` block is active; and the (generator, state) pairs to
    advance after the call."""
    bound: list[tuple[np.random.Generator, GeneratorState]] = []

    def state_of(x: Any) -> Any:
        if isinstance(x, np.random.Generator):
            state = call_state(x)
            bound.append((x, state))
            return state
        return x

    def swap(x: Any) -> Any:
        return _rebuilt(x, state_of)

    if _holds_generator(args) or _holds_generator(kwargs):
        args, kwargs = swap(args), swap(kwargs)
    stack = _ambient_stack()
    if ambient and stack and AMBIENT_KWARG not in kwargs:
        kwargs = {**kwargs, AMBIENT_KWARG: swap(stack[-1])}
    return args, kwargs, bound


def restore_generators(x: Any, bound: list[tuple[np.random.Generator, GeneratorState]]) -> Any:
    """``x`` (arguments ``bind_generators`` made) with each state of its ``bound`` pairs the
    Generator it came from again, at whatever state that Generator is now."""
    by_state = {id(state): gen for gen, state in bound}
    return _rebuilt(x, lambda leaf: by_state.get(id(leaf), leaf))


def _rebuilt(x: Any, leaf: Callable[[Any], Any]) -> Any:
    """``x`` with its dicts, lists and tuples rebuilt and ``leaf`` applied to everything else: where
    ``bind_generators`` looks for Generators."""
    if isinstance(x, dict):
        return {k: _rebuilt(v, leaf) for k, v in x.items()}
    if type(x) in (list, tuple):
        return type(x)(_rebuilt(v, leaf) for v in x)
    return leaf(x)


_GENERATOR = np.random.Generator  # (``np.random`` is a lazy module attribute: looked up once)


def _holds_generator(x: Any) -> bool:
    """Whether a Generator is in ``x`` (a walk without copying: most calls have none)."""
    todo = [x]
    while todo:
        item = todo.pop()
        kind = type(item)
        if kind is dict:
            todo.extend(item.values())
        elif kind is list or kind is tuple:
            todo.extend(item)
        elif kind is not np.ndarray and isinstance(item, _GENERATOR):
            return True
    return False


def advance_generators(graph: Graph, args: tuple, kwargs: dict, bound: list) -> None:
    """After a call of ``graph`` on ``args``/``kwargs`` (as ``bind_generators`` returned them):
    move each Philox Generator past the words the graph drew from its state."""
    if not bound:
        return
    leaves, _ = flatten((args, kwargs))
    drawn = state_inputs(graph)  # input index -> words its draws take
    for gen, state in bound:
        if not isinstance(gen.bit_generator, np.random.Philox):
            continue  # its call already took two words for the key
        k = next((i for i, leaf in enumerate(leaves) if leaf is state), None)
        if k is not None:  # counted from the end: a method's object comes first among the inputs
            k += len(graph.inputs) - len(leaves)
        if k is not None and drawn.get(k):
            new = state.view(np.ndarray).copy()
            new[2:] = int_to_words(words_to_int(state[2:]) + drawn[k])
            set_philox_state(gen, new)


# --- in the trace: TracedGenerator --------------------------------------------------------------------


def wrap_inputs(leaves: list[Any], tracers: list[Any]) -> list[Any]:
    """entry.trace: the function gets a ``TracedGenerator`` for each GeneratorState argument."""
    return [TracedGenerator(t) if isinstance(leaf, GeneratorState) else t for leaf, t in zip(leaves, tracers)]


@contextlib.contextmanager
def ambient_for_trace(kwargs: dict) -> Iterator[dict]:
    """entry.trace: take the hidden ambient-stream argument out of the function's keyword
    arguments and make it the stream the legacy functions draw from while the function runs."""
    state = kwargs.get(AMBIENT_KWARG)
    previous = getattr(_ambient, "traced", None)
    _ambient.traced = state if state is None or isinstance(state, TracedGenerator) else TracedGenerator(state)
    try:
        yield {k: v for k, v in kwargs.items() if k != AMBIENT_KWARG}
    finally:
        _ambient.traced = previous


def _ambient_generator() -> TracedGenerator | None:
    """The stream legacy calls draw from in the running trace, or None (no rng_seed block)."""
    traced = getattr(_ambient, "traced", None)
    if traced is not None:
        return traced
    stack = _ambient_stack()
    if not stack:
        return None
    gen = stack[-1]  # graphc.trace inside a rng_seed block: the state is a constant of the graph
    root = current_context()
    while root is not None and root.parent is not None:  # of the whole trace, not of a loop body
        root = root.parent
    cache = getattr(_ambient, "constant", None)
    if cache is None or cache[0] is not root or cache[1] is not gen:
        assert root is not None  # called from a patched np.random function, inside a trace
        _ambient.constant = (root, gen, TracedGenerator(root.constant(call_state(gen).view(np.ndarray))))
    return _ambient.constant[2]


def _size(size: Any) -> tuple[int, ...]:
    if size is None:
        return ()
    if isinstance(size, Tracer):
        raise TraceError("a random draw's size must be static (Python ints), not a traced value", user_location())
    try:
        return tuple(int(d) for d in size) if isinstance(size, (tuple, list)) else (int(size),)
    except TypeError:
        raise TraceError(f"size must be an int or a tuple of ints, got {size!r}", user_location()) from None


def _static_int(value: Any, what: str) -> int:
    if isinstance(value, Tracer) or not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise TraceError(f"{what} must be a static int while tracing, got {value!r}", user_location())
    return int(value)


def reject_unsupported(method: str, **given: Any) -> None:
    for name, value in given.items():
        if value is not None:
            raise TraceError(f"Generator.{method}: argument {name}= is not supported while tracing", user_location())


class TracedGenerator:
    """A ``np.random.Generator`` in a trace: its state is a traced u64[6] (key, word position) and
    ``_drawn`` the words drawn from it so far in this trace (a static offset)."""

    def __init__(self, state: Any):  # a Tracer (numpy functions on tracers are typed as ndarrays)
        self._state = state
        self._ctx = state._ctx
        self._drawn = 0
        self._parts: tuple[Tracer, Tracer] | None = None

    def __repr__(self) -> str:
        return f"TracedGenerator(Philox, {self._drawn} words drawn in this trace)"

    # --- the bits ------------------------------------------------------------------------------
    def _draw(self, shape: tuple[int, ...], dist: str) -> Tracer:
        if current_context() is not self._ctx:
            raise TraceError(
                "random draws inside a traced loop or branch (or from a generator of another trace) are not "
                "supported: draw outside the loop, for all iterations at once",
                user_location(),
            )
        if self._parts is None:
            key = bind("slice", self._state, starts=(0,), stops=(2,), steps=(1,))
            counter = bind("slice", self._state, starts=(2,), stops=(6,), steps=(1,))
            self._parts = (key, counter)
        out = bind("philox", *self._parts, shape=shape, offset=self._drawn, dist=dist, runs=None)
        self._drawn += math.prod(shape)
        return out

    # --- numpy's Generator methods ---------------------------------------------------------------
    def random(self, size: Any = None, dtype: Any = np.float64, out: Any = None) -> Tracer:
        """Floats in [0, 1): numpy's stream exactly for float64; float32 keeps the top 24 of the
        53 bits (numpy's float32 path draws 32-bit halves: not its stream)."""
        reject_unsupported("random", out=out)
        u = self._draw(_size(size), "uniform")
        dt = np.dtype(dtype)
        if dt == np.float64:
            return u
        if dt != np.float32:
            raise TraceError(f"Generator.random: dtype must be float64 or float32, got {dt}", user_location())
        return ((u * 2.0**24).astype(np.int64) * 2.0**-24).astype(np.float32)  # exact: 24 bits

    def uniform(self, low: Any = 0.0, high: Any = 1.0, size: Any = None) -> Tracer:
        """``low + (high - low) * random()``, numpy's formula: numpy's stream for float64 bounds."""
        shape = _size(size) if size is not None else np.broadcast_shapes(np.shape(low), np.shape(high))
        return low + (high - low) * self._draw(tuple(shape), "uniform")

    def standard_normal(self, size: Any = None, dtype: Any = np.float64, out: Any = None) -> Tracer:
        """Box-Muller on two counter-indexed uniforms (numpy's ziggurat takes a data-dependent
        number of words: not its stream, but the same bits on any sharding)."""
        reject_unsupported("standard_normal", out=out)
        shape = _size(size)
        u1, u2 = self._draw(shape, "uniform"), self._draw(shape, "uniform")
        z = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos((2.0 * np.pi) * u2)
        dt = np.dtype(dtype)
        if dt not in (np.float64, np.float32):
            raise TraceError(f"Generator.standard_normal: dtype must be float64 or float32, got {dt}", user_location())
        return z if dt == np.float64 else z.astype(np.float32)

    def normal(self, loc: Any = 0.0, scale: Any = 1.0, size: Any = None) -> Tracer:
        shape = _size(size) if size is not None else tuple(np.broadcast_shapes(np.shape(loc), np.shape(scale)))
        return loc + scale * self.standard_normal(shape)

    def integers(self, low: Any, high: Any = None, size: Any = None, dtype: Any = np.int64, endpoint: bool = False):
        """``low + floor(random() * n)`` for ``n = high - low`` (+1 with ``endpoint``), static bounds
        (numpy rejects and redraws: not its stream). The bias is below n / 2**53."""
        low = _static_int(low, "integers: low")
        if high is None:
            low, high = 0, low
        high = _static_int(high, "integers: high") + (1 if endpoint else 0)
        n = high - low
        if n <= 0:
            raise TraceError(f"integers: low >= high ({low} >= {high})", user_location())
        if n > 2**53:
            raise TraceError(f"integers: a range of {n} values is wider than 2**53 while tracing", user_location())
        u = self._draw(_size(size), "uniform")
        k = np.minimum((u * float(n)).astype(np.int64), n - 1)
        return (k + low).astype(dtype)

    def _ranks(self, n: int) -> Tracer:
        """A random permutation of range(n): each element's rank among n random keys (ties, of
        probability ~n**2 / 2**54, broken by position)."""
        if n > MAX_PERMUTATION:
            raise TraceError(
                f"a traced permutation of {n} > {MAX_PERMUTATION} elements (pairwise ranks need n**2 work)",
                user_location(),
            )
        keys = self._draw((n,), "bits")
        pos = np.arange(n)
        below = (keys[None, :] < keys[:, None]) | ((keys[None, :] == keys[:, None]) & (pos[None, :] < pos[:, None]))
        rank = np.sum(below.astype(np.int64), axis=1)  # rank[i]: where element i goes
        return np.sum((rank[None, :] == pos[:, None]).astype(np.int64) * pos[None, :], axis=1)  # the i with rank r

    def permutation(self, x: Any, axis: int = 0) -> Tracer:
        """A shuffled ``arange(x)``, or ``x`` shuffled along ``axis`` (random keys ranked)."""
        if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
            return self._ranks(int(x))
        x = lift(x)
        if x.ndim == 0:
            raise TraceError("permutation: x must be an int or an array of at least one dimension", user_location())
        axis = _static_int(axis, "permutation: axis") % x.ndim
        return cast(Tracer, np.take(x, self._ranks(x.shape[axis]), axis=axis))

    def choice(
        self, a: Any, size: Any = None, replace: bool = True, p: Any = None, axis: int = 0, shuffle: bool = True
    ):
        """Samples of ``range(a)`` or of a 1-D ``a``: with replacement, ``integers``; without, the
        first ``size`` of a permutation."""
        reject_unsupported("choice", p=p)
        if axis != 0:
            raise TraceError("Generator.choice: only axis=0 is supported while tracing", user_location())
        population = None
        if isinstance(a, (int, np.integer)) and not isinstance(a, bool):
            n = int(a)
        else:
            population = lift(a)
            if population.ndim != 1:
                raise TraceError("Generator.choice: a must be an int or 1-D while tracing", user_location())
            n = population.shape[0]
        shape = _size(size)
        k = math.prod(shape)
        if replace:
            idx = self.integers(0, n, shape)
        else:
            if k > n:
                raise TraceError("Cannot take a larger sample than population when replace is False", user_location())
            idx = self._ranks(n)[:k].reshape(shape)
        return idx if population is None else population[idx]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise TraceError(
            f"Generator.{name} is not supported while tracing; graphc traces random, uniform, standard_normal, "
            "normal, integers, permutation and choice (docs/random.md)",
            user_location(),
        )


# --- the np.random module functions while tracing ----------------------------------------------------


def _default_rng(seed: Any = None) -> Any:
    """``np.random.default_rng`` in a trace: ``Generator(Philox(key=seed))`` with the state in the graph."""
    if isinstance(seed, TracedGenerator):
        return seed
    if seed is None:
        ambient = _ambient_generator()
        if ambient is None:
            raise TraceError(
                "np.random.default_rng() without a seed in traced code: pass a seed, a Generator argument, "
                "or call inside graphc.rng_seed(...)",
                user_location(),
            )
        key = ambient._draw((2,), "bits")
        return TracedGenerator(np.concatenate([key, np.zeros(4, np.uint64)]))
    if isinstance(seed, Tracer):
        if seed.ndim != 0 or seed.dtype.kind not in "iu":
            raise TraceError(
                f"default_rng: a traced seed must be an integer scalar, got {seed.dtype}{list(seed.shape)}",
                user_location(),
            )
        _warn_not_numpy()
        low = np.reshape(seed.astype(np.uint64), (1,))
        return TracedGenerator(np.concatenate([low, np.zeros(5, np.uint64)]))
    if isinstance(seed, np.random.Generator):
        return TracedGenerator(lift(call_state(seed).view(np.ndarray)))
    value = _static_int(seed, "default_rng: seed")
    if not 0 <= value < 2**128:
        raise TraceError(f"default_rng: seed must be in [0, 2**128), got {value}", user_location())
    _warn_not_numpy()
    state = np.array([value & (2**64 - 1), value >> 64, 0, 0, 0, 0], dtype=np.uint64)
    return TracedGenerator(lift(state))


def _warn_not_numpy() -> None:
    _warn(
        "np.random.default_rng(seed) in traced code is Generator(Philox(key=seed)), not numpy's default_rng "
        "(PCG64): its numbers are not numpy's (docs/random.md). np.random.Generator(np.random.Philox(seed)) "
        "passed as an argument draws numpy's numbers"
    )


def _legacy(method: str, adapt: Callable[..., tuple[tuple, dict]]) -> Callable:
    def draw(original: Callable, *args: Any, **kwargs: Any) -> Any:
        gen = _ambient_generator()
        if gen is None:
            _warn(f"np.random.{original.__name__} without graphc.rng_seed(...): numpy's numbers, frozen at trace time")
            return original(*args, **kwargs)
        a, k = adapt(*args, **kwargs)
        return getattr(gen, method)(*a, **k)

    return draw


def _dims(*dims: Any) -> tuple[tuple, dict]:
    return ((dims,) if dims else (None,)), {}


def _same(*args: Any, **kwargs: Any) -> tuple[tuple, dict]:
    return args, kwargs


def _randint(low: Any, high: Any = None, size: Any = None, dtype: Any = np.int64) -> tuple[tuple, dict]:
    return (low, high, size), {"dtype": dtype}


_LEGACY: dict[str, Callable] = {
    "rand": _legacy("random", _dims),
    "randn": _legacy("standard_normal", _dims),
    "random": _legacy("random", _same),
    "random_sample": _legacy("random", _same),
    "sample": _legacy("random", _same),
    "ranf": _legacy("random", _same),
    "uniform": _legacy("uniform", _same),
    "normal": _legacy("normal", _same),
    "standard_normal": _legacy("standard_normal", _same),
    "randint": _legacy("integers", _randint),
    "permutation": _legacy("permutation", _same),
    "choice": _legacy("choice", _same),
}
_NOT_DRAWS = {"default_rng", "Generator", "RandomState", "SeedSequence", "BitGenerator", "get_state", "set_state"}


def _warn(message: str) -> None:
    loc = user_location()
    if loc is None:
        warnings.warn(message, RandomWarning, stacklevel=3)
        return
    warnings.warn_explicit(message, RandomWarning, loc.file, loc.line)  # shown as file:line: RandomWarning: ...


def _patched(name: str, original: Callable) -> Callable:
    traced = _LEGACY.get(name)

    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        if current_context() is None:
            return original(*args, **kwargs)
        if name == "default_rng":
            return _default_rng(*args, **kwargs)
        if traced is not None:
            return traced(original, *args, **kwargs)
        _warn(f"np.random.{name} is not traced by graphc: numpy's result, frozen at trace time (docs/random.md)")
        return original(*args, **kwargs)

    return patched


@functools.lru_cache(maxsize=1)
def _replacements() -> tuple[tuple[Any, str, Callable], ...]:
    targets = []
    for name in dir(np.random):
        fn = getattr(np.random, name)
        if name.startswith("_") or isinstance(fn, type) or not callable(fn) or name in _NOT_DRAWS - {"default_rng"}:
            continue
        targets.append((np.random, name, _patched(name, fn)))
    return tuple(targets)


def patch_targets() -> list[tuple[Any, str, Callable]]:
    """(module, name, replacement) for entry.numpy_patches: ``np.random.default_rng`` and the
    module's functions (a class or a non-drawing helper is left alone). Built once: a trace
    pays one setattr per name."""
    return list(_replacements())
