"""ZeRO stages (Rajbhandari et al., 2020) as sharding choices along a data-parallel axis.

A training step's state is sharded along a data axis (role "data", passes/sharding/roles.py)
by the specs the planner already has: the state inputs may be split along it, and so may the
update's values; nothing else changes. A parameter's *group* is the parameter, its optimizer
state and its gradient, found from the graph (``param_groups``). Its stage follows from the
chosen specs:

    stage  parameter  optimizer state  gradient (as the update reads it)   collectives per step
    0      R          R                R (all-reduce)                      all_reduce
    1      R          S                R (all-reduce, then a local slice)  all_reduce + all_gather
    2      R          S                S (reduce-scatter)                  reduce_scatter + all_gather
    3      S          S                S (reduce-scatter)                  reduce_scatter + all_gather
                                                                           before each use

(R / S: replicated / split along the data axis; other axes as the plan has them). ZeRO-1 and -2
gather the updated parameter (the update computes a shard, the tied output is replicated);
ZeRO-3 keeps the parameter split and gathers it for every forward or backward node that reads
it, freeing the copy after that node (passes/partition.py ``compile_devices``: ``regather``).
The problem (passes/sharding/problem.py) prices these collectives on its edges and counts in its
memory model what each stage keeps: a gradient lives as its producer left it (a full partial sum)
only until its fan-out item right after the producer, then as the fan-out's spec (the shard a
reduce-scatter leaves, which the lowering makes there), and a ZeRO-3 parameter's gathered copy
lives at its reader only.

``zero="auto"`` leaves the stage of every group to the solver; ``zero=1|2|3`` keeps only the
choices of that stage (``restrict_zero``); ``zero=0`` turns the machinery off (data axes never
split state: the planner as it was before ZeRO). The option's values are passes/options.py's
``ZERO_CHOICES``.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphc.core.errors import PlanError
from graphc.core.ir import Graph, Node, Value
from graphc.core.spec import Spec
from graphc.passes.sharding.memory import gathered, local_nbytes
from graphc.passes.sharding.problem import Problem
from graphc.passes.sharding.roles import update_nodes
from graphc.passes.sharding.strategies import Strategies


@dataclass(frozen=True)
class ParamGroup:
    """A parameter and what the update keeps for it, by graph input position."""

    param: int | None  # the state input the forward or backward reads (None: only the update does)
    states: tuple[int, ...]  # optimizer state: state inputs only the update reads
    gradients: tuple[Value, ...]  # values the backward makes and only the update reads


def gradients(graph: Graph, update: frozenset[Node] | None = None) -> set[Value]:
    """Values the backward makes that only the update (``update_nodes``) reads (and no output)."""
    update = update_nodes(graph) if update is None else update
    return _gradients(graph, update, *_reads(graph, update))


def _reads(graph: Graph, update: frozenset[Node]) -> tuple[set[Value], set[Value]]:
    """(the values some node reads, the values some node outside ``update`` reads)."""
    read: set[Value] = set()
    outside: set[Value] = set()
    for node in graph.nodes:
        read.update(node.inputs)
        if node not in update:
            outside.update(node.inputs)
    return read, outside


def _gradients(graph: Graph, update: frozenset[Node], read: set[Value], outside: set[Value]) -> set[Value]:
    """``gradients``, given ``_reads``: read, and by the update alone."""
    outputs = set(graph.outputs)
    return {
        o
        for node in graph.nodes
        if node.part == "backward" and node not in update
        for o in node.outputs
        if o not in outputs and o in read and o not in outside
    }


def param_groups(graph: Graph, state: set[int], update: frozenset[Node] | None = None) -> list[ParamGroup]:
    """The groups of the state inputs at positions ``state``: the values of one shape that update
    nodes join (an elementwise update links its operands and results of its result's shape; the
    scalars Adam shares between parameters, such as its step count, link nothing). ``update``:
    the update's nodes when known (``update_nodes(graph)``, which a problem's roles hold with ZeRO)."""
    update = update_nodes(graph) if update is None else update
    parent: dict[Value, Value] = {}

    def find(v: Value) -> Value:
        while parent.get(v, v) is not v:
            v = parent[v]
        return v

    for node in graph.nodes:
        if node not in update or not node.outputs:
            continue
        shape = node.outputs[0].type.shape
        if not shape:
            continue
        same = [v for v in (*node.inputs, *node.outputs) if v.type.shape == shape]
        for v in same[1:]:
            a, b = find(same[0]), find(v)
            if a is not b:
                parent[a] = b
    read, read_outside = _reads(graph, update)
    members: dict[Value, list[int]] = {}
    for k in sorted(state):
        members.setdefault(find(graph.inputs[k]), []).append(k)
    grads: dict[Value, list[Value]] = {}
    made = _gradients(graph, update, read, read_outside)
    for g in (o for node in graph.nodes for o in node.outputs if o in made):  # in program order
        grads.setdefault(find(g), []).append(g)
    out = []
    for root, ks in members.items():
        params = [k for k in ks if graph.inputs[k] in read_outside]
        param = params[0] if len(params) == 1 else None
        states = tuple(k for k in ks if k != param)
        if param is None and not states:
            continue
        out.append(ParamGroup(param, states, tuple(grads.get(root, ()))))
    return out


def problem_update(problem: Problem) -> frozenset[Node]:
    """``update_nodes`` of the problem's graph (made once per problem: the roles hold it with ZeRO)."""
    got = problem.derived.get("update")
    if got is None:
        roles = problem.roles
        got = problem.derived["update"] = (roles.update if roles is not None else None) or update_nodes(problem.graph)
    return got


def problem_groups(problem: Problem) -> list[ParamGroup]:
    """``param_groups`` of the problem's state (made once per problem: the offload candidates and
    the plan's ZeRO report both ask)."""
    got = problem.derived.get("param_groups")
    if got is None:
        got = problem.derived["param_groups"] = tuple(
            param_groups(problem.graph, state_positions(problem), problem_update(problem))
        )
    return list(got)


def split_on(spec: Spec, axes: tuple[int, ...]) -> bool:
    return any(spec[a].is_split for a in axes)


def stage_of(group: ParamGroup, input_spec: dict[int, Spec], gradient_spec: dict[Value, Spec], axes) -> int:
    """The stage the specs give a group (module doc): 3 with the parameter split along a ZeRO
    axis; else 2 with every gradient read split; else 1 with some optimizer state split; else 0."""
    if not axes:
        return 0
    if group.param is not None and split_on(input_spec[group.param], axes):
        return 3
    grads = [gradient_spec[g] for g in group.gradients if g in gradient_spec]
    if grads and all(split_on(s, axes) for s in grads):
        return 2
    if any(split_on(input_spec[k], axes) for k in group.states):
        return 1
    return 0


def state_positions(problem: Problem) -> set[int]:
    roles = problem.roles
    state = roles.state if roles is not None else frozenset()
    return {it.index for it in problem.items if it.kind == "input" and it.value in state}


def _update(problem: Problem) -> frozenset[Node] | None:
    """The update's nodes as the problem's roles found them (with ZeRO on a data axis, the only
    way a problem has ZeRO axes), else None (``param_groups`` finds them)."""
    roles = problem.roles
    return roles.update if roles is not None and roles.zero and problem.zero_axes else None


def gradient_hubs(problem: Problem) -> dict[Value, int]:
    """{gradient: its fan-out item}."""
    out = {}
    for i, it in enumerate(problem.items):
        if it.gradient:
            assert it.value is not None  # a fan-out holds its value
            out[it.value] = i
    return out


def restrict_zero(problem: Problem) -> None:
    """Keep only the choices of the forced stage ``problem.zero`` (1-3) for every parameter group
    that can be split evenly along a ZeRO axis (the others stay replicated, with a warning)."""
    stage = problem.zero
    if stage == "auto" or stage == 0:
        return
    axes = problem.zero_axes
    if not axes:
        raise PlanError(
            f"zero={stage}: ZeRO shards a training step's state along a data-parallel axis, and mesh "
            f"{problem.mesh} has none of size > 1 with a training step's update to shard (a 'dp' axis)"
        )
    inputs = {it.index: i for i, it in enumerate(problem.items) if it.kind == "input"}
    hubs = gradient_hubs(problem)
    names = problem.graph.value_names()
    for group in param_groups(problem.graph, state_positions(problem), _update(problem)):
        split_ok = True
        for k in group.states:
            split_ok &= _keep(problem, inputs[k], lambda s: split_on(s, axes))
        if group.param is not None:
            if stage == 3:
                split_ok &= _keep(problem, inputs[group.param], lambda s: split_on(s, axes))
            else:
                _keep(problem, inputs[group.param], lambda s: not split_on(s, axes))
        for g in group.gradients:
            if g not in hubs:
                continue
            if stage == 1:
                _keep(problem, hubs[g], lambda s: all(s[a].kind == "R" for a in axes))
            else:
                split_ok &= _keep(problem, hubs[g], lambda s: split_on(s, axes))
        if not split_ok:
            what = names[problem.graph.inputs[group.param if group.param is not None else group.states[0]]]
            problem.warnings.append(
                f"zero={stage}: %{what} cannot be split evenly along the data axis; its state stays replicated"
            )


def _keep(problem: Problem, i: int, ok) -> bool:
    """Keep the strategies of item ``i`` whose result spec is ``ok``; False (nothing kept) when
    none is."""
    it = problem.items[i]
    keep = [st for st in it.strategies if ok(st.out_specs[0])]
    if not keep:  # no even split (or a user pin rules the stage out): left as it is
        return False
    it.strategies = Strategies(keep)
    return True


def saved_bytes(problem: Problem, item: int, spec: Spec) -> int:
    """Bytes per device that ``spec`` saves over the same spec unsplit along the ZeRO axes."""
    v = problem.items[item].value
    assert v is not None
    mesh_shape = tuple(problem.mesh.shape)
    return local_nbytes(v.type, gathered(spec, problem.zero_axes), mesh_shape) - local_nbytes(v.type, spec, mesh_shape)


def zero_report(problem: Problem, choice: list[int]) -> dict[int, tuple[int, int]]:
    """{graph input position: (ZeRO stage, bytes per device its choice saves)} of every state
    input; a parameter's saving includes its gradients' (read as shards, stage 2 and 3)."""
    axes = problem.zero_axes
    if not axes:
        return {}
    inputs = {it.index: i for i, it in enumerate(problem.items) if it.kind == "input"}
    input_spec = {k: problem.items[i].strategies[choice[i]].out_specs[0] for k, i in inputs.items()}
    hubs = gradient_hubs(problem)
    gradient_spec = {g: problem.items[i].strategies[choice[i]].out_specs[0] for g, i in hubs.items()}
    out: dict[int, tuple[int, int]] = {}
    for group in problem_groups(problem):
        stage = stage_of(group, input_spec, gradient_spec, axes)
        for k in group.states:
            out[k] = (stage, saved_bytes(problem, inputs[k], input_spec[k]))
        if group.param is not None:
            saved = saved_bytes(problem, inputs[group.param], input_spec[group.param])
            saved += sum(saved_bytes(problem, hubs[g], gradient_spec[g]) for g in group.gradients if g in hubs)
            out[group.param] = (stage, saved)
    return out


__all__ = [
    "ParamGroup",
    "gradients",
    "param_groups",
    "restrict_zero",
    "stage_of",
    "zero_report",
]
