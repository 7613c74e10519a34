"""The device mesh, and the machine profile the sharding cost model reads.

    Mesh("dp=2,tp=4")       named axes; devices 0..size-1 numbered row-major (the last axis varies fastest)
      .roles[axis]          what the axis is for, by its name: data (dp), model (tp), seq (sp), pipe (pp), free
      .links[axis]          Link(latency_s, bandwidth) of one ring link along that axis
      .profile              MachineProfile: flop rate, memory bandwidth, default link, collective overhead

The cost model (passes/sharding/strategies.py, passes/sharding/redistribute.py) reads only these
numbers. ``MachineProfile.default()`` holds fixed constants, so plans do not depend on the machine
they were made on; ``graphc calibrate`` measures this machine and stores a profile that every
``Mesh`` built without an explicit profile then uses (``load_profile``). Planning never measures.

A "device" is one thread of one process, so a link is two threads handing buffers to each other
and a collective call costs at least one barrier.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphc.core.errors import GraphcError
from graphc.core.files import atomic_write, cache_dir

MESH_EXAMPLE = "dp=2,tp=4"

# What an axis is for, by its name (any other name: "free"). The planner reads it
# (passes/sharding/roles.py): a data axis splits only batch dims, a seq axis only sequence dims,
# a pipe axis holds pipeline stages; model and free axes may split anything.
ROLE_NAMES = {
    "data": ("dp", "data", "batch"),
    "model": ("tp", "model", "mp"),
    "pipe": ("pp", "pipe"),
    "seq": ("sp", "seq"),
}
_ROLE_OF = {name: role for role, names in ROLE_NAMES.items() for name in names}


def axis_role(name: str) -> str:
    """The role of a mesh axis called ``name``: "data", "model", "pipe", "seq" or "free"."""
    return _ROLE_OF.get(name.lower(), "free")


LINKS_EXAMPLE = "dp=1GB/s:50us,tp=10GB/s:5us"


class MeshError(GraphcError, ValueError):
    """A bad mesh, link, or machine profile (argument, string or file). The message says what was expected."""


def _positive(value: Any, what: str, unit: str, allow_zero: bool = False) -> float:
    """``value`` as a float, or MeshError unless it is a finite number > 0 (>= 0 with ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise MeshError(f"{what} must be a number of {unit}, got {value!r}")
    x = float(value)
    if not math.isfinite(x) or x < 0 or (x == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise MeshError(f"{what} must be a finite number of {unit} {bound}, got {value!r}")
    return x


def _require(d: Any, key: str, what: str) -> Any:
    if not isinstance(d, dict):
        raise MeshError(f"{what} must be a JSON object, got {type(d).__name__}")
    if key not in d:
        raise MeshError(f"{what} has no {key!r} key")
    return d[key]


# --- links and machine profiles ---------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    """One link of a ring along a mesh axis, in the alpha-beta model: sending ``B`` bytes one way
    takes ``latency_s + B / bandwidth``. ``bandwidth`` counts message bytes per second, per direction."""

    latency_s: float
    bandwidth: float

    def __post_init__(self):
        object.__setattr__(self, "latency_s", _positive(self.latency_s, "Link.latency_s", "seconds"))
        object.__setattr__(self, "bandwidth", _positive(self.bandwidth, "Link.bandwidth", "bytes/s"))

    def __str__(self) -> str:
        return f"{self.bandwidth / 1e9:.3g}GB/s:{self.latency_s * 1e6:.3g}us"

    def to_json(self) -> dict:
        return {"latency_s": self.latency_s, "bandwidth": self.bandwidth}

    @classmethod
    def from_json(cls, d: Any, what: str = "link") -> Link:
        return cls(_require(d, "latency_s", what), _require(d, "bandwidth", what))


@dataclass(frozen=True)
class MachineProfile:
    """What one device of this machine can do; the cost model's only machine-dependent input."""

    flops: float  # float32 matmul flop/s of one device (one thread)
    mem_bandwidth: float  # bytes/s of one device, bytes read + bytes written
    link: Link  # the link of every mesh axis not given its own (thread to thread)
    collective_overhead_s: float  # fixed cost of one collective call (barrier / synchronisation)
    source: str = "default"  # "default", or where and when it was measured

    def __post_init__(self):
        object.__setattr__(self, "flops", _positive(self.flops, "MachineProfile.flops", "flop/s"))
        object.__setattr__(
            self, "mem_bandwidth", _positive(self.mem_bandwidth, "MachineProfile.mem_bandwidth", "bytes/s")
        )
        object.__setattr__(
            self,
            "collective_overhead_s",
            _positive(self.collective_overhead_s, "MachineProfile.collective_overhead_s", "seconds", allow_zero=True),
        )
        if not isinstance(self.link, Link):
            raise MeshError(f"MachineProfile.link must be a Link, got {self.link!r}")
        if not isinstance(self.source, str):
            raise MeshError(f"MachineProfile.source must be a string, got {self.source!r}")

    @classmethod
    def default(cls) -> MachineProfile:
        """Fixed constants, so that plans (and the tests that check them) do not depend on the machine.

        Roughly one x86 core of a recent laptop or server, one thread per device:
          flops 100e9               float32 sgemm with AVX2 FMA on one core (~2.5 GHz x 32 flop/cycle, ~80 %)
          mem_bandwidth 8e9         np.copyto of a large buffer on one core, read + write bytes
          link 20 us, 6e9 B/s       a thread-to-thread handoff: an Event round trip, then a copy of the
                                    message (read + write, so about half of one core's memory bandwidth)
          collective_overhead 20us  a threading.Barrier wait across the threads taking part
        """
        return cls(flops=100e9, mem_bandwidth=8e9, link=Link(20e-6, 6e9), collective_overhead_s=20e-6, source="default")

    def to_json(self) -> dict:
        return {
            "flops": self.flops,
            "mem_bandwidth": self.mem_bandwidth,
            "link": self.link.to_json(),
            "collective_overhead_s": self.collective_overhead_s,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, d: Any) -> MachineProfile:
        what = "machine profile"
        link = Link.from_json(_require(d, "link", what), "machine profile 'link'")
        source = d.get("source", "unknown")
        return cls(
            _require(d, "flops", what),
            _require(d, "mem_bandwidth", what),
            link,
            _require(d, "collective_overhead_s", what),
            source,
        )

    def describe(self) -> str:
        """A small table of the numbers, in GF/s, GB/s and us."""
        rows = [
            ("float32 matmul, one device", f"{self.flops / 1e9:8.1f} GF/s"),
            ("memory bandwidth (read + write)", f"{self.mem_bandwidth / 1e9:8.2f} GB/s"),
            ("link bandwidth (per direction)", f"{self.link.bandwidth / 1e9:8.2f} GB/s"),
            ("link latency", f"{self.link.latency_s * 1e6:8.1f} us"),
            ("collective overhead (per call)", f"{self.collective_overhead_s * 1e6:8.1f} us"),
        ]
        lines = [f"  {name:<33}{value}" for name, value in rows]
        lines.append(f"  source: {self.source}")
        return "\n".join(lines)


# --- the stored profile -----------------------------------------------------------------------


def profile_path() -> str:
    """``$GRAPHC_PROFILE``, else ``$GRAPHC_CACHE_DIR/profile.json`` (cache dir default ~/.cache/graphc)."""
    explicit = os.environ.get("GRAPHC_PROFILE")
    if explicit:
        return explicit
    return cache_dir("profile.json")


def save_profile(profile: MachineProfile, path: str | None = None) -> str:
    """Write ``profile`` as JSON to ``path`` (default ``profile_path()``) atomically; return the path."""
    path = path or profile_path()
    atomic_write(path, json.dumps(profile.to_json(), indent=1) + "\n", make_dirs=True)
    return path


def load_profile(path: str | None = None) -> MachineProfile:
    """The profile stored at ``path`` (default ``profile_path()``), or ``MachineProfile.default()``
    when there is no such file. Never measures: planning stays deterministic and fast."""
    path = path or profile_path()
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return MachineProfile.default()
    except OSError as exc:
        raise MeshError(f"cannot read machine profile {path}: {exc.strerror}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise MeshError(
            f"{path}:{exc.lineno}:{exc.colno}: not a machine profile (bad JSON: {exc.msg}); "
            f"rerun 'graphc calibrate' or delete the file"
        ) from None
    try:
        return MachineProfile.from_json(doc)
    except MeshError as exc:
        raise MeshError(f"{path}: {exc}; rerun 'graphc calibrate' or delete the file") from None


def _bad_mesh(text: Any, why: str) -> MeshError:
    return MeshError(f"bad mesh {text!r}: {why}")


def _check_name(name: Any, text: Any) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise _bad_mesh(
            text, f"axis name {name!r} is not a Python identifier (letters, digits and _, not starting with a digit)"
        )
    return name


def _check_size(size: Any, name: str, text: Any) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
        raise _bad_mesh(text, f"axis {name!r} has size {size!r} ({type(size).__name__}); expected an integer >= 1")
    if size < 1:
        raise _bad_mesh(text, f"axis {name!r} has size {size}; expected an integer >= 1")
    return int(size)


def parse_axes(text: str) -> dict[str, int]:
    """``"dp=2,tp=4"`` -> ``{"dp": 2, "tp": 4}``."""
    expected = f"expected NAME=SIZE[,NAME=SIZE...] such as {MESH_EXAMPLE}"
    if not text.strip():
        raise _bad_mesh(text, expected)
    axes: dict[str, int] = {}
    for piece in text.split(","):
        name, eq, size = (s.strip() for s in piece.partition("="))
        if not eq or not name or not size:
            raise _bad_mesh(text, f"{piece.strip()!r} is not NAME=SIZE; {expected}")
        _check_name(name, text)
        if name in axes:
            raise _bad_mesh(text, f"axis {name!r} appears twice")
        if not size.isdigit():
            raise _bad_mesh(text, f"axis {name!r} has size {size!r}; expected an integer >= 1")
        axes[name] = _check_size(int(size), name, text)
    return axes


def _check_axes(axes: dict) -> dict[str, int]:
    if not axes:
        raise _bad_mesh(axes, f"a mesh needs at least one axis, such as {{'dp': 2}} or {MESH_EXAMPLE!r}")
    return {_check_name(name, axes): _check_size(size, name, axes) for name, size in axes.items()}


class Mesh:
    """Named axes of devices: ``Mesh({"dp": 2, "tp": 4})`` or ``Mesh("dp=2,tp=4")``.

    ``links`` overrides the link of some axes (``{"tp": Link(5e-6, 10e9)}``); the others use
    ``profile.link``. ``profile`` defaults to ``load_profile()`` (the stored one, else the defaults).
    ``Mesh(other_mesh, links=..., profile=...)`` copies ``other_mesh`` with those replaced.
    """

    def __init__(
        self,
        axes: Mesh | dict[str, int] | str,
        links: dict[str, Link] | None = None,
        profile: MachineProfile | None = None,
    ):
        overrides: dict[str, Link] = {}
        if isinstance(axes, Mesh):
            overrides = dict(axes._overrides)
            profile = axes.profile if profile is None else profile
            axes = dict(zip(axes.axis_names, axes.shape))
        elif isinstance(axes, str):
            axes = parse_axes(axes)
        elif isinstance(axes, dict):
            axes = _check_axes(axes)
        else:
            raise MeshError(
                f"a mesh is a dict like {{'dp': 2, 'tp': 4}}, a string like {MESH_EXAMPLE!r} "
                f"or a Mesh, got {type(axes).__name__}"
            )
        if profile is None:
            profile = load_profile()
        if not isinstance(profile, MachineProfile):
            raise MeshError(f"mesh profile must be a MachineProfile, got {type(profile).__name__}")
        if links is not None:
            if not isinstance(links, dict):
                raise MeshError(f"mesh links must be a dict {{axis name: Link}}, got {type(links).__name__}")
            for name, link in links.items():
                if name not in axes:
                    raise MeshError(f"link given for axis {name!r}, but the mesh has axes {', '.join(axes)}")
                if not isinstance(link, Link):
                    raise MeshError(f"link of axis {name!r} must be a Link, got {link!r}")
            overrides.update(links)
        self._axes: dict[str, int] = dict(axes)
        self._overrides: dict[str, Link] = overrides
        self._profile = profile

    # --- shape ------------------------------------------------------------------------------
    @property
    def axis_names(self) -> tuple[str, ...]:
        return tuple(self._axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._axes.values())

    @property
    def ndim(self) -> int:
        return len(self._axes)

    @property
    def size(self) -> int:
        return math.prod(self._axes.values())

    @property
    def profile(self) -> MachineProfile:
        return self._profile

    @property
    def roles(self) -> dict[str, str]:
        """Every axis's role by its name (``axis_role``): {"dp": "data", "tp": "model", ...}."""
        return {name: axis_role(name) for name in self._axes}

    def axis_with_role(self, role: str) -> str | None:
        """The first axis whose role is ``role``, or None."""
        return next((name for name in self._axes if axis_role(name) == role), None)

    @property
    def links(self) -> dict[str, Link]:
        """The link of every axis (a fresh dict)."""
        return {name: self._overrides.get(name, self._profile.link) for name in self._axes}

    def axis_index(self, axis: str | int) -> int:
        """The position of ``axis`` (a name, or an index that is checked)."""
        if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool):
            if not 0 <= axis < self.ndim:
                raise MeshError(f"mesh {self} has {self.ndim} axes; axis index {axis} is out of range")
            return int(axis)
        if axis not in self._axes:
            raise MeshError(f"mesh {self} has no axis {axis!r} (axes: {', '.join(self._axes)})")
        return self.axis_names.index(axis)

    # --- devices ----------------------------------------------------------------------------
    def devices(self) -> list[int]:
        return list(range(self.size))

    def coord(self, device: int) -> tuple[int, ...]:
        """Row-major: the last axis varies fastest."""
        if isinstance(device, bool) or not isinstance(device, (int, np.integer)) or not 0 <= device < self.size:
            raise MeshError(f"mesh {self} has devices 0..{self.size - 1}, got {device!r}")
        coord = []
        for n in reversed(self.shape):
            device, c = divmod(int(device), n)
            coord.append(c)
        return tuple(reversed(coord))

    def device_id(self, coord) -> int:
        coord = tuple(coord)
        if len(coord) != self.ndim or not all(0 <= c < n for c, n in zip(coord, self.shape)):
            raise MeshError(f"mesh {self} has coordinates in {tuple(n - 1 for n in self.shape)} (from 0), got {coord}")
        device = 0
        for c, n in zip(coord, self.shape):
            device = device * n + int(c)
        return device

    def group(self, device: int, axis: str | int) -> list[int]:
        """The devices that share every coordinate of ``device`` except the one along ``axis``,
        ordered by that coordinate (the ring a collective along ``axis`` runs over)."""
        a = self.axis_index(axis)
        c = self.coord(device)
        return [self.device_id(c[:a] + (r,) + c[a + 1 :]) for r in range(self.shape[a])]

    def groups(self, axis: str | int) -> list[list[int]]:
        """Every group along ``axis``, ordered by their first device."""
        a = self.axis_index(axis)
        return [self.group(d, a) for d in self.devices() if self.coord(d)[a] == 0]

    # --- files and comparison ---------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "axes": dict(self._axes),
            "links": {name: link.to_json() for name, link in self.links.items()},
            "profile": self._profile.to_json(),
        }

    @classmethod
    def from_json(cls, d: Any) -> Mesh:
        axes = _require(d, "axes", "mesh")
        if not isinstance(axes, dict):
            raise MeshError(f"mesh 'axes' must be an object {{name: size}}, got {axes!r}")
        profile = MachineProfile.from_json(_require(d, "profile", "mesh"))
        links_json = _require(d, "links", "mesh")
        if not isinstance(links_json, dict):
            raise MeshError(f"mesh 'links' must be an object {{axis name: link}}, got {links_json!r}")
        links = {name: Link.from_json(link, f"mesh link {name!r}") for name, link in links_json.items()}
        # Only links that differ from the profile's are overrides, as when the mesh was built.
        return cls(axes, {name: link for name, link in links.items() if link != profile.link}, profile)

    def _key(self) -> tuple:
        return (tuple(self._axes.items()), tuple(self.links.items()), self._profile)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mesh):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Mesh({', '.join(f'{name}={size}' for name, size in self._axes.items())})"

    def __str__(self) -> str:
        return ",".join(f"{name}={size}" for name, size in self._axes.items())


def as_mesh(x: Any) -> Mesh:
    """``x`` if it is a Mesh, else ``Mesh(x)`` for a dict or a string like ``"dp=2,tp=4"``."""
    if isinstance(x, Mesh):
        return x
    if isinstance(x, (dict, str)):
        return Mesh(x)
    raise MeshError(
        f"a mesh is a dict like {{'dp': 2, 'tp': 4}}, a string like {MESH_EXAMPLE!r} "
        f"or a Mesh, got {type(x).__name__} {x!r}"
    )


# --- link strings -----------------------------------------------------------------------------

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


def _quantity(text: str, units: dict[str, tuple[int, int]], what: str, piece: str, example: str) -> float:
    m = _QUANTITY.match(text)
    if not m or m.group(3) not in units:
        raise MeshError(
            f"bad {what} {text.strip()!r} in {piece.strip()!r}: expected a number with a unit "
            f"({', '.join(units)}) such as {example}"
        )
    power10, power2 = units[m.group(3)]
    value = float(f"{m.group(1)}e{int(m.group(2) or 0) + power10}") * 2.0**power2
    if value <= 0:
        raise MeshError(f"bad {what} {text.strip()!r} in {piece.strip()!r}: it must be > 0")
    return value


def parse_links(text: str) -> dict[str, Link]:
    """``"dp=1GB/s:50us,tp=10GB/s:5us"`` -> ``{"dp": Link(50e-6, 1e9), "tp": Link(5e-6, 10e9)}``.

    Each piece is NAME=BANDWIDTH:LATENCY. Bandwidth units B/s, KB/s, MB/s, GB/s, TB/s (powers of
    1000) and KiB/s, MiB/s, GiB/s, TiB/s (powers of 1024); latency units s, ms, us, ns.
    """
    expected = f"expected NAME=BANDWIDTH:LATENCY[,...] such as {LINKS_EXAMPLE}"
    if not isinstance(text, str) or not text.strip():
        raise MeshError(f"bad links {text!r}: {expected}")
    links: dict[str, Link] = {}
    for piece in text.split(","):
        name, eq, rest = piece.partition("=")
        name = name.strip()
        bandwidth, colon, latency = rest.partition(":")
        if not eq or not colon or not name:
            raise MeshError(f"bad link {piece.strip()!r} in {text!r}: {expected}")
        if not name.isidentifier():
            raise MeshError(f"bad link {piece.strip()!r}: axis name {name!r} is not a Python identifier")
        if name in links:
            raise MeshError(f"bad links {text!r}: axis {name!r} appears twice")
        links[name] = Link(
            _quantity(latency, LATENCY_UNITS, "latency", piece, "50us"),
            _quantity(bandwidth, BANDWIDTH_UNITS, "bandwidth", piece, "10GB/s"),
        )
    return links
