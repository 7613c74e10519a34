"""Print the import graph of graphc's layers as Markdown (the tables in docs/architecture.md).

    python docs/import_graph.py            print it
    python docs/import_graph.py --update   write it into docs/architecture.md

Built with grimp from the source, so the documentation says what the code does;
tests/project/test_layering.py fails when docs/architecture.md is out of date.
"""

from __future__ import annotations

import grimp

# the layers of pyproject.toml's import-linter contract, top to bottom
LAYERS = [
    "cli",
    "bench",
    "models",
    "api",
    "optim",
    "runtime",
    "passes",
    "autodiff",
    "frontend",
    "programs",
    "textir",
    "interpreter",
    "builder",
    "ops",
    "core",
]


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def render() -> str:
    graph = grimp.build_graph("graphc", cache_dir=None)
    modules: dict[str, list[str]] = {layer: [] for layer in LAYERS}
    uses: dict[str, dict[str, int]] = {layer: {} for layer in LAYERS}
    for m in sorted(graph.modules):
        layer = layer_of(m)
        if layer is None:
            continue
        modules[layer].append(m)
        for imported in graph.find_modules_directly_imported_by(m):
            other = layer_of(imported)
            if other is not None and other != layer:
                uses[layer][other] = uses[layer].get(other, 0) + 1
    lines = [
        "```mermaid",
        "flowchart TD",
        *[f"  {a} --> {b}" for a in LAYERS for b in LAYERS if b in uses[a]],
        "```",
        "",
        "| layer | modules | imports from |",
        "|---|---|---|",
    ]
    for layer in LAYERS:
        names = ", ".join(m.removeprefix(f"graphc.{layer}").lstrip(".") or layer for m in modules[layer])
        deps = ", ".join(b for b in LAYERS if b in uses[layer]) or "-"
        lines.append(f"| `{layer}` | {names} | {deps} |")
    return "\n".join(lines) + "\n"


START, END = "<!-- import-graph:start -->\n", "<!-- import-graph:end -->"


def update(path: str) -> None:
    with open(path) as f:
        doc = f.read()
    a, b = doc.index(START) + len(START), doc.index(END)
    with open(path, "w") as f:
        f.write(doc[:a] + render() + doc[b:])


if __name__ == "__main__":
    import os
    import sys

    if sys.argv[1:] == ["--update"]:
        update(os.path.join(os.path.dirname(os.path.abspath(__file__)), "architecture.md"))
    else:
        print(render(), end="")
