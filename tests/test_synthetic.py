"""Synthetic data (replibench/data/synthetic.py) and the full-size configs that run on it.

The sources: shapes and dtypes, the global batch independent of its split, and a
pipeline that is a repeat of tensors made once (no per-step host work). The
configs: each full-size config validates at its real size (models built) and
runs a few steps at tiny scale, with finite losses, no evaluation, and the
throughput record in result.json and TensorBoard.
"""

import math
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow import make_ndarray

from replibench import engine
from replibench.config import load_experiment
from replibench.data.synthetic import SyntheticImages, SyntheticTransitions
from replibench.errors import UserError
from replibench.harness.loop import run_experiment
from replibench.rl.envs import EnvConfig
from replibench.workloads.base import SYNTHETIC_TIME_TO_TARGET
from tests import helpers

# What may sit in a synthetic pipeline's graph: constants and datasets that hand them
# on. No map, generator, py_func or random op runs per element.
ALLOWED_OPS = {"Const", "TensorDataset", "ConcatenateDataset", "RepeatDataset",
               "OptionsDataset", "_Retval"}


def _ctx(batch, replicas, pipeline=0, pipelines=1):
  return engine.InputContext(batch, pipeline, pipelines, replicas)


def _elements(ds, n):
  return [tf.nest.map_structure(lambda t: t.numpy(), e) for e in ds.take(n)]


def _dataset_ops(ds) -> set[str]:
  graph = tf.compat.v1.GraphDef()
  variant = ds._variant_tensor   # pylint: disable=protected-access
  graph.ParseFromString(tf.raw_ops.DatasetToGraphV2(input_dataset=variant).numpy())
  return {node.op for node in graph.node}


def test_images_have_imagenet_shapes_and_dtypes_and_repeat_per_replica():
  source = SyntheticImages(image_size=16, num_classes=1000)
  first, second, again = _elements(source.train(_ctx(3, replicas=2), seed=7), 3)
  for images, labels in (first, second):
    assert images.shape == (3, 16, 16, 3) and images.dtype == np.float32
    assert labels.shape == (3,) and labels.dtype == np.int32
    assert labels.min() >= 0 and labels.max() < 1000
    assert np.abs(images).max() <= 2.0 and 0.5 < images.std() < 1.0   # Truncated normal.
  assert not np.array_equal(first[0], second[0])   # Each replica its own batch ...
  np.testing.assert_array_equal(again[0], first[0])   # ... the same one every step.
  gan = SyntheticImages(image_size=8, pixels="tanh").train(_ctx(2, replicas=1), 0, updates=5)
  (images, labels), = _elements(gan, 1)
  assert images.shape == (5, 2, 8, 8, 3) and labels.shape == (5, 2)
  assert images.min() >= -1.0 and images.max() <= 1.0
  assert len({images[k].tobytes() for k in range(5)}) == 5   # Distinct real batches.


def test_the_pipeline_is_a_repeat_of_constant_tensors():
  for ds in (SyntheticImages(image_size=4).train(_ctx(2, replicas=2), seed=0),
             SyntheticTransitions().train(_ctx(2, replicas=1), 0, EnvConfig(pixels=True,
                                                                          image_size=8))):
    ops = _dataset_ops(ds)
    assert ops <= ALLOWED_OPS, f"per-element work in a synthetic pipeline: {ops - ALLOWED_OPS}"
    assert "RepeatDataset" in ops


def test_a_split_global_batch_is_the_unsplit_one():
  source = SyntheticImages(image_size=4, num_classes=10)
  (whole,) = _elements(source.train(_ctx(4, replicas=1), seed=3), 1)
  two = _elements(source.train(_ctx(2, replicas=2), seed=3), 2)   # One pipeline, 2 replicas.
  workers = [_elements(source.train(_ctx(2, 2, pipeline=p, pipelines=2), seed=3), 1)[0]
             for p in (0, 1)]   # One pipeline a worker.
  for parts in (two, workers):
    for k in (0, 1):
      np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), whole[k])


def test_transitions_are_stacked_pixel_frames():
  env = EnvConfig(pixels=True, image_size=84, frame_stack=3)
  (batch,) = _elements(SyntheticTransitions().train(_ctx(2, replicas=1), 0, env), 1)
  for key in ("observation", "next_observation"):
    assert batch[key].shape == (2, 84, 84, 9) and batch[key].dtype == np.uint8
  assert batch["action"].shape == (2, 1) and np.abs(batch["action"]).max() <= 1.0
  for key in ("reward", "discount", "weight"):
    assert batch[key].shape == (2,) and batch[key].dtype == np.float32
  assert batch["key"].dtype == np.int64


def test_bad_settings_and_evaluation_are_user_errors():
  with pytest.raises(UserError, match="pixels"):
    SyntheticImages(pixels="raw")
  with pytest.raises(UserError, match="image_size"):
    SyntheticImages(image_size=0)
  with pytest.raises(UserError, match="action_low"):
    SyntheticTransitions(action_low=1.0, action_high=-1.0)
  with pytest.raises(UserError, match="no evaluation split"):
    SyntheticImages().eval(_ctx(1, 1))
  config = os.path.join(helpers.REPO, "configs/sngan/fashion_mnist.gin")
  with pytest.raises(UserError, match="scorer = None"):
    load_experiment([config], ["ConditionalGAN.scorer = None"]).check_models()


def test_every_synthetic_config_has_a_tiny_override():
  assert set(helpers.synthetic_configs()) == set(helpers.TINY_SYNTHETIC)


@pytest.mark.parametrize("config", sorted(helpers.TINY_SYNTHETIC))
def test_full_size_config_builds_at_its_real_size(config):
  experiment = load_experiment([os.path.join(helpers.REPO, config)], [])
  experiment.check_models()   # Model and data agree on 224 / 128 / 84 pixels.
  workload = experiment.workload
  assert workload.synthetic_data
  shape = (workload.synthetic.observation_shape(workload.env_config)
           if hasattr(workload, "synthetic") else workload.data.image_shape)
  assert shape in ((224, 224, 3), (128, 128, 3), (84, 84, 9)), shape


@pytest.mark.parametrize("config", sorted(helpers.TINY_SYNTHETIC))
def test_synthetic_config_runs_and_reports_throughput_only(config, tmp_path):
  # D4PG's learner is the cheapest: it also runs on 2 replicas (one pipeline, two
  # repeated batches); the others on one.
  replicas = 2 if "d4pg" in config else 1
  files = [os.path.join(helpers.REPO, config),
           os.path.join(helpers.REPO, "configs", "topology", f"local{replicas}.gin")]
  result = run_experiment(load_experiment(files, helpers.TINY_SYNTHETIC[config]),
                          str(tmp_path))

  assert result.status == "budget_exhausted" and result.final_step == 4
  assert result.curve == [] and result.time_to_target_s is None   # Never evaluated.
  record = result.throughput
  assert record["time_to_target"] == SYNTHETIC_TIME_TO_TARGET
  assert record["devices"] == replicas == len(record["device_names"])
  assert record["examples_per_s"] == result.examples_per_s > 0
  # The record keeps 6 significant digits.
  assert record["examples_per_s_per_device"] == pytest.approx(result.examples_per_s / replicas,
                                                              rel=1e-5)
  assert record["step_s"] == pytest.approx(result.global_batch_size / result.examples_per_s,
                                           rel=1e-5)
  for key in ("train_flops_per_example", "achieved_flops_per_s",
              "fraction_of_calibrated_matmul", "peak_host_memory_bytes"):
    assert math.isfinite(record[key]) and record[key] > 0, (key, record)
  assert result == helpers.result(tmp_path)

  tags = helpers.event_tags(tmp_path)
  losses = [float(make_ndarray(t)) for _, t in tags["train/loss"]]
  assert losses and np.all(np.isfinite(losses))
  for tag in ("throughput/examples_per_s_per_device", "throughput/step_s",
              "throughput/peak_host_memory_bytes", "time_to_target"):
    assert tag in tags, f"missing TensorBoard tag {tag}; have {sorted(tags)}"
  assert not any(tag.startswith("eval/") for tag in tags)
  (_, text), = tags["time_to_target"]
  assert make_ndarray(text).item().decode().startswith("undefined: synthetic data")


@pytest.mark.gpu
def test_synthetic_resnet_runs_on_a_gpu_replica(tmp_path):
  config = "configs/resnet/imagenet_synthetic.gin"
  files = [os.path.join(helpers.REPO, config),
           os.path.join(helpers.REPO, "configs", "topology", "local1.gin")]
  bindings = helpers.TINY_SYNTHETIC[config] + ["topology.Local.device = 'gpu'",
                                               "Experiment.precision = 'mixed_bfloat16'"]
  record = run_experiment(load_experiment(files, bindings), str(tmp_path)).throughput
  assert "GPU" in record["device_names"][0] and record["examples_per_s"] > 0
  assert record["fraction_of_calibrated_matmul"] is None   # A GPU's peak: a device profile.
  assert max(record["peak_accelerator_memory_bytes"].values()) > 0


def test_a_run_too_short_to_time_says_why_and_the_smallest_max_steps():
  """The first training call traces and compiles and is never timed: a session of one
  call has no throughput, and its record says so and which --max_steps gives one."""
  from replibench.harness import throughput  # pylint: disable=import-outside-toplevel
  why = throughput.why_none(0, 2, 2, 100)
  assert "ran 1 training call(s)" in why and "--max_steps=4 (two calls)" in why
  assert "--max_steps=14" in throughput.why_none(10, 12, 2, 100)   # resumed at step 10
  assert "budget (3 steps) holds fewer than two calls" in throughput.why_none(0, 3, 2, 3)
  none = throughput.record(None, 8, 1, 1, ["/CPU:0"], 1e6, None, why)
  assert none["examples_per_s"] is None and none["no_throughput_because"] == why
  assert throughput.record(100.0, 8, 1, 1, ["/CPU:0"], 1e6, None, why)[
      "no_throughput_because"] is None
