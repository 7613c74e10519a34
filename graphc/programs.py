"""Device programs: what partitioning hands the runtime, and nothing more.

A ``ParallelProgram`` is a function partitioned over a mesh: one ``DeviceProgram`` per device (an
ordinary Graph with local shapes whose collective ops name their group), and the specs that say
which piece of every whole input and output each device holds (graphc/core/spec.py). The passes
build it (graphc/passes/lower.py); the runtime runs it (graphc/runtime/devices.py) and never plans
or lowers anything itself. It prints and parses (``to_json`` / ``from_json``, the graphs in the
text IR), so a program saved by one process runs in another.

``PipelineProgram`` is the same for a pipeline: every device's forward, backward and update tasks
(graphs), the order it runs them in, and where each value comes from and goes.

``simulate`` runs a ParallelProgram in lock step with the reference semantics of every op and
collective (graphc/ops/comm.py): the oracle the lowering and the runtime are tested against.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphc.core.errors import GraphcError, ShapeError, VerifyError
from graphc.core.files import read_document
from graphc.core.ir import Graph, TensorType
from graphc.core.mesh import Mesh
from graphc.core.spec import Spec, format_spec, parse_spec, shard, unshard
from graphc.core.traits import Collective
from graphc.interpreter import run_flat
from graphc.ops import precision
from graphc.ops.comm import reference
from graphc.textir import parse

PROGRAM_VERSION = 1


@dataclass(frozen=True)
class DeviceProgram:
    """One device's program: its graph (local shapes) and which piece of every whole input and
    output it holds. ``origin`` maps each node to the node of the partitioned graph it serves
    (-1: redistributing an output), when the lowering recorded it."""

    device: int
    coord: tuple[int, ...]
    graph: Graph
    in_specs: tuple[Spec, ...]
    out_specs: tuple[Spec, ...]
    origin: tuple[int, ...] | None = None

    def with_graph(self, graph: Graph) -> DeviceProgram:
        """The same device's program with a new graph (after the device passes); origins no longer apply."""
        return DeviceProgram(self.device, self.coord, graph, self.in_specs, self.out_specs, None)


@dataclass(frozen=True)
class ParallelProgram:
    """A function partitioned over ``mesh``: one program per device, and the types of the whole
    inputs and outputs (in the order of the partitioned graph's flat inputs and outputs)."""

    mesh: Mesh
    devices: tuple[DeviceProgram, ...]
    in_types: tuple[TensorType, ...]
    out_types: tuple[TensorType, ...]

    def __post_init__(self):
        if [p.device for p in self.devices] != self.mesh.devices():
            raise GraphcError(f"a parallel program needs one program per device of mesh {self.mesh}, in order")

    @property
    def in_specs(self) -> tuple[Spec, ...]:
        return self.devices[0].in_specs

    @property
    def out_specs(self) -> tuple[Spec, ...]:
        return self.devices[0].out_specs

    # --- whole arrays <-> pieces -------------------------------------------------------------
    def shard_inputs(self, arrays: list) -> dict[int, list[np.ndarray]]:
        """Every device's pieces of the whole inputs."""
        shape = tuple(self.mesh.shape)
        return {p.device: [shard(a, s, shape, p.coord) for a, s in zip(arrays, p.in_specs)] for p in self.devices}

    def gather_outputs(self, outs: Mapping[int, list[np.ndarray]]) -> list[np.ndarray]:
        """The whole outputs from every device's pieces."""
        shape = tuple(self.mesh.shape)
        result = []
        for k, (t, spec) in enumerate(zip(self.out_types, self.out_specs)):
            pieces = {p.coord: outs[p.device][k] for p in self.devices}
            result.append(unshard(pieces, spec, shape, t.shape).astype(t.dtype, copy=False))
        return result

    # --- checks -------------------------------------------------------------------------------
    def verify(self) -> ParallelProgram:
        """Every device program verifies, and every group enters its collectives in the same order
        with the same attributes and operand types (so none can deadlock or mismatch)."""
        for p in self.devices:
            p.graph.verify()
        check_collective_order(self.devices)
        return self

    # --- text form ----------------------------------------------------------------------------
    def to_json(self) -> str:
        doc = {
            "version": PROGRAM_VERSION,
            "kind": "parallel_program",
            "mesh": self.mesh.to_json(),
            "inputs": [str(t) for t in self.in_types],
            "outputs": [str(t) for t in self.out_types],
            "devices": [
                {
                    "device": p.device,
                    "coord": list(p.coord),
                    "in_specs": [format_spec(s) for s in p.in_specs],
                    "out_specs": [format_spec(s) for s in p.out_specs],
                    "graph": str(p.graph),
                }
                for p in self.devices
            ],
        }
        return json.dumps(doc, indent=1)

    @classmethod
    def from_json(cls, text: str, source: str = "<program>") -> ParallelProgram:
        doc = read_document(text, source, "parallel program", PROGRAM_VERSION, "parallel_program")
        try:
            mesh = Mesh.from_json(doc["mesh"])
            n = len(mesh.shape)
            devices = tuple(
                DeviceProgram(
                    d["device"],
                    tuple(d["coord"]),
                    parse(d["graph"]),
                    tuple(parse_spec(s, n) for s in d["in_specs"]),
                    tuple(parse_spec(s, n) for s in d["out_specs"]),
                )
                for d in doc["devices"]
            )
            return cls(
                mesh,
                devices,
                tuple(TensorType.parse(t) for t in doc["inputs"]),
                tuple(TensorType.parse(t) for t in doc["outputs"]),
            )
        except (KeyError, TypeError, ShapeError) as exc:
            raise GraphcError(f"{source}: not a complete parallel program ({type(exc).__name__}: {exc})") from None


# --- collective order -----------------------------------------------------------------------------


def collective_sequence(g: Graph) -> list[tuple]:
    """(op, group, attrs, operand type, loc) of every collective of a device program, in order."""
    seq = []
    for node in g.nodes:
        if node.op.has(Collective):
            attrs = tuple(sorted((k, v) for k, v in node.attrs.items()))
            seq.append((node.op.name, node.attrs["group"], attrs, str(node.inputs[0].type), node.loc))
    return seq


def check_collective_order(programs) -> None:
    """Every collective of a group is entered by all its members in the same order with the same
    attributes and operand types."""
    by_device = {p.device: p for p in programs}
    per_group: dict[tuple, dict[int, list]] = {}
    for p in programs:
        for entry in collective_sequence(p.graph):
            group = entry[1]
            if p.device not in group:
                raise VerifyError(f"device {p.device} enters {entry[0]} of group {group}, which it is not in")
            per_group.setdefault(group, {}).setdefault(p.device, []).append(entry)
    for group, seqs in per_group.items():
        missing = [d for d in group if d not in by_device]
        if missing:
            raise VerifyError(f"group {group} names device {missing[0]}, which has no program")
        first = [e[:4] for e in seqs.get(group[0], [])]
        for d in group[1:]:
            mine = [e[:4] for e in seqs.get(d, [])]
            if mine != first:
                k = next((i for i, (a, b) in enumerate(zip(first, mine)) if a != b), min(len(first), len(mine)))
                a = first[k] if k < len(first) else "nothing"
                b = mine[k] if k < len(mine) else "nothing"
                raise VerifyError(
                    f"collective #{k} of group {group}: device {group[0]} enters {a}, device {d} enters {b}"
                )


# --- the oracle -----------------------------------------------------------------------------------


def simulate(program: ParallelProgram, inputs: Mapping[int, list[np.ndarray]]) -> dict[int, list[np.ndarray]]:
    """Run the device programs in lock step with the reference implementations. The programs of
    one plan have the same nodes in the same order (they differ in constants and local attributes
    only), so step k of every program runs together and a collective sees every member's operand."""
    programs = program.devices
    envs: dict[int, dict[Any, Any]] = {p.device: dict(zip(p.graph.inputs, inputs[p.device])) for p in programs}
    lengths = {len(p.graph.nodes) for p in programs}
    if len(lengths) != 1:
        raise GraphcError("device programs of one plan must have the same number of steps to run in lock step")
    by_device = {p.device: p for p in programs}
    for k in range(lengths.pop()):
        done: set[int] = set()
        for p in programs:
            if p.device in done:
                continue
            node = p.graph.nodes[k]
            if node.op.has(Collective):
                group = node.attrs["group"]
                members = [by_device[d].graph.nodes[k] for d in group]
                xs = [envs[d][m.inputs[0]] for d, m in zip(group, members)]
                for d, m, y in zip(group, members, reference(node.op.name, xs, **node.attrs)):
                    envs[d][m.outputs[0]] = y
                    done.add(d)
                continue
            env = envs[p.device]
            args = [env[v] for v in node.inputs]
            outs = (
                node.op.impl(run_flat, node.regions, *args, **node.attrs)
                if node.regions
                else precision.evaluate(node, *args)  # bfloat16 and float16 in float32, rounded
            )
            for o, y in zip(node.outputs, outs):
                env[o] = np.asarray(y)
            done.add(p.device)
    return {p.device: [envs[p.device][v] for v in p.graph.outputs] for p in programs}


# --- pipelines ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PipelineTask:
    """One task of one device: the forward ("F") or backward ("B") part of its stage for
    micro-batch ``k``, or a segment of the update ("U", ``k`` = -1 - segment). Its inputs and
    outputs are values of the step, named by id (inputs 0..n-1, then node results in order);
    ``sends`` says which devices need each output."""

    device: int
    phase: str
    k: int
    graph: Graph
    in_ids: tuple[int, ...]
    out_ids: tuple[int, ...]
    sends: Mapping[int, tuple[int, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class PipelineProgram:
    """A training step as a pipeline: ``n_stages`` stages of ``stage_devices`` (each stage a
    sub-mesh of shape ``sub_shape``), ``m`` micro-batches, and for every device its tasks and the
    order it runs them in.

    Values of the step have ids: the step's inputs 0..n_inputs-1, then every result of the program
    the tasks were cut from. ``where[vid]`` is the (stage, phase) producing a value ("F", "B",
    "U", or "M" for a meeting point, where the micro-batches' partial sums are added up);
    ``readers[vid]`` the (stage, phase) pairs reading it; ``meetings[out]`` = (summand, stage).
    Inputs listed in ``batch`` are split into micro-batches along dim 0; with a sub-mesh,
    ``in_specs`` / ``out_specs`` say which piece of every input and output a device holds."""

    mesh: Mesh
    pp_axis: int
    n_stages: int
    m: int
    schedule: str
    stage_devices: tuple[tuple[int, ...], ...]
    sub_shape: tuple[int, ...]
    order: tuple[tuple[tuple[str, int], ...], ...]  # per stage: (phase, micro-batch) in run order
    tasks: Mapping[tuple[int, str, int], PipelineTask]
    n_segments: Mapping[int, int]
    n_inputs: int
    batch: frozenset[int]
    where: Mapping[int, tuple[int, str]]
    readers: Mapping[int, frozenset[tuple[int, str]]]
    meetings: Mapping[int, tuple[int, int]]
    out_ids: tuple[int, ...]
    in_types: tuple[TensorType, ...]
    out_types: tuple[TensorType, ...]
    in_specs: tuple[Spec, ...] | None = None
    out_specs: tuple[Spec, ...] | None = None

    def stage_of(self, device: int) -> int:
        return self.mesh.coord(device)[self.pp_axis]

    def device(self, stage: int, c: int) -> int:
        return self.stage_devices[stage][c]

    def producer(self, vid: int) -> tuple[int, str]:
        """(stage, phase) producing ``vid``; a step input: (-1, "I")."""
        return (-1, "I") if vid < self.n_inputs else self.where[vid]

    def owner(self, vid: int) -> int:
        """The stage holding the final value of ``vid`` (a meeting point's: where it is summed)."""
        st, ph = self.producer(vid)
        return self.meetings[vid][1] if ph == "M" else st

    def needed_later(self, vid: int, stage: int) -> bool:
        """Whether ``stage``'s update (or the step's result) still needs ``vid``."""
        return (stage, "U") in self.readers.get(vid, ()) or vid in self.out_ids


__all__ = [
    "DeviceProgram",
    "ParallelProgram",
    "PipelineProgram",
    "PipelineTask",
    "check_collective_order",
    "collective_sequence",
    "simulate",
]
