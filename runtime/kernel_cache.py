"""The disk cache of compiled fused kernels: graphc's own, in place of Numba's ``cache=True``.

Numba's cache keeps pickles (an index and the compiled code) next to the source and unpickles
whatever it finds there under the expected name, so a planted file would run as code, and a
corrupt one breaks every later jit. Kernels use this cache instead (``attach_disk_cache``): one
sealed entry (graphc/core/cache.py) per kernel and signature in ``<cache>/kernels``, named
``k_<source hash>.<key hash>.nbk``. The key is what Numba keys its own index by (argument
types, the CPU target, the bytecode) plus the kernel source's SHA-256 and Numba's version. An
entry is unpickled only after its seal shows it was written for exactly this key and is
intact; anything else is discarded with a CacheWarning and the kernel compiled again.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from typing import Any

import numba
from numba.core import compiler, serialize

from graphc.core.cache import read_entry, warn_cache, write_entry


class KernelDiskCache:
    """What a Numba dispatcher asks its cache for (``load_overload`` / ``save_overload``, and
    ``enable`` / ``disable`` / ``flush`` / ``cache_path``: the methods of Numba's cache classes,
    which the dispatcher calls without checking a type), backed by
    sealed entries in ``folder``. ``name`` is the kernel's file stem (``k_<digest>``) and
    ``source_hash`` the SHA-256 of its source."""

    def __init__(self, py_func: Any, folder: str, name: str, source_hash: str):
        self._py_func = py_func
        self._folder = folder
        self._name = name
        self._source_hash = source_hash
        self._enabled = True

    @property
    def cache_path(self) -> str:
        return self._folder

    def enable(self) -> None:
        self._enabled = True

    def disable(self) -> None:
        self._enabled = False

    def flush(self) -> None:
        """Nothing to do: an entry is replaced when its signature is compiled again."""

    def entry(self, sig: Any, codegen: Any) -> tuple[str, str]:
        """(path, key) of the entry for argument types ``sig`` compiled by ``codegen``."""
        bytecode = hashlib.sha256(self._py_func.__code__.co_code).hexdigest()
        key = f"kernel {self._source_hash} numba {numba.__version__} {sig!r} {codegen.magic_tuple()!r} {bytecode}"
        stem = hashlib.sha256(key.encode()).hexdigest()[:16]
        return os.path.join(self._folder, f"{self._name}.{stem}.nbk"), key

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        if not self._enabled:
            return None
        target_context.refresh()  # as Numba's own cache does before loading
        path, key = self.entry(sig, target_context.codegen())
        payload = read_entry(path, key)  # None unless the seal checks out: nothing else is unpickled
        if payload is None:
            return None
        try:
            return compiler.CompileResult._rebuild(target_context, *pickle.loads(payload))
        except Exception as exc:  # sealed by graphc, yet not loadable by this Numba: compile again
            warn_cache(
                path, f"compiled kernel does not load ({type(exc).__name__}: {exc})", "discarded; compiled again"
            )
            try:
                os.unlink(path)
            except OSError:
                pass
            return None

    def save_overload(self, sig: Any, cres: Any) -> None:
        if not self._enabled or not _cachable(cres):
            return
        path, key = self.entry(sig, cres.codegen)
        write_entry(path, key, serialize.dumps(cres._reduce()))


def _cachable(cres: Any) -> bool:
    """Numba's own rule: code with lifted loops or dynamic globals cannot be cached."""
    return all(x.can_cache for x in cres.lifted) and not cres.library.has_dynamic_globals


def attach_disk_cache(dispatcher: Any, folder: str, name: str, source_hash: str) -> None:
    """Give a Numba dispatcher (``numba.njit`` without ``cache=True``) the sealed disk cache. Numba
    keeps a dispatcher's cache in ``_cache`` (what ``cache=True`` sets to its pickle cache); it is
    consulted only when a signature is compiled, so this must run before the first call."""
    dispatcher._cache = KernelDiskCache(dispatcher.py_func, folder, name, source_hash)
