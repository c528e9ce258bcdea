"""Experiment.inject_slowdown's extra work: sized to remove the asked fraction, carried
as a debt from call to call (no timing thresholds: the loop's own bookkeeping)."""

import pytest

from replibench.harness import progress, slowdown


def test_the_work_owed_removes_the_asked_fraction_of_the_rate():
  call = 0.02
  for fraction in (0.05, 0.1, 0.3):
    owed = slowdown.owed_seconds(call, fraction)
    assert call / (call + owed) == pytest.approx(1 - fraction)
  assert slowdown.owed_seconds(call, 0.0) == 0.0
  with pytest.raises(ValueError):
    slowdown.owed_seconds(call, 1.0)


def test_the_work_runs_at_least_what_is_owed_and_carries_the_rest():
  work = slowdown._Work()
  ran = work.burn(0.002)
  assert ran >= 0.002 and work.debt_s <= 0   # over-ran by at most one matmul: a credit
  credit = -work.debt_s
  ran_next = work.burn(credit / 2)           # already paid: no work at all
  assert ran_next == 0.0 and work.debt_s == pytest.approx(-credit / 2)


def test_the_meter_sums_the_calls_after_the_first_in_windows():
  meter = progress.Meter(0, 100, global_batch_size=8, window_steps=4)
  meter.trained(2, 5.0, 9.0)                 # the first call: apart
  for _ in range(5):
    meter.trained(2, 0.5, 0.9)
  assert meter.first_call_s == 5.0
  assert meter.windows == [[4, 1.0, 1.8], [4, 1.0, 1.8]]   # the fifth call's window is open
  assert meter.examples_per_s() == pytest.approx(10 * 8 / 2.5)


def test_a_run_records_its_windows_and_runs_the_slowdown_work(tmp_path):
  """One tiny run: result.json carries [steps, wall s, CPU s] per window of
  log_every_steps steps, and the injected work ran inside the timed calls."""
  import os

  from replibench.config import load_experiment
  from replibench.harness.loop import run_experiment
  from tests import helpers
  config = "configs/resnet/fashion_mnist.gin"
  experiment = load_experiment([os.path.join(helpers.REPO, config)],
                               [*helpers.TINY[config], "Experiment.log_every_steps = 2",
                                "Experiment.inject_slowdown = 0.3"])
  result = run_experiment(experiment, str(tmp_path), max_steps=7)
  # The calls after the first, in whole windows (the last one may be open).
  assert [w[0] for w in result.windows] == [2] * ((result.final_step - 1) // 2)
  assert result.windows
  assert all(w[1] > 0 and w[2] > 0 for w in result.windows)
  assert slowdown._WORK.matrix is not None              # the work ran in this process


def test_the_real_slowdown_commit_keeps_resnets_numbers(monkeypatch):
  """benchmarks/tracking/tracking_power_real.py's change to ResNet's stem (extra projections
  times a run-time zero) applies to models/resnet.py and leaves outputs and gradients
  exactly as they were: the change costs time and nothing else."""
  import os
  import types

  import numpy as np
  import tensorflow as tf

  from tests import helpers
  script = helpers.benchmark_script("tracking/tracking_power_real")
  source = open(os.path.join(helpers.REPO, script.MODEL)).read()
  assert source.count(script.ANCHOR) == 1
  from models import resnet   # Registered with gin before the patched copy is made.
  patched = types.ModuleType("patched_resnet")
  # The patched copy must not register its functions with gin: a second `small_resnet`
  # would make the selector ambiguous for every later test in this process.
  import gin
  monkeypatch.setattr(gin, "configurable", lambda fn: fn)
  exec(compile(source.replace(script.ANCHOR, script.PATCH.replace("{k}", "3")),
               "patched_resnet", "exec"), patched.__dict__)
  monkeypatch.undo()
  models = []
  for module in (resnet, patched):
    tf.keras.utils.set_random_seed(0)
    models.append(module.small_resnet.__wrapped__(widths=(4, 8)) if hasattr(
        module.small_resnet, "__wrapped__") else module.small_resnet(widths=(4, 8)))
  assert any(layer.name == "tracking_extra_work" for layer in models[1].layers)
  x = tf.random.stateless_normal((2, 28, 28, 1), seed=(1, 2))
  grads = []
  for model in models:
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(model(x, training=True) ** 2)
    grads.append([g.numpy() for g in tape.gradient(loss, model.trainable_variables)])
  np.testing.assert_array_equal(models[0](x).numpy(), models[1](x).numpy())
  for a, b in zip(*grads):
    np.testing.assert_array_equal(a, b)
