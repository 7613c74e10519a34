"""Files graphc writes: atomically, with the user's umask, and the folder of its caches."""

from __future__ import annotations

import json
import os
import secrets
from typing import Any

from graphc.core.errors import GraphcError


def cache_dir(*parts: str) -> str:
    """``$GRAPHC_CACHE_DIR`` (default ``~/.cache/graphc``), joined with ``parts``. Not created here."""
    base = os.environ.get("GRAPHC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "graphc")
    return os.path.join(base, *parts)


def atomic_write(path: str, data: str | bytes, make_dirs: bool = False) -> None:
    """Write ``data`` to ``path`` so that no reader ever sees a partial file: write a temporary file
    in the same folder, then rename it over ``path``. The file gets the permissions of a new file
    under the user's umask (0644 with the usual 022). An interrupted write leaves ``path`` as it
    was and no temporary file behind. ``make_dirs`` creates the folder first."""
    folder = os.path.dirname(os.path.abspath(path))
    if make_dirs:
        os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    payload = data.encode() if isinstance(data, str) else data
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_document(
    text: str,
    source: str,
    what: str,
    version: int,
    kind: str | None = None,
    error: type[GraphcError] = GraphcError,
) -> dict[str, Any]:
    """The JSON object in ``text`` (a graphc document: a plan, a program), checked for its
    ``version`` and, where one is given, its ``kind``; ``error`` names ``source`` and, for bad
    JSON, the line and column."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{source}:{exc.lineno}:{exc.colno}: not a graphc {what} (bad JSON: {exc.msg})") from None
    if not isinstance(doc, dict) or "version" not in doc or (kind is not None and doc.get("kind") != kind):
        raise error(f"{source}: not a graphc {what}")
    if doc["version"] != version:
        raise error(f"{source}: {what} version {doc['version']!r} is not supported (expected {version})")
    return doc


def dump_document(doc: dict) -> str:
    """``doc`` as JSON text a person can read and edit: one top-level key per line, and a list of
    records (the nodes of a plan) one record per line. Written by the C encoder (``indent``
    makes ``json`` fall back to pure Python, 5-10x slower on a 10 MB plan)."""
    lines = []
    for k, v in doc.items():
        key = json.dumps(k)
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            body = ",\n  ".join(json.dumps(x) for x in v)
            lines.append(f"{key}: [\n  {body}\n ]")
        else:
            lines.append(f"{key}: {json.dumps(v)}")
    return "{\n " + ",\n ".join(lines) + "\n}\n"
