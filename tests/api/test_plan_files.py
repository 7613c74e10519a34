"""Plan files: ``graphc run --plan`` and ``parallelize(plan=...)`` run a plan exactly as written
(checked against the model and the mesh, never solved again); ``compile`` writes its plan where it
says, never over a file that is not a plan, and keeps it when an ``--explain`` name is a typo."""

import json
import os

import numpy as np
import pytest

import graphc
import graphc.cli.run
from graphc.api.parallel import Parallelized
from graphc.frontend.locations import display_path
from graphc.models import mlp
from tests.helpers import assert_same_pytree, cache_of_its_own
from tests.helpers import graphc_cli as call

TARGET = ["models/mlp.py:train_step", "--example", "example_train_args"]
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture
def env(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", cache_of_its_own(tmp_path / "cache"))
    monkeypatch.setenv("GRAPHC_PROFILE", str(tmp_path / "no_profile.json"))
    monkeypatch.chdir(ROOT)
    return tmp_path


def _what_runs(plan) -> tuple:
    """Everything of a plan the lowering follows: every spec and strategy, every collective."""
    return (
        [str(x.spec) for x in plan.inputs],
        [str(x.spec) for x in plan.outputs],
        [(n.index, n.strategy, tuple(map(str, n.in_specs)), tuple(map(str, n.out_specs))) for n in plan.nodes],
        [(c.kind, c.axes, c.tensor, c.node) for c in plan.collectives],
    )


def _tight_memory(args, kwargs) -> tuple[int, graphc.ShardingPlan]:
    """A per-device memory limit under which the planner chooses another plan on tp=2, and the plan
    it chooses without one."""
    static = tuple(kwargs)
    free = graphc.parallelize(mlp.train_step, mesh="tp=2", static_argnames=static, cache=False).plan(*args, **kwargs)
    with pytest.raises(graphc.PlanError) as info:
        graphc.parallelize(mlp.train_step, mesh="tp=2", memory_limit=1024, static_argnames=static, cache=False).plan(
            *args, **kwargs
        )
    smallest = info.value.min_memory_bytes
    assert smallest is not None and smallest < max(free.memory.peak_bytes)
    return (smallest + max(free.memory.peak_bytes)) // 2, free


def test_run_plan_runs_the_file_exactly_not_a_new_solve(env, monkeypatch):
    args, kwargs = mlp.example_train_args()
    limit, free = _tight_memory(args, kwargs)
    plan_file = env / "tight.json"
    code, _out, err = call("compile", *TARGET, "--mesh", "tp=2", "--memory", str(limit), "-o", str(plan_file))
    assert code == 0, err
    written = graphc.Plan.load(str(plan_file))
    assert max(written.memory.peak_bytes) <= limit
    assert _what_runs(written) != _what_runs(free)  # else this test could not tell a re-solve apart

    made = []  # the parallelized function the CLI builds, to ask what it compiled

    def spy(*a, **k):
        made.append(Parallelized(*a, **k))
        return made[-1]

    monkeypatch.setattr(graphc.cli.run, "Parallelized", spy)
    code, out, err = call("run", *TARGET, "--plan", str(plan_file), "--repeat", "1")
    assert code == 0, err
    assert f"{plan_file} run as written" in out and "equals graphc's interpreter: yes" in out
    compiled = made[0].compile(*args, **kwargs)
    assert compiled.plan.timing.get("given") is True  # nothing was solved
    assert _what_runs(compiled.plan) == _what_runs(written)
    # the device programs hold the file's collectives, not those of a plan without the limit
    kinds = sorted(n.op.name for p in compiled.partitioned.lowered.devices[:1] for n in p.graph.nodes)
    lowered_free = graphc.parallelize(mlp.train_step, mesh="tp=2", static_argnames=tuple(kwargs), cache=False)
    free_kinds = sorted(
        n.op.name for p in lowered_free.compile(*args, **kwargs).partitioned.lowered.devices[:1] for n in p.graph.nodes
    )
    assert kinds != free_kinds
    # the memory column is the file's prediction
    held = written.memory.held
    assert f"{graphc.core.units.fmt_bytes(held[0]):>9}" in out


def test_parallelize_with_a_plan_runs_it_and_checks_mesh_and_graph(env):
    args, kwargs = mlp.example_train_args()
    limit, free = _tight_memory(args, kwargs)
    static = tuple(kwargs)
    tight = graphc.parallelize(mlp.train_step, mesh="tp=2", memory_limit=limit, static_argnames=static, cache=False)
    path = str(env / "plan.json")
    tight.plan(*args, **kwargs).save(path)
    loaded = graphc.Plan.load(path)

    pf = graphc.parallelize(mlp.train_step, mesh={"tp": 2}, plan=loaded, static_argnames=static)
    assert _what_runs(pf.plan(*args, **kwargs)) == _what_runs(loaded) != _what_runs(free)
    assert_same_pytree(pf(*args, **kwargs), mlp.train_step(*args, **kwargs))
    no_mesh = graphc.parallelize(mlp.train_step, plan=loaded, static_argnames=static)  # the plan's mesh
    assert no_mesh.mesh.shape == (2,) and _what_runs(no_mesh.plan(*args, **kwargs)) == _what_runs(loaded)

    with pytest.raises(graphc.PlanError, match=r"made for mesh tp=2 \(graph @train_step\), but the mesh is dp=2"):
        graphc.parallelize(mlp.train_step, mesh="dp=2", plan=loaded)
    with pytest.raises(graphc.PlanError, match=r"made for mesh tp=2 .* but the mesh is tp=4"):
        graphc.parallelize(mlp.train_step, mesh="tp=4", plan=loaded)
    other = graphc.parallelize(mlp.train_step, mesh="tp=2", plan=loaded, static_argnames=static)
    smaller = (args[0], args[1][:8], args[2][:8])
    with pytest.raises(graphc.PlanError, match=rf"made for graph @train_step with hash {loaded.graph_hash}, but"):
        other.compile(*smaller, **kwargs)
    with pytest.raises(graphc.GraphcError, match="plan must be a ShardingPlan or PipelinePlan"):
        graphc.parallelize(mlp.train_step, mesh="tp=2", plan=path)


def test_run_a_pipeline_plan_as_written(env):
    plan_file = env / "pipe.json"
    code, _out, err = call("compile", *TARGET, "--mesh", "pp=2", "--microbatches", "2", "-o", str(plan_file))
    assert code == 0, err
    code, out, err = call("run", *TARGET, "--plan", str(plan_file), "--repeat", "1")  # its 2 micro-batches
    assert code == 0, err
    assert "2 stages x 2 micro-batches" in out and "equals graphc's interpreter: yes" in out
    code, _out, err = call("run", *TARGET, "--plan", str(plan_file), "--microbatches", "4")
    assert code == 2 and "the pipeline plan runs microbatches=2, but microbatches=4 was asked for" in err


def test_compile_says_where_the_default_plan_went_and_never_overwrites_other_files(env, monkeypatch):
    monkeypatch.chdir(env)
    model = os.path.join(ROOT, "models", "mlp.py")
    target = [f"{model}:train_step", "--example", "example_train_args", "--mesh", "dp=2", "--quiet"]
    code, _out, err = call("compile", *target)
    assert code == 0, err
    assert f"wrote {env / 'plan.json'} (the default; -o FILE writes elsewhere)" in err
    assert graphc.Plan.load(str(env / "plan.json")).mesh.shape == (2,)
    code, _out, err = call("compile", *target)  # a plan may be replaced by a plan
    assert code == 0, err

    (env / "plan.json").write_text("my notes, not a plan\n")
    code, _out, err = call("compile", *target)
    assert code == 2 and "-o plan.json: exists and is not a graphc plan; refusing to overwrite it" in err
    assert (env / "plan.json").read_text() == "my notes, not a plan\n"
    code, _out, err = call("compile", *target, "--force")
    assert code == 0, err
    assert json.loads((env / "plan.json").read_text())["graph"]["name"] == "train_step"
    (env / "empty.json").write_text("")  # an empty file (mktemp) holds nothing to lose
    code, _out, err = call("compile", *target, "-o", "empty.json")
    assert code == 0, err


def test_an_unknown_explain_name_is_reported_and_the_plan_still_written(env):
    out_file = env / "plan.json"
    code, out, err = call(
        "compile", *TARGET, "--mesh", "dp=2", "--explain", "%x", "--explain", "%paramz.layers.0.w", "-o", str(out_file)
    )
    assert code == 0, err
    assert graphc.Plan.load(str(out_file)).graph_name == "train_step"
    assert "input %x f32[" in out  # the known name is explained
    warning = next(line for line in err.splitlines() if "%paramz" in line)
    assert warning.startswith("graphc: warning: --explain %paramz.layers.0.w: the plan has no input or node")
    assert "names are inputs" in warning and "close: %params.layers.0.w" in warning


def test_a_float_that_changes_every_step_plans_once(env):
    """A learning rate traced as a value: one plan, one plan-cache entry, one compile."""
    (params, x, labels), _kw = mlp.example_train_args()
    pf = graphc.parallelize(mlp.train_step, mesh="dp=2")
    for lr in (0.1, 0.05, 0.025):
        got = pf(params, x, labels, lr=lr)
        assert_same_pytree(got, mlp.train_step(params, x, labels, lr=lr))
    assert len(pf._compiled) == 1
    assert len(os.listdir(env / "cache" / "plans")) == 1
    assert np.asarray(got[-1]).dtype == np.float32  # lr stayed weak: the loss is float32 as in numpy


def test_resolve_pins_refuses_a_plan_of_another_mesh(env):
    """Pins are specs of the mesh their plan was made for: followed on another mesh they would
    mean something else (a tp=2 plan's [S(1)] is a valid dp=2 spec), so the file is refused,
    naming both meshes (issue 27: the CLI guide resolved a dp=2,tp=4 plan's pins on tp=4)."""
    args, kwargs = mlp.example_train_args()
    static = tuple(kwargs)
    planned = graphc.parallelize(mlp.train_step, mesh="tp=2", static_argnames=static, cache=False).plan(*args, **kwargs)
    doc = json.loads(planned.to_json())
    doc["inputs"][0]["pinned"] = True
    edited = env / "edited.json"
    edited.write_text(json.dumps(doc))
    pins = graphc.Plan.load(str(edited))

    same = graphc.parallelize(mlp.train_step, mesh="tp=2", static_argnames=static, cache=False)
    assert same.follow(pins, *args, **kwargs) == 1
    for mesh in ("dp=2", "tp=4"):
        other = graphc.parallelize(mlp.train_step, mesh=mesh, static_argnames=static, cache=False)
        with pytest.raises(
            graphc.PlanError, match=rf"made for mesh tp=2 \(graph @train_step\), but the mesh is {mesh}"
        ):
            other.follow(pins, *args, **kwargs)
        assert other.followed is None
    code, _out, err = call(
        "compile", *TARGET, "--mesh", "dp=2", "--resolve-pins", str(edited), "-o", str(env / "r.json")
    )
    assert code == 2 and "made for mesh tp=2 (graph @train_step), but the mesh is dp=2" in err
    assert not (env / "r.json").exists()


def test_the_graph_hash_sees_every_byte_of_a_large_constant_and_leaves_the_text_ir_alone():
    """graph_hash hashes large constants by their SHA-256 (arrays_as_digests), not by printing
    their compressed bytes: one changed element changes the hash, equal bytes give equal hashes,
    and the text IR printed outside the hash still carries the bytes and parses back."""
    from graphc.core.ir import print_graph
    from graphc.passes.sharding.plan import graph_hash
    from graphc.textir import parse

    mask = np.tril(np.ones((300, 300), np.float32))  # over the small-literal size: printed compressed

    def graph_with(constant):
        return graphc.trace(lambda x: x @ constant, np.ones((2, 300), np.float32))

    changed = mask.copy()
    changed[299, 0] = 0.5
    base = graph_with(mask)
    assert graph_hash(base) == graph_hash(graph_with(mask.copy()))
    assert graph_hash(base) != graph_hash(graph_with(changed))
    from graphc.core.literals import arrays_as_digests

    with arrays_as_digests():
        assert "array<f32[300,300]>#" in print_graph(base)
    text = print_graph(base)
    assert "#" not in text and print_graph(parse(text)) == text


def test_the_plan_cache_prints_the_graph_once_and_the_plan_carries_its_hash(env, monkeypatch):
    """With its plan cache, ``parallelize`` hashes the graph for the cache key and hands that hash
    to the plan: the graph's text is printed once (a 1,000-layer step prints for seconds), and the
    plan's hash is the graph's (a plan file made from it is followed on that graph only)."""
    from graphc.core import ir
    from graphc.passes.sharding import plan as plan_module

    printed = []
    real = ir.print_graph

    def counting(g, names=None):
        printed.append(g.name)
        return real(g, names)

    monkeypatch.setattr(plan_module, "print_graph", counting)
    args, kwargs = mlp.example_train_args()
    pf = graphc.parallelize(mlp.train_step, mesh="tp=2", static_argnames=tuple(kwargs))
    planned = pf.plan(*args, **kwargs)
    assert printed == ["train_step"]
    graph = pf.trace_optimized(*args, **kwargs)[1]
    assert planned.graph_hash == plan_module.graph_hash(graph)
    assert pf.follow(planned, *args, **kwargs) == 0  # checked against the graph: the hash is its own


def test_a_plan_compiled_in_one_folder_runs_from_another(env, monkeypatch):
    """The text IR names the model's file relative to the working directory; the graph hash a plan
    is made for names it by its absolute path, so a plan compiled beside the model runs from the
    folder above (it was refused there as stale: "the model or its arguments changed")."""
    folder = env / "project"
    folder.mkdir()
    (folder / "model.py").write_text(
        "import numpy as np\n\n\ndef f(w, x):\n    return np.tanh(x @ w)\n\n\n"
        "def example_args():\n    return (np.ones((3, 2)), np.ones((4, 3))), {}\n"
    )
    plan_file = str(env / "plan.json")
    monkeypatch.chdir(folder)
    code, _out, err = call("compile", "model.py:f", "--mesh", "dp=2", "-o", plan_file, "--no-cache")
    assert code == 0, err
    monkeypatch.chdir(env)
    display_path.cache_clear()  # as a new process starts: the working directory changed in this one
    code, out, err = call("run", "project/model.py:f", "--plan", plan_file, "--repeat", "1")
    assert code == 0 and "stale" not in err, err
    assert "graphc run project/model.py:f on mesh dp=2" in out
