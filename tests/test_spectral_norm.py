"""Spectral normalization: the paper's sigma, gradients, and u's life cycle."""

import numpy as np
import pytest
import tensorflow as tf

from models import spectral_norm


def _layers():
  return {
      "dense": (spectral_norm.SNDense(5), tf.random.stateless_normal((3, 7), (1, 2))),
      "conv": (spectral_norm.SNConv2D(6, 3), tf.random.stateless_normal((2, 5, 5, 4), (1, 2))),
      "embedding": (spectral_norm.SNEmbedding(8, 4), tf.constant([0, 3, 7])),
  }


@pytest.mark.parametrize("kind", ["dense", "conv", "embedding"])
def test_sigma_converges_to_largest_singular_value(kind):
  layer, x = _layers()[kind]
  layer(x, training=True)
  w_matrix = layer.kernel.numpy().reshape(-1, layer.kernel.shape[-1])
  power_step = tf.function(lambda: layer(x, training=True))
  for _ in range(200):
    power_step()
  largest = np.linalg.svd(w_matrix, compute_uv=False)[0]
  np.testing.assert_allclose(float(layer.sigma()), largest, rtol=1e-4)
  # The layer computes with W / sigma.
  if kind == "dense":
    expected = x.numpy() @ (layer.kernel.numpy() / float(layer.sigma())) + layer.bias.numpy()
    np.testing.assert_allclose(layer(x, training=False).numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["dense", "conv", "embedding"])
def test_training_pass_updates_u_but_never_the_kernel(kind):
  layer, x = _layers()[kind]
  layer(x, training=False)
  kernel, u = layer.kernel.numpy(), layer.sn_u.numpy()
  y_inference = layer(x, training=False).numpy()
  np.testing.assert_array_equal(layer.sn_u.numpy(), u)
  y_training = layer(x, training=True).numpy()
  assert not np.allclose(layer.sn_u.numpy(), u)
  np.testing.assert_array_equal(layer.kernel.numpy(), kernel)
  # Both modes run the same iteration from the stored u; only training stores u'.
  np.testing.assert_allclose(y_training, y_inference, rtol=1e-6, atol=1e-6)


def test_gradient_is_that_of_w_over_sigma_with_u_and_v_constant():
  layer = spectral_norm.SNDense(4, use_bias=False)
  x = tf.random.stateless_normal((3, 6), (3, 4))
  c = tf.random.stateless_normal((3, 4), (5, 6))
  layer.build(x.shape)
  w, u = layer.kernel.numpy().astype(np.float64), layer.sn_u.numpy().astype(np.float64)
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(layer(x, training=True) * c)
  grad = tape.gradient(loss, layer.kernel.value).numpy()

  # The same iteration in numpy: v = Wu/|Wu|, u' = W^T v/|W^T v|, sigma = v^T W u'.
  v = w @ u
  v /= np.linalg.norm(v)
  u_new = w.T @ v
  u_new /= np.linalg.norm(u_new)
  sigma = v @ w @ u_new
  np.testing.assert_allclose(layer.sn_u.numpy(), u_new, rtol=1e-5)
  # L(W / sigma(W)) with dL/dW_SN = G and d sigma/dW = v u'^T (u, v constant).
  g = x.numpy().astype(np.float64).T @ c.numpy()
  expected = g / sigma - np.sum(g * w) / sigma**2 * np.outer(v, u_new)
  np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-6)


def test_u_copies_stay_identical_when_replicas_see_different_data():
  # u' depends only on the (replicated) kernel and u, not on the replica's batch:
  # each replica writes its own copy (aggregation 'none', no communication) and
  # the copies stay bit-identical.
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  with strategy.scope():
    layer = spectral_norm.SNDense(3)
    layer.build((None, 2))
  assert layer.sn_u.aggregation == "none"

  @tf.function
  def forward():
    def fn():
      replica = tf.distribute.get_replica_context().replica_id_in_sync_group
      return layer(tf.fill((4, 2), tf.cast(replica, tf.float32) * 3.0 + 1.0), training=True)
    return strategy.run(fn)

  before = layer.sn_u.numpy()
  for _ in range(3):
    forward()
  copies = [c.numpy() for c in strategy.experimental_local_results(layer.sn_u.value)]
  assert len(copies) == 2 and not np.array_equal(copies[0], before)
  np.testing.assert_array_equal(copies[0], copies[1])
