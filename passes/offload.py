"""Offload to host memory of the optimizer state and of stashed activations, as both planners
price it: the block search (passes/scale.py ``compose``) per layout, and the fixed-mesh sharding
ILP per parameter and per value (passes/sharding/offload_terms.py).

ZeRO-Offload (Ren et al., *ZeRO-Offload: Democratizing Billion-Scale Model Training*, USENIX
ATC 2021) keeps the optimizer state (Adam's moments, the fp32 master copy) in host memory and
runs the update on the CPU. Per step and per device, for the share of the state this device
updates (its ZeRO partition when the stage is >= 1, else all of it over tp):

- gradients go device -> host over PCIe as the backward makes them; ZeRO-Offload (section 4.1)
  overlaps this copy with the backward, so only what the last micro-batch's backward does not
  hide waits: ``max(0, d2h - overlap x backward)``, ``d2h = latency + grads / bandwidth``;
- the CPU runs Adam: memory-bound, it reads and writes the state and the host copy of the
  parameters and reads the gradients, ``(2 x state + 2 x params + grads) / host DRAM bandwidth``
  (the gradients' bytes as the step makes them: a bfloat16 parameter's gradient summed in float32
  moves twice its parameter's bytes; the fixed-mesh ILP prices them as the parameters');
- the updated parameters go host -> device before the next forward. ZeRO-Offload's one-step
  delayed parameter update (section 4.2) would hide the update and this copy, but changes the
  numerics (the step uses last step's parameters); it is not assumed, so both wait.

The device then holds no optimizer state; its parameters and gradients stay (ZeRO-Offload also
streams the gradients out in buckets, which this model leaves on the device: a conservative
peak). The host must hold the state and a copy of the parameters. The figures (PCIe, host DRAM
size and bandwidth) are the profile's host tier (graphc/core/profiles.py ``HostTier``); a
profile without one never offloads. Both planners price a choice with ``offload_costs``; the
fixed-mesh plan records what it moved as an ``OffloadRecord`` (its JSON ``"offload"``).

**Activations** (``activation_costs``). A forward value the backward reads is stashed on the
device from its last forward use to its first backward use, across the micro-batches in flight.
Megatron Core's CPU offloading (``TransformerConfig.cpu_offloading`` with
``cpu_offloading_num_layers``, the layers whose activations move, through TransformerEngine's
``get_cpu_offload_context``; and its fine-grained activation offloading, which copies a module's
saved tensors out after its forward and reloads the next module's during the backward) and
ZeRO-Infinity's offload of activation checkpoints (Rajbhandari et al., SC 2021) copy such a value
to host memory after the forward and back before the backward, on a stream of its own beside the
compute. (The block search's share of a stage's stash plays the part of the number of layers.) The rule both planners use: the link is full duplex and each figure
of ``HostTier.link`` is one direction; a micro-batch's copies out run beside its forward, its
copies back beside its backward (prefetched), and only what that pass's compute does not hide
waits: ``max(0, out - forward) + max(0, back - backward)``, with ``out = back = transfers x
latency + bytes / bandwidth``. The optimizer state's transfers share the link in other phases
(the gradients go out in the last backward, when no activation goes out; the parameters come
back after it, when every activation is back), so the two never wait for each other. The device
keeps, besides what stays, one layer's offloaded share of one micro-batch in transit (the
block search's ``staging`` bytes; the fixed-mesh model frees a value only between its last
forward and first backward use, so a value in transit is counted whole).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from graphc.core.errors import PlanError
from graphc.core.profile import Link
from graphc.core.profiles import HostTier, host_tier
from graphc.core.units import fmt_bytes, fmt_time

OFFLOADS = ("off", "optimizer", "activations", "both")  # what a layout may offload
# the shares of a stage's stashed activations the block search tries to keep in host memory
ACTIVATION_FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def offloads_state(kind: str) -> bool:
    """Whether a layout's ``offload`` moves the optimizer state."""
    return kind in ("optimizer", "both")


def offloads_activations(kind: str) -> bool:
    """Whether a layout's ``offload`` moves stashed activations."""
    return kind in ("activations", "both")


def offload_choices(profile) -> tuple[str, ...]:
    """What a layout may offload on ``profile``: nothing without a host tier."""
    return OFFLOADS if host_tier(profile) is not None else ("off",)


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


def offload_costs(
    host: HostTier,
    state_bytes: float,
    param_bytes: float,
    backward_s: float,
    overlap: float,
    grad_bytes: float | None = None,
):
    """The OffloadCost of moving ``state_bytes`` to ``host`` for the update of ``param_bytes`` of
    parameters from ``grad_bytes`` of gradients (None: as many as the parameters), the copy of the
    gradients hidden behind ``overlap`` x ``backward_s`` (module doc)."""
    grads = param_bytes if grad_bytes is None else grad_bytes
    link = host.link
    d2h = link.latency_s + grads / link.bandwidth
    exposed = max(0.0, d2h - overlap * backward_s)
    update = (2 * state_bytes + 2 * param_bytes + grads) / host.memory_bandwidth
    h2d = link.latency_s + param_bytes / link.bandwidth
    return OffloadCost(state_bytes, param_bytes, d2h, exposed, update, h2d)


@dataclass(frozen=True, slots=True, kw_only=True)
class ActivationOffload:
    """Stashed activations one device keeps in host memory, per micro-batch, and their copies
    priced by the overlap rule (module doc, ``activation_costs``)."""

    values: tuple[str, ...]  # the offloaded values (the fixed-mesh plan's names; () in the block search)
    value_bytes: tuple[float, ...]  # each one's bytes per device (the block search: one entry per stage layer)
    fraction: float  # the share of the stash moved (the block search's choice; 1.0 in the fixed-mesh plan)
    transfers: int  # copies each way (one per value, or per layer)
    out_s: float  # device -> host, after the forward
    back_s: float  # host -> device, before the backward
    forward_s: float  # the compute that hides the copies out
    backward_s: float  # the compute that hides the copies back

    @property
    def nbytes(self) -> float:
        return float(sum(self.value_bytes))

    @property
    def out_exposed_s(self) -> float:
        return max(0.0, self.out_s - self.forward_s)

    @property
    def back_exposed_s(self) -> float:
        return max(0.0, self.back_s - self.backward_s)

    @property
    def exposed_s(self) -> float:
        """What the step waits for, per micro-batch: the copies the compute does not hide."""
        return self.out_exposed_s + self.back_exposed_s

    @property
    def hidden_s(self) -> float:
        return self.out_s + self.back_s - self.exposed_s

    def to_json(self) -> dict:
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc["values"], doc["value_bytes"] = list(self.values), list(self.value_bytes)
        return {**doc, "bytes_per_device": self.nbytes, "exposed_s": self.exposed_s, "hidden_s": self.hidden_s}

    @classmethod
    def from_json(cls, d: dict) -> ActivationOffload:
        values = {f.name: d[f.name] for f in fields(cls)}
        values["values"], values["value_bytes"] = tuple(values["values"]), tuple(values["value_bytes"])
        return cls(**values)

    def why(self) -> str:
        """One sentence: what moved, the copies, what the compute hid."""
        what = f"{len(self.values)} stashed activation(s)" if self.values else f"{self.fraction:.0%} of the stash"
        return (
            f"offloads {what} to host memory: {fmt_bytes(int(self.nbytes))} less per device and micro-batch, "
            f"copied out in {fmt_time(self.out_s)} beside the forward ({fmt_time(self.forward_s)}) and back in "
            f"{fmt_time(self.back_s)} beside the backward ({fmt_time(self.backward_s)}): "
            f"{fmt_time(self.hidden_s)} hidden, {fmt_time(self.exposed_s)} exposed"
        )


def activation_costs(
    link: Link,
    value_bytes: tuple[float, ...],
    forward_s: float,
    backward_s: float,
    values: tuple[str, ...] = (),
    fraction: float = 1.0,
) -> ActivationOffload:
    """The ActivationOffload of copying ``value_bytes`` (one transfer each) out beside
    ``forward_s`` of compute and back beside ``backward_s`` (module doc)."""
    copy = len(value_bytes) * link.latency_s + sum(value_bytes) / link.bandwidth
    return ActivationOffload(
        values=values,
        value_bytes=tuple(float(b) for b in value_bytes),
        fraction=fraction,
        transfers=len(value_bytes),
        out_s=copy,
        back_s=copy,
        forward_s=forward_s,
        backward_s=backward_s,
    )


def stash_bytes(flight: int, stash: float, fraction: float, staging: float) -> float:
    """A stage's activation bytes on the device when ``flight`` micro-batches each stash ``stash``
    bytes and ``fraction`` of it lives in host memory, one layer's share (``staging``) of one
    micro-batch in transit (module doc)."""
    if not fraction:
        return flight * stash
    return flight * stash * (1 - fraction) + fraction * staging


def stage_activations(host: HostTier | None, fraction: float, layer_bytes, bounds, forward, per_microbatch):
    """Per stage of a block-search cut (stage s holds layers ``bounds[s]:bounds[s + 1]``, each
    stashing ``layer_bytes[i]`` a micro-batch), the ActivationOffload of keeping ``fraction`` of
    its stash in host memory: one copy per layer each way, out beside the stage's forward of the
    micro-batch (``forward[s]``), back beside the rest of its ``per_microbatch[s]`` (the backward,
    and the forward run again under full recomputation). [] without a host tier or a fraction."""
    if host is None or not fraction:
        return []
    return [
        activation_costs(
            host.link,
            tuple(fraction * float(b) for b in layer_bytes[lo:hi]),
            forward[s],
            per_microbatch[s] - forward[s],
            fraction=fraction,
        )
        for s, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:]))
    ]


def host_shortfall(host: HostTier | None, state: OffloadCost | None, acts, microbatches: int) -> str | None:
    """Why the host cannot hold what a layout moves (the state and the host copy of the
    parameters, and each stage's stash over its micro-batches in flight, 1F1B), else None."""
    if host is None:
        return None
    stages = len(acts)
    need = (state.host_bytes if state is not None else 0.0) + max(
        (min(microbatches, stages - s) * a.nbytes for s, a in enumerate(acts)), default=0.0
    )
    if need <= host.memory_bytes:
        return None
    return (
        f"offload needs {need / 2**30:.1f} GiB of host memory per device, the host has {host.memory_bytes / 2**30:.1f}"
    )


def composed_json(state: OffloadCost | None, values: tuple[str, ...], acts: ActivationOffload | None) -> dict | None:
    """The block search plan's JSON ``"offload"``: the state's record (``OffloadCost.to_json``)
    and ``"activations"``, what moved in ``"what"``; None when nothing did."""
    if state is None and acts is None:
        return None
    doc = state.to_json(values) if state is not None else {}
    what = " and ".join((["optimizer state"] if state is not None else []) + (["activations"] if acts else []))
    return {**doc, "what": what, "activations": None if acts is None else acts.to_json()}


def fastest(results) -> tuple:
    """The (plan, None) of the fastest plan among the (plan, why) ``results``, else the first
    (None, why): the block search composes a layout at every ``ACTIVATION_FRACTIONS``."""
    results = list(results)
    plans = [r for r in results if r[0] is not None]
    if not plans:
        return results[0]
    return min(plans, key=lambda r: r[0].predicted["step_s"])


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadRecord:
    """What a fixed-mesh plan (passes/sharding/plan.py ``ShardingPlan.offload``) keeps in host
    memory, per device: optimizer state priced by ``offload_costs`` at the plan's choices (its
    fields are empty and zero when only activations move), and stashed ``activations`` priced by
    ``activation_costs``. ``reason`` is "fit" (the peak keeping everything on the device,
    ``kept_peak_bytes``, is over the limit) or "faster" (the step is shorter with the update on
    the host)."""

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
    kept_peak_bytes: int  # the plan's peak with everything kept on the device
    reason: str  # "fit" or "faster"
    activations: ActivationOffload | None = None  # stashed activations in host memory

    @property
    def cost(self) -> OffloadCost:
        return OffloadCost(
            self.state_bytes, self.param_bytes, self.d2h_s, self.d2h_exposed_s, self.host_update_s, self.h2d_s
        )

    @property
    def host_s(self) -> float:
        """What the step waits for on the host tier: the state's transfers and CPU update, and the
        activation copies the compute does not hide (``Cost.offload_s``)."""
        return self.cost.step_s + (self.activations.exposed_s if self.activations is not None else 0.0)

    @property
    def step_s(self) -> float:
        """What offloading adds to the step: the host's part, less the device update it replaces."""
        return self.host_s - self.device_update_s

    @property
    def what(self) -> str:
        parts = (["optimizer state"] if self.params else []) + (["activations"] if self.activations else [])
        return " and ".join(parts) or "nothing"

    def to_json(self) -> dict:
        doc = {f.name: getattr(self, f.name) for f in fields(self)}
        doc["activations"] = None if self.activations is None else self.activations.to_json()
        return {
            **self.cost.to_json(self.values),
            **doc,
            "what": self.what,
            "step_s": self.host_s,  # what the step waits on the host tier (Cost.offload_s)
            "values": list(self.values),
            "params": list(self.params),
        }

    @classmethod
    def from_json(cls, d: dict) -> OffloadRecord:
        values = {f.name: d[f.name] for f in fields(cls) if f.name != "activations"}
        values["values"], values["params"] = tuple(values["values"]), tuple(values["params"])
        acts = d.get("activations")
        return cls(**values, activations=None if acts is None else ActivationOffload.from_json(acts))

    def because(self, limit_bytes: int | None) -> str:
        """Why anything moved: the peak keeping it over the limit, or a shorter step."""
        if self.reason != "fit":
            return "the step is shorter with the update on the host than on the device"
        return (
            f"keeping it, the peak would be {fmt_bytes(self.kept_peak_bytes)} per device, over the limit"
            + (f" of {fmt_bytes(limit_bytes)}" if limit_bytes else "")
            + ": the solver moves what costs the least time"
        )

    def why(self, limit_bytes: int | None) -> str:
        """Why the plan offloads, and what it costs (one paragraph)."""
        because = self.because(limit_bytes)
        parts = []
        if self.params:
            parts.append(
                f"{self.cost.why()}; the device's own update of those parameters "
                f"({fmt_time(self.device_update_s)}) no longer runs"
            )
        if self.activations is not None:
            parts.append(self.activations.why())
        return "; ".join(parts) + f"; {because}"


def not_runnable(record: OffloadRecord, profile: str) -> PlanError:
    """The error of running a plan that offloads ``record`` (the lowering raises it)."""
    what = f"the optimizer state of {len(record.params)} parameter(s)" if record.params else ""
    if record.activations is not None:
        what += (" and " if what else "") + f"{len(record.activations.values)} stashed activation(s)"
    return PlanError(
        f"the plan keeps {what} in host memory (offload on "
        f"profile {profile}), which the runtime here cannot do: it is a prediction, not a plan to run; plan "
        "with a memory limit that fits without offload, or on a profile without a host tier (cpu-here)"
    )


__all__ = [
    "ACTIVATION_FRACTIONS",
    "OFFLOADS",
    "ActivationOffload",
    "OffloadCost",
    "OffloadRecord",
    "activation_costs",
    "composed_json",
    "fastest",
    "host_shortfall",
    "not_runnable",
    "offload_choices",
    "offload_costs",
    "offloads_activations",
    "offloads_state",
    "stage_activations",
    "stash_bytes",
]
