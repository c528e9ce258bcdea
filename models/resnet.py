"""ResNet v1.5 in plain Keras 3: ResNet-50 for ImageNet and small variants for 28x28 inputs.

v1.5 means the stride of a downsampling bottleneck sits on its 3x3 convolution,
not on the first 1x1 (He et al. 2016 as used by Goyal et al. 2017, the TF Model
Garden and MLPerf). Both builders below go through one `_build_resnet`, with
`bottleneck_block` or `basic_block` as the residual unit: a function, chosen in
gin by reference (small_resnet.block = @bottleneck_block), like norm_layer.

Normalisation is a factory, `norm_layer(name=...) -> keras.layers.Layer`, so a
config can inject a cross-replica batch norm without this module knowing the
engine. Weight decay is not a kernel_regularizer: the training step adds its own
L2 term over `decayed_weights(model)`.

Where the model may be split across devices (it says where, never how):
- tensor parallelism: each residual unit builds its convolutions with a `conv_layer`
  factory (default `models.layers.conv2d`, whole layers) and names a Megatron pair,
  the first convolution split by output channels, the next by input channels, with
  only its norm and ReLU between them (in gin: basic_block.conv_layer = ...);
- a pipeline: `resnet_pieces(model)` cuts the model after its stem and after every
  residual block.
"""

from __future__ import annotations

from typing import Callable, Sequence

import gin
import keras

from models import pieces as pieces_lib
from models.layers import SPLIT_INPUT, SPLIT_OUTPUT, MeanAggregatedBatchNorm, conv2d

NormFactory = Callable[..., keras.layers.Layer]

# Convolutions: He-normal (fan_in), no bias (every conv is followed by a norm layer).
_CONV_INIT = "he_normal"


@gin.configurable
def batch_norm(name: str | None = None, momentum: float = 0.9,
               epsilon: float = 1e-5) -> keras.layers.Layer:
  """The default norm factory: per-replica batch statistics, replica-consistent moving ones.

  momentum 0.9 (Keras' default is 0.99) suits short schedules: the moving
  statistics must track the weights within a few hundred steps.
  """
  return MeanAggregatedBatchNorm(momentum=momentum, epsilon=epsilon, name=name)


def _zero_gamma(layer: keras.layers.Layer) -> None:
  """Sets a built norm layer's scale to 0, so its residual branch starts as identity."""
  gamma = getattr(layer, "gamma", None)
  if gamma is None:
    raise ValueError(
        f"zero_init_residual=True needs a norm layer with a 'gamma' scale variable; "
        f"{type(layer).__name__} {layer.name!r} has none. Pass zero_init_residual=False "
        f"or a norm_layer factory whose layers have gamma (e.g. BatchNormalization).")
  gamma.assign(keras.ops.zeros(gamma.shape, dtype=gamma.dtype))


def _conv(filters: int, kernel_size: int, strides: int, name: str, conv_layer=conv2d,
          split: str | None = None) -> keras.layers.Layer:
  return conv_layer(filters, kernel_size, strides=strides, padding="same", use_bias=False,
                    kernel_initializer=_CONV_INIT, name=name, split=split)


def _projection(x, filters: int, strides: int, norm_layer: NormFactory, name: str):
  """Shortcut: identity if the shape is kept, else a strided 1x1 conv + norm."""
  if strides == 1 and x.shape[-1] == filters:
    return x
  x = _conv(filters, 1, strides, name=f"{name}_proj_conv")(x)
  return norm_layer(name=f"{name}_proj_norm")(x)


@gin.configurable
def basic_block(x, filters: int, strides: int, norm_layer: NormFactory, name: str,
                zero_init_residual: bool = True, conv_layer=conv2d):
  """Two 3x3 convs (ResNet-18/34 unit); output has `filters` channels. The two convs
  are a pair a model-parallel conv_layer may split (see the module docstring)."""
  shortcut = _projection(x, filters, strides, norm_layer, name)
  y = _conv(filters, 3, strides, f"{name}_conv1", conv_layer, SPLIT_OUTPUT)(x)
  y = norm_layer(name=f"{name}_norm1")(y)
  y = keras.layers.ReLU(name=f"{name}_relu1")(y)
  y = _conv(filters, 3, 1, f"{name}_conv2", conv_layer, SPLIT_INPUT)(y)
  last_norm = norm_layer(name=f"{name}_norm2")
  y = last_norm(y)
  if zero_init_residual:
    _zero_gamma(last_norm)
  y = keras.layers.Add(name=f"{name}_add")([shortcut, y])
  return keras.layers.ReLU(name=f"{name}_out")(y)


basic_block.expansion = 1


@gin.configurable
def bottleneck_block(x, filters: int, strides: int, norm_layer: NormFactory, name: str,
                     zero_init_residual: bool = True, conv_layer=conv2d):
  """1x1 -> 3x3 (strided, v1.5) -> 1x1 (x4); output has 4 * `filters` channels. The
  1x1 and the 3x3 are a pair a model-parallel conv_layer may split; the last 1x1 is whole."""
  out_filters = 4 * filters
  shortcut = _projection(x, out_filters, strides, norm_layer, name)
  y = _conv(filters, 1, 1, f"{name}_conv1", conv_layer, SPLIT_OUTPUT)(x)
  y = norm_layer(name=f"{name}_norm1")(y)
  y = keras.layers.ReLU(name=f"{name}_relu1")(y)
  y = _conv(filters, 3, strides, f"{name}_conv2", conv_layer, SPLIT_INPUT)(y)
  y = norm_layer(name=f"{name}_norm2")(y)
  y = keras.layers.ReLU(name=f"{name}_relu2")(y)
  y = _conv(out_filters, 1, 1, f"{name}_conv3", conv_layer)(y)
  last_norm = norm_layer(name=f"{name}_norm3")
  y = last_norm(y)
  if zero_init_residual:
    _zero_gamma(last_norm)
  y = keras.layers.Add(name=f"{name}_add")([shortcut, y])
  return keras.layers.ReLU(name=f"{name}_out")(y)


bottleneck_block.expansion = 4

# A residual unit: block(x, filters, strides, norm_layer, name=..., zero_init_residual=...)
# -> the block's output tensor.
BlockFn = Callable[..., keras.KerasTensor]


def _positive_ints(name: str, value) -> tuple[int, ...]:
  """value as a non-empty tuple of positive integers; ValueError naming the argument."""
  values = tuple(value) if isinstance(value, (tuple, list)) else None
  if not values or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                           for v in values):
    raise ValueError(f"{name} = {value!r}: must be a tuple of positive integers "
                     f"(e.g. {name} = (16, 32, 64)).")
  return values


def _build_resnet(*, inputs, stem: Callable, block: BlockFn, widths: Sequence[int],
                  blocks_per_stage: Sequence[int], strides: Sequence[int],
                  num_classes: int, norm_layer: NormFactory | None,
                  zero_init_residual: bool, dropout: float, head_init, name: str) -> keras.Model:
  """The one builder: stem -> stages of residual blocks -> global pool -> dense logits."""
  if not callable(block):
    raise ValueError(f"block={block!r}: must be a residual-unit function such as "
                     f"basic_block or bottleneck_block (in gin: @basic_block).")
  if not (len(widths) == len(blocks_per_stage) == len(strides)):
    raise ValueError(
        f"widths {tuple(widths)}, blocks_per_stage {tuple(blocks_per_stage)} and strides "
        f"{tuple(strides)} must have the same length (one entry per stage).")
  if any(b < 1 for b in blocks_per_stage):
    raise ValueError(f"blocks_per_stage {tuple(blocks_per_stage)}: each stage needs >= 1 block.")
  norm_layer = norm_layer or batch_norm
  x = stem(inputs, norm_layer)
  for s, (width, n, stride) in enumerate(zip(widths, blocks_per_stage, strides), start=1):
    for b in range(1, n + 1):
      x = block(x, width, stride if b == 1 else 1, norm_layer, name=f"stage{s}_block{b}",
                zero_init_residual=zero_init_residual)
  x = keras.layers.GlobalAveragePooling2D(name="avg_pool")(x)
  if dropout:
    x = keras.layers.Dropout(dropout, name="dropout")(x)
  logits = keras.layers.Dense(num_classes, kernel_initializer=head_init, name="logits")(x)
  return keras.Model(inputs, logits, name=name)


@gin.configurable
def resnet50(num_classes: int = 1000, norm_layer: NormFactory | None = None,
             zero_init_residual: bool = True,
             input_shape: tuple[int, int, int] = (224, 224, 3)) -> keras.Model:
  """ResNet-50 v1.5 for ImageNet: 25,557,032 trainable parameters at 1000 classes."""

  def stem(x, norm):
    x = keras.layers.ZeroPadding2D(3, name="stem_pad")(x)
    x = keras.layers.Conv2D(64, 7, strides=2, padding="valid", use_bias=False,
                            kernel_initializer=_CONV_INIT, name="stem_conv")(x)
    x = norm(name="stem_norm")(x)
    x = keras.layers.ReLU(name="stem_relu")(x)
    x = keras.layers.ZeroPadding2D(1, name="pool_pad")(x)
    return keras.layers.MaxPooling2D(3, strides=2, name="stem_pool")(x)

  return _build_resnet(
      inputs=keras.Input(shape=input_shape, name="images"), stem=stem, block=bottleneck_block,
      widths=(64, 128, 256, 512), blocks_per_stage=(3, 4, 6, 3), strides=(1, 2, 2, 2),
      num_classes=num_classes, norm_layer=norm_layer, zero_init_residual=zero_init_residual,
      dropout=0.0, head_init=keras.initializers.RandomNormal(stddev=0.01), name="resnet50")


@gin.configurable
def small_resnet(num_classes: int = 10, widths: Sequence[int] = (16, 32, 64),
                 blocks_per_stage: Sequence[int] | None = None,
                 strides: Sequence[int] | None = None, stem_width: int | None = None,
                 stem_stride: int = 1, block: BlockFn = basic_block,
                 norm_layer: NormFactory | None = None, zero_init_residual: bool = True,
                 dropout: float = 0.0,
                 input_shape: tuple[int, int, int] = (28, 28, 1)) -> keras.Model:
  """A CIFAR-style ResNet for small images (Fashion-MNIST: 28x28x1).

  Stem: one 3x3 conv (stem_width channels, default widths[0]) + norm + ReLU with
  stride stem_stride (1 keeps 28x28). Then one stage per entry of widths, the
  first block of stage i strided by strides[i] (default 1 for the first stage,
  2 for the others), with blocks_per_stage[i] blocks (default 1 each). block is
  the residual unit (basic_block or bottleneck_block; in gin
  small_resnet.block = @bottleneck_block); with bottleneck_block a stage outputs
  4 * width channels.
  """
  widths = _positive_ints("widths", widths)
  blocks_per_stage = (_positive_ints("blocks_per_stage", blocks_per_stage)
                      if blocks_per_stage else (1,) * len(widths))
  strides = (_positive_ints("strides", strides) if strides is not None
             else (1,) + (2,) * (len(widths) - 1))
  stem_width = _positive_ints("stem_width", (stem_width or widths[0],))[0]
  _positive_ints("stem_stride", (stem_stride,))
  if not (isinstance(dropout, (int, float)) and 0 <= dropout < 1):
    raise ValueError(f"dropout = {dropout!r}: must be a number in [0, 1).")

  def stem(x, norm):
    x = _conv(stem_width, 3, stem_stride, name="stem_conv")(x)
    x = norm(name="stem_norm")(x)
    return keras.layers.ReLU(name="stem_relu")(x)

  return _build_resnet(
      inputs=keras.Input(shape=input_shape, name="images"), stem=stem, block=block,
      widths=widths, blocks_per_stage=tuple(blocks_per_stage), strides=strides,
      num_classes=num_classes, norm_layer=norm_layer, zero_init_residual=zero_init_residual,
      dropout=dropout, head_init="glorot_uniform", name="small_resnet")


@gin.configurable
def resnet_pieces(model: keras.Model) -> list[pieces_lib.Piece]:
  """A ResNet of this module cut after its stem and after every residual block: the
  points where a pipeline may place a stage boundary (models/pieces.py)."""
  names = [layer.name for layer in model.layers]
  stem_end = "stem_pool" if "stem_pool" in names else "stem_relu"
  blocks = [n for n in names if n.startswith("stage") and n.endswith("_out")]
  return pieces_lib.functional_pieces(model, [stem_end] + blocks)


_DECAYED_NAMES = ("kernel", "depthwise_kernel", "pointwise_kernel")


def decayed_weights(model: keras.Model) -> list:
  """The variables weight decay applies to: conv and dense kernels.

  Not norm-layer scales/offsets, moving statistics or biases. Each variable
  appears once, in model.trainable_variables order.
  """
  seen, out = set(), []
  for v in model.trainable_variables:
    if v.name.split("/")[-1].split(":")[0] in _DECAYED_NAMES and id(v) not in seen:
      seen.add(id(v))
      out.append(v)
  return out


__all__ = ["basic_block", "batch_norm", "bottleneck_block", "decayed_weights", "resnet50",
           "resnet_pieces", "small_resnet"]
