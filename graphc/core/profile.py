"""The machine profile the sharding cost model reads: what one device can do and how devices are
linked.

    MachineProfile          matmul rate per dtype (and per size class), memory bandwidth, the links
                            inside and between nodes, collective overhead, devices sharing cores
    Link(latency_s, bandwidth)   one ring link along a mesh axis (alpha-beta model)

The cost model (passes/sharding/costs.py, strategies.py, redistribute.py) reads only these
numbers. ``MachineProfile.default()`` holds fixed constants, so plans do not depend on the machine
they were made on. Where profiles come from (presets of published hardware, the profile ``graphc
calibrate`` stores, a profile file a user hands in) is graphc/core/profiles.py; the mesh that
carries one is graphc/core/mesh.py.

When it runs here, a "device" is one thread of one process, so a link is two threads handing
buffers to each other and a collective call costs at least one barrier.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np

from graphc.core.errors import MeshError
from graphc.core.roles import axis_role


def _positive(value: Any, what: str, unit: str, allow_zero: bool = False) -> float:
    """``value`` as a float, or MeshError unless it is a finite number > 0 (>= 0 with ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise MeshError(f"{what} must be a number of {unit}, got {value!r}")
    x = float(value)
    if not math.isfinite(x) or x < 0 or (x == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise MeshError(f"{what} must be a finite number of {unit} {bound}, got {value!r}")
    return x


def required_key(d: Any, key: str, what: str) -> Any:
    """``d[key]``, or MeshError unless ``d`` is a JSON object with that key (``what`` names ``d``)."""
    if not isinstance(d, dict):
        raise MeshError(f"{what} must be a JSON object, got {type(d).__name__}")
    if key not in d:
        raise MeshError(f"{what} has no {key!r} key")
    return d[key]


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
        return cls(required_key(d, "latency_s", what), required_key(d, "bandwidth", what))


# Dtypes a profile gives a matmul rate for (numpy's names); a dtype it does not list runs at the
# float32 rate, ``MachineProfile.flops``.
MATMUL_DTYPES = ("float64", "float32", "bfloat16", "float16")

# Size classes of one matrix product, by the cube root of its work (m n k)^(1/3): a profile's
# ``matmul_table`` gives an effective rate per dtype, class and batching (``matmul_key``).
# A product of cube root below 96 is "small" (attention heads, narrow layers: BLAS call overhead
# and short loops), below 384 "medium", else "large" (the peak rate). runtime/calibrate.py
# measures each class on a product of edge 48, 192 and 1024 (``CLASS_SIZES``).
SIZE_CLASSES = (("small", 96.0), ("medium", 384.0), ("large", math.inf))
# The fixed default's table, relative to its peak per dtype: what ``graphc calibrate`` measured
# on one core of the 2-core machine of MACHINE_FACTS.md (issue 16), rounded: a 48^3 float32
# product runs at about 75% of the 1024^3 rate (BLAS call overhead), batches of them and 192^3
# products within 10% of it.
DEFAULT_MATMUL_EFFICIENCY = {
    "small": 0.75,
    "medium": 1.0,
    "large": 1.0,
    "small batched": 1.0,
    "medium batched": 1.0,
    "large batched": 1.0,
}


def size_class(work_per_matrix: float) -> str:
    """The size class (``SIZE_CLASSES``) of one matrix product of ``m n k`` = ``work_per_matrix``."""
    return next(name for name, below in SIZE_CLASSES if work_per_matrix < below**3)


def matmul_key(work_per_matrix: float, batched: bool) -> str:
    """The ``matmul_table`` key of a product: "small", "medium batched", ..."""
    return size_class(work_per_matrix) + (" batched" if batched else "")


# Roles whose axes cross nodes, and so take a profile's ``inter_link``: data-parallel replicas and
# pipeline stages exchange a step's gradients or one activation per micro-batch, while model and
# sequence axes exchange activations inside every layer and need the fast link of one node.
INTER_NODE_ROLES = ("data", "pipe")


@dataclass(frozen=True)
class MachineProfile:
    """What one device can do and how devices are linked; the cost model's only machine-dependent
    input.

    ``link`` joins the devices of one node; ``inter_link`` joins nodes (None: there is one node, or
    no difference). ``link_for(axis)`` picks a mesh axis's link: its own in ``axis_links``, else by
    its role: data and pipe axes cross nodes, model, seq and free axes stay inside one.
    ``matmul_flops`` holds the peak matmul rate per dtype (``MATMUL_DTYPES``); its float32 entry is
    always ``flops``, and a dtype it does not list runs at ``flops``.
    """

    flops: float  # float32 matmul flop/s of one device (here: one thread)
    mem_bandwidth: float  # bytes/s of one device, bytes read + bytes written
    link: Link  # the link inside a node (thread to thread here)
    collective_overhead_s: float  # fixed cost of one collective call (barrier / synchronisation)
    source: str = "default"  # "default", where and when it was measured, or where its numbers come from
    name: str = "cpu-here"  # a preset's name (graphc/core/profiles.py), or the name a profile file gives
    matmul_flops: Mapping[str, float] = field(default_factory=dict, hash=False)  # dtype name -> flop/s
    inter_link: Link | None = None  # the link between nodes (data and pipe axes); None: ``link``
    axis_links: Mapping[str, Link] = field(default_factory=dict, hash=False)  # axis name -> its own link
    # The device's compiler fuses chains of elementwise ops and last-axis reductions, so their
    # intermediates never reach memory (passes/sharding/fusion.py). False prices every op's round
    # trip, as plans for this machine always have (graphc's runtime fuses float32/float64 chains
    # here too, but the measured predictions in docs/ were made without it).
    fuses_elementwise: bool = False
    # Effective matmul flop/s per dtype and size class: {dtype: {"small": r, "small batched": r,
    # "medium": r, ...}} (keys ``matmul_key``). A dtype or class it lacks runs at the dtype's peak
    # (``matmul_rate``), as every matmul of the GPU presets and of profiles stored before it.
    matmul_table: Mapping[str, Mapping[str, float]] = field(default_factory=dict, hash=False)
    # --- devices that are threads of one machine (cpu-here); None / 0: each device has its own hardware
    cores: int | None = None  # cores the devices share: more devices than cores divide them (``device_share``)
    dispatch_s: float = 0.0  # runtime overhead of one op of a device program on one thread alone
    # per op and thread while two device threads dispatch at once (the interpreter runs one thread
    # at a time: about twice ``dispatch_s`` when serialized); n threads: n / 2 times this
    concurrent_dispatch_s: float = 0.0
    # the same with twice as many device threads as cores: a thread holding the interpreter may
    # be waiting for a core (0: ``concurrent_dispatch_s`` x devices / 2 there too)
    oversubscribed_dispatch_s: float = 0.0
    shared_mem_bandwidth: float = 0.0  # bytes/s of all cores copying at once (0: ``mem_bandwidth`` per device)

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
        if self.inter_link is not None and not isinstance(self.inter_link, Link):
            raise MeshError(f"MachineProfile.inter_link must be a Link or None, got {self.inter_link!r}")
        if not isinstance(self.source, str):
            raise MeshError(f"MachineProfile.source must be a string, got {self.source!r}")
        if not isinstance(self.fuses_elementwise, bool):
            raise MeshError(f"MachineProfile.fuses_elementwise must be true or false, got {self.fuses_elementwise!r}")
        if not isinstance(self.name, str) or not self.name:
            raise MeshError(f"MachineProfile.name must be a non-empty string, got {self.name!r}")
        for name in ("dispatch_s", "concurrent_dispatch_s", "oversubscribed_dispatch_s"):
            object.__setattr__(
                self, name, _positive(getattr(self, name), f"MachineProfile.{name}", "seconds", allow_zero=True)
            )
        object.__setattr__(
            self,
            "shared_mem_bandwidth",
            _positive(self.shared_mem_bandwidth, "MachineProfile.shared_mem_bandwidth", "bytes/s", allow_zero=True),
        )
        if self.cores is not None and (
            isinstance(self.cores, bool) or not isinstance(self.cores, (int, np.integer)) or self.cores < 1
        ):
            raise MeshError(f"MachineProfile.cores must be an integer >= 1 or None, got {self.cores!r}")
        object.__setattr__(self, "cores", None if self.cores is None else int(self.cores))
        object.__setattr__(self, "matmul_flops", MappingProxyType(self._checked_rates()))
        object.__setattr__(self, "matmul_table", MappingProxyType(self._checked_table()))
        object.__setattr__(self, "axis_links", MappingProxyType(self._checked_axis_links()))

    def _checked_rates(self) -> dict[str, float]:
        """``matmul_flops`` checked, with float32 = ``flops``, in ``MATMUL_DTYPES`` order."""
        if not isinstance(self.matmul_flops, Mapping):
            raise MeshError(f"MachineProfile.matmul_flops must map dtype names to flop/s, got {self.matmul_flops!r}")
        rates = {}
        for dtype, rate in self.matmul_flops.items():
            if dtype not in MATMUL_DTYPES:
                raise MeshError(
                    f"MachineProfile.matmul_flops has an unknown dtype {dtype!r} (expected {', '.join(MATMUL_DTYPES)})"
                )
            rates[dtype] = _positive(rate, f"MachineProfile.matmul_flops[{dtype!r}]", "flop/s")
        if rates.get("float32", self.flops) != self.flops:
            raise MeshError(
                f"MachineProfile.matmul_flops['float32'] is {rates['float32']:g} but flops, the float32 rate, "
                f"is {self.flops:g}"
            )
        rates["float32"] = self.flops
        return {dtype: rates[dtype] for dtype in MATMUL_DTYPES if dtype in rates}

    def _checked_table(self) -> dict[str, Mapping[str, float]]:
        """``matmul_table`` checked: known dtypes and size classes, positive rates."""
        if not isinstance(self.matmul_table, Mapping):
            raise MeshError(
                f"MachineProfile.matmul_table must map dtype names to {{size class: flop/s}}, got {self.matmul_table!r}"
            )
        keys = [name + batched for name, _ in SIZE_CLASSES for batched in ("", " batched")]
        table: dict[str, Mapping[str, float]] = {}
        for dtype, rates in self.matmul_table.items():
            if dtype not in MATMUL_DTYPES:
                raise MeshError(
                    f"MachineProfile.matmul_table has an unknown dtype {dtype!r} (expected {', '.join(MATMUL_DTYPES)})"
                )
            if not isinstance(rates, Mapping):
                raise MeshError(
                    f"MachineProfile.matmul_table[{dtype!r}] must map size classes to flop/s, got {rates!r}"
                )
            checked = {}
            for key, rate in rates.items():
                if key not in keys:
                    raise MeshError(
                        f"MachineProfile.matmul_table[{dtype!r}] has an unknown size class {key!r} (expected {', '.join(keys)})"
                    )
                checked[key] = _positive(rate, f"MachineProfile.matmul_table[{dtype!r}][{key!r}]", "flop/s")
            table[dtype] = MappingProxyType({k: checked[k] for k in keys if k in checked})
        return {dtype: table[dtype] for dtype in MATMUL_DTYPES if dtype in table}

    def _checked_axis_links(self) -> dict[str, Link]:
        if not isinstance(self.axis_links, Mapping):
            raise MeshError(f"MachineProfile.axis_links must map axis names to Links, got {self.axis_links!r}")
        for axis, link in self.axis_links.items():
            if not isinstance(axis, str) or not axis.isidentifier():
                raise MeshError(f"MachineProfile.axis_links: axis name {axis!r} is not a Python identifier")
            if not isinstance(link, Link):
                raise MeshError(f"MachineProfile.axis_links[{axis!r}] must be a Link, got {link!r}")
        return dict(self.axis_links)

    @classmethod
    def default(cls) -> MachineProfile:
        """Fixed constants, so that plans (and the tests that check them) do not depend on the machine.

        Roughly one x86 core of a recent laptop or server, one thread per device:
          flops 100e9               float32 sgemm with AVX2 FMA on one core (~2.5 GHz x 32 flop/cycle, ~80 %)
          mem_bandwidth 8e9         np.copyto of a large buffer on one core, read + write bytes
          link 20 us, 6e9 B/s       a thread-to-thread handoff: an Event round trip, then a copy of the
                                    message (read + write, so about half of one core's memory bandwidth)
          collective_overhead 20us  a threading.Barrier wait across the threads taking part
          matmul_table              per size class, ``DEFAULT_MATMUL_EFFICIENCY`` of the float32 rate and
                                    of half of it for float64 (one core's float64 FMA rate is half)
        Every device is a thread of one process, so there is no inter-node link. It prices no sharing
        of cores between devices and no dispatch overhead (``cores`` None, ``dispatch_s`` 0): every
        device is its own core, so plans made with it do not depend on the machine's core count.
        """
        flops = 100e9
        table = {
            dtype: {key: peak * eff for key, eff in DEFAULT_MATMUL_EFFICIENCY.items()}
            for dtype, peak in (("float64", flops / 2), ("float32", flops))
        }
        return cls(
            flops=flops,
            mem_bandwidth=8e9,
            link=Link(20e-6, 6e9),
            collective_overhead_s=20e-6,
            source="default",
            matmul_flops={"float64": flops / 2, "float32": flops},
            matmul_table=table,
        )

    # --- what the cost model asks ----------------------------------------------------------------
    def matmul_rate(self, dtype: Any, work_per_matrix: float | None = None, batched: bool = False) -> float:
        """Matmul flop/s of one device on ``dtype`` operands: the peak (``flops`` for unlisted
        dtypes), or, given the size of one matrix product (m n k), the ``matmul_table`` rate of its
        size class when the table has one."""
        name = np.dtype(dtype).name
        peak = self.matmul_flops.get(name, self.flops)
        if work_per_matrix is None:
            return peak
        return self.matmul_table.get(name, {}).get(matmul_key(work_per_matrix, batched), peak)

    def device_share(self, devices: int) -> float:
        """The share of one device's compute and memory rates each of ``devices`` device threads
        gets: cores / devices when more devices than ``cores`` run at once, else 1."""
        if self.cores is None or devices <= self.cores:
            return 1.0
        return self.cores / devices

    def concurrent_bandwidth(self, devices: int) -> float:
        """Memory bytes/s of one of ``devices`` devices running at once: ``mem_bandwidth``, capped
        by ``shared_mem_bandwidth`` split between the devices that run on cores at once, times
        ``device_share``."""
        bw = self.mem_bandwidth
        if self.shared_mem_bandwidth and devices > 1:
            running = devices if self.cores is None else min(devices, self.cores)
            bw = min(bw, self.shared_mem_bandwidth / running)
        return bw * self.device_share(devices)

    def op_overhead(self, devices: int) -> float:
        """Seconds of runtime overhead per op of a device program when ``devices`` devices run:
        ``dispatch_s`` alone; with several, ``concurrent_dispatch_s`` x devices / 2 (the
        interpreter runs one thread at a time, so the threads' overheads add up), up to ``cores``
        devices; from there linearly to ``oversubscribed_dispatch_s`` at twice ``cores`` devices,
        and on along that line."""
        if devices <= 1 or not self.concurrent_dispatch_s:
            return self.dispatch_s
        cores = self.cores or devices
        at_cores = self.concurrent_dispatch_s * max(cores, 2) / 2
        if devices <= cores or not self.oversubscribed_dispatch_s:
            return max(self.dispatch_s, self.concurrent_dispatch_s * devices / 2)
        slope = (self.oversubscribed_dispatch_s - at_cores) / cores
        return max(self.dispatch_s, at_cores + slope * (devices - cores))

    def link_for(self, axis: str) -> Link:
        """The link of the mesh axis called ``axis``: its own in ``axis_links``; else ``inter_link``
        for data and pipe axes (``INTER_NODE_ROLES``) when there is one; else ``link``."""
        own = self.axis_links.get(axis)
        if own is not None:
            return own
        if self.inter_link is not None and axis_role(axis) in INTER_NODE_ROLES:
            return self.inter_link
        return self.link

    # --- files -----------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "name": self.name,
            "flops": self.flops,
            "matmul_flops": dict(self.matmul_flops),
            "mem_bandwidth": self.mem_bandwidth,
            "link": self.link.to_json(),
            "inter_link": None if self.inter_link is None else self.inter_link.to_json(),
            "axis_links": {axis: link.to_json() for axis, link in self.axis_links.items()},
            "collective_overhead_s": self.collective_overhead_s,
            "fuses_elementwise": self.fuses_elementwise,
            "matmul_table": {dtype: dict(rates) for dtype, rates in self.matmul_table.items()},
            "cores": self.cores,
            "dispatch_s": self.dispatch_s,
            "concurrent_dispatch_s": self.concurrent_dispatch_s,
            "oversubscribed_dispatch_s": self.oversubscribed_dispatch_s,
            "shared_mem_bandwidth": self.shared_mem_bandwidth,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, d: Any, strict: bool = False) -> MachineProfile:
        """The profile ``to_json`` wrote. ``strict`` (a profile file the user hands in) also requires
        ``name``, ``matmul_flops``, ``inter_link`` (null for one node) and ``fuses_elementwise``;
        without it they default, so that profiles stored by ``graphc calibrate`` and plans written
        before they existed load. ``axis_links``, ``source`` and the numbers of devices sharing
        one machine (``matmul_table``, ``cores``, ``dispatch_s``, ``concurrent_dispatch_s``,
        ``oversubscribed_dispatch_s``, ``shared_mem_bandwidth``; a profile stored before them
        prices as it did) are optional."""
        what = "machine profile"
        link = Link.from_json(required_key(d, "link", what), "machine profile 'link'")
        flops, mem_bandwidth, overhead = (
            required_key(d, key, what) for key in ("flops", "mem_bandwidth", "collective_overhead_s")
        )
        if strict:
            for key in ("name", "matmul_flops", "inter_link", "fuses_elementwise"):
                required_key(d, key, what)
        inter = d.get("inter_link")
        axis_links = d.get("axis_links", {})
        if not isinstance(axis_links, dict):
            raise MeshError(f"machine profile 'axis_links' must be an object {{axis name: link}}, got {axis_links!r}")
        return cls(
            flops,
            mem_bandwidth,
            link,
            overhead,
            d.get("source", "unknown"),
            d.get("name", "cpu-here"),
            d.get("matmul_flops", {}),
            None if inter is None else Link.from_json(inter, "machine profile 'inter_link'"),
            {axis: Link.from_json(x, f"machine profile 'axis_links' {axis!r}") for axis, x in axis_links.items()},
            d.get("fuses_elementwise", False),
            _table_from(d.get("matmul_table", {})),
            d.get("cores"),
            d.get("dispatch_s", 0.0),
            d.get("concurrent_dispatch_s", 0.0),
            d.get("oversubscribed_dispatch_s", 0.0),
            d.get("shared_mem_bandwidth", 0.0),
        )

    def describe(self) -> str:
        """A small table of the numbers, in GF/s (TF/s), GB/s and us."""
        rows = [("float32 matmul, one device", _rate(self.flops))]
        rows += [(f"{dtype} matmul", _rate(r)) for dtype, r in self.matmul_flops.items() if dtype != "float32"]
        rows += [
            ("memory bandwidth (read + write)", f"{self.mem_bandwidth / 1e9:8.2f} GB/s"),
            ("link bandwidth (per direction)", f"{self.link.bandwidth / 1e9:8.2f} GB/s"),
            ("link latency", f"{self.link.latency_s * 1e6:8.1f} us"),
        ]
        if self.inter_link is not None:
            rows += [
                ("inter-node link (data, pipe axes)", f"{self.inter_link.bandwidth / 1e9:8.2f} GB/s"),
                ("inter-node link latency", f"{self.inter_link.latency_s * 1e6:8.1f} us"),
            ]
        rows += [(f"link of axis {axis}", str(link)) for axis, link in self.axis_links.items()]
        for dtype, rates in self.matmul_table.items():
            rows += [(f"{dtype} matmul, {key}", _rate(r)) for key, r in rates.items()]
        rows.append(("collective overhead (per call)", f"{self.collective_overhead_s * 1e6:8.1f} us"))
        if self.cores is not None:
            rows.append(("cores the devices share", f"{self.cores:8d}"))
        if self.shared_mem_bandwidth:
            rows.append(("memory bandwidth, all cores", f"{self.shared_mem_bandwidth / 1e9:8.2f} GB/s"))
        if self.dispatch_s or self.concurrent_dispatch_s:
            rows.append(("op overhead, one device", f"{self.dispatch_s * 1e6:8.2f} us"))
            rows.append(("op overhead, two devices at once", f"{self.concurrent_dispatch_s * 1e6:8.2f} us"))
            if self.oversubscribed_dispatch_s:
                rows.append(
                    (
                        f"op overhead, {2 * (self.cores or 1)} devices at once",
                        f"{self.oversubscribed_dispatch_s * 1e6:8.2f} us",
                    )
                )
        rows.append(("elementwise chains", "fused" if self.fuses_elementwise else "one kernel per op"))
        lines = [f"  {name:<33}{value}" for name, value in rows]
        lines.append(f"  profile {self.name}; source: {self.source}")
        return "\n".join(lines)


def _table_from(d: Any) -> dict:
    """A ``matmul_table`` from JSON (checked by MachineProfile)."""
    if not isinstance(d, dict):
        raise MeshError(
            f"machine profile 'matmul_table' must be an object {{dtype: {{size class: flop/s}}}}, got {d!r}"
        )
    return d


def _rate(flops: float) -> str:
    """flop/s in GF/s, or TF/s from 1e12 on."""
    return f"{flops / 1e12:8.1f} TF/s" if flops >= 1e12 else f"{flops / 1e9:8.1f} GF/s"
