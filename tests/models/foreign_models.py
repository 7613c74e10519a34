"""Plain-numpy models written the way people write numpy models when they have never heard of graphc.

Each ``make_*`` function returns ``(fn, args, kwargs, rtol)``; the tests trace ``fn(*args, **kwargs)``
and compare graphc's reference interpreter with eager numpy. The model code itself deliberately uses
many different idioms (classes, lambdas, python loops, dicts of lists, einsum, fancy indexing, ...).
"""

import numpy as np

F32 = 1e-4
F64 = 1e-6


# ------------------------------------------------------------------------------------------------
# 1. picoGPT-style GPT-2, unbatched: inputs are a [n_seq] sequence of token ids
# ------------------------------------------------------------------------------------------------


def pico_gelu(x):
    # np.sqrt(2 / np.pi) is a numpy float64 scalar: under NEP 50 it promotes float32 to float64
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def pico_softmax(x):
    exp_x = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return exp_x / np.sum(exp_x, axis=-1, keepdims=True)


def pico_layer_norm(x, g, b, eps: float = 1e-5):
    mean = np.mean(x, axis=-1, keepdims=True)
    variance = np.var(x, axis=-1, keepdims=True)
    x = (x - mean) / np.sqrt(variance + eps)
    return g * x + b


def pico_linear(x, w, b):
    return x @ w + b


def pico_ffn(x, c_fc, c_proj):
    a = pico_gelu(pico_linear(x, **c_fc))
    x = pico_linear(a, **c_proj)
    return x


def pico_attention(q, k, v, mask):
    return pico_softmax(q @ k.T / np.sqrt(q.shape[-1]) + mask) @ v


def pico_mha(x, c_attn, c_proj, n_head):
    x = pico_linear(x, **c_attn)
    qkv = np.split(x, 3, axis=-1)
    qkv_heads = list(map(lambda x: np.split(x, n_head, axis=-1), qkv))
    causal_mask = (1 - np.tri(x.shape[0], dtype=x.dtype)) * -1e10
    out_heads = [pico_attention(q, k, v, causal_mask) for q, k, v in zip(*qkv_heads)]
    x = np.hstack(out_heads)
    x = pico_linear(x, **c_proj)
    return x


def pico_block(x, mlp, attn, ln_1, ln_2, n_head):
    x = x + pico_mha(pico_layer_norm(x, **ln_1), **attn, n_head=n_head)
    x = x + pico_ffn(pico_layer_norm(x, **ln_2), **mlp)
    return x


def gpt2(inputs, wte, wpe, blocks, ln_f, n_head):
    x = wte[inputs] + wpe[range(len(inputs))]
    for block in blocks:
        x = pico_block(x, **block, n_head=n_head)
    x = pico_layer_norm(x, **ln_f)
    return x @ wte.T


def _gpt2_params(rng, n_vocab, n_ctx, n_embd, n_layer, dtype):
    def randn(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(dtype)

    def ln():
        return {"g": (1 + randn(n_embd)).astype(dtype), "b": randn(n_embd)}

    return {
        "wte": randn(n_vocab, n_embd),
        "wpe": randn(n_ctx, n_embd),
        "blocks": [
            {
                "mlp": {
                    "c_fc": {"w": randn(n_embd, 4 * n_embd), "b": randn(4 * n_embd)},
                    "c_proj": {"w": randn(4 * n_embd, n_embd), "b": randn(n_embd)},
                },
                "attn": {
                    "c_attn": {"w": randn(n_embd, 3 * n_embd), "b": randn(3 * n_embd)},
                    "c_proj": {"w": randn(n_embd, n_embd), "b": randn(n_embd)},
                },
                "ln_1": ln(),
                "ln_2": ln(),
            }
            for _ in range(n_layer)
        ],
        "ln_f": ln(),
    }


def make_gpt2_token_array():
    rng = np.random.default_rng(0)
    params = _gpt2_params(rng, n_vocab=50, n_ctx=16, n_embd=16, n_layer=2, dtype=np.float32)
    inputs = rng.integers(0, 50, size=10)
    return gpt2, (inputs,), dict(**params, n_head=4), F64  # float32 weights, float64 result (NEP 50)


def make_gpt2_token_list():
    # picoGPT passes the prompt as a python list of ints: a static argument
    rng = np.random.default_rng(1)
    params = _gpt2_params(rng, n_vocab=40, n_ctx=12, n_embd=8, n_layer=1, dtype=np.float64)
    inputs = [int(t) for t in rng.integers(0, 40, size=7)]
    return gpt2, (inputs,), dict(**params, n_head=2), F64


# ------------------------------------------------------------------------------------------------
# 2. Small layer classes built inside the traced function from params passed in as arguments
# ------------------------------------------------------------------------------------------------


class Dense:
    def __init__(self, w, b=None):
        self.w = w
        self.b = b

    def __call__(self, x):
        y = x.dot(self.w)
        if self.b is not None:
            y = y + self.b
        return y


class ReLU:
    def __call__(self, x):
        return np.maximum(x, 0)


class LeakyReLU:
    def __init__(self, alpha=0.01):
        self.alpha = alpha

    def __call__(self, x):
        return np.where(x > 0, x, self.alpha * x)


class LayerNorm:
    def __init__(self, gamma, beta, eps=1e-5):
        self.gamma, self.beta, self.eps = gamma, beta, eps

    def __call__(self, x):
        mu = x.mean(axis=-1, keepdims=True)
        sigma = x.std(axis=-1, keepdims=True)
        return self.gamma * (x - mu) / (sigma + self.eps) + self.beta


class Sequential:
    def __init__(self, *layers):
        self.layers = layers

    def __call__(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def __len__(self):
        return len(self.layers)


def class_mlp(weights, x, use_bias=True):
    layers = []
    for i, p in enumerate(weights["dense"]):
        layers.append(Dense(p["w"], p["b"] if use_bias else None))
        if i < len(weights["dense"]) - 1:
            layers.append(ReLU() if i % 2 == 0 else LeakyReLU(alpha=0.1))
    layers.append(LayerNorm(weights["norm"]["gamma"], weights["norm"]["beta"]))
    model = Sequential(*layers)
    out = model(x)
    return {"logits": out, "num_layers": len(model)}


def make_class_mlp(use_bias=True):
    rng = np.random.default_rng(2)
    sizes = [12, 32, 32, 24, 6]
    weights = {
        "dense": [
            {
                "w": rng.normal(0, 1 / np.sqrt(a), (a, b)).astype(np.float32),
                "b": rng.normal(0, 0.1, b).astype(np.float32),
            }
            for a, b in zip(sizes[:-1], sizes[1:])
        ],
        "norm": {"gamma": np.ones(6, np.float32), "beta": np.zeros(6, np.float32)},
    }
    x = rng.standard_normal((5, 12)).astype(np.float32)
    return class_mlp, (weights, x), {"use_bias": use_bias}, F32


# ------------------------------------------------------------------------------------------------
# 3. min-char-rnn style vanilla RNN (column vectors, dicts keyed by time step, static token lists)
# ------------------------------------------------------------------------------------------------


def char_rnn_loss(inputs, targets, hprev, Wxh, Whh, Why, bh, by):
    vocab_size = Wxh.shape[1]
    xs, hs, ys, ps = {}, {}, {}, {}
    hs[-1] = np.copy(hprev)
    loss = 0
    for t in range(len(inputs)):
        xs[t] = np.zeros((vocab_size, 1))  # one-hot, built in plain numpy from a static token id
        xs[t][inputs[t]] = 1
        hs[t] = np.tanh(np.dot(Wxh, xs[t]) + np.dot(Whh, hs[t - 1]) + bh)
        ys[t] = np.dot(Why, hs[t]) + by
        ps[t] = np.exp(ys[t]) / np.sum(np.exp(ys[t]))
        loss += -np.log(ps[t][targets[t], 0])
    return loss, hs[len(inputs) - 1]


def make_char_rnn():
    rng = np.random.default_rng(3)
    vocab, hidden = 11, 16
    data = [int(c) for c in rng.integers(0, vocab, size=9)]
    inputs, targets = data[:-1], data[1:]
    params = dict(
        Wxh=rng.standard_normal((hidden, vocab)) * 0.1,
        Whh=rng.standard_normal((hidden, hidden)) * 0.1,
        Why=rng.standard_normal((vocab, hidden)) * 0.1,
        bh=np.zeros((hidden, 1)),
        by=np.zeros((vocab, 1)),
    )
    hprev = np.zeros((hidden, 1))
    return char_rnn_loss, (inputs, targets, hprev), params, F64


# ------------------------------------------------------------------------------------------------
# 4. Batched Elman RNN and LSTM: python time loop, concat [h, x], np.stack the outputs
# ------------------------------------------------------------------------------------------------


def rnn_forward(x, params):
    # x: [batch, time, features]
    W, b, W_out, b_out = params["W"], params["b"], params["W_out"], params["b_out"]
    batch, T, _ = x.shape
    h = np.zeros((batch, W.shape[1]), dtype=np.float32)
    outputs = []
    for t in range(T):
        h = np.tanh(np.concatenate([h, x[:, t, :]], axis=1) @ W + b)
        outputs.append(h @ W_out + b_out)
    return np.stack(outputs, axis=1), h


def make_rnn():
    rng = np.random.default_rng(4)
    B, T, D, H, O = 3, 6, 5, 8, 4
    params = {
        "W": (rng.standard_normal((H + D, H)) / np.sqrt(H + D)).astype(np.float32),
        "b": np.zeros(H, np.float32),
        "W_out": (rng.standard_normal((H, O)) / np.sqrt(H)).astype(np.float32),
        "b_out": np.zeros(O, np.float32),
    }
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    return rnn_forward, (x, params), {}, F32


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def lstm_cell(x, h, c, W, b):
    hidden = h.shape[-1]
    z = np.concatenate((h, x), axis=-1) @ W + b
    i = sigmoid(z[:, :hidden])
    f = sigmoid(z[:, hidden : 2 * hidden] + 1.0)  # forget-gate bias trick
    o = sigmoid(z[:, 2 * hidden : 3 * hidden])
    g = np.tanh(z[:, 3 * hidden :])
    c = f * c + i * g
    h = o * np.tanh(c)
    return h, c


def lstm(xs, W, b, h0=None, c0=None, return_sequences=True):
    # xs: [T, B, D] (time-major)
    T, B, _ = xs.shape
    H = W.shape[1] // 4
    h = np.zeros((B, H), xs.dtype) if h0 is None else h0
    c = np.zeros((B, H), xs.dtype) if c0 is None else c0
    hs = []
    for t in range(T):
        h, c = lstm_cell(xs[t], h, c, W, b)
        hs.append(h)
    if return_sequences:
        return np.stack(hs), (h, c)
    return h, (h, c)


def make_lstm(with_state=False):
    rng = np.random.default_rng(5)
    T, B, D, H = 5, 2, 3, 6
    xs = rng.standard_normal((T, B, D)).astype(np.float32)
    W = rng.uniform(-0.3, 0.3, (H + D, 4 * H)).astype(np.float32)
    b = np.zeros(4 * H, np.float32)
    kwargs = {}
    if with_state:
        kwargs = {
            "h0": rng.standard_normal((B, H)).astype(np.float32),
            "c0": rng.standard_normal((B, H)).astype(np.float32),
            "return_sequences": False,
        }
    return lstm, (xs, W, b), kwargs, F32


# ------------------------------------------------------------------------------------------------
# 5. Attention three ways: einsum, einsum with '...', matmul + swapaxes
# ------------------------------------------------------------------------------------------------


def split_heads(x, n_heads):
    b, t, d = x.shape
    return x.reshape(b, t, n_heads, d // n_heads).transpose(0, 2, 1, 3)


def einsum_attention(x, wq, wk, wv, wo, n_heads=2, causal=True):
    q, k, v = (split_heads(x @ w, n_heads) for w in (wq, wk, wv))
    scores = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    if causal:
        T = x.shape[1]
        mask = np.triu(np.ones((T, T), dtype=bool), k=1)
        scores = np.where(mask, -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    out = np.einsum("bhqk,bhkd->bhqd", weights, v)
    out = out.transpose(0, 2, 1, 3).reshape(x.shape)
    return np.einsum("btd,de->bte", out, wo), weights


def ellipsis_attention(q, k, v, bias):
    d = q.shape[-1]
    s = np.einsum("...qd,...kd->...qk", q, k) * d**-0.5 + bias
    p = np.exp(s - np.log(np.sum(np.exp(s), axis=-1, keepdims=True)))
    return np.einsum("...qk,...kd->...qd", p, v)


def matmul_attention(q, k, v, key_padding):
    # q, k, v: [B, H, T, D]; key_padding: [B, T] of 0/1 floats (1 = keep)
    scale = 1.0 / np.sqrt(q.shape[-1])
    att = np.matmul(q, np.swapaxes(k, -1, -2)) * scale
    att = att + (1.0 - key_padding[:, None, None, :]) * -1e9
    att = np.exp(att - np.amax(att, axis=-1, keepdims=True))
    att = att / att.sum(-1)[..., np.newaxis]
    y = np.matmul(att, v)
    return np.moveaxis(y, 1, 2).reshape(y.shape[0], y.shape[2], -1)


def make_einsum_attention(causal=True):
    rng = np.random.default_rng(6)
    B, T, D = 2, 5, 8
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    ws = [(rng.standard_normal((D, D)) / np.sqrt(D)).astype(np.float32) for _ in range(4)]
    # the output is float64 (np.sqrt of a python int is a float64 scalar) but the projections and the
    # q.k einsum run in float32, whose summation order numpy's einsum does not fix: float32 tolerance
    return einsum_attention, (x, *ws), {"n_heads": 2, "causal": causal}, F32


def make_ellipsis_attention():
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 3, 4, 6)) for _ in range(3))
    bias = rng.standard_normal((4, 4))
    return ellipsis_attention, (q, k, v, bias), {}, F64


def make_matmul_attention():
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((2, 2, 5, 4)).astype(np.float32) for _ in range(3))
    key_padding = np.ones((2, 5), np.float32)
    key_padding[1, 3:] = 0
    return matmul_attention, (q, k, v, key_padding), {}, F64


# ------------------------------------------------------------------------------------------------
# 6. Residual MLP with batch norm (training mode uses batch statistics), kwargs-only flags
# ------------------------------------------------------------------------------------------------


def batchnorm(x, gamma, beta, running_mean, running_var, training, momentum, eps=1e-5):
    if training:
        mu = np.mean(x, axis=0, keepdims=True)
        var = np.var(x, axis=0, keepdims=True)
        new_mean = momentum * running_mean + (1 - momentum) * mu.squeeze(0)
        new_var = momentum * running_var + (1 - momentum) * var.squeeze(0) * x.shape[0] / (x.shape[0] - 1)
    else:
        mu, var = running_mean, running_var
        new_mean, new_var = running_mean, running_var
    x_hat = (x - mu) / np.sqrt(var + eps)
    return gamma * x_hat + beta, (new_mean, new_var)


def resmlp(params, x, *, training=False, momentum=0.9):
    h = x @ params["stem"]["w"] + params["stem"]["b"]
    new_stats = []
    for blk in params["blocks"]:
        y, stats = batchnorm(
            h,
            blk["bn"]["gamma"],
            blk["bn"]["beta"],
            blk["bn"]["mean"],
            blk["bn"]["var"],
            training=training,
            momentum=momentum,
        )
        y = np.maximum(y, 0.0)
        y = y @ blk["fc1"]["w"] + blk["fc1"]["b"]
        y = y * (y > 0)
        y = y @ blk["fc2"]["w"] + blk["fc2"]["b"]
        h = h + y
        new_stats.append({"mean": stats[0], "var": stats[1]})
    out = h @ params["head"]["w"] + params["head"]["b"]
    return out, new_stats


def make_resmlp(training=True):
    rng = np.random.default_rng(9)
    D, H, n_blocks = 6, 10, 2

    def lin(a, b):
        return {"w": (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32), "b": np.zeros(b, np.float32)}

    params = {
        "stem": lin(4, D),
        "blocks": [
            {
                "bn": {
                    "gamma": np.ones(D, np.float32),
                    "beta": np.zeros(D, np.float32),
                    "mean": rng.standard_normal(D).astype(np.float32),
                    "var": rng.uniform(0.5, 2, D).astype(np.float32),
                },
                "fc1": lin(D, H),
                "fc2": lin(H, D),
            }
            for _ in range(n_blocks)
        ],
        "head": lin(D, 3),
    }
    x = rng.standard_normal((8, 4)).astype(np.float32)
    return resmlp, (params, x), {"training": training}, F32


# ------------------------------------------------------------------------------------------------
# 7. Logistic regression and softmax regression, one step of gradient descent
# ------------------------------------------------------------------------------------------------


def logreg_step(w, b, X, y, lr=0.1, l2=1e-3):
    n = X.shape[0]
    z = np.dot(X, w) + b
    p = 1.0 / (1.0 + np.exp(-z))
    eps = 1e-7
    p = np.clip(p, eps, 1 - eps)
    loss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)) + 0.5 * l2 * np.sum(w**2)
    grad_w = X.T.dot(p - y) / n + l2 * w
    grad_b = np.sum(p - y) / n
    # Gauss-Newton curvature of the loss (diagonal weights p(1-p))
    hess = sum(p[i] * (1 - p[i]) * np.outer(X[i], X[i]) for i in range(n)) / n
    return w - lr * grad_w, b - lr * grad_b, loss, hess


def make_logreg():
    rng = np.random.default_rng(10)
    X = rng.standard_normal((7, 3))
    y = (rng.random(7) > 0.5).astype(np.float64)
    w = rng.standard_normal(3)
    b = np.float64(0.1)  # a numpy scalar argument becomes a 0-d graph input
    return logreg_step, (w, b, X, y), {"lr": 0.5}, F64


def softmax_regression(W, b, X, labels, num_classes):
    scores = X.dot(W) + b
    scores -= np.max(scores, axis=1, keepdims=True)
    probs = np.exp(scores) / np.sum(np.exp(scores), axis=1, keepdims=True)
    Y = (labels[:, None] == np.arange(num_classes)[None, :]).astype(X.dtype)  # one-hot
    loss = -np.sum(Y * np.log(np.clip(probs, 1e-12, 1.0))) / len(X)
    dW = np.dot(X.T, probs - Y) / len(X)
    db = np.mean(probs - Y, axis=0)
    return {"loss": loss, "dW": dW, "db": db, "pred": probs.argmax(axis=1)}


def make_softmax_regression():
    rng = np.random.default_rng(11)
    X = rng.standard_normal((9, 5)).astype(np.float32)
    labels = rng.integers(0, 4, 9)
    W = (0.01 * rng.standard_normal((5, 4))).astype(np.float32)
    b = np.zeros(4, np.float32)
    return softmax_regression, (W, b, X, labels, 4), {}, F32


# ------------------------------------------------------------------------------------------------
# 8. Small CNN: padding, im2col via slicing + np.stack, conv as matmul, avg pooling by reshape+mean
# ------------------------------------------------------------------------------------------------


def im2col(x, kh, kw, stride=1):
    N, C, H, W = x.shape
    out_h = (H - kh) // stride + 1
    out_w = (W - kw) // stride + 1
    patches = []
    for i in range(kh):
        for j in range(kw):
            patches.append(x[:, :, i : i + stride * out_h : stride, j : j + stride * out_w : stride])
    cols = np.stack(patches, axis=2)  # [N, C, kh*kw, out_h, out_w]
    cols = cols.reshape(N, C * kh * kw, out_h * out_w)
    return cols, out_h, out_w


def conv2d(x, weight, bias, stride=1, pad=0):
    F, C, kh, kw = weight.shape
    if pad > 0:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    cols, oh, ow = im2col(x, kh, kw, stride)
    out = weight.reshape(F, -1) @ cols  # [F, C*kh*kw] @ [N, C*kh*kw, L] -> [N, F, L]
    out = out + bias.reshape(1, -1, 1)
    return out.reshape(x.shape[0], F, oh, ow)


def avg_pool2x2(x):
    N, C, H, W = x.shape
    return x.reshape(N, C, H // 2, 2, W // 2, 2).mean(axis=(3, 5))


def cnn(params, images):
    x = conv2d(images, params["conv1"]["w"], params["conv1"]["b"], pad=1)
    x = np.maximum(0, x)
    x = avg_pool2x2(x)
    x = conv2d(x, params["conv2"]["w"], params["conv2"]["b"], stride=2, pad=1)
    x = np.maximum(0, x)
    x = x.reshape(x.shape[0], -1)
    logits = x @ params["fc"]["w"] + params["fc"]["b"]
    logits = logits - logits.max(axis=1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def make_cnn(dtype=np.float64):
    rng = np.random.default_rng(12)
    params = {
        "conv1": {"w": rng.normal(0, 0.3, (4, 2, 3, 3)).astype(dtype), "b": rng.normal(0, 0.1, 4).astype(dtype)},
        "conv2": {"w": rng.normal(0, 0.3, (6, 4, 3, 3)).astype(dtype), "b": np.zeros(6, dtype)},
        "fc": {"w": rng.normal(0, 0.2, (6 * 2 * 2, 5)).astype(dtype), "b": np.zeros(5, dtype)},
    }
    images = rng.standard_normal((3, 2, 8, 8)).astype(dtype)
    return cnn, (params, images), {}, (F64 if dtype == np.float64 else F32)


def depthwise_separable(x, dw, pw):
    # "sum of shifted views" convolution (no im2col), channels-last, then a 1x1 conv via einsum
    N, H, W, C = x.shape
    k = dw.shape[0]
    xp = np.pad(x, [(0, 0), (k // 2, k // 2), (k // 2, k // 2), (0, 0)], mode="constant")
    out = sum(xp[:, i : i + H, j : j + W, :] * dw[i, j] for i in range(k) for j in range(k))
    out = np.clip(out, 0.0, 6.0)  # relu6
    return np.einsum("nhwc,cd->nhwd", out, pw)


def make_depthwise():
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 6, 6, 3)).astype(np.float32)
    dw = rng.standard_normal((3, 3, 3)).astype(np.float32)
    pw = rng.standard_normal((3, 5)).astype(np.float32)
    return depthwise_separable, (x, dw, pw), {}, F32


# ------------------------------------------------------------------------------------------------
# 9. Bag-of-embeddings text classifier: emb[tokens], np.take, cross-entropy by fancy indexing
# ------------------------------------------------------------------------------------------------


def text_classifier(emb, W, b, tokens, labels, pad_id=0):
    e = emb[tokens]  # [B, L, D]
    mask = (tokens != pad_id).astype(np.float32)
    pooled = (e * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1.0)
    # a second "feature": the embedding of the first token, looked up with np.take
    first = np.take(emb, tokens[:, 0], axis=0)
    feats = np.concatenate([pooled, first], axis=-1)
    logits = feats @ W + b
    n = logits.shape[0]
    logits = logits - logits.max(axis=1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    loss = -log_probs[np.arange(n), labels].mean()
    acc = np.mean(np.argmax(logits, axis=1) == labels)  # float64 scalar
    return loss, acc


def make_text_classifier():
    rng = np.random.default_rng(14)
    V, D, L, B, K = 30, 8, 7, 5, 3
    emb = rng.standard_normal((V, D)).astype(np.float32)
    W = (rng.standard_normal((2 * D, K)) * 0.3).astype(np.float32)
    b = np.zeros(K, np.float32)
    tokens = rng.integers(1, V, (B, L))
    tokens[:, 5:] = 0  # padding
    labels = rng.integers(0, K, B)
    return text_classifier, (emb, W, b, tokens, labels), {}, F32


# ------------------------------------------------------------------------------------------------
# 10. Mixture-of-experts (top-1 gate), with a dict output containing a static python int
# ------------------------------------------------------------------------------------------------


def expert(x, p):
    return np.tanh(x @ p["w1"]) @ p["w2"]


def moe_layer(x, gate_w, experts):
    E = len(experts)
    gate_logits = x @ gate_w
    gate = np.exp(gate_logits - gate_logits.max(-1, keepdims=True))
    gate = gate / gate.sum(-1, keepdims=True)
    top1 = np.argmax(gate, axis=-1)  # [n]
    top1_prob = gate[np.arange(x.shape[0]), top1]
    all_out = np.stack([expert(x, p) for p in experts], axis=1)  # [n, E, d]
    onehot = np.arange(E)[None, :] == top1[:, None]
    y = np.sum(all_out * onehot[:, :, None], axis=1) * top1_prob[:, None]
    frac = onehot.mean(axis=0)
    aux_loss = E * np.sum(frac * gate.mean(axis=0))
    return {"y": y, "aux_loss": aux_loss, "expert_index": top1, "num_experts": E}


def moe_layer_take_along_axis(x, gate_w, experts):
    gate_logits = x @ gate_w
    gate = np.exp(gate_logits - gate_logits.max(-1, keepdims=True))
    gate = gate / gate.sum(-1, keepdims=True)
    top1 = np.argmax(gate, axis=-1)
    all_out = np.stack([expert(x, p) for p in experts], axis=1)  # [n, E, d]
    top1_prob = np.take_along_axis(gate, top1[:, None], axis=-1)  # [n, 1]
    y = np.take_along_axis(all_out, top1[:, None, None], axis=1)[:, 0, :] * top1_prob
    return y, len(experts)


def make_moe(take_along_axis=False):
    rng = np.random.default_rng(15)
    n, d, h, E = 6, 4, 8, 3
    x = rng.standard_normal((n, d)).astype(np.float32)
    gate_w = rng.standard_normal((d, E)).astype(np.float32)
    experts = [
        {"w1": rng.standard_normal((d, h)).astype(np.float32), "w2": rng.standard_normal((h, d)).astype(np.float32)}
        for _ in range(E)
    ]
    fn = moe_layer_take_along_axis if take_along_axis else moe_layer
    return fn, (x, gate_w, experts), {}, F32


# ------------------------------------------------------------------------------------------------
# 11. Tanh autoencoder returning a tuple with a python int and a python str
# ------------------------------------------------------------------------------------------------


def autoencoder(x, enc, dec, noise=None):
    h = x if noise is None else x + noise
    for W, b in enc:
        h = np.tanh(h @ W + b)
    z = h
    for k, (W, b) in enumerate(dec):
        h = h @ W + b
        if k != len(dec) - 1:
            h = np.tanh(h)
    recon = 1 / (1 + np.exp(-h))
    mse = np.mean(np.square(recon - x))
    l2 = sum(np.linalg.norm(W) ** 2 for W, _ in enc + dec)
    return recon, z, mse + 1e-4 * l2, z.shape[-1], "tanh"


def make_autoencoder(noisy=False):
    rng = np.random.default_rng(16)
    dims = [10, 6, 3]

    def layers(ds):
        return [(rng.normal(0, 0.5, (a, b)), rng.normal(0, 0.1, b)) for a, b in zip(ds[:-1], ds[1:])]

    x = rng.random((4, 10))
    kwargs = {"noise": rng.normal(0, 0.05, x.shape)} if noisy else {}
    return autoencoder, (x, layers(dims), layers(dims[::-1])), kwargs, F64


# ------------------------------------------------------------------------------------------------
# 12. Transformer encoder layer with params as nested dicts of lists of dicts and static flags
# ------------------------------------------------------------------------------------------------


def positional_encoding(T, d):
    pos = np.arange(T)[:, None]
    i = np.arange(d)[None, :]
    angle = pos / np.power(10000, (2 * (i // 2)) / d)
    return np.where(i % 2 == 0, np.sin(angle), np.cos(angle)).astype(np.float32)


def encoder(params, x, *, training=False, pre_norm=True, n_heads=2):
    B, T, d = x.shape
    x = x + positional_encoding(T, d)  # a float32 constant
    for layer in params["layers"]:
        ln1, ln2 = layer["norms"]
        h = LayerNorm(ln1["g"], ln1["b"])(x) if pre_norm else x
        qkv = [h @ layer["attn"][name]["w"] for name in ("q", "k", "v")]
        q, k, v = (split_heads(t, n_heads) for t in qkv)
        att = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(d // n_heads))
        att = np.exp(att - att.max(axis=-1, keepdims=True))
        att = att / att.sum(axis=-1, keepdims=True)
        o = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, d) @ layer["attn"]["o"]["w"]
        x = x + o
        if not pre_norm:
            x = LayerNorm(ln1["g"], ln1["b"])(x)
        h = LayerNorm(ln2["g"], ln2["b"])(x) if pre_norm else x
        for j, lin in enumerate(layer["ffn"]):
            h = h @ lin["w"] + lin["b"]
            if j == 0:
                h = np.maximum(h, 0)
        x = x + h
        if not pre_norm:
            x = LayerNorm(ln2["g"], ln2["b"])(x)
    pooled = x.mean(axis=1)
    out = {"pooled": pooled}
    if training:
        out["sequence"] = x
    return out


def make_encoder(training=False, pre_norm=True):
    rng = np.random.default_rng(17)
    B, T, d, f = 2, 4, 8, 16

    def w(*s):
        return (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)

    params = {
        "layers": [
            {
                "norms": [{"g": np.ones(d, np.float32), "b": np.zeros(d, np.float32)} for _ in range(2)],
                "attn": {name: {"w": w(d, d)} for name in ("q", "k", "v", "o")},
                "ffn": [{"w": w(d, f), "b": np.zeros(f, np.float32)}, {"w": w(f, d), "b": np.zeros(d, np.float32)}],
            }
            for _ in range(2)
        ]
    }
    x = rng.standard_normal((B, T, d)).astype(np.float32)
    return encoder, (params, x), {"training": training, "pre_norm": pre_norm}, F32


# ------------------------------------------------------------------------------------------------
# 13. Stateful model object: weights live on ``self`` (constants in the graph); trace the method
# ------------------------------------------------------------------------------------------------


class TwoLayerNet:
    def __init__(self, sizes, seed=0):
        rng = np.random.default_rng(seed)
        # He init; note `* np.sqrt(2.0 / a)` is a float64 scalar, so these weights end up float64
        self.params = [
            (rng.standard_normal((a, b)).astype(np.float32) * np.sqrt(2.0 / a), np.zeros(b, np.float32))
            for a, b in zip(sizes[:-1], sizes[1:])
        ]

    def forward(self, x):
        for k, (W, b) in enumerate(self.params):
            x = x @ W + b
            if k < len(self.params) - 1:
                x = np.maximum(x, 0)
        return x

    def predict(self, x):
        return np.argmax(self.forward(x), axis=1)

    def __call__(self, x):
        scores = self.forward(x)
        return {"scores": scores, "pred": scores.argmax(axis=1)}


def make_stateful_net(method="__call__"):
    net = TwoLayerNet([5, 7, 3])
    x = np.random.default_rng(23).standard_normal((4, 5)).astype(np.float32)
    fn = net if method == "__call__" else getattr(net, method)
    return fn, (x,), {}, F64


# ------------------------------------------------------------------------------------------------
# Idioms that once hit graphc gaps (kept as the models people write; now regular models below)
# ------------------------------------------------------------------------------------------------


def one_hot_eye(logits, labels):
    # one-hot via indexing a constant identity matrix with a traced label array
    Y = np.eye(logits.shape[1], dtype=logits.dtype)[labels]
    return -np.sum(Y * logits, axis=1).mean()


def make_one_hot_eye():
    rng = np.random.default_rng(18)
    return one_hot_eye, (rng.standard_normal((5, 4)), rng.integers(0, 4, 5)), {}, F64


def one_hot_take(logits, labels):
    Y = np.take(np.eye(logits.shape[1]), labels, axis=0)
    return -np.sum(Y * logits, axis=1).mean()


def make_one_hot_take():
    rng = np.random.default_rng(19)
    return one_hot_take, (rng.standard_normal((5, 4)), rng.integers(0, 4, 5)), {}, F64


def ensemble_mean(x, heads):
    # average the predictions of several heads, passed to np.mean as a python list
    preds = [np.tanh(x @ w) for w in heads]
    return np.mean(preds, axis=0), np.max(preds, axis=0)


def make_ensemble_mean():
    rng = np.random.default_rng(20)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    heads = [rng.standard_normal((3, 2)).astype(np.float32) for _ in range(3)]
    return ensemble_mean, (x, heads), {}, F32


def bce_with_logits(w, X, y):
    # the numerically stable binary cross-entropy: softplus via np.log1p / np.logaddexp
    z = X @ w
    loss_a = np.mean(np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z))))
    loss_b = np.mean(np.logaddexp(0, z) - z * y)
    return loss_a, loss_b


def make_bce_with_logits():
    rng = np.random.default_rng(21)
    X = rng.standard_normal((6, 3)).astype(np.float32)
    y = (rng.random(6) > 0.5).astype(np.float32)
    return bce_with_logits, (rng.standard_normal(3).astype(np.float32), X, y), {}, F32


def inplace_scaled_attention(q, k, v):
    # `scores /= np.sqrt(d_k)` updates a float32 array in place: numpy keeps it float32
    scores = q @ k.swapaxes(-1, -2)
    scores /= np.sqrt(q.shape[-1])
    scores -= scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    return probs @ v


def make_inplace_scaled_attention():
    rng = np.random.default_rng(24)
    q, k, v = (rng.standard_normal((2, 4, 3)).astype(np.float32) for _ in range(3))
    return inplace_scaled_attention, (q, k, v), {}, F32


def standardize_(x):
    # in-place helper in the sklearn style: mutates and returns its argument
    x -= x.mean(axis=0)
    x /= x.std(axis=0) + 1e-8
    return x


def random_features(X, W):
    H = np.cos(X @ W)
    Z = standardize_(H)  # H and Z are the same array afterwards
    return H, Z


def make_random_features():
    rng = np.random.default_rng(25)
    return random_features, (rng.standard_normal((6, 3)), rng.standard_normal((3, 5))), {}, F64


MODELS = {
    "gpt2_picogpt_token_array": make_gpt2_token_array,
    "gpt2_picogpt_token_list": make_gpt2_token_list,
    "class_mlp": make_class_mlp,
    "class_mlp_no_bias": lambda: make_class_mlp(use_bias=False),
    "char_rnn": make_char_rnn,
    "batched_rnn": make_rnn,
    "lstm_sequences": make_lstm,
    "lstm_with_state": lambda: make_lstm(with_state=True),
    "einsum_attention_causal": make_einsum_attention,
    "einsum_attention_full": lambda: make_einsum_attention(causal=False),
    "ellipsis_attention": make_ellipsis_attention,
    "matmul_attention": make_matmul_attention,
    "resmlp_batchnorm_train": make_resmlp,
    "resmlp_batchnorm_eval": lambda: make_resmlp(training=False),
    "logistic_regression": make_logreg,
    "softmax_regression": make_softmax_regression,
    "cnn_im2col_f64": make_cnn,
    "cnn_im2col_f32": lambda: make_cnn(np.float32),
    "depthwise_separable": make_depthwise,
    "text_classifier": make_text_classifier,
    "moe_top1": make_moe,
    "autoencoder": make_autoencoder,
    "autoencoder_noisy": lambda: make_autoencoder(noisy=True),
    "encoder_pre_norm_eval": make_encoder,
    "encoder_post_norm_train": lambda: make_encoder(training=True, pre_norm=False),
    "stateful_net_call": make_stateful_net,
    "stateful_net_forward": lambda: make_stateful_net("forward"),
    "stateful_net_predict": lambda: make_stateful_net("predict"),
}

# gaps found by these tests and since fixed in graphc: kept as regular models
MODELS.update(
    {
        "moe_take_along_axis": lambda: make_moe(take_along_axis=True),
        "one_hot_np_take_constant": make_one_hot_take,
        "np_mean_of_list_of_traced": make_ensemble_mean,
        "bce_log1p_logaddexp": make_bce_with_logits,
        "inplace_divide_keeps_float32": make_inplace_scaled_attention,
        "inplace_update_through_alias": make_random_features,
        "one_hot_eye_indexed_by_traced": make_one_hot_eye,  # (the source transform rewrites the subscript)
    }
)
