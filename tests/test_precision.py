"""Mixed precision (Experiment.precision): policies, dynamic loss scaling, replication.

The engine-level tests train small Keras models through the engine's Sync regime
with the workloads' precision helpers (replibench/workloads/precision.py); the
workload tests run each workload's own step in mixed precision.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from replibench import engine
from replibench.config import load_experiment
from replibench.config.plan import format_plan, make_plan
from replibench.errors import UserError
from replibench.workloads import precision
from tests import helpers
from tests.test_engine_replication import _convnet, _mlp

GLOBAL_BATCH = 16
STEPS = 3
RESNET = os.path.join(helpers.REPO, "configs/resnet/fashion_mnist.gin")

# A variable's difference, 2 replicas against 1 (L2), as a fraction of the change
# training made to it (L2): see test_mixed_replicas_match_one_replica.
UPDATE_TOLERANCE = {"mixed_bfloat16": 0.2, "mixed_float16": 0.05}


class _Run:
  """A model and optimizer built under a precision on n logical CPU replicas."""

  def __init__(self, build_model, num_replicas, policy, device="cpu", **loss_scale):
    self.replicator = engine.Replicator(engine.Local(num_replicas=num_replicas, device=device))
    with self.replicator.scope():
      keras.utils.set_random_seed(1)
      with precision.policy_scope(policy):
        self.model = build_model()
      optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
      self.optimizer = (keras.optimizers.LossScaleOptimizer(optimizer, **loss_scale)
                        if loss_scale else precision.wrap_optimizer(optimizer, policy))
      self.replicator.regime.build_optimizer(self.optimizer, self.model.trainable_variables)

  def train(self, x, y, steps):
    """`steps` steps on x [steps * 16, 8, 8, 3], y [steps * 16]; the mean loss."""
    model, optimizer, regime = self.model, self.optimizer, self.replicator.regime

    def input_fn(ctx):
      ds = tf.data.Dataset.from_tensor_slices((x, y))
      return ds.batch(ctx.per_replica_batch_size, drop_remainder=True).with_options(
          helpers.no_autotune())   # No autotuning thread for a freed iterator to wait on.

    def step_fn(batch):
      images, labels = batch
      with tf.GradientTape() as tape:
        logits = precision.to_float32(model(images, training=True))
        per_example = keras.losses.sparse_categorical_crossentropy(labels, logits,
                                                                   from_logits=True)
        loss = engine.average_loss(per_example, GLOBAL_BATCH)
        scaled = precision.scaled(optimizer, loss)
      regime.apply_gradients(optimizer, tape.gradient(scaled, model.trainable_variables),
                             model.trainable_variables)
      return {"loss": loss * engine.num_replicas()}

    return self.replicator.compile(step_fn, input_fn, GLOBAL_BATCH, steps_per_call=steps)()

  def copies(self, variable) -> list:
    """Every replica's value of variable, as numpy."""
    return [c.numpy() for c in
            self.replicator.strategy.experimental_local_results(variable.value)]

  def state(self) -> list:
    return self.model.variables + self.optimizer.variables


def test_policy_scope_builds_mixed_layers_and_restores_the_previous_policy():
  assert keras.config.dtype_policy().name == "float32"
  with precision.policy_scope("mixed_bfloat16"):
    model = _convnet()
  assert keras.config.dtype_policy().name == "float32"   # nothing leaks to later builds
  assert _mlp().layers[-1].compute_dtype == "float32"
  assert {layer.compute_dtype for layer in model.layers} == {"bfloat16"}
  assert {v.dtype for v in model.variables} == {"float32"}
  with pytest.raises(ValueError), precision.policy_scope("float8"):
    pass
  assert keras.config.dtype_policy().name == "float32"


@pytest.mark.parametrize("overflow", ["scale", "one_replica"])
def test_float16_overflow_skips_the_step_on_every_replica_and_halves_the_scale(overflow):
  """A non-finite all-reduced gradient: no replica updates, every replica halves S.

  'scale': an initial scale of 2^40 overflows float16 on every replica.
  'one_replica': replica 0's batch holds 6e4 * 10 (inf in float16), so only its
  own gradients are non-finite; the all-reduced sum is non-finite on both.
  """
  x, y = helpers.random_images(GLOBAL_BATCH)
  initial = 2.0**40 if overflow == "scale" else 2.0**10
  if overflow == "one_replica":
    x[0, 0, 0, 0] = 6e5
  run = _Run(_mlp, 2, "mixed_float16", initial_scale=initial)
  before = [run.copies(v) for v in run.state()]
  run.train(x, y, steps=1)
  assert int(run.optimizer.iterations.numpy()) == 0          # the step was skipped ...
  for v, old in zip(run.state(), before):
    if "dynamic_scale" in v.path or "step_counter" in v.path:
      continue
    for copy, old_copy in zip(run.copies(v), old):
      np.testing.assert_array_equal(copy, old_copy, err_msg=f"{v.path} changed")
  # ... and the scale halved on every replica.
  assert run.copies(run.optimizer.dynamic_scale) == [initial / 2, initial / 2]

  # The next, finite step (replica 0's outlier gone, the scale 2^9) updates again.
  x, y = helpers.random_images(GLOBAL_BATCH)
  run.optimizer.dynamic_scale.assign(2.0**9)
  assert np.isfinite(run.train(x, y, steps=1)["loss"])
  assert int(run.optimizer.iterations.numpy()) == 1
  kernel = run.copies(run.model.layers[-1].kernel)
  np.testing.assert_array_equal(kernel[0], kernel[1])
  assert not np.array_equal(kernel[0], before[len(run.model.variables) - 2][0])


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_replicas_match_one_replica(policy):
  """2 replicas at global batch 16 against 1 at 16 (cross-replica batch norm), STEPS steps.

  Every replica's copy of every variable (float32) must be bit-identical. Against
  one replica, each variable's (and optimizer slot's) difference, in L2 norm, must
  stay within UPDATE_TOLERANCE of how far training moved it: 20% for bfloat16, 5%
  for float16. In float32 the same comparison is exact here (and held to 1e-5 in
  tests/test_engine_replication.py).

  Why those figures: both runs do the same math, but rounded to 16 bits at other
  places (a weight gradient rounded once per replica over 8 examples against once
  over 16; batch-norm moments summed in float32 in another order, whose last-bit
  differences flip 16-bit roundings downstream). Each rounding is within the unit
  roundoff u (2^-9 = 0.2% for bfloat16's 8-bit significand, 2^-12 = 0.024% for
  float16's 11 bits), but at initialisation (loss ~ ln 10) the gradients are
  small sums of larger terms (batch norm's backward subtracts the mean gradient),
  so relative to the update the error is u times that cancellation. Measured on
  this model: one bfloat16 replica differs from one float32 replica by up to 13% of
  the update (first batch norm's gamma), and 2 or 4 bfloat16 replicas differ from
  one by up to 10%; float16 differs from float32 by 0.24%, and 2 (4) float16
  replicas from one by 0.23% (1.9%: CPU float16 kernels round partial sums). The
  tolerances are about twice the worst replication difference seen.
  """
  x, y = helpers.random_images(GLOBAL_BATCH * STEPS)
  one, two = (_Run(_convnet, n, policy) for n in (1, 2))
  initial = [v.numpy() for v in one.state()]
  losses = [run.train(x, y, STEPS)["loss"] for run in (one, two)]
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-3)
  for start, want, got in zip(initial, one.state(), two.state()):
    assert got.dtype in ("float32", "int64"), got.path
    copies = two.copies(got)
    np.testing.assert_array_equal(copies[0], copies[1], err_msg=f"{got.path} differs")
    if got.dtype != "float32" or "dynamic_scale" in got.path:
      continue
    change = np.linalg.norm(want.numpy() - start)
    error = np.linalg.norm(copies[0] - want.numpy())
    assert error <= UPDATE_TOLERANCE[policy] * change + 1e-7, (
        f"{got.path}: 2 replicas differ from 1 by {error:.3g} (L2), training moved it by "
        f"{change:.3g}")


def test_precision_is_validated_naming_the_binding():
  with pytest.raises(UserError, match=r"Experiment.precision = 'float8'"):
    load_experiment([RESNET], ["Experiment.precision = 'float8'"])
  with pytest.raises(UserError, match=r"Experiment.precision = 'mixed_float16' with "
                                      r"Experiment.regime = local_sgd"):
    load_experiment([RESNET], ["Experiment.precision = 'mixed_float16'",
                               "Experiment.regime = @regimes.LocalSGD()"])
  experiment = load_experiment([RESNET], ["Experiment.precision = 'mixed_bfloat16'",
                                          "Experiment.regime = @regimes.LocalSGD()"])
  assert experiment.train_spec().precision == "mixed_bfloat16"


def test_plan_states_the_precision_and_float32_gradient_bytes():
  plans = {p: make_plan(load_experiment([RESNET], [f"Experiment.precision = '{p}'"]))
           for p in ("float32", "mixed_float16")}
  half = plans["mixed_float16"]
  assert half["precision"]["compute_dtype"] == "float16"
  assert half["precision"]["variable_dtype"] == "float32"
  assert half["precision"]["gradient_allreduce_dtype"] == "float32"
  assert half["precision"]["loss_scaling"].startswith("dynamic")
  assert plans["float32"]["precision"]["loss_scaling"] == "none"
  # Gradients are all-reduced in float32 under any precision: the same bytes.
  for key in ("allreduce_bytes_per_step", "bytes_communicated_per_step"):
    assert half[key] == plans["float32"][key] == 4 * half["parameters"]
  assert half["communication"] == plans["float32"]["communication"]
  assert "gradients all-reduced in float32" in format_plan(half)


@pytest.mark.slow
def test_resnet_runs_end_to_end_in_mixed_bfloat16(tmp_path):
  from tensorflow import make_ndarray  # pylint: disable=import-outside-toplevel
  from replibench.harness.loop import run_experiment  # pylint: disable=import-outside-toplevel
  config = "configs/resnet/fashion_mnist.gin"
  files = [os.path.join(helpers.REPO, config),
           os.path.join(helpers.REPO, "configs", "topology", "local2.gin")]
  # Two blocks and 200 evaluation images (test_model_parallel_runs' short ResNet): the
  # run checks the harness end to end in bfloat16, not the tiny config's depth.
  overrides = helpers.TINY[config] + ["Experiment.precision = 'mixed_bfloat16'",
                                      "small_resnet.widths = (4, 8)",
                                      "small_resnet.blocks_per_stage = (1, 1)",
                                      "FashionMNIST.num_eval_examples = 200",
                                      "ImageClassification.eval_batch_size = 200"]
  result = run_experiment(load_experiment(files, overrides), str(tmp_path))
  assert result.status in ("reached", "budget_exhausted") and result.num_replicas == 2
  assert len(result.curve) >= 2 and all(np.isfinite(m) for _, _, m in result.curve)
  assert "mixed_bfloat16" in result.operative_config
  tags = helpers.event_tags(tmp_path)
  for tag in ("train/loss", result.target_metric):
    assert tag in tags, f"missing TensorBoard tag {tag}; have {sorted(tags)}"
  losses = [float(make_ndarray(t)) for _, t in tags["train/loss"]]
  assert losses and np.all(np.isfinite(losses))
  assert keras.config.dtype_policy().name == "float32"


@pytest.mark.gpu
@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_trains_on_a_gpu(policy):
  """The tensor-core path: one GPU replica computes in 16 bits and trains in float32."""
  x, y = helpers.random_images(GLOBAL_BATCH * STEPS)
  run = _Run(_convnet, 1, policy, device="gpu")
  before = run.model.layers[-1].kernel.numpy()
  assert np.isfinite(run.train(x, y, STEPS)["loss"])
  assert int(run.optimizer.iterations.numpy()) == STEPS   # no step skipped at 2^15
  assert not np.array_equal(before, run.model.layers[-1].kernel.numpy())
  assert {v.dtype for v in run.model.variables} == {"float32"}


def test_sngan_step_in_float16_scales_both_losses_and_keeps_spectral_norm_float32():
  """One replica (tests above cover skipping on several): each of the N_DIS
  discriminator updates and the generator update per step is applied or skipped
  with its optimizer's scale halved (this tiny GAN overflows 2^15 at first)."""
  from tests import test_gan_workload  # pylint: disable=import-outside-toplevel
  from replibench.workloads.base import TrainSpec  # pylint: disable=import-outside-toplevel
  replicator = engine.Replicator(engine.Local(num_replicas=1, device="cpu"))
  workload = test_gan_workload._workload()   # pylint: disable=protected-access
  spec = TrainSpec(8, 1, 3, 100.0, 4, replicator.regime, "mixed_float16")
  with replicator.scope():
    workload.build_learner(spec)
  outputs = replicator.compile(workload.step_fn, workload.input_fn, 8, steps_per_call=4)()
  assert np.isfinite(outputs["d_loss"]) and np.isfinite(outputs["g_loss"])
  for optimizer, updates in ((workload.d_optimizer, 4 * test_gan_workload.N_DIS),
                             (workload.g_optimizer, 4)):
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    skipped = np.log2(2.0**15 / optimizer.dynamic_scale.numpy())
    assert int(optimizer.iterations.numpy()) + skipped == updates, optimizer.name
  assert int(workload.d_optimizer.iterations.numpy()) > 0   # some updates got through
  every_layer = workload.discriminator._flatten_layers()   # pylint: disable=protected-access
  layers = [layer for layer in every_layer if hasattr(layer, "sn_u")]
  assert layers and {layer.compute_dtype for layer in layers} == {"float16"}
  assert {layer.kernel.dtype for layer in layers} | {layer.sn_u.dtype for layer in layers} == {
      "float32"}
  assert all(layer.sigma().dtype == "float32" for layer in layers)


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
def test_d4pg_step_in_mixed_precision_projects_in_float32(policy):
  from models import d4pg  # pylint: disable=import-outside-toplevel
  from tests import test_d4pg_workload  # pylint: disable=import-outside-toplevel
  from replibench.workloads.base import TrainSpec  # pylint: disable=import-outside-toplevel
  replicator = engine.Replicator(engine.Local(num_replicas=1, device="cpu"))
  work = test_d4pg_workload.tiny_workload()
  with replicator.scope():
    work.build_learner(TrainSpec(8, 1, 0, 10.0, 100, replicator.regime, policy))
  nets = work.networks
  assert nets.critic.layers[-1].compute_dtype == policy.split("_")[1]
  batch = test_d4pg_workload.fixed_batch(nets)
  assert d4pg.critic_loss(nets, batch).dtype == tf.float32     # softmax, projection, CE
  assert d4pg.policy_loss(nets, batch).dtype == tf.float32
  before = [v.numpy() for v in nets.critic.trainable_variables]
  step = tf.function(lambda b: replicator.reduce(replicator.run(work.step_fn, b)))
  outputs = step({k: tf.constant(v) for k, v in batch.items()})
  assert np.isfinite(outputs["critic_loss"]) and np.isfinite(outputs["policy_loss"])
  assert any(not np.array_equal(b, v.numpy())
             for b, v in zip(before, nets.critic.trainable_variables))
