"""A GPipe pipeline: a model's pieces grouped into K stages on K devices, over micro-batches.

Bound in gin around a model builder,

    ImageClassification.model = @model_parallel.pipelined
    model_parallel.pipelined.builder = @small_resnet
    model_parallel.pipelined.split = @resnet_pieces      # or the model's own pieces()

the model is cut where it says it may be (models/pieces.py: each piece a callable
carry, training -> carry with the `variables` it uses) and its consecutive
pieces are grouped into K = topology.Mesh.model stages holding about equal numbers of
parameters (the memory the model's state takes on each device), or where the config
says (model_parallel.pipelined.stage_starts: a convolutional network's early,
high-resolution pieces hold few parameters but most activations and FLOPs). Inside a replicated step each
replica d splits its batch into n = topology.Mesh.micro_batches micro-batches and
sends each through stage k on device (d, k), k = 0..K-1; TensorFlow's dataflow
executor runs micro-batch i on stage k while micro-batch i+1 is on stage k-1. The
loss needs every micro-batch, so the backward pass starts when the forward pass is
done: GPipe's schedule (Huang et al. 2019), whose idle share of each device, the
bubble, is (K-1)/(n+K-1). Each stage's backward pass runs on its own device (a
custom gradient per stage and micro-batch: the backward ops of a TF2 tape would
otherwise all land on the device that asks for the gradient); activations are kept,
not re-materialised, so a device holds its stage's activations of all n micro-batches.

Every layer sees micro-batches: batch normalisation uses each micro-batch's
statistics and updates its moving averages once per micro-batch (as GPipe does), and
a spectral norm advances its power iteration once per micro-batch. With n = 1, or a
model without such layers, the pipeline computes exactly what one device computes.
A batch that n does not divide (an evaluation's) goes through as one micro-batch.
"""

import math
from typing import Callable, Sequence

import gin
import keras
import tensorflow as tf

from replibench.engine import compilation
from replibench.engine.model_parallel import layout as layout_lib, model_axis, placement
from replibench.errors import UserError


@gin.configurable(module="model_parallel")
def pipelined(builder: Callable[..., keras.Model] = gin.REQUIRED,
              split: Callable | None = None, stage_starts: Sequence[int] | None = None,
              **kwargs) -> keras.Model:
  """builder(**kwargs) as a pipelined model; split(model) -> its pieces (default: the
  model's own pieces()); stage_starts: the first piece of each stage after the first
  (K - 1 increasing indices; default: stages of about equal parameters)."""
  return Pipelined(builder(**kwargs), split, stage_starts)


def partition(costs: list[float], stages: int) -> list[int]:
  """The first piece of each stage: consecutive groups minimising the largest cost."""
  n = len(costs)
  prefix = [0.0]
  for c in costs:
    prefix.append(prefix[-1] + c)
  # best[(k, i)]: (largest group cost, group starts) of the first i pieces in k groups.
  best = {(0, 0): (0.0, [])}
  for k in range(1, stages + 1):
    for i in range(k, n - stages + k + 1):
      best[(k, i)] = min(
          (max(best[(k - 1, j)][0], prefix[i] - prefix[j]), best[(k - 1, j)][1] + [j])
          for j in range(k - 1, i) if (k - 1, j) in best)
  return best[(stages, n)][1]


class Pipelined(keras.Model):
  """A model run as a pipeline of its pieces (see the module docstring)."""

  def __init__(self, inner: keras.Model, split: Callable | None = None,
               stage_starts: Sequence[int] | None = None, **kwargs):
    super().__init__(name=f"{inner.name}_pipelined", **kwargs)
    self.inner = inner
    self._split, self._starts = split, stage_starts
    self._layout = layout_lib.current()
    self.stages = None   # [[pieces of stage k], ...] once built.
    if self._layout is not None:
      self._layout.pipelines.append(self)
    if inner.built:
      self._prepare()

  def __getattr__(self, name):
    # The wrapped model's own attributes (z_dim, image_shape, input_shape...).
    if name.startswith("_") or name in ("inner", "stages"):
      raise AttributeError(name)
    return getattr(self.inner, name)

  def build(self, input_shape):
    if not self.inner.built:
      self.inner.build(input_shape)
    self._prepare()

  def _prepare(self) -> None:
    pieces = self._split(self.inner) if self._split else self.inner.pieces()
    self._check_cover(pieces)
    stages = self._layout.stages if self._layout else 1
    if len(pieces) < stages:
      raise UserError(f"Pipeline: {self.inner.name} can be cut into {len(pieces)} pieces, "
                      f"fewer than the {stages} stages of topology.Mesh.model = {stages}; use "
                      f"fewer devices a replica or a deeper model.")
    costs = [sum(math.prod(v.shape) for v in p.variables if v.trainable) for p in pieces]
    # One stage (no mesh: a model built to check or to plan the whole) ignores the cuts.
    starts = ([0, *self._check_starts(len(pieces), stages)] if self._starts and stages > 1
              else partition(costs, stages)) + [len(pieces)]
    self.stages = [pieces[a:b] for a, b in zip(starts, starts[1:])]
    if self._layout is not None and not self._layout.planning:
      for k, stage in enumerate(self.stages[1:], start=1):
        placement.relocate([v for p in stage for v in p.variables], k)
    self.built = True

  def _check_starts(self, pieces: int, stages: int) -> list[int]:
    starts = list(self._starts)
    if len(starts) != stages - 1 or starts != sorted(set(starts)) or not (
        0 < starts[0] and starts[-1] < pieces):
      raise UserError(f"model_parallel.pipelined.stage_starts = {tuple(starts)}: need "
                      f"{stages - 1} increasing piece indices in [1, {pieces - 1}] for "
                      f"{stages} stages of {self.inner.name}'s {pieces} pieces.")
    return starts

  def _check_cover(self, pieces) -> None:
    used = [id(v) for p in pieces for v in p.variables]
    if len(used) != len(set(used)) or set(used) != {id(v) for v in self.inner.variables}:
      raise UserError(f"Pipeline: the pieces of {self.inner.name} do not use each of its "
                      f"variables exactly once (a cut inside a layer shared between pieces?); "
                      f"cut it where only the carried tensors cross (models/pieces.py).")

  def stage_variables(self) -> list[list]:
    """The variables of each stage, in stage order."""
    return [[v for p in stage for v in p.variables] for stage in self.stages]

  @tf.autograph.experimental.do_not_convert   # Plain Python over a static schedule.
  def call(self, *inputs, training=None):
    carry = inputs if len(inputs) > 1 else inputs[0]
    layout = layout_lib.current()
    if not layout_lib.in_replica(layout) or layout.parallelism != layout_lib.PIPELINE:
      return _run([p for stage in self.stages for p in stage], carry, training)
    d, _ = layout.coordinates()
    devices = [_stage_device(layout, d, k) for k in range(len(self.stages))]
    outputs = []
    for micro in _micro_batches(carry, layout.micro_batches):
      for k, stage in enumerate(self.stages):
        if k:
          micro = _boundary(micro, devices[k])   # Stage k-1's device to stage k's.
        micro = _staged(stage, micro, devices[k], training)
      outputs.append(micro)
    whole = tf.nest.map_structure(lambda *parts: tf.concat(parts, 0), *outputs)
    # Back to the replica's own device, where the step goes on.
    return _boundary(whole, devices[0]) if len(devices) > 1 else whole


def _forward(stage: list, training):
  """The stage's pieces as a function of its input. Under Experiment.jit_compile the
  step's pass spans the stages' devices, which no XLA cluster can (one device's
  program): each stage's forward pass is then a cluster of its own, on the stage's
  device (compilation.per_device_pieces), and its backward pass the gradient of that
  function, on the same device."""
  run = lambda carry: _run(stage, carry, training)  # noqa: E731
  if not compilation.compiles_per_device():
    return run
  return compilation.device_piece(run, "a pipeline stage's forward pass")


def _run(pieces: list, carry, training):
  """Pieces (callables carry, training -> carry: models/pieces.py) one after another."""
  for piece in pieces:
    carry = piece(carry, training)
  return carry


def _stage_device(layout: layout_lib.Layout, d: int, k: int) -> str:
  # Planning traces on device names that need not exist (the graph never runs).
  return f"/device:CPU:{k}" if layout.planning else layout.device(d, k)


@tf.autograph.experimental.do_not_convert
def _boundary(carry, device: str):
  """carry copied to device, its gradient copied back: each way one send of its
  floating tensors in the communication account."""
  @tf.custom_gradient
  def send(*flat):
    model_axis.record_transfer(flat)
    with tf.device(device):
      out = [tf.identity(t) for t in flat]

    def grad(*dys):
      back = [g if t.dtype.is_floating else None for t, g in zip(flat, dys)]
      model_axis.record_transfer([g for g in back if g is not None])
      return back

    return out, grad

  return tf.nest.pack_sequence_as(carry, list(send(*tf.nest.flatten(carry))))


def _micro_batches(carry, n: int) -> list:
  batch = tf.nest.flatten(carry)[0].shape[0]
  if n == 1 or batch is None or batch % n:
    return [carry]
  flat = [tf.split(t, n, axis=0) for t in tf.nest.flatten(carry)]
  return [tf.nest.pack_sequence_as(carry, [parts[i] for parts in flat]) for i in range(n)]


@tf.autograph.experimental.do_not_convert
def _staged(stage: list, carry, device: str, training):
  """The stage's pieces on device, forward and backward (a custom gradient whose
  backward pass runs there from the forward pass's own tape)."""
  flat = tf.nest.flatten(carry)
  structure = []   # The stage output's nest, known once traced.

  @tf.custom_gradient
  def run(*flat_in):
    with tf.device(device), tf.GradientTape() as tape:
      floats = [t for t in flat_in if t.dtype.is_floating]
      tape.watch(floats)
      out = _forward(stage, training)(tf.nest.pack_sequence_as(carry, list(flat_in)))
    structure.append(out)
    flat_out = tf.nest.flatten(out)

    def grad(*dys, variables=None):
      targets = [(t, g) for t, g in zip(flat_out, dys) if t.dtype.is_floating and g is not None]
      with tf.device(device):
        found = tape.gradient([t for t, _ in targets], floats + list(variables or []),
                              output_gradients=[g for _, g in targets])
      by_input = iter(found[:len(floats)])
      inputs = [next(by_input) if t.dtype.is_floating else None for t in flat_in]
      return inputs, found[len(floats):]

    return flat_out, grad

  flat_out = run(*flat)
  return tf.nest.pack_sequence_as(structure[0], list(flat_out))
