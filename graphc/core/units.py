"""Byte sizes and durations, as users write them and as graphc prints them."""

from __future__ import annotations

import math
import re

import numpy as np

from graphc.core.errors import GraphcError

_SIZE = re.compile(r"^\s*([-+]?)(\d+(?:\.\d+)?(?:e[-+]?\d+)?)\s*([KMGT]?i?B?)\s*$", re.IGNORECASE)
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


def parse_bytes(value, *, allow_zero: bool = False, what: str = "memory size") -> int | None:
    """``2GiB``, ``512MB``, ``1e9`` (text or a number) or an int -> bytes (None stays None); a
    fraction of a byte is dropped. ``what`` names the quantity (the flag's or keyword's) in the
    error; ``allow_zero`` takes 0 (``0``, ``0B``, ``0MiB``) for sizes where 0 means "none" (a
    gradient bucket of 0 bytes: no buckets)."""
    if value is None:
        return None
    sign = "non-negative" if allow_zero else "positive (at least 1 byte)"
    shown = repr(value) if isinstance(value, str) else str(value)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        size = float(value) if abs(value) < 2**63 else float("inf")
    elif isinstance(value, (float, np.floating)):
        size = float(value)
    else:
        m = _SIZE.match(str(value))
        unit = m.group(3).upper() if m else None
        if not m or unit not in _UNITS:
            raise GraphcError(f"bad {what} {value!r}: expected a number of bytes or e.g. 2GiB, 512MB, 64KiB")
        size = float(m.group(1) + m.group(2)) * _UNITS[unit]
    if not math.isfinite(size) or size >= 2**63:
        raise GraphcError(f"bad {what} {shown}: expected a {sign.split()[0]} number of bytes under 2**63")
    if int(size) < 0 or (int(size) == 0 and not allow_zero):  # 0.5 bytes counts as 0
        raise GraphcError(f"{what} must be {sign}, got {shown}")
    return int(value) if isinstance(value, (int, np.integer)) else int(size)


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


# --- bandwidths and latencies (link strings, graphc/core/mesh.py: parse_links) ---------------------

# unit -> (power of 10, power of 2): "50us" is parsed as the decimal 50e-6, exactly like the literal
BANDWIDTH_UNITS = {
    "B/s": (0, 0),
    "KB/s": (3, 0),
    "kB/s": (3, 0),
    "MB/s": (6, 0),
    "GB/s": (9, 0),
    "TB/s": (12, 0),
    "KiB/s": (0, 10),
    "MiB/s": (0, 20),
    "GiB/s": (0, 30),
    "TiB/s": (0, 40),
}
LATENCY_UNITS = {"s": (0, 0), "ms": (-3, 0), "us": (-6, 0), "µs": (-6, 0), "ns": (-9, 0)}
_QUANTITY = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:[eE]([-+]?\d+))?\s*(\S+?)\s*$")


def parse_quantity(text: str, units: dict[str, tuple[int, int]]) -> float | None:
    """``"50us"`` with ``LATENCY_UNITS`` -> 5e-05 (a number and one of ``units``), or None when
    ``text`` is not such a quantity. Not checked for sign or size: the caller says what it needs."""
    m = _QUANTITY.match(text)
    if not m or m.group(3) not in units:
        return None
    power10, power2 = units[m.group(3)]
    return float(f"{m.group(1)}e{int(m.group(2) or 0) + power10}") * 2.0**power2
