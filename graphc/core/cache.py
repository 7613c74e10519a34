"""graphc's on-disk caches: which folders graphc trusts, and sealed entries.

The caches (compiled kernels in ``kernels/``, solved plans in ``plans/``) live in the folder
``graphc.core.files.cache_dir`` names. What is trusted and what is checked (docs/guide/jit.md's threat
model):

* A cache folder is used only when it is the user's alone: owned by the user and writable by no
  one else, and no folder above it is world-writable without the sticky bit. Folders graphc
  creates are 0700. Otherwise graphc gives one ``CacheWarning`` naming the folder and why, and
  works without that cache.
* An entry file is read only when it is a regular file (not a link) with the same owner and
  mode rules; entries are written 0600, atomically.
* Every entry is sealed: its first line holds the SHA-256 of the key it was built from and of its
  payload, and the payload's length. A truncated, corrupt, planted or stale entry fails its seal
  and is discarded with a warning and rebuilt; its payload is never unpickled or run before the
  seal checks out, and a bad entry is never fatal.

A seal guards against damage, mix-ups and files nobody wrote through graphc, not against someone
who can already write to the user's own folder (they could change the user's code as well).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import threading
import warnings

from graphc.core.errors import CacheWarning
from graphc.core.files import atomic_write, cache_dir

MAGIC = b"graphc-cache-entry 1"
_HEADER_MAX = 256  # bytes: a header is about 180

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def warn_cache(path: str, why: str, consequence: str) -> None:
    """One CacheWarning per path and reason in a process: ``PATH: WHY; CONSEQUENCE``."""
    with _warned_lock:
        if (path, why) in _warned:
            return
        _warned.add((path, why))
    warnings.warn(CacheWarning(f"{path}: {why}; {consequence}"), stacklevel=3)


def unsafe_reason(st: os.stat_result) -> str | None:
    """Why a cache folder or file with this ``stat`` is not the user's alone, or None."""
    me = os.geteuid()
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid != me:
        return f"is owned by uid {st.st_uid}, not by you (uid {me})"
    if mode & stat.S_IWOTH:
        return f"is world-writable (mode {mode:04o})"
    if mode & stat.S_IWGRP:
        return f"is group-writable (mode {mode:04o})"
    return None


def _missing_folders(path: str) -> tuple[str, list[str]]:
    """The deepest existing folder on the way to ``path``, and the folders below it that are missing
    (outermost first)."""
    missing = []
    p = path
    while not os.path.isdir(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p, missing[::-1]


def _make_private(missing: list[str]) -> None:
    """Create the ``missing`` folders, outermost first, each 0700 (``os.makedirs`` gives only the
    last one its mode)."""
    for p in missing:
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:
            pass  # made meanwhile by another process; checked below like any folder


def _folder_problem(path: str, strict: str) -> tuple[str, str] | None:
    """(folder, why) for the first folder from ``path`` up that makes it untrustworthy: ``strict``
    (the cache folder) and the folders inside graphc's cache root must be the user's alone; the
    folders above must not let others replace them (world-writable without the sticky bit)."""
    root = os.path.abspath(cache_dir())
    p = path
    while True:
        st = os.stat(p)
        inside = p == strict or p == root or p.startswith(root + os.sep)
        if inside:
            why = unsafe_reason(st)
            if why is not None:
                return p, why
        elif st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
            return p, "is world-writable without the sticky bit (anyone can replace the folders in it)"
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p = parent


def private_dir(path: str) -> str | None:
    """``path`` (absolute) ready to hold cache entries, created 0700 when missing; None, after a
    CacheWarning naming the folder and why, when it cannot be created or is not the user's alone
    (checked along ``path`` and, when a symbolic link is on it, along the path it resolves to)."""
    path = os.path.abspath(path)
    try:
        existing, missing = _missing_folders(path)
        problem = _folder_problem(existing, path)  # nothing is created under a folder others control
        if problem is None and missing:
            _make_private(missing)
            problem = _folder_problem(path, path)
        real = os.path.realpath(path)
        if problem is None and real != path:  # a link (or one above): the folders it leads through too
            problem = _folder_problem(real, real)
    except OSError as exc:
        warn_cache(path, f"cannot create or inspect the cache folder ({exc.strerror})", "working without this cache")
        return None
    if problem is not None:
        folder, why = problem
        warn_cache(
            folder,
            f"cache folder {why}",
            "working without this cache (make it yours alone, e.g. chmod 700, or set GRAPHC_CACHE_DIR)",
        )
        return None
    return path


# --- sealed entries ------------------------------------------------------------------------------


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def seal(key: str, payload: bytes) -> bytes:
    """``payload`` behind its header: the SHA-256 of ``key`` (what it was built from), of the payload,
    and the payload's length."""
    header = b"%s key=%s sha256=%s bytes=%d\n" % (
        MAGIC,
        _digest(key.encode()).encode(),
        _digest(payload).encode(),
        len(payload),
    )
    return header + payload


def unseal(blob: bytes, key: str) -> tuple[bytes | None, str]:
    """(payload, "") when ``blob`` is an intact entry built from ``key``, else (None, why not)."""
    end = blob.find(b"\n", 0, _HEADER_MAX)
    fields = blob[:end].split(b" ") if end >= 0 else []
    if len(fields) != 5 or b" ".join(fields[:2]) != MAGIC:
        return None, "not a graphc cache entry (no seal)"
    values = dict(f.split(b"=", 1) for f in fields[2:] if b"=" in f)
    payload = blob[end + 1 :]
    if values.get(b"key") != _digest(key.encode()).encode():
        return None, "cache entry was built from something else (its key does not match)"
    if values.get(b"bytes") != str(len(payload)).encode():
        said = values.get(b"bytes", b"?").decode(errors="replace")
        return None, f"truncated or padded cache entry ({len(payload)} bytes, its seal says {said})"
    if values.get(b"sha256") != _digest(payload).encode():
        return None, "corrupt cache entry (its SHA-256 does not match its seal)"
    return payload, ""


def _discard(path: str, why: str) -> None:
    warn_cache(path, why, "discarded; it is rebuilt")
    try:
        os.unlink(path)
    except OSError:
        pass  # rebuilt entries replace it anyway


def read_entry(path: str, key: str) -> bytes | None:
    """The payload of the sealed entry at ``path`` built from ``key``; None when there is none, or
    (after a warning, the file removed) when it is not the user's alone or fails its seal."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            _discard(path, "cache entry is a symbolic link")
        else:
            warn_cache(path, f"cannot read the cache entry ({exc.strerror})", "rebuilt")
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            warn_cache(path, "cache entry is not a regular file", "not read; rebuilt")
            return None
        why = unsafe_reason(st)
        if why is not None:
            _discard(path, f"cache entry {why}")
            return None
        blob = f.read()
    payload, why = unseal(blob, key)
    if payload is None:
        _discard(path, why)
    return payload


def write_entry(path: str, key: str, payload: bytes) -> bool:
    """Write ``payload`` sealed with ``key`` to ``path`` (atomically, 0600). A cache that cannot be
    written is not an error: a warning, and False."""
    try:
        atomic_write(path, seal(key, payload), mode=0o600)
    except OSError as exc:
        warn_cache(os.path.dirname(path), f"cannot write to the cache folder ({exc.strerror})", "not cached")
        return False
    return True
