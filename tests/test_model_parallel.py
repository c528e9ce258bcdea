"""Model parallelism must not change the math: D x M devices at global batch B match one
device at batch B; every data-parallel copy stays identical; each device holds only its
share (read from where the variables are); a checkpoint holds whole tensors.

Tolerance: rtol 1e-5, atol 1e-6 after 3 steps (as tests/test_engine_replication.py).
Both kinds change only the order of float32 sums: a split convolution adds its M
partial sums in an all-reduce instead of inside one kernel, and the data axis adds D
gradients; each reordering moves a result by a few float32 ulps (~1e-7 relative), and
3 momentum steps compound that to below 1e-6 here. A wrong split or a reduction over
the wrong devices moves the weights by the size of an update (~1e-2).
"""

import dataclasses
import functools

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

from models.resnet import resnet_pieces, small_resnet
from replibench import engine, internals
from replibench.engine import model_parallel
from replibench.engine.regimes import ShardedSync, Sync
from replibench.errors import UserError
from replibench.workloads.classification import ImageClassification
from tests import helpers

GLOBAL_BATCH, STEPS = 8, 3


class _Images:
  """A data source of fixed random 8x8x3 images: global batch s is rows [sB, (s+1)B)."""

  num_classes, image_shape = 10, (8, 8, 3)

  def train_examples(self) -> int:
    return GLOBAL_BATCH * STEPS

  def train(self, ctx, seed):
    del seed
    x, y = helpers.random_images(GLOBAL_BATCH * STEPS)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(
        ctx.per_replica_batch_size, drop_remainder=True).with_options(helpers.no_autotune())


def _batch_norm_resnet(num_classes):
  """Basic blocks whose conv pairs a tensor-parallel factory splits, cross-replica BN."""
  return small_resnet(num_classes=num_classes, widths=(4, 8), input_shape=(8, 8, 3),
                      norm_layer=engine.cross_replica_batch_norm, zero_init_residual=False)


def _plain_resnet(num_classes):
  """No batch statistics: a pipeline over micro-batches computes what one device does."""
  return small_resnet(num_classes=num_classes, widths=(4, 8), input_shape=(8, 8, 3),
                      norm_layer=lambda name=None, **_: keras.layers.Identity(name=name),
                      zero_init_residual=False)


def _train(topology, model_fn):
  """ImageClassification's own step, STEPS steps in one call: (replicator, workload)."""
  replicator = engine.make_replicator(topology, Sync())
  workload = ImageClassification(model=model_fn, data=_Images(), base_lr_per_256=3.2,
                                 warmup_epochs=0.0, weight_decay=5e-4)
  spec = engine.TrainSpec(GLOBAL_BATCH, replicator.num_replicas, seed=0, steps_per_epoch=STEPS,
                          total_steps=STEPS, regime=replicator.regime, steps_per_call=STEPS)
  with replicator.scope():
    workload.build(spec)
  train = replicator.compile(workload.step_fn, workload.input_fn, spec)
  train.trace()
  assert np.isfinite(train()["loss"])
  return replicator, workload, train


@pytest.fixture(scope="module")
def tensor_parallel():
  gin.clear_config()
  gin.bind_parameter("basic_block.conv_layer", model_parallel.tensor_parallel_conv)
  try:
    reference = _train(engine.Local(num_replicas=1, device="cpu"), _batch_norm_resnet)
    split = _train(model_parallel.Mesh(data=2, model=2, device="cpu"), _batch_norm_resnet)
  finally:
    gin.clear_config()
  return reference, split


@pytest.fixture(scope="module")
def pipeline():
  pipelined = functools.partial(model_parallel.pipelined, builder=_plain_resnet,
                                split=resnet_pieces)
  reference = _train(engine.Local(num_replicas=1, device="cpu"), _plain_resnet)
  split = _train(model_parallel.Mesh(data=2, model=2, parallelism="pipeline",
                                     micro_batches=2, device="cpu"), pipelined)
  return reference, split


def _state(workload):
  return workload.model.variables + workload.optimizer.variables


def _components(replicator, variable) -> list:
  return list(replicator.strategy.experimental_local_results(variable.value))


def _assert_matches_one_device(reference, split):
  (_, ref_workload, _), (_, workload, _) = reference, split
  ref_state, state = _state(ref_workload), _state(workload)
  assert [v.path.split("/")[-1] for v in state] == [v.path.split("/")[-1] for v in ref_state]
  moved = 0
  for want, got in zip(ref_state, state):
    # Read from the host, a split variable is the whole tensor (its parts concatenated).
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6,
                               err_msg=f"{got.path}: the mesh != one device")
    moved += "kernel" in want.path
  assert moved >= 5
  # Training moved the weights (the test compares updates, not initial values).
  keras.utils.set_random_seed(0)
  fresh = ref_workload.model_fn(num_classes=10)
  assert not np.allclose(fresh.get_layer("logits").kernel.numpy(),
                         ref_workload.model.get_layer("logits").kernel.numpy())


def test_tensor_parallel_matches_one_device(tensor_parallel):
  _assert_matches_one_device(*tensor_parallel)


def test_pipeline_over_micro_batches_matches_one_device(pipeline):
  _assert_matches_one_device(*pipeline)


def test_tensor_parallel_copies_are_identical_and_each_device_holds_its_share(tensor_parallel):
  (_, reference, _), (replicator, workload, _) = tensor_parallel
  devices = replicator.layout.devices
  assert type(replicator.regime) is ShardedSync   # noqa: E721  (the topology's, from Sync)
  trainable = {id(v) for v in workload.model.trainable_variables}
  split_bytes = 0
  for v in _state(workload):
    copies = _components(replicator, v)
    assert [c.device for c in copies] == [engine_device(d) for d in devices], v.path
    for m in range(2):   # Slot m of model replica 0 and of model replica 1.
      np.testing.assert_array_equal(copies[m].numpy(), copies[2 + m].numpy(),
                                    err_msg=f"{v.path}: data-parallel copies differ")
    whole = tuple(v.numpy().shape)
    if tuple(copies[0].shape) != whole:   # Split: each device holds half.
      assert sum(c.shape.num_elements() for c in copies[:2]) == np.prod(whole), v.path
      split_bytes += 4 * np.prod(whole) * (id(v) in trainable)
    else:                                  # Whole: identical on the model axis too.
      np.testing.assert_array_equal(copies[0].numpy(), copies[1].numpy(), err_msg=v.path)
  names = {v.path.split("/")[0] for v in workload.model.variables if _split(replicator, v)}
  assert names == {"stage1_block1_conv1", "stage1_block1_conv2", "stage1_block1_norm1",
                   "stage2_block1_conv1", "stage2_block1_conv2", "stage2_block1_norm1"}
  full = sum(4 * v.shape.num_elements() for v in reference.model.trainable_variables)
  held = replicator.recorder.held_bytes(replicator.strategy)
  assert len(held) == 4
  for device, kinds in held.items():   # Whole layers, plus half of each split one.
    assert kinds["parameters"] == full - split_bytes // 2, device
    assert kinds["optimizer"] == kinds["parameters"], device   # SGD momentum: one slot.


def test_pipeline_stages_live_on_their_devices(pipeline):
  (_, reference, _), (replicator, workload, _) = pipeline
  stages = workload.model.stage_variables()
  assert len(stages) == 2 and all(stages)
  devices = replicator.layout.devices   # Replica d's stage k: device 2d + k.
  for k, stage in enumerate(stages):
    for v in stage:
      placed = [c.device for c in _components(replicator, v)]
      assert placed == [engine_device(devices[k]), engine_device(devices[2 + k])], v.path
  held = replicator.recorder.held_bytes(replicator.strategy)
  stage_bytes = [sum(4 * v.shape.num_elements() for v in stage if v.trainable)
                 for stage in stages]
  for d in range(2):
    for k in range(2):
      assert held[engine_device(devices[2 * d + k])]["parameters"] == stage_bytes[k]
  full = sum(4 * v.shape.num_elements() for v in reference.model.trainable_variables)
  assert sum(stage_bytes) == full and max(stage_bytes) < full


def test_a_tensor_parallel_checkpoint_holds_whole_tensors(tensor_parallel, tmp_path):
  (_, reference, _), (_, workload, _) = tensor_parallel
  path = tf.train.Checkpoint(model=workload.model).save(str(tmp_path / "ckpt"))
  gin.bind_parameter("basic_block.conv_layer", model_parallel.tensor_parallel_conv)
  keras.utils.set_random_seed(7)
  whole = _batch_norm_resnet(10)   # Not on a mesh: every layer whole.
  tf.train.Checkpoint(model=whole).restore(path).assert_existing_objects_matched()
  for want, got in zip(workload.model.variables, whole.variables):
    np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=got.path)


def test_a_tensor_parallel_model_samples_whole_from_the_host(tensor_parallel):
  """Outside a replicated step (a GAN's sampling) the split model computes the whole
  model's output, as one device would."""
  (_, reference, _), (_, workload, _) = tensor_parallel
  x, _ = helpers.random_images(4)
  sample = tf.function(lambda images: workload.model(images, training=False))   # As a GAN's.
  np.testing.assert_allclose(sample(x).numpy(), reference.model(x, training=False).numpy(),
                             rtol=1e-5, atol=1e-5)


def test_a_device_over_its_memory_is_refused_before_training(tensor_parallel):
  _, (replicator, _, train) = tensor_parallel
  mesh, ledger = replicator.mesh, train._ledger  # pylint: disable=protected-access
  replicator.mesh = dataclasses.replace(mesh, device_memory_bytes=1e4)
  try:
    with pytest.raises(UserError, match=r"needs \S+ MB \(parameters .*more than its 0.01 MB"):
      train.trace()   # What the harness calls in init, before any step.
  finally:
    replicator.mesh, train._ledger = mesh, ledger  # pylint: disable=protected-access


def _split(replicator, variable) -> bool:
  return tuple(_components(replicator, variable)[0].shape) != tuple(variable.numpy().shape)


def engine_device(name: str) -> str:
  return internals.canonical_device(name)
