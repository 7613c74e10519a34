"""LLaMA-3 8B and 70B training steps by types only (graphc.ArraySpec: no memory is allocated), for
planning: the model is models/llama.py's; the shapes are Meta's (The Llama 3 Herd of Models,
2024, table 3: 8B has 32 layers, d = 4096, 32 heads, 8 key/value heads, FFN 14336; 70B has 80
layers, d = 8192, 64 heads, 8 key/value heads, FFN 28672; both a 128256-token vocabulary),
bfloat16 parameters and Adam moments, 2048-token sequences (the batch is per example below).
"""

import graphc
from graphc.models.llama import example_train_specs, train_step

__all__ = ["example_train_specs_8b", "example_train_specs_70b", "train_step"]


def example_train_specs_8b(batch=512):
    """LLaMA-3-8B on ``batch`` sequences of 2048 tokens (1M tokens by default)."""
    return example_train_specs(batch=batch, dtype=graphc.bfloat16)


def example_train_specs_70b(batch=1024):
    """LLaMA-3-70B on ``batch`` sequences of 2048 tokens (2M tokens by default)."""
    return example_train_specs(
        n_layer=80, d=8192, n_head=64, n_kv_head=8, ffn=28672, batch=batch, dtype=graphc.bfloat16
    )
