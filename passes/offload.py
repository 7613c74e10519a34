"""Optimizer-state offload, as both planners price it: the block search (passes/scale.py
``compose``) per layout, and the fixed-mesh sharding ILP per parameter
(passes/sharding/offload_terms.py).

ZeRO-Offload (Ren et al., *ZeRO-Offload: Democratizing Billion-Scale Model Training*, USENIX
ATC 2021) keeps the optimizer state (Adam's moments, the fp32 master copy) in host memory and
runs the update on the CPU. Per step and per device, for the share of the state this device
updates (its ZeRO partition when the stage is >= 1, else all of it over tp):

- gradients go device -> host over PCIe as the backward makes them; ZeRO-Offload (section 4.1)
  overlaps this copy with the backward, so only what the last micro-batch's backward does not
  hide waits: ``max(0, d2h - overlap x backward)``;
- the CPU runs Adam: memory-bound, it reads and writes the state and the host copy of the
  parameters and reads the gradients, ``(2 x state + 3 x params) / host DRAM bandwidth``;
- the updated parameters go host -> device before the next forward. ZeRO-Offload's one-step
  delayed parameter update (section 4.2) would hide the update and this copy, but changes the
  numerics (the step uses last step's parameters); it is not assumed, so both wait.

The device then holds no optimizer state; its parameters and gradients stay (ZeRO-Offload also
streams the gradients out in buckets, which this model leaves on the device: a conservative
peak). The host must hold the state and a copy of the parameters. The figures (PCIe, host DRAM
size and bandwidth) are the profile's host tier (graphc/core/profiles.py ``HostTier``); a
profile without one never offloads. Both planners price a choice with ``offload_costs``; the
fixed-mesh plan records what it moved as an ``OffloadRecord`` (its JSON ``"offload"``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from graphc.core.errors import PlanError
from graphc.core.profiles import HostTier
from graphc.core.units import fmt_bytes, fmt_time

OFFLOADS = ("off", "optimizer")  # what a layout may offload


@dataclass(frozen=True, slots=True)
class OffloadCost:
    """What offloading ``state_bytes`` of optimizer state costs one device a step."""

    state_bytes: float  # optimizer state moved to host memory (the device's saving)
    param_bytes: float  # the parameters it updates there (gradients out, parameters back)
    d2h_s: float  # the gradients' copy to the host
    d2h_exposed_s: float  # its part the last backward does not hide
    host_update_s: float  # Adam on the CPU
    h2d_s: float  # the updated parameters' copy back

    @property
    def step_s(self) -> float:
        """What the step waits for: the exposed gradient copy, the CPU update, the copy back."""
        return self.d2h_exposed_s + self.host_update_s + self.h2d_s

    @property
    def host_bytes(self) -> float:
        """Host memory it needs: the state and the host copy of the parameters."""
        return self.state_bytes + self.param_bytes

    def to_json(self, values: tuple[str, ...]) -> dict:
        return {
            "what": "optimizer state",
            "values": list(values),
            "bytes_per_device": self.state_bytes,
            "host_bytes_per_device": self.host_bytes,
            "d2h_s": self.d2h_s,
            "d2h_exposed_s": self.d2h_exposed_s,
            "host_update_s": self.host_update_s,
            "h2d_s": self.h2d_s,
            "step_s": self.step_s,
        }

    def why(self) -> str:
        """One sentence: the bytes saved and the time they cost."""
        hidden = self.d2h_s - self.d2h_exposed_s
        return (
            f"offloads the optimizer state to host memory: {fmt_bytes(int(self.state_bytes))} less per device "
            f"for {fmt_time(self.step_s)} a step (gradients to the host {fmt_time(self.d2h_s)}, "
            f"{fmt_time(hidden)} of it hidden behind the backward; Adam on the CPU "
            f"{fmt_time(self.host_update_s)}; parameters back {fmt_time(self.h2d_s)})"
        )


def offload_costs(host: HostTier, state_bytes: float, param_bytes: float, backward_s: float, overlap: float):
    """The OffloadCost of moving ``state_bytes`` to ``host`` for the update of ``param_bytes`` of
    parameters, the copy of their gradients hidden behind ``overlap`` x ``backward_s`` (module doc)."""
    link = host.link
    d2h = link.latency_s + param_bytes / link.bandwidth
    exposed = max(0.0, d2h - overlap * backward_s)
    update = (2 * state_bytes + 3 * param_bytes) / host.memory_bandwidth
    h2d = link.latency_s + param_bytes / link.bandwidth
    return OffloadCost(state_bytes, param_bytes, d2h, exposed, update, h2d)


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadRecord:
    """What a fixed-mesh plan (passes/sharding/plan.py ``ShardingPlan.offload``) keeps in host
    memory, per device, priced by ``offload_costs`` at the plan's choices; ``reason`` is "fit"
    (the peak keeping the state, ``kept_peak_bytes``, is over the limit) or "faster" (the step
    is shorter with the update on the host)."""

    values: tuple[str, ...]  # the offloaded inputs (optimizer state), graph input names
    params: tuple[str, ...]  # the parameters the host updates
    state_bytes: float
    param_bytes: float
    backward_s: float  # the backward the gradients' copy hides behind (its compute, as the ILP prices it)
    overlap: float  # the share of it that hides the copy (ClusterFigures.dp_overlap)
    d2h_s: float
    d2h_exposed_s: float
    host_update_s: float
    h2d_s: float
    device_update_s: float  # the device's update of those parameters, which no longer runs
    kept_peak_bytes: int  # the plan's peak with the state kept on the device
    reason: str  # "fit" or "faster"

    @property
    def cost(self) -> OffloadCost:
        return OffloadCost(
            self.state_bytes, self.param_bytes, self.d2h_s, self.d2h_exposed_s, self.host_update_s, self.h2d_s
        )

    @property
    def step_s(self) -> float:
        """What offloading adds to the step: the host's part, less the device update it replaces."""
        return self.cost.step_s - self.device_update_s

    def to_json(self) -> dict:
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**self.cost.to_json(self.values), **doc, "values": list(self.values), "params": list(self.params)}

    @classmethod
    def from_json(cls, d: dict) -> OffloadRecord:
        values = {f.name: d[f.name] for f in fields(cls)}
        values["values"], values["params"] = tuple(values["values"]), tuple(values["params"])
        return cls(**values)

    def why(self, limit_bytes: int | None) -> str:
        """Why the plan offloads, and what it costs (one paragraph)."""
        if self.reason == "fit":
            because = (
                f"keeping it, the peak would be {fmt_bytes(self.kept_peak_bytes)} per device, over the limit"
                + (f" of {fmt_bytes(limit_bytes)}" if limit_bytes else "")
                + ": the solver moves the state whose transfers cost the least time"
            )
        else:
            because = "the step is shorter with the update on the host than on the device"
        return (
            f"{self.cost.why()}; the device's own update of those parameters "
            f"({fmt_time(self.device_update_s)}) no longer runs; {because}"
        )


def not_runnable(record: OffloadRecord, profile: str) -> PlanError:
    """The error of running a plan that offloads ``record`` (the lowering raises it)."""
    return PlanError(
        f"the plan keeps the optimizer state of {len(record.params)} parameter(s) in host memory (offload on "
        f"profile {profile}), which the runtime here cannot do: it is a prediction, not a plan to run; plan "
        "with a memory limit that fits without offload, or on a profile without a host tier (cpu-here)"
    )


__all__ = ["OFFLOADS", "OffloadCost", "OffloadRecord", "not_runnable", "offload_costs"]
