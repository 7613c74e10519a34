"""``graphc run`` of a step that draws from a ``np.random.Generator`` argument (dropout, as
models/gpt3.py's): the run, its rounding bounds and its baseline start from the Generator's state
as the example made it, so the compiled step's draws are the function's own, on every mesh and
with micro-batches."""

from __future__ import annotations

import textwrap

import pytest

from tests.helpers import cache_of_its_own
from tests.helpers import graphc_cli as call

MODEL = textwrap.dedent(
    """
    import numpy as np
    import graphc


    def loss(w, x, y, rng):
        h = np.maximum(x @ w["a"], 0)  # [batch, hidden]
        keep = rng.random(h.shape, dtype=np.float32) >= 0.5  # dropout, p = 0.5
        h = np.where(keep, h * 2.0, 0)
        return np.mean((h @ w["b"] - y) ** 2)


    def step(w, x, y, rng):
        value, g = graphc.value_and_grad(loss)(w, x, y, rng)
        return {k: w[k] - 0.1 * g[k] for k in w}, value


    def example_args():
        r = np.random.default_rng(0)
        w = {"a": r.standard_normal((6, 16)).astype(np.float32), "b": r.standard_normal((16, 3)).astype(np.float32)}
        x = r.standard_normal((8, 6)).astype(np.float32)
        y = r.standard_normal((8, 3)).astype(np.float32)
        return (w, x, y, np.random.Generator(np.random.Philox(3))), {}
    """
)


@pytest.fixture
def model(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPHC_CACHE_DIR", cache_of_its_own(tmp_path / "cache"))
    monkeypatch.setenv("GRAPHC_PROFILE", str(tmp_path / "no_profile.json"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "drop.py").write_text(MODEL)
    return "drop.py:step"


@pytest.mark.parametrize(
    "flags", [["--mesh", "dp=2"], ["--mesh", "dp=2", "--microbatches", "2"], ["--mesh", "pp=2"]], ids=str
)
def test_a_step_drawing_from_a_generator_argument_runs_as_the_function(model, flags):
    code, out, err = call("run", model, *flags, "--repeat", "1")
    assert code == 0, (out, err)
    assert "result equals graphc's interpreter: yes" in out, out
