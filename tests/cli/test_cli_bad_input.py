"""Every command of the CLI, driven with a table of bad inputs: each is one or two lines on stderr
that name the input, exit status 2, and never a traceback (unless --debug or GRAPHC_DEBUG=1).

The commands run in this process (``graphc.cli.main.main(argv)``), so the table takes seconds."""

import contextlib
import json
import os
import stat
import textwrap

import pytest

from tests.helpers import cache_of_its_own
from tests.helpers import graphc_cli as call

MODEL = textwrap.dedent(
    """
    import numpy as np


    def f(x):
        return x * 2


    def g(x):
        return x + 1


    def mm(x):
        return x @ np.ones((4, 4), np.float32)  # <mm>


    def user_bug(x):
        raise RuntimeError("user bug")  # <user-bug>


    def user_bug_in_if(x):
        if np.sum(x) > 0:  # a traced condition: graphc makes each branch a function of its own
            raise RuntimeError("user bug in a branch")  # <user-bug-if>
        return x


    def example_args():
        return (np.ones((4, 4), np.float32),), {}


    def ex_wrong_shape():
        return (np.ones((3, 5), np.float32),), {}


    def ex_not_a_pair():
        return (np.ones(3),)


    def ex_raises():
        raise ValueError("boom in the example")  # <ex-raises>


    def ex_bad_leaf():
        return (object(),), {}


    def ex_extra_keyword():
        return (np.ones(3),), {"scale": 2.0}


    def ex_types_only():
        from graphc import ArraySpec

        return ({"w": np.ones((4, 4), np.float32), "x": ArraySpec((4, 4), np.float32)},), {}
    """
)


def _line(marker: str) -> int:
    return next(i for i, line in enumerate(MODEL.splitlines(), 1) if marker in line)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A user model, a plan for it (mesh dp=2), and bad files of every kind."""
    d = tmp_path_factory.mktemp("bad_input")
    (d / "model.py").write_text(MODEL)
    (d / "broken.py").write_text("def f(x:\n    return x\n")
    (d / "adir").mkdir()
    (d / "not_json.json").write_text("this is not json\n")
    for name in ("binary.py", "binary.gir", "binary.json"):
        (d / name).write_bytes(b"\xff\xfe\x00 not text")
    (d / "not_a_plan.txt").write_text("notes I care about\n")
    (d / "v99.json").write_text('{"version": 99, "graph": {"hash": "x"}, "mesh": {}}')
    with _env(d):
        code, _out, err = call("compile", f"{d}/model.py:f", "--mesh", "dp=2", "-o", f"{d}/plan.json", "--quiet")
    assert code == 0, err
    text = (d / "plan.json").read_text()
    (d / "truncated.json").write_text(text[: len(text) // 2])
    (d / "plan.gir").write_text(text)  # a plan where an IR file is expected
    doc = json.loads(text)
    (d / "pipeline_plan.gir").write_text(json.dumps({**doc, "kind": "pipeline"}))
    (d / "composed.json").write_text(json.dumps({**doc, "kind": "composed"}))
    unreadable = d / "unreadable.py"
    unreadable.write_text(MODEL)
    unreadable.chmod(0)
    return d


@contextlib.contextmanager
def _env(d):
    saved = {k: os.environ.get(k) for k in ("GRAPHC_CACHE_DIR", "GRAPHC_PROFILE", "GRAPHC_DEBUG")}
    os.environ.update(GRAPHC_CACHE_DIR=cache_of_its_own(d / "cache"), GRAPHC_PROFILE=str(d / "no_profile.json"))
    os.environ.pop("GRAPHC_DEBUG", None)
    cwd = os.getcwd()
    os.chdir(d)
    try:
        yield
    finally:
        os.chdir(cwd)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# (id, argv with {d} for the folder of the files, a text the message must contain: it names the input)
CASES = [
    # graphc ir
    ("missing FILE", ["ir", "{d}/missing.py:f"], "missing.py: no such file"),
    ("missing FUNC", ["ir", "{d}/model.py:nope"], "no function 'nope'"),
    ("FILE without FUNC", ["ir", "{d}/model.py"], "model.py': expected FILE:FUNC, e.g. {d}/model.py:f"),
    ("missing example", ["ir", "{d}/model.py:f", "--example", "nothing"], "no function 'nothing'"),
    ("example not (args, kwargs)", ["ir", "{d}/model.py:f", "--example", "ex_not_a_pair"], "ex_not_a_pair()"),
    ("example of the wrong shape", ["ir", "{d}/model.py:mm", "--example", "ex_wrong_shape"], "model.py:{mm}:"),
    ("example raises", ["ir", "{d}/model.py:f", "--example", "ex_raises"], "model.py:{ex-raises}: ValueError"),
    ("example with a bad leaf", ["ir", "{d}/model.py:f", "--example", "ex_bad_leaf"], "has type object"),
    (
        "example the function does not take",
        ["compile", "{d}/model.py:f", "--example", "ex_extra_keyword", "--mesh", "dp=2"],
        "model.py:ex_extra_keyword() returns arguments that f ({d}/model.py:5) does not take: got an unexpected "
        "keyword argument 'scale' (parameters: x)",
    ),
    (
        "run of an example of types only",
        ["run", "{d}/model.py:f", "--example", "ex_types_only", "--mesh", "dp=2"],
        "model.py:ex_types_only() gives types, not data (arguments[0]['x'] is an ArraySpec float32[4, 4]): graphc "
        "run runs the step",
    ),
    (
        "bench of an example of types only",
        ["bench", "{d}/model.py:f", "--example", "ex_types_only", "--mesh", "dp=2"],
        "ex_types_only() gives types, not data",
    ),
    (
        "run of the block search's prediction",
        ["run", "{d}/model.py:f", "--plan", "{d}/composed.json"],
        "composed.json: a layout the block search predicted (docs/scale.md), not a plan graphc can run",
    ),
    ("function raises", ["ir", "{d}/model.py:user_bug"], "model.py:{user-bug}: RuntimeError: user bug"),
    (
        "function raises in a branch",
        ["ir", "{d}/model.py:user_bug_in_if"],
        "model.py:{user-bug-if}: RuntimeError: user bug in a branch\n  (in user_bug_in_if, while",
    ),
    ("syntax error", ["ir", "{d}/broken.py:f"], "broken.py:1: syntax error"),
    ("folder as FILE", ["ir", "{d}/adir:f"], "adir: is a folder"),
    ("folder as target", ["ir", "{d}/adir"], "adir: is a folder"),
    ("plan given as IR", ["ir", "{d}/plan.json"], "plan.json: expected a text IR file"),
    ("IR file of the wrong kind", ["ir", "{d}/plan.gir"], "plan.gir: line 1, column 1"),
    ("pipeline plan as IR", ["ir", "{d}/pipeline_plan.gir"], "pipeline_plan.gir: line 1"),
    ("missing IR file", ["ir", "{d}/missing.gir"], "missing.gir"),
    ("unknown pass", ["ir", "{d}/model.py:f", "--after", "nosuch"], "'nosuch'"),
    ("-o in a missing folder", ["ir", "{d}/model.py:f", "-o", "/nonexistent-graphc/x.gir"], "/nonexistent-graphc"),
    ("-o is a folder", ["ir", "{d}/model.py:f", "-o", "{d}/adir"], "-o {d}/adir: is a folder"),
    ("-o over another file", ["ir", "{d}/model.py:f", "-o", "{d}/not_a_plan.txt"], "not_a_plan.txt: exists"),
    ("unreadable FILE", ["ir", "{d}/unreadable.py:f"], "unreadable.py: cannot read"),
    ("FILE not UTF-8", ["ir", "{d}/binary.py:f"], "binary.py: syntax error"),
    ("IR file not UTF-8", ["ir", "{d}/binary.gir"], "binary.gir: line 1, column 1: not UTF-8"),
    # graphc compile
    ("malformed --mesh", ["compile", "{d}/model.py:f", "--mesh", "dp=x"], "'dp=x'"),
    (
        "--mesh dp=0",
        ["compile", "{d}/model.py:f", "--mesh", "dp=0"],
        "graphc compile: error: argument --mesh: bad mesh 'dp=0': axis 'dp' has size 0; expected an integer >= 1",
    ),
    ("--mesh dp=-1", ["compile", "{d}/model.py:f", "--mesh", "dp=-1"], "argument --mesh: bad mesh 'dp=-1'"),
    ("run: --mesh dp=0", ["run", "{d}/model.py:f", "--mesh", "dp=0"], "argument --mesh: bad mesh 'dp=0'"),
    ("bench: --mesh dp=0", ["bench", "{d}/model.py:f", "--mesh", "dp=0"], "argument --mesh: bad mesh 'dp=0'"),
    (
        "--link for an axis the mesh lacks",
        ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--link", "tp=1GB/s:1us"],
        "graphc: error: --mesh/--link: link given for axis 'tp', but the mesh has axes dp",
    ),
    ("--mesh without a size", ["compile", "{d}/model.py:f", "--mesh", "dp=2,tp"], "dp=2,tp"),
    ("malformed --memory", ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--memory", "lots"], "'lots'"),
    ("--memory 0B", ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--memory", "0B"], "memory size must be positive"),
    # argparse took -1GiB for an unknown option ("argument --memory: expected one argument")
    *[
        (f"--memory {size}", ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--memory", size], message)
        for size, message in [
            ("-1GiB", "argument --memory: memory size must be positive (at least 1 byte), got '-1GiB'"),
            ("-5", "argument --memory: memory size must be positive (at least 1 byte), got '-5'"),
            ("0", "argument --memory: memory size must be positive (at least 1 byte), got '0'"),
            ("abc", "argument --memory: bad memory size 'abc': expected a number of bytes or e.g. 2GiB"),
            ("1.5XB", "argument --memory: bad memory size '1.5XB': expected a number of bytes or e.g. 2GiB"),
        ]
    ],
    (
        "--memory=-1GiB",
        ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--memory=-1GiB"],
        "argument --memory: memory size must be positive (at least 1 byte), got '-1GiB'",
    ),
    (
        "--bucket -1MiB",
        ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--bucket", "-1MiB"],
        "argument --bucket: bucket size must be non-negative, got '-1MiB'",
    ),
    (
        "run: --memory -1GiB",
        ["run", "{d}/model.py:f", "--mesh", "dp=2", "--memory", "-1GiB"],
        "argument --memory: memory size must be positive (at least 1 byte), got '-1GiB'",
    ),
    (
        "malformed --bucket",
        ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--bucket", "lots"],
        "bad bucket size 'lots'",
    ),
    ("malformed --link", ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--link", "dp=fast"], "--link: bad link"),
    ("--microbatches not a number", ["compile", "{d}/model.py:f", "--mesh", "pp=2", "--microbatches", "x"], "'x'"),
    *[
        (
            f"--microbatches {k}",
            ["compile", "{d}/model.py:f", "--mesh", mesh, "--microbatches", k],
            f"argument --microbatches: expected a positive integer, got '{k}'",
        )
        for mesh, k in [("pp=2", "0"), ("dp=2", "0"), ("dp=2", "-2")]
    ],
    (
        "negative --time-limit",
        ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--time-limit", "-5"],
        "argument --time-limit: expected a positive number of seconds, got '-5'",
    ),
    ("--time-limit nan", ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--time-limit", "nan"], "got 'nan'"),
    (
        "--time-limit -1e3",
        ["compile", "{d}/model.py:f", "--devices", "2", "--time-limit", "-1e3"],
        "argument --time-limit: expected a positive number of seconds, got '-1e3'",
    ),
    ("--time-limit not a number", ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--time-limit", "soon"], "'soon'"),
    ("unknown --profile", ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--profile", "nosuch"], "--profile: unknown"),
    ("--devices: unknown --profile", ["compile", "{d}/model.py:f", "--devices", "2", "--profile", "x"], "--profile: "),
    (
        "non-JSON --profile",
        ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--profile", "{d}/not_json.json"],
        "not_json",
    ),
    (
        "--profile not UTF-8",
        ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--profile", "{d}/binary.json"],
        "binary.json",
    ),
    *[
        (
            f"--devices {n}",
            ["compile", "{d}/model.py:f", "--devices", n],
            f"argument --devices: expected a positive integer, got '{n}'",
        )
        for n in ("0", "-2")
    ],
    (
        "pins: non-JSON plan",
        ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--resolve-pins", "{d}/not_json.json"],
        "not_json.json:1:1",
    ),
    (
        "pins: plan of version 99",
        ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--resolve-pins", "{d}/v99.json"],
        "v99.json: plan version 99",
    ),
    (
        "pins: truncated plan",
        ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--resolve-pins", "{d}/truncated.json"],
        "truncated.json:",
    ),
    ("pins: folder as plan", ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--resolve-pins", "{d}/adir"], "adir"),
    (
        "pins: plan not UTF-8",
        ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--resolve-pins", "{d}/binary.json"],
        "binary.json",
    ),
    (
        "compile --plan (renamed)",
        ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--plan", "{d}/plan.json"],
        "--resolve-pins {d}/plan.json",
    ),
    (
        "-o over a file not a plan",
        ["compile", "{d}/model.py:f", "--mesh", "dp=2", "-o", "{d}/not_a_plan.txt"],
        "not_a_plan.txt: exists and is not a graphc plan",
    ),
    (
        "-o in a missing folder",
        ["compile", "{d}/model.py:f", "--mesh", "dp=2", "-o", "/nonexistent-graphc/p.json"],
        "/nonexistent-graphc",
    ),
    (
        "--dump-ir over a file",
        ["compile", "{d}/model.py:f", "--mesh", "dp=2", "--dump-ir", "{d}/not_a_plan.txt"],
        "not_a_plan.txt: exists and is not a folder",
    ),
    # graphc run
    ("run: no --mesh nor --plan", ["run", "{d}/model.py:f"], "--mesh"),
    (
        "run: non-JSON plan",
        ["run", "{d}/model.py:f", "--plan", "{d}/not_json.json"],
        "not_json.json:1:1: not a graphc plan",
    ),
    ("run: plan of version 99", ["run", "{d}/model.py:f", "--plan", "{d}/v99.json"], "v99.json: plan version 99"),
    ("run: truncated plan", ["run", "{d}/model.py:f", "--plan", "{d}/truncated.json"], "truncated.json:"),
    ("run: missing plan", ["run", "{d}/model.py:f", "--plan", "{d}/missing.json"], "missing.json"),
    ("run: folder as plan", ["run", "{d}/model.py:f", "--plan", "{d}/adir"], "adir"),
    ("run: plan not UTF-8", ["run", "{d}/model.py:f", "--plan", "{d}/binary.json"], "cannot read plan {d}/binary.json"),
    (
        "run: plan for another mesh",
        ["run", "{d}/model.py:f", "--plan", "{d}/plan.json", "--mesh", "dp=4"],
        "made for mesh dp=2 (graph @f), but the mesh is dp=4",
    ),
    (
        "run: plan for another model",
        ["run", "{d}/model.py:g", "--plan", "{d}/plan.json"],
        "--plan {d}/plan.json: stale plan: it was made for graph @f",
    ),
    (
        "run: plan with --memory",
        ["run", "{d}/model.py:f", "--plan", "{d}/plan.json", "--memory", "1GiB"],
        "--plan {d}/plan.json runs that plan as written",
    ),
    ("run: --repeat 0", ["run", "{d}/model.py:f", "--mesh", "dp=2", "--repeat", "0"], "--repeat"),
    ("run: negative --timeout", ["run", "{d}/model.py:f", "--mesh", "dp=2", "--timeout", "-1"], "'-1'"),
    (
        "run: --trace in a missing folder",
        ["run", "{d}/model.py:f", "--mesh", "dp=2", "--trace", "/nonexistent-graphc/t.json"],
        "--trace /nonexistent-graphc/t.json",
    ),
    (
        "run: --trace over a file",
        ["run", "{d}/model.py:f", "--mesh", "dp=2", "--trace", "{d}/not_a_plan.txt"],
        "not_a_plan.txt: exists and is not a Chrome trace",
    ),
    ("run: unknown backend", ["run", "{d}/model.py:f", "--mesh", "dp=2", "--backend", "nccl"], "'nccl'"),
    # graphc bench
    ("bench: --repeat 0", ["bench", "{d}/model.py:f", "--repeat", "0"], "--repeat"),
    ("bench: malformed --mesh", ["bench", "{d}/model.py:f", "--mesh", "dp=x"], "'dp=x'"),
    ("bench: unknown target", ["bench", "nosuch"], "'nosuch'"),
    # graphc calibrate
    ("calibrate: non-JSON profile", ["calibrate", "--show", "-o", "{d}/not_json.json"], "not_json.json:1:1"),
    ("calibrate: folder as profile", ["calibrate", "--show", "-o", "{d}/adir"], "adir"),
    ("calibrate: profile not UTF-8", ["calibrate", "--show", "-o", "{d}/binary.json"], "binary.json"),
    (
        "calibrate: -o over another file",
        ["calibrate", "-o", "{d}/not_a_plan.txt"],
        "not_a_plan.txt: exists and is not a graphc machine profile",
    ),
    # the parser
    ("unknown command", ["frobnicate"], "'frobnicate'"),
    ("unknown option", ["ir", "{d}/model.py:f", "--frobnicate"], "--frobnicate"),
]


@pytest.mark.parametrize("argv, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_or_two_lines_naming_it_with_exit_status_2(files, argv, message):
    if "unreadable" in " ".join(argv) and os.geteuid() == 0:
        pytest.skip("root reads any file")
    d = str(files)
    argv = [a.format(d=d) for a in argv]
    marks = {m: _line(f"<{m}>") for m in ("mm", "ex-raises", "user-bug", "user-bug-if")}
    message = message.replace("{d}", d).format(**marks)
    with _env(files):
        before = sorted(os.listdir(files))
        code, out, err = call(*argv)
        after = sorted(os.listdir(files))
    assert code == 2, (code, out, err)
    assert "Traceback" not in err and "Traceback" not in out
    assert message in err, err
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 2, err
    assert after == before, "a failed command left a file behind"


def test_debug_flag_and_graphc_debug_show_the_traceback(files):
    argv = ["ir", f"{files}/model.py:user_bug"]
    with _env(files):
        code, _out, err = call(*argv, "--debug")
        assert code == 2 and "Traceback" in err and "RuntimeError: user bug" in err
        os.environ["GRAPHC_DEBUG"] = "1"
        code, _out, err = call(*argv)
        assert code == 2 and "Traceback" in err
        os.environ.pop("GRAPHC_DEBUG")
        code, _out, err = call("--debug", "run", f"{files}/model.py:f", "--plan", f"{files}/v99.json")
        assert code == 2 and "Traceback" in err and "plan version 99" in err


def test_a_bug_in_graphc_is_status_1_with_how_to_report_it(files, monkeypatch):
    import graphc.cli.ir

    # a failure inside graphc's own code, not the user's: a builtin called with the wrong arguments
    monkeypatch.setattr(graphc.cli.ir, "trace", {}.__getitem__)
    with _env(files):
        code, _out, err = call("ir", f"{files}/model.py:f")
    assert code == 1, err
    assert "Traceback" not in err
    assert err.startswith("graphc: error: internal error: TypeError: dict.__getitem__()") and "--debug" in err
    assert len(err.strip().splitlines()) == 2


def test_output_folders_are_created_inside_the_working_directory_and_elsewhere_only_with_mkdir(files, tmp_path):
    with _env(files):
        code, _out, err = call("ir", f"{files}/model.py:f", "-o", "new/sub/f.gir")
        assert code == 0, err
        assert (files / "new" / "sub" / "f.gir").read_text().startswith("graph @f(")
        outside = tmp_path / "a" / "b" / "f.gir"
        code, _out, err = call("ir", f"{files}/model.py:f", "-o", str(outside))
        assert code == 2 and f"the folder {outside.parent} does not exist" in err and "--mkdir" in err
        assert not (tmp_path / "a").exists()
        code, _out, err = call("ir", f"{files}/model.py:f", "-o", str(outside), "--mkdir")
        assert code == 0, err
        assert outside.read_text().startswith("graph @f(")


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_outputs_are_written_with_the_users_umask(files, tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        with _env(files):
            code, _out, err = call("ir", f"{files}/model.py:f", "-o", str(tmp_path / "f.gir"))
            assert code == 0, err
            code, _out, err = call(
                "compile", f"{files}/model.py:f", "--mesh", "dp=2", "-o", str(tmp_path / "p.json"), "--quiet"
            )
            assert code == 0, err
    finally:
        os.umask(old)
    for name in ("f.gir", "p.json"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == mode, name
    assert sorted(os.listdir(tmp_path)) == ["f.gir", "p.json"]  # no temporary file left behind
