"""Byte sizes and durations, as users write them and as graphc prints them."""

from __future__ import annotations

import re

import numpy as np

from graphc.core.errors import GraphcError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "TB": 1e12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
    "K": 2**10,
    "M": 2**20,
    "G": 2**30,
    "T": 2**40,
}


def parse_bytes(value) -> int | None:
    """``2GiB``, ``512MB``, ``1e9`` or an int -> bytes (None stays None)."""
    if value is None:
        return None
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if value <= 0:
            raise GraphcError(f"memory limit must be positive, got {value}")
        return int(value)
    if isinstance(value, float):
        return parse_bytes(int(value))
    m = _SIZE.match(str(value))
    unit = m.group(2).upper() if m else None
    if not m or unit not in _UNITS:
        raise GraphcError(f"bad memory size {value!r}: expected a number of bytes or e.g. 2GiB, 512MB, 64KiB")
    return parse_bytes(int(float(m.group(1)) * _UNITS[unit]))


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def fmt_time(t: float) -> str:
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    return f"{t * 1e6:.1f} us"


def fmt_rate(flops: float) -> str:
    """flop/s in GF/s, or TF/s from 1e12 on."""
    return f"{flops / 1e12:.4g} TF/s" if flops >= 1e12 else f"{flops / 1e9:.4g} GF/s"
