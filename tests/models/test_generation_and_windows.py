"""Real-model styles of issue 32 items 7 and 8 (tests/models/real_models/): a CNN written with
Python loops over windows (Numpy-CNN), whose max-pool backward uses np.nanargmax and
np.unravel_index; and KV-cache generation loops that must not re-plan for every token."""

from __future__ import annotations

import numpy as np
import pytest

import graphc
from graphc.core.mesh import Mesh
from graphc.core.profiles import MachineProfile
from tests.models.real_models import numpy_cnn

pytestmark = pytest.mark.filterwarnings("ignore::graphc.PromotionWarning")


def close(got, want, rtol=1e-9, atol=1e-12):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=rtol, atol=atol)
    assert np.asarray(got).shape == np.asarray(want).shape and np.asarray(got).dtype == np.asarray(want).dtype


# --- a CNN from loops over windows ----------------------------------------------------------------


def cnn_data(size=8, seed=1):
    params = numpy_cnn.make_params(n_f=2, size=size)
    rng = np.random.default_rng(seed)
    image = rng.standard_normal((1, size, size))
    pooled = (size - 3 + 1) // 2
    return params, image, rng.standard_normal((2, pooled, pooled))


def test_cnn_from_windows_forward_and_pool_backward_equal_numpys():
    params, image, dpool = cnn_data()
    close(graphc.jit(numpy_cnn.forward)(image, params), numpy_cnn.forward(image, params))
    want = numpy_cnn.pool_gradient(image, params, dpool)
    assert np.count_nonzero(want) > 0
    np.testing.assert_array_equal(graphc.jit(numpy_cnn.pool_gradient)(image, params, dpool), want)
    # a window with a NaN: nanargmax skips it, as numpy's does
    image[0, 0, 0] = np.nan
    got = graphc.jit(numpy_cnn.pool_gradient)(image, params, dpool)
    np.testing.assert_array_equal(got, numpy_cnn.pool_gradient(image, params, dpool))


def test_cnn_from_windows_gradient_and_mesh():
    params, image, _ = cnn_data(size=6)

    def loss(params, image):
        return -np.log(numpy_cnn.forward(image, params)[3, 0])

    value, grads = graphc.value_and_grad(loss)(params, image)
    close(value, loss(params, image))
    eps, w = 1e-6, params[2]
    direction = np.random.default_rng(5).standard_normal(w.shape)
    plus = [*params[:2], w + eps * direction, params[3]]
    minus = [*params[:2], w - eps * direction, params[3]]
    numeric = (loss(plus, image) - loss(minus, image)) / (2 * eps)
    np.testing.assert_allclose(np.sum(grads[2] * direction), numeric, rtol=1e-6)
    on_mesh = graphc.parallelize(
        numpy_cnn.forward, mesh=Mesh({"dp": 2, "tp": 2}, profile=MachineProfile.default()), cache=False
    )
    close(on_mesh(image, params), numpy_cnn.forward(image, params), rtol=1e-12, atol=1e-15)
