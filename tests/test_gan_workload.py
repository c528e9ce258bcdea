"""The SN-GAN workload: replication does not change the math; the harness runs it."""

import dataclasses
import functools
import math
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from tensorflow import make_ndarray

from models.sngan import sngan_discriminator, sngan_generator
from replibench import engine
from replibench.engine import regimes
from replibench.config import load_experiment
from replibench.data.sources import FashionMNIST
from replibench.errors import UserError
from replibench.harness.loop import run_experiment
from replibench.workloads.base import TrainSpec
from replibench.workloads.gan import ConditionalGAN
from tests import helpers, tiny_runs

GLOBAL_BATCH = 8
N_DIS = 2
STEPS = 2
CONFIG = "configs/sngan/fashion_mnist.gin"
# The generator's conv biases feed batch norms, so their global gradient is 0 and
# what remains is float rounding, which differs with the replica count. Adam's
# default epsilon would turn that noise into full +-lr steps; a larger epsilon
# keeps such updates negligible while real gradients still move the weights.
EPSILON = 1e-3
BN_CANCELLED = re.compile(r"generator_block\d+_c(1|2|_sc)_bias")


class _NoScorer:
  """Stands in for the classifier when only training is under test."""

  def prepare(self, data, num_samples):
    del data, num_samples
    return {}


def _workload():
  return ConditionalGAN(
      # One block each (G 14 -> 28, D 28 -> 14): every kind of layer, little tracing.
      generator=functools.partial(sngan_generator, ch=4, widths=(1, 1), bottom_width=14,
                                  norm_layer=engine.cross_replica_batch_norm),
      discriminator=functools.partial(sngan_discriminator, ch=4, widths=(1,),
                                      downsample=(True,)),
      data=FashionMNIST(augment=False, pixels="tanh"), scorer=_NoScorer(), n_dis=N_DIS,
      z_dim=16, eval_num_samples=10, epsilon=EPSILON)


def _train(num_replicas):
  """STEPS GAN steps in one compiled call; returns (replicator, workload, outputs)."""
  replicator = engine.Replicator(engine.Local(num_replicas=num_replicas, device="cpu"))
  workload = _workload()
  spec = TrainSpec(global_batch_size=GLOBAL_BATCH, num_replicas=num_replicas, seed=3,
                   steps_per_epoch=60000 / GLOBAL_BATCH, total_steps=STEPS,
                   regime=replicator.regime)
  with replicator.scope():
    workload.build(spec)
  train = replicator.compile(workload.step_fn, helpers.without_autotuning(workload.input_fn),
                             GLOBAL_BATCH, steps_per_call=STEPS)
  return replicator, workload, train()


def _all_variables(workload):
  return (workload.generator.variables + workload.discriminator.variables
          + workload.g_optimizer.variables + workload.d_optimizer.variables)


def test_replicas_match_one_replica_and_each_other():
  reference = None
  for n in (1, 2):   # 4 replicas pass too but double the tracing time.
    replicator, workload, outputs = _train(n)
    assert np.isfinite(outputs["d_loss"]) and np.isfinite(outputs["g_loss"])
    variables = _all_variables(workload)
    paths = " ".join(v.path for v in variables)
    for kind in ("sn_u", "moving_mean", "moving_variance", "g_adam", "d_adam", "momentum",
                 "velocity"):
      assert kind in paths, f"no {kind} variable among {paths}"
    assert int(workload.g_optimizer.iterations.numpy()) == STEPS
    assert int(workload.d_optimizer.iterations.numpy()) == STEPS * N_DIS
    finals = []
    for v in variables:
      copies = [c.numpy() for c in
                replicator.strategy.experimental_local_results(v.value)]
      for copy in copies[1:]:
        np.testing.assert_array_equal(copies[0], copy,
                                      err_msg=f"{v.path} differs across {n} replicas")
      finals.append(copies[0])
    if reference is None:
      reference = (finals, outputs)
      continue
    for v, want, got in zip(variables, reference[0], finals):
      # The Adam slots of BN-cancelled biases hold rounding noise (see EPSILON).
      noise = BN_CANCELLED.search(v.path.replace("/", "_")) and "adam" in v.path
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 if noise else 1e-5,
                                 err_msg=f"{v.path}: {n} replicas != 1 replica")
    for key in ("d_loss", "g_loss"):
      np.testing.assert_allclose(outputs[key], reference[1][key], rtol=1e-4)


def test_input_regroups_the_same_real_batches_for_any_replica_count():
  workload = _workload()
  workload.spec = TrainSpec(GLOBAL_BATCH, 1, 3, 60000 / GLOBAL_BATCH, STEPS, regimes.Sync())

  def first_step(num_replicas, start_step=0):
    ctx = engine.InputContext(GLOBAL_BATCH // num_replicas, 0, 1, num_replicas, start_step)
    elements = list(workload.input_fn(ctx).take(num_replicas))   # One per replica, in turn.
    for images, labels in elements:
      assert images.shape == (N_DIS, GLOBAL_BATCH // num_replicas, 28, 28, 1)
      assert labels.shape == (N_DIS, GLOBAL_BATCH // num_replicas)
    # Global batch of update k: the replicas' slices [k] side by side.
    return np.concatenate([images.numpy() for images, _ in elements], axis=1)

  one = first_step(1)
  assert one.min() >= -1.0 and one.max() <= 1.0 and one.min() < -0.99
  np.testing.assert_array_equal(first_step(2), one)
  np.testing.assert_array_equal(first_step(4), one)
  assert not np.array_equal(one[0], one[1])   # Each update has its own real batch.
  # A resumed pipeline continues with the next step's batches.
  two_steps = workload.input_fn(engine.InputContext(GLOBAL_BATCH, 0, 1, 1)).take(2)
  np.testing.assert_array_equal(first_step(2, start_step=1),
                                list(two_steps)[1][0].numpy())
  # A worker of 2 (keep), each with 2 of the 4 replicas: their elements of the whole.
  whole = engine.InputContext(GLOBAL_BATCH // 4, 0, 1, 4, 1)
  every = list(workload.input_fn(whole).take(8))
  for worker in (0, 1):
    kept = list(workload.input_fn(dataclasses.replace(whole, keep=(worker, 2))).take(4))
    want = [every[s * 4 + worker * 2 + r] for s in (0, 1) for r in (0, 1)]
    for (got_x, got_y), (want_x, want_y) in zip(kept, want, strict=True):
      np.testing.assert_array_equal(got_x.numpy(), want_x.numpy())
      np.testing.assert_array_equal(got_y.numpy(), want_y.numpy())


def test_tiny_config_reports_scores_real_references_and_a_sample_grid(tmp_path_factory):
  # The tiny config on 1 replica (its target, 0, never met: 2 evaluations), the run
  # test_configs_end_to_end checks too; its scorer trained into a fresh cache.
  result, tmp_path = tiny_runs.run(tmp_path_factory, CONFIG, "local1.gin")
  assert result.target == 0.0
  assert result.target_metric == "eval/fid" and not result.higher_is_better
  assert result.final_step == 4 and len(result.curve) == 2
  metrics = result.final_metrics
  assert metrics["eval/num_samples"] == 100
  for key in ("fid", "classifier_score", "kid"):
    assert math.isfinite(metrics[f"eval/{key}"]) and math.isfinite(metrics[f"eval/real_{key}"])
  assert metrics["eval/fid"] > metrics["eval/real_fid"] >= 0   # 4 steps are far from real.
  assert "samples/per_class" not in metrics                     # Images stay out of JSON.

  tags = helpers.event_tags(tmp_path)
  for tag in ("train/d_loss", "train/g_loss", "eval/real_fid", "samples/per_class"):
    assert tag in tags, f"missing {tag}; have {sorted(tags)}"
  # tf.summary.image stores [width, height, encoded PNG]: 10 rows of 2 28x28 samples.
  width, height, _ = make_ndarray(tags["samples/per_class"][-1][1])
  assert (int(width), int(height)) == (2 * 29 + 1, 10 * 29 + 1)


def test_imagenet_config_fails_cleanly_without_data(tmp_path, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "no_data"))
  experiment = load_experiment(
      [os.path.join(helpers.REPO, "configs/sngan/imagenet128.gin"),
       os.path.join(helpers.REPO, "configs/topology/local1.gin")],
      ["sngan_generator.ch = 1", "sngan_discriminator.ch = 1"])
  with pytest.raises(UserError, match="imagenet2012.*not prepared"):
    run_experiment(experiment, str(tmp_path / "run"))
  assert not (tmp_path / "run" / "result.json").exists()


def test_bad_settings_are_user_errors():
  with pytest.raises(UserError, match="n_dis"):
    ConditionalGAN(generator=sngan_generator, discriminator=sngan_discriminator,
                   data=FashionMNIST(), scorer=_NoScorer(), n_dis=0)
  mismatched = ConditionalGAN(
      generator=functools.partial(sngan_generator, ch=2, out_channels=3),
      discriminator=sngan_discriminator, data=FashionMNIST(), scorer=_NoScorer())
  with pytest.raises(UserError, match="generator makes"):
    mismatched.describe(None)
  with pytest.raises(UserError, match="pixels"):
    FashionMNIST(pixels="0-255")


def test_noise_is_each_replicas_slice_of_one_global_draw():
  workload = _workload()
  workload.spec = TrainSpec(GLOBAL_BATCH, 2, 3, 1.0, 1, regimes.Sync())
  workload._noise_seed = tf.constant([3, 1], tf.int64)  # pylint: disable=protected-access
  noise = lambda update, b: workload._noise(  # pylint: disable=protected-access
      tf.constant(5, tf.int64), update, b)
  z, labels = noise(1, GLOBAL_BATCH)   # No strategy: one replica holds the whole batch.
  replicator = engine.Replicator(engine.Local(num_replicas=2, device="cpu"))
  halves = replicator.reduce(replicator.run(lambda: noise(1, GLOBAL_BATCH // 2)), "concat")
  np.testing.assert_array_equal(halves[0], z)
  np.testing.assert_array_equal(halves[1], labels)
  assert not np.allclose(noise(2, GLOBAL_BATCH)[0], z)   # Each update draws afresh.
