"""The structure of graphc, checked so that it cannot rot (docs/architecture.md describes it).

* the import-linter contracts in pyproject.toml: one direction of dependency between the layers,
  a runtime that never plans or traces, and no import cycle inside any package;
* the only imports inside functions are the heavy optional ones listed in pyproject.toml;
* graphc's own modules do not go through the lazy package facade;
* the runtime runs a saved device program with the compiler's packages blocked;
* an installed graphc has no top-level passes, runtime or models package;
* the modules the type checker skips are the ones listed, with their reason.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import grimp
import numpy as np
import pytest
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("graphc", include_external_packages=True, cache_dir=None)


def test_import_contracts_hold():
    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "3 kept, 0 broken" in res.stdout


def _module_file(graph_module: str) -> str:
    """The source file of a module of graphc (the linked folders resolve through graphc/)."""
    parts = graph_module.split(".")
    base = os.path.join(ROOT, *parts)
    return os.path.join(base, "__init__.py") if os.path.isdir(base) else base + ".py"


def _local_imports(graph) -> set[str]:
    """``importer -> imported`` of every import inside a function of graphc, of graphc's own
    modules and of third-party packages (the standard library's are not a layering question)."""
    stdlib = set(sys.stdlib_module_names)
    found = set()
    for module in sorted(m for m in graph.modules if m.startswith("graphc")):
        with open(_module_file(module)) as f:
            tree = ast.parse(f.read())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                else:
                    continue
                found.update(f"{module} -> {n}" for n in names if n.split(".")[0] not in stdlib)
    return found


def test_only_the_listed_heavy_imports_are_inside_functions(graph):
    allowed = _pyproject()["tool"]["graphc"]["lazy-imports"]
    assert all(reason.strip() for reason in allowed.values())
    assert _local_imports(graph) == set(allowed)


def test_graphc_modules_do_not_import_the_facade(graph):
    """``import graphc`` is for users (and the example models): inside graphc it would make every
    module depend on everything the facade exposes."""
    importers = {m for m in graph.find_modules_that_directly_import("graphc") if not m.startswith("graphc.models")}
    assert importers == {"graphc.__main__"} or not importers, importers


def test_type_checker_exclusions_only_shrink():
    overrides = _pyproject()["tool"]["mypy"]["overrides"]
    skipped = {m for o in overrides if o.get("ignore_errors") for m in o["module"]}
    assert skipped <= {"graphc.runtime.fastmath"}


# --- the runtime runs what it is handed -------------------------------------------------------------

_BLOCKED_RUN = textwrap.dedent(
    """
    import importlib.abc, json, sys
    import numpy as np

    BLOCKED = ("graphc.passes", "graphc.frontend", "graphc.autodiff", "graphc.api")

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.startswith(BLOCKED):
                raise ImportError(f"{name} is blocked: the runtime must not need it")
            return None

    sys.meta_path.insert(0, Block())
    from graphc.programs import ParallelProgram
    from graphc.runtime.devices import ParallelExecutable

    folder = sys.argv[1]
    with open(folder + "/program.json") as f:
        program = ParallelProgram.from_json(f.read(), "program.json")
    inputs = [np.load(f"{folder}/in{k}.npy") for k in range(len(program.in_types))]
    outs = ParallelExecutable(program, timeout_s=30).run_flat(inputs)
    for k, o in enumerate(outs):
        np.save(f"{folder}/out{k}.npy", o)
    print(json.dumps(sorted(m for m in sys.modules if m.startswith(BLOCKED))))
    """
)


@pytest.mark.slow
def test_runtime_runs_a_saved_program_with_the_compiler_blocked(tmp_path):
    import graphc
    from graphc.core.mesh import MachineProfile, Mesh
    from graphc.interpreter import bind_arguments, run_flat
    from graphc.models import mlp
    from graphc.passes.partition import partition

    (params, x, labels), kw = mlp.example_train_args(batch=32, sizes=(16, 32, 8))
    traced = graphc.trace(mlp.train_step, params, x, labels, **kw)
    done = partition(traced, Mesh({"dp": 2, "tp": 2}, profile=MachineProfile.default()))
    arrays = bind_arguments(traced, (params, x, labels), kw)
    want = run_flat(done.graph, arrays)
    (tmp_path / "program.json").write_text(done.program.to_json())
    for k, a in enumerate(arrays):
        np.save(tmp_path / f"in{k}.npy", a)
    res = subprocess.run(
        [sys.executable, "-c", _BLOCKED_RUN, str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.splitlines()[-1]) == []
    for k, w in enumerate(want):
        np.testing.assert_allclose(np.load(tmp_path / f"out{k}.npy"), w, rtol=1e-5, atol=1e-6)


def test_a_program_round_trips_through_json():
    import graphc
    from graphc.core.mesh import MachineProfile, Mesh
    from graphc.models import gpt
    from graphc.passes.partition import partition
    from graphc.programs import ParallelProgram

    args, kw = gpt.example_args(batch=2, seq=8, d=32, n_layer=1, n_head=2, n_vocab=64)
    pf = graphc.parallelize(gpt.gpt, mesh={"tp": 2}, static_argnames=("n_head",), cache=False)
    traced = graphc.trace(pf.static.bind({"n_head": kw.pop("n_head")}), *args, **kw)
    program = partition(traced, Mesh({"tp": 2}, profile=MachineProfile.default())).program
    back = ParallelProgram.from_json(program.to_json())
    assert back.to_json() == program.to_json()
    assert back.mesh == program.mesh and back.in_specs == program.in_specs


# --- packaging --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), ROOT],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    (path,) = out.glob("graphc-*.whl")
    return path


@pytest.mark.slow
def test_the_wheel_installs_only_the_graphc_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"graphc", next(t for t in tops if t.endswith(".dist-info"))}
    for inside in ("graphc/passes/partition.py", "graphc/runtime/devices.py", "graphc/models/gpt.py"):
        assert inside in names


@pytest.mark.slow
def test_installed_graphc_works_without_top_level_folders(wheel, tmp_path):
    target = tmp_path / "site"
    res = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr
    code = textwrap.dedent(
        """
        import importlib.util, sys
        import graphc, graphc.passes.partition, graphc.runtime.devices, graphc.models.gpt
        print(graphc.__file__)
        print(*[importlib.util.find_spec(n) is None for n in ("passes", "runtime", "models")])
        """
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    res = subprocess.run([sys.executable, "-c", code], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    where, missing = res.stdout.splitlines()
    assert where.startswith(str(target))
    assert missing == "True True True"


def test_the_documented_import_graph_is_current():
    res = subprocess.run(
        [sys.executable, "docs/import_graph.py"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
        doc = f.read()
    start, end = "<!-- import-graph:start -->\n", "<!-- import-graph:end -->"
    documented = doc[doc.index(start) + len(start) : doc.index(end)]
    assert documented == res.stdout, "docs/architecture.md is out of date: run python docs/import_graph.py --update"
