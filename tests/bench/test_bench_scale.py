"""``graphc bench scale``: its rows are the issue's four setups, described by types only, and one
row on a small step prints the chosen layout, step and MFU."""

import numpy as np
import pytest

import graphc
from graphc.bench import scale
from graphc.core.pytree import flatten
from graphc.models import gpt3


def test_the_rows_are_the_published_setups_and_allocate_nothing():
    got = [(r.model, r.devices, r.profile) for r in scale.ROWS]
    assert got == [
        ("GPT-3 175B", 1024, "a100-sxm"),
        ("LLaMA-3-8B", 64, "h100-sxm"),
        ("LLaMA-3-70B", 512, "h100-sxm"),
        ("GPT-3 13B", 128, "a100-sxm"),
    ]
    assert "45%" in scale.ROWS[0].published and scale.ROWS[0].time_limit == 60.0
    # the published MFU in model flops: Megatron-LM's 96 B s l h^2 (1 + s/6h + V/16lh) counts the
    # recomputed forward; 72 B s l h^2 (1 + s/6h + V/12lh) of it are model flops
    B, s, n_layer, h, V = 1536, 2048, 96, 12288, 51200
    hardware = 96 * B * s * n_layer * h * h * (1 + s / (6 * h) + V / (16 * n_layer * h))
    model = 72 * B * s * n_layer * h * h * (1 + s / (6 * h) + V / (12 * n_layer * h))
    assert scale.ROWS[0].published.startswith(f"{140e12 * model / hardware / 312e12:.1%}")
    for row in scale.ROWS:
        leaves = flatten(row.example())[0]
        assert leaves and all(isinstance(x, graphc.ArraySpec) for x in leaves if not isinstance(x, (int, float)))
    (params, state, tokens, _t), kw = gpt3.example_train_specs_175b()
    assert params["wte"].shape == (51200, 12288) and len(params["blocks"]) == 96 and kw["n_head"] == 96
    assert params["wte"].dtype == graphc.bfloat16 and state["m"]["wte"].dtype == np.float32
    assert tokens.shape == (1536, 2048)
    n = sum(int(np.prod(x.shape)) for x in flatten(params)[0])
    assert 174e9 < n < 176e9  # GPT-3 175B's parameter count


@pytest.mark.long  # 16 s loaded: a whole --devices search of a small GPT-3
def test_a_row_prints_its_layout_step_and_mfu():
    row = scale.Row("small", gpt3.train_step, gpt3.example_train_specs_small, 4, "a100-sxm", 80, "-", 30.0)
    cells = scale.run_row(row)
    assert cells[0] == "small" and cells[1] == "4 x a100-sxm" and cells[-1] == "-"
    assert cells[3].startswith("pp=") and " tp=" in cells[3] and "mb=" in cells[3]
    assert cells[4].endswith(" s") and cells[5].endswith("%") and 0 < float(cells[5][:-1]) < 100
