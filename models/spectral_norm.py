"""Spectral normalization (Miyato et al. 2018) as Dense, Conv2D and Embedding layers.

The layers compute with W_SN = W / sigma(W), where sigma is estimated by one
power iteration per training forward pass on a persistent vector u:

  v = normalize(W u),  u' = normalize(W^T v),  sigma = v^T W u'

(W is the kernel viewed as a [rows, cols] matrix, u has cols entries). u and v
are held constant for the gradient (as in the authors' Chainer code), so
gradients flow through W / sigma(W) only. The stored kernel is never
overwritten: unlike keras.layers.SpectralNormalization, which assigns W / sigma
back into the kernel, the optimizer here always updates the raw W.

u is a non-trainable variable with Keras' default aggregation 'none': every
replica computes the same u' from the same W and u (the same float32 ops on the
same values), so each writes its own copy and the copies stay identical with no
communication. ('only_first_replica' would copy replica 0's value to the others:
under MultiWorkerMirroredStrategy one collective per layer and forward pass, 40
per SN-GAN step, which made two worker processes slower than one.)
In inference (training falsy) the same iteration runs from the stored u but u is
not written, so both modes compute the same W_SN for the same variables.

Under a mixed-precision policy the power iteration and W / sigma stay float32:
the kernel is read as stored (autocast=False, unlike other Keras kernels, which
a mixed layer reads in its compute dtype), and only W_SN is cast to the compute
dtype for the matmul, convolution or lookup.
"""

import keras
from keras import ops

# Added inside the square roots that normalise u and v (Chainer used 1e-12).
_EPS = 1e-12


def _l2_normalize(x):
  return x * ops.rsqrt(ops.sum(ops.square(x)) + _EPS)


def power_iteration(w_matrix, u):
  """One power iteration for the largest singular value of w_matrix.

  Args:
    w_matrix: float tensor [rows, cols].
    u: float tensor [cols], the current estimate of the top right singular vector.

  Returns:
    (sigma, u_new): scalar estimate of the largest singular value (differentiable
    w.r.t. w_matrix, with u and v constant) and the updated u [cols] (no gradient).
  """
  w_const = ops.stop_gradient(w_matrix)
  v = _l2_normalize(ops.matmul(w_const, u))
  u_new = ops.stop_gradient(_l2_normalize(ops.matmul(ops.transpose(w_const), v)))
  v = ops.stop_gradient(v)
  sigma = ops.sum(v * ops.matmul(w_matrix, u_new))
  return sigma, u_new


class SpectralNormMixin:
  """Holds u for one kernel and returns the normalised kernel.

  A subclass calls `_build_spectral_norm(kernel)` in build() after creating the
  kernel and `_normalized(kernel, training)` in call().
  """

  def _build_spectral_norm(self, kernel):
    cols = kernel.shape[-1]
    # Chainer's sngan_projection draws u from N(0, 1) without normalising it.
    self.sn_u = self.add_weight(
        name="sn_u", shape=(cols,), trainable=False,
        initializer=keras.initializers.RandomNormal(stddev=1.0, seed=self._u_seed),
        autocast=False)

  def _add_kernel(self, name, shape, initializer):
    """The raw kernel W: float32, read as float32 even inside a mixed-precision call."""
    return self.add_weight(name=name, shape=shape, initializer=initializer, autocast=False)

  def _normalized(self, kernel, training):
    """Returns (kernel / sigma with the kernel's shape, sigma), in the kernel's dtype."""
    w_matrix = ops.reshape(kernel, (-1, kernel.shape[-1]))
    sigma, u_new = power_iteration(w_matrix, ops.convert_to_tensor(self.sn_u))
    if training:
      self.sn_u.assign(u_new)
    return kernel / sigma, sigma

  def sigma(self):
    """The current sigma estimate (one iteration from the stored u, no update)."""
    return self._normalized(self.kernel, training=False)[1]


def _common_config(layer):
  return {"use_bias": layer.use_bias, "u_seed": layer._u_seed}


class SNDense(SpectralNormMixin, keras.layers.Layer):
  """Dense layer y = x W_SN + b with kernel W [in, out]."""

  def __init__(self, units, use_bias=True, kernel_initializer="glorot_uniform",
               u_seed=None, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self.use_bias = use_bias
    self.kernel_initializer = keras.initializers.get(kernel_initializer)
    self._u_seed = u_seed

  def build(self, input_shape):
    self.kernel = self._add_kernel("kernel", (input_shape[-1], self.units),
                                   self.kernel_initializer)
    self.bias = (self.add_weight(name="bias", shape=(self.units,), initializer="zeros")
                 if self.use_bias else None)
    self._build_spectral_norm(self.kernel)

  def call(self, inputs, training=None):
    kernel = ops.cast(self._normalized(self.kernel, training)[0], self.compute_dtype)
    outputs = ops.matmul(inputs, kernel)
    return outputs + self.bias if self.use_bias else outputs

  def compute_output_shape(self, input_shape):
    return tuple(input_shape[:-1]) + (self.units,)

  def get_config(self):
    return {**super().get_config(), **_common_config(self), "units": self.units}


class SNConv2D(SpectralNormMixin, keras.layers.Layer):
  """NHWC convolution with kernel [kh, kw, cin, cout], normalised as [kh*kw*cin, cout]."""

  def __init__(self, filters, kernel_size, strides=1, padding="same", use_bias=True,
               kernel_initializer="glorot_uniform", u_seed=None, **kwargs):
    super().__init__(**kwargs)
    self.filters = filters
    self.kernel_size = ((kernel_size, kernel_size) if isinstance(kernel_size, int)
                        else tuple(kernel_size))
    self.strides = strides
    self.padding = padding
    self.use_bias = use_bias
    self.kernel_initializer = keras.initializers.get(kernel_initializer)
    self._u_seed = u_seed

  def build(self, input_shape):
    shape = self.kernel_size + (input_shape[-1], self.filters)
    self.kernel = self._add_kernel("kernel", shape, self.kernel_initializer)
    self.bias = (self.add_weight(name="bias", shape=(self.filters,), initializer="zeros")
                 if self.use_bias else None)
    self._build_spectral_norm(self.kernel)

  def call(self, inputs, training=None):
    kernel = ops.cast(self._normalized(self.kernel, training)[0], self.compute_dtype)
    outputs = ops.conv(inputs, kernel, strides=self.strides, padding=self.padding)
    return outputs + self.bias if self.use_bias else outputs

  def compute_output_shape(self, input_shape):
    return keras.layers.Conv2D(self.filters, self.kernel_size, self.strides,
                               self.padding).compute_output_shape(input_shape)

  def get_config(self):
    return {**super().get_config(), **_common_config(self), "filters": self.filters,
            "kernel_size": self.kernel_size, "strides": self.strides,
            "padding": self.padding}


class SNEmbedding(SpectralNormMixin, keras.layers.Layer):
  """Embedding lookup in a spectrally normalised table [input_dim, output_dim].

  Used for the class embedding of the projection discriminator.
  """

  def __init__(self, input_dim, output_dim, embeddings_initializer="glorot_uniform",
               u_seed=None, **kwargs):
    super().__init__(**kwargs)
    self.input_dim = input_dim
    self.output_dim = output_dim
    self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
    self.use_bias = False
    self._u_seed = u_seed

  def build(self, input_shape=None):
    self.kernel = self._add_kernel("embeddings", (self.input_dim, self.output_dim),
                                   self.embeddings_initializer)
    self._build_spectral_norm(self.kernel)

  def call(self, ids, training=None):
    table = ops.cast(self._normalized(self.kernel, training)[0], self.compute_dtype)
    return ops.take(table, ops.cast(ids, "int32"), axis=0)

  def compute_output_shape(self, input_shape):
    return tuple(input_shape) + (self.output_dim,)

  def get_config(self):
    return {**super().get_config(), "input_dim": self.input_dim,
            "output_dim": self.output_dim, "u_seed": self._u_seed}
