"""The "against JAX" peer: ``jax.jit`` of the same numpy source that graphc compiles.

The JAX functions are not a port of the model. They are models/gpt.py and graphc/optim.py
themselves, their source executed once more in a fresh namespace whose globals are then rebound:

    np                    -> jax.numpy            (in both files)
    graphc.value_and_grad -> jax.value_and_grad   (gpt.train_step)
    graphc.optim.adam     -> optim.adam run the same way (gpt.train_step)
    tree_map              -> jax.tree_util.tree_map (optim.py; graphc's own pytree code takes
                             numpy leaves only, and the GPT's gradients have no None leaf, the
                             one case where the two differ)

A function looks its globals up when it runs, so rebinding them after the source has run is
enough: the model code, line for line, runs on ``jax.numpy``. Every line of ``gpt.gpt``,
``gpt.lm_loss``, ``gpt.train_step`` and ``optim.adam`` runs under ``jax.numpy`` unchanged
(``np.tri(T, dtype=x.dtype)`` and ``np.split`` included), so no line needs a shim.

JAX is the optional ``bench`` extra (``pip install 'graphc[bench]'``), never a dependency of
graphc: it is imported inside these functions only (pyproject.toml, [tool.graphc.lazy-imports]).
Arguments go through ``to_jax`` (numpy leaves to device arrays) and results through ``block``
(JAX dispatches asynchronously: a timing must wait for the result). JAX's default 32-bit mode
applies: int64 tokens become int32, float32 stays float32.

    forward = jax_gpt_forward(n_head)                 # jitted (params, tokens) -> logits
    step = jax_train_step(n_head, lr)                 # jitted (params, opt_state, tokens, targets)
    params, opt_state, loss = block(step(*to_jax((params, opt_state, tokens, targets))))
"""

from __future__ import annotations

import importlib.util
import types
from collections.abc import Callable
from typing import Any

from graphc import optim
from graphc.models import gpt


def jax_available() -> bool:
    """Whether JAX is installed (without importing it)."""
    return importlib.util.find_spec("jax") is not None


def _source_under_jax(module: types.ModuleType, **rebind: Any) -> dict[str, Any]:
    """The globals of ``module``'s source executed afresh, with ``np`` rebound to ``jax.numpy``
    and the other names of ``rebind`` rebound as given."""
    import jax

    filename = module.__file__
    assert filename is not None, f"{module.__name__} has no source file"
    with open(filename) as f:
        code = compile(f.read(), filename, "exec")
    namespace: dict[str, Any] = {"__name__": f"{module.__name__}[jax.numpy]", "__file__": filename}
    exec(code, namespace)
    namespace.update(np=jax.numpy, **rebind)
    return namespace


def jax_adam() -> Callable:
    """graphc.optim.adam's source on jax.numpy: (params, grads, state, lr=...) -> (params, state)."""
    import jax

    return _source_under_jax(optim, tree_map=jax.tree_util.tree_map)["adam"]


def jax_gpt_namespace() -> dict[str, Any]:
    """models/gpt.py's functions on jax.numpy, ``graphc.value_and_grad`` and ``graphc.optim.adam``
    in train_step resolving to JAX's."""
    import jax

    graphc_on_jax = types.SimpleNamespace(
        value_and_grad=jax.value_and_grad, optim=types.SimpleNamespace(adam=jax_adam())
    )
    return _source_under_jax(gpt, graphc=graphc_on_jax)


def jax_gpt_forward(n_head: int) -> Callable:
    """``jax.jit`` of models/gpt.py's ``gpt``: (params, tokens) -> logits [B, T, V]."""
    import jax

    model = jax_gpt_namespace()["gpt"]
    return jax.jit(lambda params, tokens: model(params, tokens, n_head))


def jax_train_step(n_head: int, lr: float = 1e-3) -> Callable:
    """``jax.jit`` of models/gpt.py's ``train_step`` (value_and_grad of lm_loss, then one Adam
    step): (params, opt_state, tokens, targets) -> (params, opt_state, loss)."""
    import jax

    step = jax_gpt_namespace()["train_step"]
    return jax.jit(lambda params, opt_state, tokens, targets: step(params, opt_state, tokens, targets, n_head, lr))


def to_jax(tree: Any) -> Any:
    """The numpy leaves of a pytree as JAX device arrays (copied once, before any timing)."""
    import jax

    return jax.device_put(tree)


def block(x: Any) -> Any:
    """``x`` (a pytree of JAX arrays) once every array in it is computed."""
    import jax

    return jax.block_until_ready(x)
