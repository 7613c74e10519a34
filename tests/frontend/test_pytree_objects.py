"""Objects as arguments (issue 20, item 3): dataclasses, NamedTuples, registered classes and plain
objects are pytrees everywhere pytrees are used; a bound method's object is an implicit argument
of graphc.jit / graphc.parallelize; what a traced function writes into its argument objects is
stored back after every call, as numpy would have changed them. Every model here is checked
against the same numpy code run eagerly."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import pytest

import graphc
from graphc.core.mesh import Mesh
from graphc.core.profile import MachineProfile
from graphc.core.pytree import flatten, unflatten

RNG = np.random.default_rng(20)


def _f32(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def _no_tracer(x, path="obj", seen=None):
    """No graphc.Tracer anywhere in an object's attributes, lists, dicts and tuples."""
    seen = set() if seen is None else seen
    if id(x) in seen:
        return
    seen.add(id(x))
    assert not isinstance(x, graphc.Tracer), f"{path} holds a Tracer"
    if isinstance(x, dict):
        items = x.items()
    elif isinstance(x, (list, tuple)):
        items = enumerate(x)
    elif isinstance(getattr(x, "__dict__", None), dict) and not isinstance(x, type):
        items = vars(x).items()
    else:
        return
    for k, v in items:
        _no_tracer(v, f"{path}.{k}", seen)


# --- frozen dataclass config + params dict ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelArgs:  # as in LLaMA ports
    dim: int = 8
    n_heads: int = 2
    norm_eps: float = 1e-5
    name: str = "tiny"
    rope: tuple = (1, 2)


def rms_mlp(args: ModelArgs, params: dict, x):
    # [B, dim] -> [B, dim]
    h = x / np.sqrt((x * x).mean(-1, keepdims=True) + args.norm_eps)
    h = h.reshape(x.shape[0], args.n_heads, args.dim // args.n_heads).reshape(x.shape[0], args.dim)
    return np.tanh(h @ params["w1"]) @ params["w2"]


def test_frozen_dataclass_config_is_static_and_params_dict_traced():
    args = ModelArgs()
    params = {"w1": _f32(8, 16), "w2": _f32(16, 8)}
    x = _f32(3, 8)
    f = graphc.jit(rms_mlp)
    _close(f(args, params, x), rms_mlp(args, params, x))
    g = graphc.trace(rms_mlp, args, params, x)
    assert len(g.inputs) == 3  # the config's fields are static: only w1, w2 and x are inputs
    assert str(graphc.parse(str(g))) == str(g)
    # a new static field traces again; new array values do not
    params2 = {k: v * 2 for k, v in params.items()}
    _close(f(args, params2, x), rms_mlp(args, params2, x))
    assert f._cache.compiles == 1
    args2 = dataclasses.replace(args, norm_eps=1e-3)
    _close(f(args2, params, x), rms_mlp(args2, params, x))
    assert f._cache.compiles == 2
    f(ModelArgs(), params, x)  # an equal config is the same specialization
    assert f._cache.compiles == 2


def test_dataclass_with_array_fields_and_dataclass_result():
    @dataclasses.dataclass
    class Linear:
        w: np.ndarray
        b: np.ndarray
        scale: float = 2.0

    def double(layer: Linear):
        return Linear(layer.w * layer.scale, layer.b + 1, layer.scale)

    layer = Linear(_f32(3, 2), _f32(2))
    got = graphc.jit(double)(layer)
    assert type(got) is Linear and got.scale == 2.0
    _close(got.w, layer.w * 2)
    _close(got.b, layer.b + 1)


# --- NamedTuple params -------------------------------------------------------------------------------


class Params(NamedTuple):
    w: np.ndarray
    b: np.ndarray


class Adam(NamedTuple):
    m: Params
    step: int


def sgd(p: Params, g: Params, lr):
    return Params(p.w - lr * g.w, p.b - lr * g.b)


def test_namedtuple_params_come_back_as_the_namedtuple():
    p, g = Params(_f32(4, 3), _f32(3)), Params(_f32(4, 3), _f32(3))
    got = graphc.jit(sgd)(p, g, 0.1)
    assert type(got) is Params
    _close(got.w, p.w - np.float32(0.1) * g.w)
    _close(got.b, p.b - np.float32(0.1) * g.b)
    state = Adam(p, 3)
    out = graphc.jit(lambda s: Adam(Params(s.m.w * s.step, s.m.b), s.step + 1))(state)
    assert type(out) is Adam and type(out.m) is Params and out.step == 4
    _close(out.m.w, p.w * 3)


def test_tree_map_keeps_objects():
    p = Params(np.ones(2), np.zeros(3))
    got = graphc.tree_map(lambda a, b: a + b, p, p)
    assert type(got) is Params
    np.testing.assert_array_equal(got.w, [2, 2])


# --- a registered class ------------------------------------------------------------------------------


class Rotary:
    """A class graphc cannot look inside (no __dict__) until it is registered."""

    __slots__ = ("freqs", "theta")

    def __init__(self, freqs, theta):
        self.freqs, self.theta = freqs, theta


def rotate(r: Rotary, x):
    return x * np.cos(r.freqs) * r.theta


def test_unregistered_slots_class_is_a_clear_error():
    r = Rotary(_f32(4), 2.0)
    for call in (lambda: graphc.trace(rotate, r, _f32(4)), lambda: graphc.jit(rotate)(r, _f32(4))):
        with pytest.raises(graphc.TraceError) as info:
            call()
        assert isinstance(info.value, TypeError)
        assert "has type Rotary" in str(info.value) and "graphc.register_pytree(Rotary" in str(info.value)


@pytest.fixture
def rotary_registered():
    from graphc.core import pytree

    graphc.register_pytree(Rotary, lambda r: ((r.freqs,), r.theta), lambda theta, kids: Rotary(kids[0], theta))
    yield
    pytree._REGISTERED.pop(Rotary)
    pytree._HOW.pop(Rotary, None)


def test_registered_class(rotary_registered):
    r, x = Rotary(_f32(4), 2.0), _f32(4)
    f = graphc.jit(rotate)
    _close(f(r, x), rotate(r, x))
    assert len(graphc.trace(rotate, r, x).inputs) == 2  # freqs and x; theta is aux (static)
    f(Rotary(_f32(4), 2.0), x)
    assert f._cache.compiles == 1
    _close(f(Rotary(r.freqs, 3.0), x), rotate(Rotary(r.freqs, 3.0), x))  # a new aux traces again
    assert f._cache.compiles == 2
    leaves, tree = flatten(r)
    back = unflatten(tree, leaves)
    assert type(back) is Rotary and back.theta == 2.0 and back.freqs is r.freqs
    out = graphc.jit(lambda r: Rotary(r.freqs * 2, r.theta))(r)
    assert type(out) is Rotary and out.theta == 2.0
    _close(out.freqs, r.freqs * 2)


# --- objects whose methods are the model ------------------------------------------------------------


class Layer:
    def __init__(self, d_in, d_out, act=np.tanh):
        self.w = _f32(d_in, d_out) / np.float32(np.sqrt(d_in))
        self.b = _f32(d_out)
        self.act = act  # a function: static
        self.name = f"layer{d_in}x{d_out}"

    def __call__(self, x):
        return self.act(x @ self.w + self.b)


class MLP:
    def __init__(self, sizes):
        self.config = ModelArgs(dim=sizes[0])
        self.layers = [Layer(a, b) for a, b in zip(sizes[:-1], sizes[1:])]
        self.head = {"w": _f32(sizes[-1], 2)}
        self.dropout = None

    def forward(self, x):
        # [B, sizes[0]] -> [B, 2]
        for layer in self.layers:
            x = layer(x)
        return x @ self.head["w"]

    def loss(self, x, y):
        return ((self.forward(x) - y) ** 2).mean()


def test_jit_of_a_bound_method_and_of_a_function_taking_the_object():
    model, x = MLP([4, 8, 8]), _f32(5, 4)
    want = model.forward(x)
    f = graphc.jit(model.forward)
    _close(f(x), want)
    _close(graphc.jit(lambda m, x: m.forward(x))(model, x), want)
    _close(graphc.jit(MLP.forward)(model, x), want)
    # the weights are inputs read in every call: a new value is seen without tracing again
    model.layers[0].w = model.layers[0].w * 2
    _close(f(x), model.forward(x))
    assert f._cache.compiles == 1
    # a static attribute is part of the key
    model.layers[1].name = "renamed"
    f(x)
    assert f._cache.compiles == 2
    _no_tracer(model)


def test_callable_object_is_its_own_receiver():
    layer, x = Layer(4, 3), _f32(2, 4)
    f = graphc.jit(layer)
    _close(f(x), layer(x))
    layer.b = layer.b + 1
    _close(f(x), layer(x))
    assert f._cache.compiles == 1


def test_value_and_grad_of_an_object_gives_the_same_object_of_gradients():
    model, x, y = MLP([3, 4]), _f32(6, 3), _f32(6, 2)
    layer = model.layers[0]

    def loss(m, x, y):
        return m.loss(x, y)

    value, grads = graphc.jit(graphc.value_and_grad(loss))(model, x, y)
    assert type(grads) is MLP and type(grads.layers[0]) is Layer
    assert grads.config == model.config and grads.layers[0].name == layer.name  # static fields as they are
    assert grads.layers[0].act is np.tanh and grads.dropout is None
    # numpy: out = tanh(x w + b) @ h;  loss = mean((out - y)^2)
    z = np.tanh(x @ layer.w + layer.b)
    out = z @ model.head["w"]
    d_out = 2 * (out - y) / out.size
    d_pre = (d_out @ model.head["w"].T) * (1 - z * z)
    _close(value, ((out - y) ** 2).mean())
    _close(grads.head["w"], z.T @ d_out)
    _close(grads.layers[0].w, x.T @ d_pre)
    _close(grads.layers[0].b, d_pre.sum(0))
    # eager value_and_grad gives the same
    _, eager = graphc.value_and_grad(loss)(model, x, y)
    _close(eager.layers[0].w, grads.layers[0].w)
    # a step of SGD over the object with tree_map: a new MLP
    new = graphc.tree_map(lambda p, g: p - 0.1 * g, model, grads)
    assert type(new) is MLP
    _close(new.head["w"], model.head["w"] - 0.1 * grads.head["w"])
    _no_tracer(model)


# --- writing back object state ------------------------------------------------------------------------


class Smoother:
    """State on self, updated by rebinding attributes (no item assignment)."""

    def __init__(self, d):
        self.w = _f32(d, d)
        self.state = np.zeros(d, np.float32)
        self.history = [np.zeros(d, np.float32)]
        self.calls = 0

    def step(self, x):
        # [B, d] -> [B, d]
        self.state = self.state * np.float32(0.5) + x.sum(0)
        self.history[0] = self.history[0] + self.state
        self.calls += 1  # a static int: written back too (the next call traces again)
        return np.tanh(x @ self.w) + self.state


def test_write_back_of_rebound_attributes_equals_numpy():
    ours, theirs = Smoother(4), Smoother(4)
    ours.w = theirs.w.copy()
    f = graphc.jit(ours.step)
    for _ in range(3):
        x = _f32(2, 4)
        _close(f(x), theirs.step(x))
        _close(ours.state, theirs.state)
        _close(ours.history[0], theirs.history[0])
        assert ours.calls == theirs.calls
        assert type(ours.state) is np.ndarray and ours.state.flags.writeable
    _no_tracer(ours)


def test_write_back_through_trace_and_evaluate():
    model, x = Smoother(3), _f32(2, 3)
    g = graphc.trace(Smoother.step, model, x)
    out = graphc.evaluate(g, model, x)
    assert isinstance(out, graphc.StateUpdate)
    assert [p.text(["self", "x"]) for p in out.places] == ["self.state", "self.history[0]", "self.calls"]
    numpy_model = Smoother(3)
    numpy_model.w = model.w
    want = numpy_model.step(x)
    result = out.apply(model, x)
    _close(result, want)
    _close(model.state, numpy_model.state)
    assert model.calls == 1
    # a bound method traced directly: the object's arrays are constants, and it is left as it was
    before = model.state.copy()
    g2 = graphc.trace(model.step, x)
    assert len(g2.inputs) == 1
    np.testing.assert_array_equal(model.state, before)
    assert model.calls == 1
    _no_tracer(model)


def test_containers_passed_directly_are_not_written_back():
    def f(cache, obj, x):
        cache[0] = cache[0] + x  # a list argument: the function's own business (return it)
        obj.seen = x * 2  # a new attribute of an object: written back
        return x

    cache, obj, x = [np.zeros(2)], Smoother(2), np.ones(2)
    graphc.jit(f)(cache, obj, x)
    np.testing.assert_array_equal(cache[0], [0, 0])
    np.testing.assert_array_equal(obj.seen, [2, 2])


def test_no_tracer_left_after_an_exception_during_tracing():
    class Broken(Smoother):
        def step(self, x):
            self.state = self.state + x.sum(0)
            self.history.append(self.state)
            raise RuntimeError("the user's bug")

    model = Broken(3)
    state = model.state
    for call in (graphc.jit(model.step), lambda x: graphc.trace(Broken.step, model, x)):
        with pytest.raises(RuntimeError, match="the user's bug"):
            call(_f32(2, 3))
        assert model.state is state and len(model.history) == 1
        _no_tracer(model)


def test_a_frozen_config_inside_a_stateful_object_keeps_its_identity():
    model = Smoother(2)
    model.config = ModelArgs()
    config = model.config
    graphc.jit(model.step)(_f32(1, 2))
    assert model.config is config  # not written: it did not change


class KVModel:
    """A tiny attention decoder with a KV cache on self, written at start_pos in every call."""

    def __init__(self, vocab=11, d=8, n_layers=2, max_seq=12, seed=3):
        r = np.random.default_rng(seed)
        self.emb = r.standard_normal((vocab, d)).astype(np.float32)
        self.wq = [r.standard_normal((d, d)).astype(np.float32) / 3 for _ in range(n_layers)]
        self.wk = [r.standard_normal((d, d)).astype(np.float32) / 3 for _ in range(n_layers)]
        self.wv = [r.standard_normal((d, d)).astype(np.float32) / 3 for _ in range(n_layers)]
        self.cache_k = np.zeros((n_layers, max_seq, d), np.float32)
        self.cache_v = np.zeros((n_layers, max_seq, d), np.float32)

    def forward(self, h, start_pos):
        # h: [n, d] -> logits [vocab] of the last position
        n = h.shape[0]
        for layer in range(len(self.wq)):
            q, k, v = h @ self.wq[layer], h @ self.wk[layer], h @ self.wv[layer]
            self.cache_k[layer, start_pos : start_pos + n] = k
            self.cache_v[layer, start_pos : start_pos + n] = v
            keys = self.cache_k[layer, : start_pos + n]  # [T, d]
            vals = self.cache_v[layer, : start_pos + n]
            s = q @ keys.T / np.float32(np.sqrt(h.shape[1]))
            s = np.exp(s - s.max(-1, keepdims=True))
            h = h + (s / s.sum(-1, keepdims=True)) @ vals
        return h[-1] @ self.emb.T


def generate(model, step, prompt, n_tokens):
    tokens, pos = list(prompt), 0
    h = model.emb[np.array(tokens)]
    for _ in range(n_tokens):
        logits = step(h, pos)
        pos += h.shape[0]
        tokens.append(int(np.argmax(logits)))
        h = model.emb[np.array(tokens[-1:])]
    return tokens


def test_kv_cache_generation_loop_gives_numpys_tokens():
    ours, theirs = KVModel(), KVModel()
    cache_k = ours.cache_k  # another name of the cache sees the writes, as in numpy
    want = generate(theirs, theirs.forward, [1, 5, 2], 8)
    got = generate(ours, graphc.jit(ours.forward, static_argnames=("start_pos",)), [1, 5, 2], 8)
    assert got == want
    _close(ours.cache_k, theirs.cache_k)
    _close(ours.cache_v, theirs.cache_v)
    assert ours.cache_k is cache_k
    _no_tracer(ours)


# --- parallelize ----------------------------------------------------------------------------------------

MESH = {"dp": 2, "tp": 2}


def _mesh():
    return Mesh(MESH, profile=MachineProfile.default())


def test_parallelize_bound_method_with_nested_layers_and_state_on_a_2x2_mesh():
    ours, theirs = Smoother(8), Smoother(8)
    ours.w = theirs.w.copy()
    pf = graphc.parallelize(ours.step, mesh=_mesh(), cache=False)
    for _ in range(2):
        x = _f32(4, 8)
        _close(pf(x), theirs.step(x))
        _close(ours.state, theirs.state)
        _close(ours.history[0], theirs.history[0])
        assert ours.calls == theirs.calls
    _no_tracer(ours)
    model, x = MLP([8, 16, 8]), _f32(4, 8)
    _close(graphc.parallelize(model.forward, mesh=_mesh(), cache=False)(x), model.forward(x))
    _close(graphc.parallelize(lambda m, x: m.forward(x), mesh=_mesh(), cache=False)(model, x), model.forward(x))


def test_parallelize_kv_cache_with_sharded_state():
    ours, theirs = KVModel(), KVModel()
    pf = graphc.parallelize(ours.forward, mesh=_mesh(), cache=False, static_argnames=("start_pos",), sharded_state=True)
    want = generate(theirs, theirs.forward, [4, 7], 3)
    got = generate(ours, pf, [4, 7], 3)
    assert got == want
    _close(ours.cache_k, theirs.cache_k)
    # the caches stayed on the devices between calls (tied to their inputs' specs), and they are whole
    assert isinstance(ours.cache_k, graphc.ShardedArray)
    _close(ours.cache_v.gather(), theirs.cache_v)


def test_in_specs_of_a_bound_method_are_for_the_arguments_after_the_object():
    layer = Layer(8, 8)
    x = _f32(4, 8)
    pf = graphc.parallelize(layer, mesh={"tp": 2}, cache=False, in_specs=("[S(1)]",))
    plan = pf.plan(x)
    specs = plan.input_specs()
    assert len(specs) == 3  # w, b (the object's), then x
    assert graphc.core.spec.format_spec(specs[2]) == "[S(1)]"
    _close(pf(x), layer(x))


def test_an_object_that_holds_itself_is_a_clear_error():
    model = Smoother(2)
    model.parent = model
    with pytest.raises(graphc.TraceError, match=r"argument\[0\]\[0\]\.parent is an object that holds itself"):
        graphc.jit(model.step)(_f32(1, 2))


def test_a_list_subclass_is_not_taken_apart_as_an_object():
    class Layers(list):  # its __dict__ would not hold its items: an error, not an empty object
        pass

    with pytest.raises(graphc.TraceError, match=r"has type Layers.*graphc.register_pytree\(Layers"):
        graphc.trace(lambda ls, x: x, Layers([np.ones(2)]), np.ones(2))


def test_checkpoint_of_an_object_saves_its_arrays_by_attribute(tmp_path):
    state = Adam(Params(_f32(3, 2), _f32(2)), 7)
    graphc.save_checkpoint(tmp_path / "ckpt", state)
    back = graphc.load_checkpoint(tmp_path / "ckpt")  # a manifest holds no classes: dicts of the fields
    np.testing.assert_array_equal(back["m"]["w"], state.m.w)
    assert back["step"] == 7
    leaves, tree = flatten(state)  # rebuilt as the class from a template's structure
    again = unflatten(tree, flatten(back)[0])
    assert type(again) is Adam and type(again.m) is Params
    np.testing.assert_array_equal(again.m.b, state.m.b)


def test_standard_library_objects_are_static_and_namespaces_are_objects():
    import logging
    import threading
    import types

    layer = Layer(3, 3)
    layer.log = logging.getLogger("graphc.test")  # not looked inside: static, by identity
    layer.lock = threading.Lock()
    layer.cfg = types.SimpleNamespace(gain=np.float32(2.0), depth=1)  # a namespace of fields
    x = _f32(2, 3)

    def forward(layer, x):
        return layer(x) * layer.cfg.gain

    g = graphc.trace(forward, layer, x)
    assert len(g.inputs) == 4  # w, b, cfg.gain and x
    assert str(graphc.parse(str(g))) == str(g)
    _close(graphc.jit(forward)(layer, x), forward(layer, x))


def test_a_jitted_method_called_inside_another_trace_leaves_no_tracer_on_its_object():
    model = Smoother(3)
    inner = graphc.jit(model.step)
    outer = graphc.jit(lambda x: inner(x) * 2)  # inlined: model's arrays are constants of outer
    x = _f32(2, 3)
    want = Smoother.step(_copy_arrays(model), x) * 2
    _close(outer(x), want)
    _no_tracer(model)
    assert model.calls == 0


def _copy_arrays(obj):
    leaves, tree = flatten(obj)
    return unflatten(tree, [np.array(a) for a in leaves])
