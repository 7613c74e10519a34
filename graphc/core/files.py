"""Files graphc writes: atomically, with the user's umask, and the folder of its caches."""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import types
import typing
from collections.abc import Mapping
from typing import Any

from graphc.core.errors import GraphcError


def cache_dir(*parts: str) -> str:
    """graphc's cache folder joined with ``parts``: ``$GRAPHC_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/graphc``, else ``~/.cache/graphc``. Not created here (graphc/core/cache.py
    creates it, 0700, and checks it is the user's alone before using it)."""
    base = os.environ.get("GRAPHC_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME")
        # the XDG spec: a relative path is invalid and is ignored
        root = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(root, "graphc")
    return os.path.join(base, *parts)


def atomic_write(path: str, data: str | bytes, make_dirs: bool = False, mode: int = 0o666) -> None:
    """Write ``data`` to ``path`` so that no reader ever sees a partial file: write a temporary file
    in the same folder, then rename it over ``path``. The file gets ``mode`` under the user's umask
    (0644 with the usual 022; cache entries pass 0o600). An interrupted write leaves ``path`` as it
    was and no temporary file behind. ``make_dirs`` creates the folder first."""
    folder = os.path.dirname(os.path.abspath(path))
    if make_dirs:
        os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    payload = data.encode() if isinstance(data, str) else data
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_text(path: str, what: str, error: type[GraphcError] = GraphcError) -> str:
    """The text of the file ``path`` (a graphc document), or ``error`` naming it: missing, a folder,
    not UTF-8 text."""
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from None


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
    found = doc.get("kind") if isinstance(doc, dict) else None
    if isinstance(found, str) and found != kind:  # another graphc document (a pipeline plan read as a plan)
        raise error(f"{source}: not a graphc {what} (a graphc {found} document)")
    if not isinstance(doc, dict) or "version" not in doc or (kind is not None and found != kind):
        raise error(f"{source}: not a graphc {what}")
    if doc["version"] != version:
        raise error(f"{source}: {what} version {doc['version']!r} is not supported (expected {version})")
    return doc


def check_record(record: Any, where: str, error: type[GraphcError] = GraphcError) -> None:
    """Raise ``error`` unless every field of the dataclass ``record`` holds a value of its declared
    type (recursively through tuples, lists, mappings, unions and the dataclasses of the same
    package: a plan's records live beside it): what a document's reader calls on the value it
    built from a hand-edited file, so a wrong type is reported where it was read
    (``where.field[2]: expected int, got 'x'``), not as a TypeError wherever the value is first
    used. An int is a float; a bool is neither."""
    package = _package(type(record))
    hints = typing.get_type_hints(type(record))
    for f in dataclasses.fields(record):
        _check_value(getattr(record, f.name), hints[f.name], f"{where}.{f.name}", package, error)


def _package(cls: Any) -> str:
    """The package of the module defining ``cls``."""
    return cls.__module__.rpartition(".")[0]


def _check_value(value: Any, hint: Any, where: str, package: str, error: type[GraphcError]) -> None:
    origin = typing.get_origin(hint)
    if hint is Any:
        return
    if origin in (typing.Union, types.UnionType):
        _check_union(value, hint, where, package, error)
    elif origin in (tuple, list):
        _check_sequence(value, origin, typing.get_args(hint), where, package, error)
    elif origin in (Mapping, dict):
        if not isinstance(value, Mapping):
            raise error(f"{where}: expected a mapping, got {_short(value)}")
        key_hint, value_hint = typing.get_args(hint) or (Any, Any)
        for k, x in value.items():
            _check_value(k, key_hint, f"{where} key", package, error)
            _check_value(x, value_hint, f"{where}[{k!r}]", package, error)
    elif not _is_instance(value, hint):
        raise error(f"{where}: expected {_type_name(hint)}, got {_short(value)}")
    elif dataclasses.is_dataclass(hint) and _package(hint) == package:
        check_record(value, where, error)


def _check_union(value: Any, hint: Any, where: str, package: str, error: type[GraphcError]) -> None:
    for arm in typing.get_args(hint):
        try:
            _check_value(value, arm, where, package, error)
            return
        except GraphcError:
            continue
    raise error(f"{where}: expected {_type_name(hint)}, got {_short(value)}")


def _check_sequence(value: Any, origin: type, args: tuple, where: str, package: str, error: type[GraphcError]) -> None:
    if not isinstance(value, (tuple, list)) or not isinstance(value, origin):
        raise error(f"{where}: expected a {origin.__name__}, got {_short(value)}")
    items: list[Any] = list(value)
    if origin is tuple and args and args[-1] is not Ellipsis:  # tuple[X, Y]: one hint per item
        if len(items) != len(args):
            raise error(f"{where}: expected {len(args)} items, got {len(items)}")
        for i, (x, arm) in enumerate(zip(items, args)):
            _check_value(x, arm, f"{where}[{i}]", package, error)
        return
    for i, x in enumerate(items):
        _check_value(x, args[0] if args else Any, f"{where}[{i}]", package, error)


def _is_instance(value: Any, hint: Any) -> bool:
    if hint is type(None) or hint is None:
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return not isinstance(hint, type) or isinstance(value, hint)  # other annotations are not checked


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _short(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'...' if len(text) > 40 else ''}"


def dump_document(doc: dict) -> str:
    """``doc`` as JSON text a person can read and edit: one top-level key per line, and a list of
    records (the nodes of a plan) one record per line. Written by the C encoder (``indent``
    makes ``json`` fall back to its pure-Python encoder, several times slower on a large plan:
    docs/measurements.md#json-indent)."""
    lines = []
    for k, v in doc.items():
        key = json.dumps(k)
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            body = ",\n  ".join(json.dumps(x) for x in v)
            lines.append(f"{key}: [\n  {body}\n ]")
        else:
            lines.append(f"{key}: {json.dumps(v)}")
    return "{\n " + ",\n ".join(lines) + "\n}\n"
