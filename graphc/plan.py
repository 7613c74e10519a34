"""A partition plan: what the auto-sharding pass chose, what it costs, and why.

``Plan.to_json()`` is a versioned document (``PLAN_VERSION``):

    version, graph (name, hash), mesh (axes, links, profile), options,
    inputs / outputs   [{name, type, spec}]
    nodes              [{index, name, op, loc, part, strategy, in_specs, out_specs, compute_s,
                         pinned, warning, alternatives: [{strategy, out_specs, delta_s}]}]
    collectives        [{kind, axes, bytes (the whole logical tensor), local_bytes, tensor, node,
                         op, loc, part, from, to, time_s}]
    cost               {compute_s, comm_s, total_s}
    memory             {limit_bytes, peak_bytes: [one per device], peak_at}
    solver             {name, status, objective_s, bound_s, gap, seconds, variables, constraints,
                         vars_unshrunk, groups, ...}
    warnings           [...]

A plan file can be loaded (``Plan.load``), hand-edited (set a node's ``"pinned": true`` after
changing its ``strategy``, or pin an input's ``spec``) and re-solved around the pins
(``graphc compile --plan FILE``); ``check(graph)`` refuses a plan made for another graph (the
hash of the graph's text IR).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from graphc.core.errors import PlanError
from graphc.core.files import atomic_write
from graphc.core.spec import format_spec
from graphc.core.units import fmt_bytes, fmt_time

PLAN_VERSION = 1


def graph_hash(graph) -> str:
    from graphc.textir import print_graph

    return hashlib.sha256(print_graph(graph).encode()).hexdigest()[:32]


class Plan:
    def __init__(self, doc: dict[str, Any], problem=None, solution=None):
        self.doc = doc
        self.problem = problem  # present for plans solved in this process
        self.solution = solution

    # --- construction ---------------------------------------------------------------------
    @classmethod
    def from_solution(cls, problem, sol, memory_limit, ghash: str, build_s: float, options: dict) -> Plan:
        from graphc.passes.sharding import collectives_of

        graph = problem.graph
        mesh = problem.mesh
        names = graph.value_names()
        choice = sol.choice
        alternatives = _alternatives(problem, choice)
        inputs, outputs, nodes = [], [], []
        for i, it in enumerate(problem.items):
            st = it.strategies[choice[i]]
            if it.kind == "input":
                inputs.append({"index": it.index, "name": f"%{names[it.value]}", "type": str(it.value.type),
                               "spec": format_spec(st.out_specs[0]), "pinned": bool(it.pinned),
                               "alternatives": alternatives.get(i, [])})
            elif it.kind == "output":
                outputs.append({"index": it.index, "name": f"%{names[it.value]}", "type": str(it.value.type),
                                "spec": format_spec(st.in_specs[0]), "pinned": bool(it.pinned),
                                "alternatives": alternatives.get(i, [])})
            else:
                n = it.node
                nodes.append({
                    "index": it.index,
                    "name": f"%{names[n.outputs[0]]}" if n.outputs else f"node{it.index}",
                    "op": n.op.name, "loc": str(n.loc) if n.loc else None, "part": n.part,
                    "types": [str(o.type) for o in n.outputs],
                    "strategy": st.name,
                    "in_specs": [format_spec(s) for s in st.in_specs],
                    "out_specs": [format_spec(s) for s in st.out_specs],
                    "compute_s": st.compute_s,
                    "pinned": bool(it.pinned), "warning": it.warning,
                    "alternatives": alternatives.get(i, []),
                })
        ev = problem.evaluate(choice)
        collectives = collectives_of(problem, choice)
        comm = sum(c["time_s"] for c in collectives)
        peak, at = problem.peak_memory(choice)
        at_item = problem.items[problem.order[at]] if problem.order else None
        doc = {
            "version": PLAN_VERSION,
            "graph": {"name": graph.name, "hash": ghash, "nodes": len(graph.nodes)},
            "mesh": mesh.to_json(),
            "options": dict(options),
            "inputs": inputs,
            "outputs": outputs,
            "nodes": nodes,
            "collectives": collectives,
            "cost": {"compute_s": ev["compute_s"], "comm_s": comm, "total_s": ev["compute_s"] + comm},
            "memory": {"limit_bytes": memory_limit, "peak_bytes": [peak] * mesh.size,
                       "peak_at": _item_name(at_item, names) if at_item is not None else None},
            "solver": {"name": options.get("solver", "CBC"), "status": sol.status, "objective_s": sol.objective,
                       "bound_s": sol.bound, "gap": sol.gap, "seconds": sol.seconds, "build_s": build_s,
                       **sol.stats},
            "ties": [[problem.items[a].index, problem.items[b].index] for a, b in problem.ties],
            "warnings": _dedupe(problem.warnings),
        }
        return cls(doc, problem, sol)

    # --- accessors ------------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self.doc["version"]

    @property
    def cost(self) -> dict:
        return self.doc["cost"]

    @property
    def memory(self) -> dict:
        return self.doc["memory"]

    @property
    def collectives(self) -> list[dict]:
        return self.doc["collectives"]

    @property
    def nodes(self) -> list[dict]:
        return self.doc["nodes"]

    @property
    def solver(self) -> dict:
        return self.doc["solver"]

    @property
    def mesh(self):
        from graphc.core.mesh import Mesh

        return Mesh.from_json(self.doc["mesh"])

    @property
    def graph_hash(self) -> str:
        return self.doc["graph"]["hash"]

    def input_specs(self) -> list[str]:
        return [d["spec"] for d in self.doc["inputs"]]

    def output_specs(self) -> list[str]:
        return [d["spec"] for d in self.doc["outputs"]]

    # --- files ----------------------------------------------------------------------------
    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.doc, indent=indent, sort_keys=False)

    def save(self, path: str, make_dirs: bool = False) -> None:
        atomic_write(path, self.to_json(), make_dirs=make_dirs)

    @classmethod
    def from_json(cls, text: str, source: str = "<plan>") -> Plan:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise PlanError(f"{source}:{exc.lineno}:{exc.colno}: not a plan file: {exc.msg}") from None
        if not isinstance(doc, dict) or "version" not in doc:
            raise PlanError(f"{source}: not a graphc plan (no 'version' key)")
        if doc["version"] != PLAN_VERSION:
            raise PlanError(f"{source}: plan version {doc['version']} is not supported (expected {PLAN_VERSION})")
        for key in ("mesh", "nodes", "collectives", "cost", "memory", "solver", "graph", "inputs", "outputs"):
            if key not in doc:
                raise PlanError(f"{source}: plan has no {key!r} section")
        return cls(doc)

    @classmethod
    def load(cls, path: str) -> Plan:
        try:
            with open(path) as f:
                text = f.read()
        except OSError as exc:
            raise PlanError(f"cannot read plan {path}: {exc.strerror}") from None
        return cls.from_json(text, path)

    def check(self, graph) -> None:
        """Refuse a plan made for a different graph."""
        h = graph_hash(graph)
        if h != self.graph_hash:
            raise PlanError(
                f"stale plan: it was made for graph @{self.doc['graph']['name']} with hash {self.graph_hash}, "
                f"but the graph now hashes to {h} (the model or its arguments changed); recompile the plan")

    def pins(self) -> tuple[dict, dict, dict]:
        """(input pins, output pins, node pins) marked ``"pinned": true`` in the document."""
        ins = {d["index"]: d["spec"] for d in self.doc["inputs"] if d.get("pinned")}
        outs = {d["index"]: d["spec"] for d in self.doc["outputs"] if d.get("pinned")}
        nodes = {d["index"]: d["strategy"] for d in self.doc["nodes"] if d.get("pinned")}
        return ins, outs, nodes

    # --- reading --------------------------------------------------------------------------
    def summary(self, top: int = 12) -> str:
        d = self.doc
        mesh = d["mesh"]
        axes = ", ".join(f"{name}={size}" for name, size in mesh["axes"].items())
        c = d["cost"]
        m = d["memory"]
        s = d["solver"]
        lines = [
            f"plan for @{d['graph']['name']} on mesh ({axes}): {d['graph']['nodes']} nodes, "
            f"{len(d['collectives'])} collectives",
            f"predicted step {fmt_time(c['total_s'])} = compute {fmt_time(c['compute_s'])} + communication {fmt_time(c['comm_s'])}",
            f"memory per device: peak {fmt_bytes(m['peak_bytes'][0])}"
            + (f" of {fmt_bytes(m['limit_bytes'])}" if m.get("limit_bytes") else " (no limit)")
            + (f", at {m['peak_at']}" if m.get("peak_at") else ""),
            f"solver {s['name']}: {s['status']}, objective {fmt_time(s['objective_s'])}, gap {s['gap']:.2%}, "
            f"{s['seconds']:.2f} s, {s.get('variables', '?')} variables / {s.get('constraints', '?')} constraints "
            f"(unshrunk {s.get('vars_unshrunk', '?')}; {s.get('items', '?')} items -> {s.get('groups', '?')} groups)",
        ]
        coll = sorted(d["collectives"], key=lambda x: -x["time_s"])
        if coll:
            by_kind: dict[str, list] = {}
            for x in coll:
                by_kind.setdefault(x["kind"], []).append(x)
            lines.append("collectives: " + ", ".join(
                f"{k} x{len(v)} ({fmt_time(sum(x['time_s'] for x in v))})" for k, v in sorted(by_kind.items())))
            lines.append(f"  {'kind':<15}{'axes':<8}{'tensor':>12}  {'bytes':>11}  {'time':>10}  {'part':<9} where")
            for x in coll[:top]:
                lines.append(f"  {x['kind']:<15}{','.join(x['axes']):<8}{x['tensor']:>12}  {fmt_bytes(x['bytes']):>11}  "
                             f"{fmt_time(x['time_s']):>10}  {x['part'] or '-':<9} {x['op']} {x['loc'] or ''} {x['from']} -> {x['to']}")
        costly = sorted(d["nodes"], key=lambda n: -n["compute_s"])[:top]
        lines.append(f"  {'node':<8}{'op':<12}{'compute':>10}  {'strategy':<22} out spec        where")
        for n in costly:
            lines.append(f"  {n['name']:<8}{n['op']:<12}{fmt_time(n['compute_s']):>10}  {n['strategy']:<22} "
                         f"{', '.join(n['out_specs']):<15} {n['loc'] or ''} {n['part'] or ''}")
        specs = [f"{x['name']}: {x['spec']}" for x in d["inputs"]]
        if specs:
            lines.append("inputs: " + "; ".join(specs[:top]) + (" ..." if len(specs) > top else ""))
        for w in d.get("warnings", [])[:top]:
            lines.append(f"warning: {w}")
        return "\n".join(lines)

    def explain(self, name: str) -> str:
        """Why a tensor (or node) got its spec: its cost against the best alternatives, holding
        every other choice fixed (compute of its node + the redistributions it causes)."""
        key = name if name.startswith("%") else f"%{name}"
        for x in self.doc["inputs"]:
            if x["name"] == key:
                lines = [f"input {key} {x['type']}: spec {x['spec']}" + (" (pinned)" if x["pinned"] else "")
                         + "; against the best other specs, every other choice held fixed"
                         + (" (a tied state input: its output keeps this spec too)"
                            if any(t[0] == x["index"] for t in self.doc.get("ties", [])) else "") + ":"]
                for a in x.get("alternatives") or []:
                    mem = a.get("memory_delta_bytes", 0)
                    lines.append(f"  instead {', '.join(a['out_specs']):<22} redistribution to its consumers would cost "
                                 f"{'+' if a['delta_s'] >= 0 else ''}{fmt_time(a['delta_s'])}, memory per device "
                                 f"{'+' if mem >= 0 else '-'}{fmt_bytes(abs(mem))}")
                if len(lines) == 1:
                    lines.append("  no alternative spec on this mesh")
                return "\n".join(lines)
        for n in self.doc["nodes"]:
            if n["name"] == key:
                lines = [f"{key} = {n['op']} at {n['loc'] or '?'} ({n['part'] or 'untagged'}): strategy {n['strategy']}, "
                         f"out {', '.join(n['out_specs'])}, in {', '.join(n['in_specs'])}, compute {fmt_time(n['compute_s'])}"
                         + (" (pinned)" if n["pinned"] else "")]
                if n.get("warning"):
                    lines.append(f"  warning: {n['warning']}")
                alts = n.get("alternatives") or []
                if not alts:
                    lines.append("  no alternative strategy (only one is valid on this mesh)")
                for a in alts:
                    lines.append(f"  instead {a['strategy']:<22} out {', '.join(a['out_specs']):<18} would cost "
                                 f"{'+' if a['delta_s'] >= 0 else ''}{fmt_time(a['delta_s'])} "
                                 f"(compute {fmt_time(a['compute_s'])}, redistribution {fmt_time(a['comm_s'])})")
                return "\n".join(lines)
        raise PlanError(f"plan has no tensor or node named {key}")

    def __repr__(self) -> str:
        c = self.doc["cost"]
        return f"<Plan @{self.doc['graph']['name']} total {fmt_time(c['total_s'])}, {len(self.collectives)} collectives>"


def _dedupe(warnings: list[str]) -> list[str]:
    counts: dict[str, int] = {}
    for w in warnings:
        counts[w] = counts.get(w, 0) + 1
    return [w if n == 1 else f"{w} (x{n})" for w, n in counts.items()]


def _item_name(item, names) -> str:
    if item.kind == "node":
        return f"%{names[item.node.outputs[0]]} ({item.node.op.name} at {item.node.loc or '?'})" if item.node.outputs else item.node.op.name
    return f"{item.kind} %{names[item.value]}"


def _local_bytes(value, spec, problem) -> int:
    from graphc.core.spec import local_shape

    n = value.type.dtype.itemsize
    for d in local_shape(value.type.shape, spec, tuple(problem.mesh.shape)):
        n *= d
    return n


def _alternatives(problem, choice, top: int = 3) -> dict[int, list[dict]]:
    """For every item (input, node, output): its best alternatives with everything else fixed:
    its compute, the redistributions on its edges and, for inputs, the bytes each device holds."""
    incident: dict[int, list] = {}
    for e in problem.edges:
        incident.setdefault(e.src, []).append(e)
        incident.setdefault(e.dst, []).append(e)
    out = {}
    for i, it in enumerate(problem.items):
        if len(it.strategies) < 2:
            continue

        def local(s, i=i, it=it):
            comm = 0.0
            for e in incident.get(i, []):
                a = s if e.src == i else choice[e.src]
                b = s if e.dst == i else choice[e.dst]
                comm += problem.edge_time(e, a, b)
            return it.strategies[s].compute_s, comm

        c0, m0 = local(choice[i])
        alts = []
        for s in range(len(it.strategies)):
            if s == choice[i]:
                continue
            c, m = local(s)
            st = it.strategies[s]
            alt = {"strategy": st.name, "out_specs": [format_spec(x) for x in st.out_specs],
                   "compute_s": c, "comm_s": m, "delta_s": (c + m) - (c0 + m0)}
            if it.kind == "input":
                alt["memory_delta_bytes"] = _local_bytes(it.value, st.out_specs[0], problem) - \
                    _local_bytes(it.value, it.strategies[choice[i]].out_specs[0], problem)
            alts.append(alt)
        alts.sort(key=lambda a: a["delta_s"])
        out[i] = alts[:top]
    return out
