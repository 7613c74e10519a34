"""A message-passing graph network in plain numpy, as GNN tutorials write it: messages gathered
along the edges (``h[src]``) and summed into their destination nodes with ``np.add.at`` into an
``np.zeros`` buffer (a scatter-add), degrees counted the same way.
"""

import numpy as np


def aggregate(h, src, dst, n_nodes):
    # h: [V, F] -> mean of the incoming messages per node: [V, F]
    out = np.zeros((n_nodes, h.shape[1]))
    np.add.at(out, dst, h[src])
    deg = np.zeros(n_nodes)
    np.add.at(deg, dst, 1.0)
    return out / np.maximum(deg, 1.0)[:, None]


def gnn_layer(h, src, dst, W_self, W_neigh):
    n_nodes = h.shape[0]
    return np.tanh(h @ W_self + aggregate(h, src, dst, n_nodes) @ W_neigh)


def loss(params, h, edges, target):
    src, dst = edges[0], edges[1]
    for layer in params:
        h = gnn_layer(h, src, dst, layer["W_self"], layer["W_neigh"])
    return 0.5 * np.sum((h - target) ** 2)


def init_params(rng, sizes):
    return [
        {"W_self": rng.standard_normal((m, n)) / np.sqrt(m), "W_neigh": rng.standard_normal((m, n)) / np.sqrt(m)}
        for m, n in zip(sizes[:-1], sizes[1:])
    ]
