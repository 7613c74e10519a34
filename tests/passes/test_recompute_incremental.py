"""passes/recompute/cheap.py's incremental fixed point decides exactly what the first version decided:
rescanning every kept value after each decision (kept here as the reference), on the model steps
the planner traces and on random elementwise programs."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import graphc
from graphc.core.ir import Value
from graphc.models import gpt, gpt3, llama
from graphc.passes import run_passes
from graphc.passes.recompute.cheap import _Choice, recompute_cheap

BEFORE_RECOMPUTE = ("fold_constants", "simplify", "cse", "dce")


class _Rescan(_Choice):
    """The fixed point as first written: every round rescans every kept value."""

    def run(self, order: dict[Value, int]) -> set[Value]:
        while True:
            candidates = sorted((v for v in self.kept if self.candidate(v)), key=order.__getitem__)
            pure = [v for v in candidates if not self.chain(v)[1]]
            if pure:
                self.recompute(pure)
                continue
            by_operand: dict[Value, list[Value]] = {}
            for v in candidates:
                needs = self.chain(v)[1]
                if len(needs) == 1:
                    by_operand.setdefault(next(iter(needs)), []).append(v)
            best = max(
                by_operand.items(),
                key=lambda item: (sum(v.type.nbytes for v in item[1]) - item[0].type.nbytes, -order[item[0]]),
                default=None,
            )
            if best is None or sum(v.type.nbytes for v in best[1]) <= best[0].type.nbytes:
                return self.recomputed
            self.recompute(best[1])


def _decisions(graph, choice_class):
    order = {v: i for i, n in enumerate(graph.nodes) for v in n.outputs}
    order.update({v: -1 for v in graph.inputs})
    c = choice_class(graph.inputs, graph.nodes, graph.outputs, graph.users())
    recomputed = c.run(order)
    return sorted(order[v] for v in recomputed), sorted(order[v] for v in c.kept)


def _same_decisions(graph) -> int:
    new, old = _decisions(graph, _Choice), _decisions(graph, _Rescan)
    assert new == old
    return len(new[0])


def _step(fn, args, kwargs):
    static = {k: v for k, v in kwargs.items() if isinstance(v, int)}
    traced = graphc.trace(lambda *a: fn(*a, **kwargs), *args) if not static else graphc.trace(fn, *args, **kwargs)
    return run_passes(traced, BEFORE_RECOMPUTE).graph


def test_gpt_llama_gpt3_steps_take_the_same_decisions():
    cases = [
        (gpt.train_step, *gpt.example_train_specs(n_layer=3, d=32, n_head=4, batch=2, seq=8, n_vocab=64)),
        (llama.train_step, *llama.example_train_args(n_layer=3)),
        (gpt3.train_step, *gpt3.example_train_args(n_layer=2, d=32, n_head=4)),
    ]
    for fn, args, kwargs in cases:
        assert _same_decisions(_step(fn, args, kwargs)) > 0  # something is recomputed, identically


UNARY = [np.tanh, np.exp, lambda a: a * 0.5, lambda a: -a, lambda a: a * a, np.abs, lambda a: 1.0 + a]
BINARY = [np.add, np.subtract, np.multiply, np.maximum, lambda a, b: a / (1.0 + b * b)]


def _random_step(program, seed):
    def loss(w, x):
        vals = [x @ w]
        for binary, op, i, j in program:
            a, b = vals[i % len(vals)], vals[j % len(vals)]
            vals.append(BINARY[op % len(BINARY)](a, b) if binary else UNARY[op](a))
        return np.sum(vals[-1] @ w.T) + np.sum(vals[len(vals) // 2] @ w.T)

    rng = np.random.default_rng(seed)
    args = (rng.standard_normal((4, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32))
    return run_passes(graphc.trace(graphc.value_and_grad(loss, argnums=(0, 1)), *args), BEFORE_RECOMPUTE).graph


def test_seeded_random_steps_take_the_same_decisions():
    """300 random programs: among them ones where a decision changes a later candidate's chain
    (recomputing a value unkeeps it, so a chain after it reaches further)."""
    for seed in range(300):
        r = np.random.default_rng(seed)
        n = int(r.integers(1, 25))
        program = [
            (bool(r.integers(2)), int(r.integers(7)), int(r.integers(31)), int(r.integers(31))) for _ in range(n)
        ]
        _same_decisions(_random_step(program, seed))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 6), st.integers(0, 30), st.integers(0, 30)), min_size=1, max_size=24
    )
)
def test_random_elementwise_steps_take_the_same_decisions(program):
    graph = _random_step(program, len(program))
    _same_decisions(graph)
    recompute_cheap(graph).verify()
