"""Example models written as plain numpy functions (no graphc imports): an MLP classifier, a
GPT-style decoder, a LLaMA-style decoder (RMSNorm, rotary embeddings, grouped-query attention,
SwiGLU) and a CNN with im2col convolutions. The forward and loss functions are plain
numpy; each ``train_step`` differentiates the loss with ``graphc.value_and_grad`` and applies a
``graphc.optim`` update. Each file has ``example_args()`` (and ``example_loss_args``,
``example_train_args``) returning ``(args, kwargs)`` so that tools (``graphc ir FILE:FUNC``) can run it."""

import os

import graphc

graphc.add_user_code(os.path.dirname(__file__))  # errors name these files' lines, as any user's
