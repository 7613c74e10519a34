"""The device mesh: named axes of devices.

    Mesh("dp=2,tp=4")       named axes; devices 0..size-1 numbered row-major (the last axis varies fastest)
      .roles[axis]          what the axis is for, by its name (graphc/core/roles.py): data (dp),
                            model (tp), seq (sp), pipe (pp), free
      .links[axis]          Link(latency_s, bandwidth) of one ring link along that axis
      .profile              MachineProfile (graphc/core/profile.py): matmul rate per dtype, memory
                            bandwidth, the links inside and between nodes, collective overhead

An axis's link is, first found: the mesh's own override (``links=``, ``--link``, ``parse_links``),
the profile's link for that axis name, the profile's inter-node link for data and pipe axes, its
link inside a node (``MachineProfile.link_for``).

A mesh built without an explicit profile uses the one ``graphc calibrate`` stored, else the fixed
default (``load_profile``, graphc/core/profiles.py, which also holds the presets of hardware graphc
does not run on: ``--profile h100-sxm``). Planning never measures.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphc.core.errors import MeshError
from graphc.core.profile import Link, MachineProfile, required_key
from graphc.core.profiles import load_profile
from graphc.core.roles import axis_role
from graphc.core.units import BANDWIDTH_UNITS, LATENCY_UNITS, parse_quantity

MESH_EXAMPLE = "dp=2,tp=4"
LINKS_EXAMPLE = "dp=1GB/s:50us,tp=10GB/s:5us"


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
    ``profile.link_for(axis)`` (by the axis's name and role). ``profile`` defaults to ``load_profile()`` (the stored one, else the defaults).
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
        return {name: self._overrides.get(name, self._profile.link_for(name)) for name in self._axes}

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
        axes = required_key(d, "axes", "mesh")
        if not isinstance(axes, dict):
            raise MeshError(f"mesh 'axes' must be an object {{name: size}}, got {axes!r}")
        profile = MachineProfile.from_json(required_key(d, "profile", "mesh"))
        links_json = required_key(d, "links", "mesh")
        if not isinstance(links_json, dict):
            raise MeshError(f"mesh 'links' must be an object {{axis name: link}}, got {links_json!r}")
        links = {name: Link.from_json(link, f"mesh link {name!r}") for name, link in links_json.items()}
        # Only links that differ from the profile's are overrides, as when the mesh was built.
        return cls(axes, {name: link for name, link in links.items() if link != profile.link_for(name)}, profile)

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


def _quantity(text: str, units: dict[str, tuple[int, int]], what: str, piece: str, example: str) -> float:
    value = parse_quantity(text, units)
    if value is None:
        raise MeshError(
            f"bad {what} {text.strip()!r} in {piece.strip()!r}: expected a number with a unit "
            f"({', '.join(units)}) such as {example}"
        )
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
