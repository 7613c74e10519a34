"""A transformer block as layer objects holding their weights (the numpy-transformer style).

Every layer is a class whose ``__init__`` draws ``self.w``/``self.b`` and whose ``forward`` takes
the activations; the block is called as ``block.forward(x)``.
"""

import numpy as np


class Dense:
    def __init__(self, n_in, n_out, rng):
        self.w = rng.normal(0, 1 / np.sqrt(n_in), (n_in, n_out))
        self.b = np.zeros(n_out)

    def forward(self, x):
        # [..., n_in] -> [..., n_out]
        return np.dot(x, self.w) + self.b


class LayerNorm:
    def __init__(self, dim, eps=1e-5):
        self.gamma = np.ones(dim)
        self.beta = np.zeros(dim)
        self.eps = eps

    def forward(self, x):
        mean = np.mean(x, axis=-1, keepdims=True)
        var = np.var(x, axis=-1, keepdims=True)
        x_hat = (x - mean) / np.sqrt(var + self.eps)
        return self.gamma * x_hat + self.beta


class Softmax:
    def forward(self, x):
        e_x = np.exp(x - np.max(x, axis=-1, keepdims=True))
        return e_x / np.sum(e_x, axis=-1, keepdims=True)


class GELU:
    def forward(self, x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * np.power(x, 3))))


class MultiHeadAttention:
    def __init__(self, d_model, heads_num, rng):
        self.d_model = d_model
        self.heads_num = heads_num
        self.d_k = d_model // heads_num
        self.scale = np.sqrt(self.d_k)
        self.K_linear = Dense(d_model, d_model, rng)
        self.Q_linear = Dense(d_model, d_model, rng)
        self.V_linear = Dense(d_model, d_model, rng)
        self.O_linear = Dense(d_model, d_model, rng)
        self.activation = Softmax()

    def split_heads_forward(self, x):
        batch_size = x.shape[0]
        # [batch, seq, d_model] -> [batch, heads, seq, d_k]
        return x.reshape(batch_size, -1, self.heads_num, self.d_k).transpose(0, 2, 1, 3)

    def group_heads_forward(self, x):
        batch_size = x.shape[0]
        return x.transpose(0, 2, 1, 3).reshape(batch_size, -1, self.heads_num * self.d_k)

    def forward(self, query, key, value, mask=None):
        K = self.split_heads_forward(self.K_linear.forward(key))
        Q = self.split_heads_forward(self.Q_linear.forward(query))
        V = self.split_heads_forward(self.V_linear.forward(value))
        energy = np.matmul(Q, K.transpose(0, 1, 3, 2)) / self.scale  # [batch, heads, seq, seq]
        if mask is not None:
            energy = np.where(mask == 0, -1e9, energy)
        attention = self.activation.forward(energy)
        output = np.matmul(attention, V)
        return self.O_linear.forward(self.group_heads_forward(output))


class TransformerBlock:
    def __init__(self, d_model, heads_num, d_ff, seed=0):
        rng = np.random.default_rng(seed)
        self.ln_1 = LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, heads_num, rng)
        self.ln_2 = LayerNorm(d_model)
        self.fc = Dense(d_model, d_ff, rng)
        self.act = GELU()
        self.proj = Dense(d_ff, d_model, rng)

    def forward(self, x):
        seq_len = x.shape[1]
        mask = np.tril(np.ones((seq_len, seq_len)))  # causal
        h = self.ln_1.forward(x)
        x = x + self.attn.forward(h, h, h, mask)
        x = x + self.proj.forward(self.act.forward(self.fc.forward(self.ln_2.forward(x))))
        return x

    def loss(self, x, target):
        return np.mean((self.forward(x) - target) ** 2)
