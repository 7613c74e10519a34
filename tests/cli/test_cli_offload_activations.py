"""``graphc compile --devices`` on a GPU profile under a limit where moving activations is the
fastest way to fit (docs/remat.md, "Activations"): LLaMA-3-8B on one H100 at 56 GiB (its plan
moving a quarter of the stash needs 56,304 MiB with its 64 micro-batches' float32 gradient sums;
at 46 GiB recomputing wins). The plan
JSON marks the moved share of the stash in its ``"offload"`` record, and the output says what
moved, what the copies cost and that it is a prediction; ``graphc run --plan`` refuses it."""

import json

import pytest

from tests.cli.test_cli import run

MODEL = ["models/llama.py:train_step", "--example", "example_train_specs_8b_bf16", "--devices", "1"]


@pytest.mark.slow  # two CLI processes, the first tracing LLaMA-3-8B's specs and solving its block
def test_compile_moves_activations_and_says_so(tmp_path):
    plan = tmp_path / "plan.json"
    res = run("compile", *MODEL, "--profile", "h100-sxm", "--memory", "56GiB", "--no-cache", "-o", str(plan))
    assert res.returncode == 0, res.stderr
    doc = json.loads(plan.read_text())
    assert doc["layout"]["offload"] in ("activations", "both") and doc["layout"]["recompute"] == "off"
    acts = doc["offload"]["activations"]
    assert "activations" in doc["offload"]["what"] and 0 < acts["fraction"] <= 1
    assert acts["hidden_s"] + acts["exposed_s"] == pytest.approx(acts["out_s"] + acts["back_s"])
    assert max(doc["memory_bytes"]) <= 56 * 2**30
    assert "of the stash to host memory" in res.stdout and "beside the forward" in res.stdout
    assert "a prediction, not run" in res.stdout and "offloads the optimizer state or activations" in res.stdout
    again = run("run", "models/llama.py:train_step", "--example", "example_train_specs_8b_bf16", "--plan", str(plan))
    assert again.returncode == 2 and "Traceback" not in again.stderr
