"""The D4PG acting network (`models.d4pg.make_actor_network`) evaluated in numpy.

Actor processes must not load TensorFlow: Mesa's EGL driver (which renders the
pixel observations) and TensorFlow crash the process when both are loaded, in
either import order (both bring their own LLVM). A numpy forward pass is also
far cheaper per step than a TF call (~0.5 ms of dispatch overhead per step here,
versus ~0.2 ms for a cartpole step). The weights list is the Keras actor's
`get_weights()` order; tests check outputs against the Keras model.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

_LN_EPSILON = 1e-3  # keras.layers.LayerNormalization's default.
_CONV_KERNEL = 3
_CONV_CHANNELS = 32


def _conv_out(size: int, stride: int) -> int:
  return (size - _CONV_KERNEL) // stride + 1


def actor_weight_shapes(obs_shape: Sequence[int], action_dim: int,
                        policy_sizes: Sequence[int], pixels: bool,
                        embed_dim: int = 50) -> list[tuple[int, ...]]:
  """Shapes of the actor network's weights, in Keras get_weights() order."""
  shapes = []
  if pixels:
    height, width, channels = obs_shape
    k, c = _CONV_KERNEL, _CONV_CHANNELS
    flat = _conv_out(_conv_out(height, 2), 1) * _conv_out(_conv_out(width, 2), 1) * c
    shapes += [(k, k, channels, c), (c,), (k, k, c, c), (c,), (flat, embed_dim),
               (embed_dim,), (embed_dim,), (embed_dim,)]
    in_dim = embed_dim
  else:
    in_dim = obs_shape[0]
  sizes = list(policy_sizes)
  shapes += [(in_dim, sizes[0]), (sizes[0],), (sizes[0],), (sizes[0],)]
  for a, b in zip(sizes[:-1], sizes[1:]):
    shapes += [(a, b), (b,)]
  shapes += [(sizes[-1], action_dim), (action_dim,)]
  return shapes


def _layer_norm(x, gamma, beta):
  """LayerNorm of one vector x [D] (np.mean's Python overhead dominates at D=256)."""
  centered = x - np.add.reduce(x) / x.size
  variance = np.dot(centered, centered) / x.size
  return centered * (gamma / np.sqrt(variance + _LN_EPSILON)) + beta


def _elu(x):
  return np.where(x > 0, x, np.expm1(np.minimum(x, 0)))


def _conv_valid(x, kernel, bias, stride: int):
  """'valid' 2-D convolution of one image x [H, W, C] with kernel [k, k, C, O]."""
  k = kernel.shape[0]
  windows = sliding_window_view(x, (k, k), axis=(0, 1))[::stride, ::stride]  # [Ho,Wo,C,k,k]
  patches = windows.transpose(0, 1, 3, 4, 2).reshape(windows.shape[0], windows.shape[1], -1)
  return patches @ kernel.reshape(-1, kernel.shape[-1]) + bias


class NumpyPolicy:
  """Deterministic policy a = pi(obs) for one observation, weights set from the learner."""

  def __init__(self, obs_shape: Sequence[int], action_low, action_high,
               policy_sizes: Sequence[int], pixels: bool, embed_dim: int = 50):
    self.pixels = pixels
    self.low = np.asarray(action_low, np.float32)
    self.high = np.asarray(action_high, np.float32)
    self.num_mlp_layers = len(policy_sizes)
    self.shapes = actor_weight_shapes(obs_shape, len(self.low), policy_sizes, pixels,
                                      embed_dim)
    self._weights: list[np.ndarray] | None = None

  def set_weights(self, weights: list[np.ndarray]) -> None:
    shapes = [tuple(np.shape(w)) for w in weights]
    if shapes != self.shapes:
      raise ValueError(f"Policy weight shapes {shapes} do not match this network's "
                       f"{self.shapes}: actor and learner network settings differ.")
    self._weights = [np.asarray(w, np.float32) for w in weights]

  def _torso(self, obs, w):
    x = np.asarray(obs, np.float32) * np.float32(1 / 255)
    x = _elu(_conv_valid(x, w[0], w[1], stride=2))
    x = _elu(_conv_valid(x, w[2], w[3], stride=1))
    x = x.reshape(-1) @ w[4] + w[5]
    return np.tanh(_layer_norm(x, w[6], w[7]))

  def __call__(self, observation: np.ndarray) -> np.ndarray:
    """observation: one unbatched observation -> float32 action [action_dim]."""
    if self._weights is None:
      raise RuntimeError("NumpyPolicy called before set_weights().")
    w = self._weights
    if self.pixels:
      x, w = self._torso(observation, w), w[8:]
    else:
      x = np.asarray(observation, np.float32)
    x = np.tanh(_layer_norm(x @ w[0] + w[1], w[2], w[3]))
    for i in range(self.num_mlp_layers - 1):
      x = _elu(x @ w[4 + 2 * i] + w[5 + 2 * i])
    x = np.tanh(x @ w[-2] + w[-1])
    return (self.low + (x + 1.0) * (0.5 * (self.high - self.low))).astype(np.float32)
