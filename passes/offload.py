"""Optimizer-state offload, as the scale search prices it (passes/scale.py ``compose``).

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
profile without one never offloads.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphc.core.profiles import HostTier

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
            f"offloads the optimizer state to host memory: {self.state_bytes / 2**30:.2f} GiB less per device "
            f"for {self.step_s * 1e3:.3f} ms a step (gradients to the host {self.d2h_s * 1e3:.3f} ms, "
            f"{hidden * 1e3:.3f} ms of it hidden behind the backward; Adam on the CPU "
            f"{self.host_update_s * 1e3:.3f} ms; parameters back {self.h2d_s * 1e3:.3f} ms)"
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


__all__ = ["OFFLOADS", "OffloadCost", "offload_costs"]
