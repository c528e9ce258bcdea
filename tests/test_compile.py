"""Experiment.jit_compile: the XLA-compiled step matches the graph step; refusals.

Each equivalence test trains the same tiny config a few steps twice from the same
initial weights, once with jit_compile False and once True (engine/compilation.py:
the forward and backward pass and the optimizer's update compiled, the exchange
between them not), through the engine directly, and compares the losses of every
step and every variable after them.

Tolerance: XLA fuses ops and may reorder float32 sums (its CPU convolutions are
Eigen's, the graph's oneDNN's; a reduction's accumulation order; a fused multiply-add
where the graph rounds twice), so the two steps agree to float32 rounding, not bit
for bit. The compiled update alone matches to 2e-7 (measured: same kernels); the
compiled forward and backward pass differs near 1e-6 relative in the first step, and
batch norm over a few examples amplifies it step by step: after three steps the
worst variable (ResNet's stem kernel, the end of the backward chain) differed by
1.4e-4 (6.7e-4 relative) and the losses by under 1e-5. So losses are compared at
rtol = atol = 1e-4 and variables at 1e-3, while a wrong step (a skipped or doubled
update, a wrong gradient, an update on another variable's slots, which an early
version of compile_updates made) moved them by 1e-3 to 1e-2 within two steps.
The regime and precision tests below state their own measured differences.
"""

import dataclasses
import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from replibench import config, engine, results
from replibench.config import compile_choice
from replibench.config import plan as plan_lib
from replibench.engine import compilation
from replibench.engine import regimes as regimes_lib
from replibench.errors import UserError
from replibench.harness import outcome
from tests import helpers

STEPS = 3
LOSS_TOLERANCE = 1e-4   # rtol and atol, for the losses of each step
VARIABLE_TOLERANCE = 1e-3   # rtol and atol, for every variable after STEPS steps
RESNET = "configs/resnet/fashion_mnist.gin"
SNGAN = "configs/sngan/fashion_mnist.gin"
D4PG = "configs/d4pg/cartpole_swingup.gin"
PER_REPLICA_BN = ["small_resnet.norm_layer = @engine.per_replica_batch_norm",
                  "sngan_generator.norm_layer = @engine.per_replica_batch_norm"]


def _local(n: int) -> list[str]:
  return ["Experiment.topology = @topology.Local()", f"topology.Local.num_replicas = {n}",
          "topology.Local.device = 'cpu'"]


def _experiment(gin_file: str, bindings: list[str], jit) -> config.Experiment:
  return config.load_experiment([gin_file], [*helpers.TINY.get(gin_file, []), *bindings,
                                             f"Experiment.jit_compile = {jit!r}"])


def _train(gin_file: str, bindings: list[str], jit: bool) -> tuple[list, list]:
  """STEPS steps, one a call: (the losses of each step, every variable after them)."""
  experiment = _experiment(gin_file, bindings, jit)
  spec = dataclasses.replace(experiment.train_spec(), steps_per_call=1)
  assert spec.jit_compile is jit
  workload = experiment.workload
  replicator = engine.make_replicator(experiment.topology, spec.regime)
  try:
    with replicator.scope():
      workload.build(spec)
    train = replicator.compile(workload.step_fn, helpers.without_autotuning(workload.input_fn),
                               spec)
    losses = [train()["loss"] for _ in range(STEPS)]
    items = workload.checkpoint_items()
    variables = [np.array(v.numpy()) for item in items.values()
                 for v in getattr(item, "variables", [])]
  finally:
    workload.close()
  return losses, variables


def _assert_equivalent(gin_file: str, bindings: list[str], scale: float = 1.0):
  """scale multiplies both tolerances (a bfloat16 step rounds at 2^-8)."""
  graph_losses, graph_vars = _train(gin_file, bindings, False)
  xla_losses, xla_vars = _train(gin_file, bindings, True)
  loss_tol, var_tol = LOSS_TOLERANCE * scale, VARIABLE_TOLERANCE * scale
  np.testing.assert_allclose(xla_losses, graph_losses, rtol=loss_tol, atol=loss_tol)
  assert len(xla_vars) == len(graph_vars) > 0
  for xla, graph in zip(xla_vars, graph_vars):
    np.testing.assert_allclose(xla, graph, rtol=var_tol, atol=var_tol)


# The ResNet tests' model: two blocks, not the tiny config's three (the measured
# differences above are the three-block model's; a shallower chain amplifies less).
# Tracing and compiling the pass is most of each test; every block kind stays.
TWO_BLOCKS = ["small_resnet.widths = (4, 8)", "small_resnet.blocks_per_stage = (1, 1)"]


def test_resnet_compiled_step_matches_graph_step_on_two_replicas():
  _assert_equivalent(RESNET, [*_local(2), *PER_REPLICA_BN, *TWO_BLOCKS])


def test_resnet_cross_replica_batch_norm_compiles_on_one_replica():
  """The config as committed, one replica: its batch norm's all-reduce over one replica
  is the identity inside the compiled pass."""
  _assert_equivalent(RESNET, [*_local(1), *TWO_BLOCKS])


SNGAN_SYNTHETIC = "configs/sngan/imagenet128_synthetic.gin"
# One block each (synthetic_tiny keeps the 128 model's six): XLA compiles the deep one
# for minutes on a loaded 2-core machine; the blocks' kinds are the same. Ten classes,
# not ImageNet's 1,000: the class embeddings are the same ops, and the larger ones cost
# ~3 CPU-s more of the test's 27-32 (alternated, 2026-12-07).
SNGAN_SHALLOW = ["sngan_generator.widths = (1, 1)", "sngan_generator.bottom_width = 16",
                 "sngan_discriminator.widths = (1,)", "sngan_discriminator.downsample = (True,)",
                 "SyntheticImages.num_classes = 10"]
D4PG_SYNTHETIC = "configs/d4pg/cartpole_swingup_pixels_synthetic.gin"


def test_sngan_compiled_step_matches_graph_step_on_two_replicas():
  """Adam divides each update by its gradient's RMS plus epsilon: a parameter whose true
  gradient is zero (SN-GAN's convolution biases before batch norm, which removes them)
  moves by about +-lr on the sign of float32 rounding noise, independently on either
  path (measured: 1.5e-4 on biases near 8e-5, and 1.3e-3 on a moving mean downstream,
  after three steps). epsilon = 1e-3 damps updates of such noise-sized gradients and
  leaves the real ones (orders of magnitude larger) normalised as before."""
  _assert_equivalent(SNGAN_SYNTHETIC, [*helpers.TINY_SYNTHETIC[SNGAN_SYNTHETIC],
                                       *_local(2), *PER_REPLICA_BN, *SNGAN_SHALLOW,
                                       "ConditionalGAN.epsilon = 1e-3"])


def test_d4pg_compiled_step_matches_graph_step_on_two_replicas():
  _assert_equivalent(D4PG_SYNTHETIC, [*helpers.TINY_SYNTHETIC[D4PG_SYNTHETIC], *_local(2)])


# -- the choice, its refusals and where it is recorded (no training) ----------------------

class _Workload:   # compile_choice reads the workload's class name only.
  pass


def test_auto_resolves_per_device_kind_and_workload(monkeypatch):
  cpu = compile_choice.resolve("auto", _Workload(), engine.Local(1, device="cpu"), None)
  assert (cpu.enabled, cpu.device_kind) == (False, "cpu")
  assert "CPU_DEFAULTS" in cpu.describe()
  monkeypatch.setitem(compile_choice.CPU_DEFAULTS, "_Workload", True)
  assert compile_choice.resolve("auto", _Workload(), engine.Local(1, device="cpu"),
                                None).enabled
  monkeypatch.setattr(compile_choice.devices, "resolve_kind", lambda n, device: "gpu")
  gpu = compile_choice.resolve("auto", _Workload(), engine.Local(1), None)
  assert (gpu.enabled, gpu.device_kind) == (True, "gpu")
  assert compile_choice.resolve(False, _Workload(), engine.Local(1), None).enabled is False


@pytest.mark.parametrize("requested,topology,regime,said", [
    ("yes", engine.Local(1), None, "Experiment.jit_compile = 'yes': choose True"),
    (1, engine.Local(1), None, "Experiment.jit_compile = 1: choose True"),
    (False, engine.Tpu(8), None, "a TPU runs nothing but XLA"),
    (True, "mesh", None, "an XLA cluster on a CPU or GPU is one device's program"),
    (True, engine.MultiWorker(workers=2), "async", "cannot read a variable placed on another device"),
])
def test_paths_that_cannot_compile_are_refused(requested, topology, regime, said):
  from replibench.engine import model_parallel, regimes   # pylint: disable=import-outside-toplevel
  topology = model_parallel.Mesh(data=1, model=2) if topology == "mesh" else topology
  regime = regimes.AsyncPS() if regime == "async" else regimes.Sync()
  with pytest.raises(UserError, match=said):
    compile_choice.resolve(requested, _Workload(), topology, regime)


def test_auto_does_not_refuse_it_resolves_false_with_the_reason():
  from replibench.engine import model_parallel, regimes   # pylint: disable=import-outside-toplevel
  choice = compile_choice.resolve("auto", _Workload(), model_parallel.Mesh(data=1, model=2),
                                  regimes.Sync())
  assert choice.enabled is False and "one device's program" in choice.reason


def test_cross_replica_batch_norm_on_two_replicas_is_refused_at_config_time():
  with pytest.raises(UserError, match="binds @engine.cross_replica_batch_norm"):
    _experiment(RESNET, _local(2), True)
  assert _experiment(RESNET, _local(1), True).train_spec().jit_compile is True
  auto = _experiment(RESNET, _local(2), "auto")
  assert auto.compile_choice.enabled is False


def test_a_collective_inside_the_compiled_pass_is_a_user_error_on_two_replicas():
  """The trace-time backstop for a model whose forward pass holds a collective."""
  replicator = engine.Replicator(engine.Local(num_replicas=2, device="cpu"))
  piece = lambda x: engine.all_reduce(x, "sum")   # noqa: E731
  with pytest.raises(UserError, match="holds a collective"):
    replicator.run(lambda: compilation.compiled(piece, True)(tf.ones([2])))
  one = engine.Replicator(engine.Local(num_replicas=1, device="cpu"))
  out = one.run(lambda: compilation.compiled(piece, True)(tf.ones([2])))
  np.testing.assert_array_equal(one.reduce(out, "sum"), [1.0, 1.0])   # The identity.


def test_plan_prints_the_choice_and_exits_2_on_a_refusal(capsys):
  from tests.test_bad_inputs import run_cli   # pylint: disable=import-outside-toplevel
  line = run_cli(capsys, "plan", f"--gin_file={RESNET}", "--gin_file=configs/topology/local2.gin",
                 "--gin_bindings=Experiment.jit_compile = True")
  assert "Experiment.jit_compile = True: the config binds @engine.cross_replica_batch_norm" in line
  facts = plan_lib.make_plan(_experiment(RESNET, _local(1), True))
  assert facts["jit_compile"].startswith("XLA: Experiment.jit_compile = True, as configured")


def test_result_json_records_the_choice_and_old_files_read_null(tmp_path):
  compiled = _result_with(True)
  assert compiled.hparams.get("jit_compile") is None   # hparams: the harness's (below)
  results.write(str(tmp_path), compiled)
  assert results.read(str(tmp_path)).jit_compile is True
  data = json.loads((tmp_path / results.FILE).read_text())
  del data["jit_compile"]   # A schema-2 file from before the choice.
  (tmp_path / results.FILE).write_text(json.dumps(data))
  assert results.read(str(tmp_path)).jit_compile is None


def test_history_and_ab_are_keyed_on_the_choice():
  from replibench.tracking import record, store   # pylint: disable=import-outside-toplevel
  base = dict(commit="a", commit_time="t", machine="m", suite="s", config="replicas=2",
              seed=0, status="reached", metrics={}, source="ab", run_id="r")
  assert store.Record(**base).series_config == "replicas=2"
  assert store.Record(**base, jit_compile=True).series_config == "replicas=2 [xla]"
  graph, xla = _result_with(None), _result_with(True)
  record.check_same_compilation("t", graph, _result_with(False))   # null reads as graph
  with pytest.raises(UserError, match="must not compare a compiled step with an uncompiled"):
    record.check_same_compilation("t", graph, xla)


def _result_with(jit) -> results.RunResult:
  from tests.test_results import _facts   # pylint: disable=import-outside-toplevel
  return outcome.make_result(dataclasses.replace(_facts(), jit_compile=jit), results.REACHED)


def test_hparams_name_the_choice_only_when_compiled():
  spec = engine.TrainSpec(8, 2, jit_compile=True)
  shown = outcome.hparams(spec, engine.Local(2), _NoHparams(), None)
  assert shown["jit_compile"] is True
  graph = outcome.hparams(dataclasses.replace(spec, jit_compile=False), engine.Local(2),
                          _NoHparams(), None)
  assert "jit_compile" not in graph   # Graph runs group with those from before the choice.


class _NoHparams:
  def hparams(self):
    return {}


# -- every regime and precision, on a tiny MLP through TrainSpec's two hooks --------------

def _mlp_run(regime_fn, precision: str, jit: bool, replicas: int = 2) -> tuple[list, list]:
  """regime_runs' MLP (SGD with momentum) for STEPS steps, its forward and backward pass
  through TrainSpec.compiled and its optimizer built by TrainSpec.build_optimizer."""
  from replibench.workloads import precision as precision_lib  # pylint: disable=C0415
  from tests import regime_runs   # pylint: disable=import-outside-toplevel
  regime = regime_fn()
  replicator = engine.Replicator(engine.Local(num_replicas=replicas, device="cpu"), regime)
  spec = engine.TrainSpec(regime_runs.GLOBAL_BATCH, replicas, regime=replicator.regime,
                          precision=precision, jit_compile=jit)
  with replicator.scope():
    with precision_lib.policy_scope(precision):
      model = regime_runs.mlp()
    optimizer = precision_lib.wrap_optimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                                             precision)
    spec.build_optimizer(optimizer, model.trainable_variables)
  x, y = helpers.random_images(regime_runs.GLOBAL_BATCH * STEPS)

  def input_fn(ctx):
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(ctx.num_input_pipelines,
                                                          ctx.input_pipeline_id)
    return ds.batch(ctx.per_replica_batch_size, drop_remainder=True).with_options(
        helpers.no_autotune())

  def gradients(batch):
    images, labels = batch
    with tf.GradientTape() as tape:
      logits = precision_lib.to_float32(model(images, training=True))
      loss = engine.average_loss(keras.losses.sparse_categorical_crossentropy(
          labels, logits, from_logits=True), regime_runs.GLOBAL_BATCH)
      scaled = precision_lib.scaled(optimizer, loss)
    return loss, tape.gradient(scaled, model.trainable_variables)

  def step_fn(batch):
    loss, grads = spec.compiled(gradients)(batch)
    metrics = spec.regime.apply_gradients(optimizer, grads, model.trainable_variables)
    return {"loss": loss * engine.num_replicas(), **metrics}

  train = replicator.compile(step_fn, input_fn, spec)
  losses = [train()["loss"] for _ in range(STEPS)]
  values = [np.array(c.numpy()) for v in model.trainable_variables + optimizer.variables
            for c in replicator.strategy.experimental_local_results(getattr(v, "value", v))]
  return losses, values


REGIMES = {
    "sync": lambda: regimes_lib.Sync(),
    "local_sgd": lambda: regimes_lib.LocalSGD(sync_every=2),
    "compressed": lambda: regimes_lib.Compressed(bits=8),
    "gossip": lambda: regimes_lib.Gossip(),
    "gradient_tracking": lambda: regimes_lib.GradientTracking(),
}


@pytest.mark.parametrize("regime", sorted(REGIMES))
def test_every_synchronous_regime_compiles_to_the_same_training(regime):
  """Measured: the MLP's losses and variables matched to 2.4e-7 and 6e-8 under every
  regime (no batch norm to amplify rounding), well inside the tolerances."""
  graph = _mlp_run(REGIMES[regime], "float32", False)
  xla = _mlp_run(REGIMES[regime], "float32", True)
  np.testing.assert_allclose(xla[0], graph[0], rtol=LOSS_TOLERANCE, atol=LOSS_TOLERANCE)
  for a, b in zip(xla[1], graph[1]):
    np.testing.assert_allclose(a, b, rtol=VARIABLE_TOLERANCE, atol=VARIABLE_TOLERANCE)


@pytest.mark.parametrize("precision,tolerance", [("mixed_bfloat16", 1e-2),
                                                  ("mixed_float16", None)])
def test_mixed_precision_compiles_to_the_same_training(precision, tolerance):
  """bfloat16 rounds at 2^-8, and XLA's fusions keep some intermediates in float32
  where the graph rounds each op's output to bfloat16: measured, losses differed by
  1.7e-3 and variables by 1.2e-3 after three steps, so both are compared at 1e-2 (one
  step at learning rate 0.1 moves them by more). float16 (with loss scaling, the
  inner optimizer's update compiled) matched to 3e-8: the float32 tolerances."""
  graph = _mlp_run(REGIMES["sync"], precision, False)
  xla = _mlp_run(REGIMES["sync"], precision, True)
  loss_tol, var_tol = (tolerance, tolerance) if tolerance else (LOSS_TOLERANCE,
                                                                 VARIABLE_TOLERANCE)
  np.testing.assert_allclose(xla[0], graph[0], rtol=loss_tol, atol=loss_tol)
  for a, b in zip(xla[1], graph[1]):
    np.testing.assert_allclose(a, b, rtol=var_tol, atol=var_tol)


# Worker processes: tests/test_multiworker.py launches two compiled workers against the
# two-replica graph run its per-replica launch compares with (one reference for both).


def test_compiled_updates_keep_each_variables_own_slots():
  """Two variables of one shape: a trace shared between them would update the second
  with the first one's momentum (an early version did; the ResNet test caught it)."""
  def train(jit: bool) -> list:
    a, b = tf.Variable([1.0, 2.0]), tf.Variable([-3.0, 5.0])
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    spec = engine.TrainSpec(2, 1, jit_compile=jit)
    spec.build_optimizer(optimizer, [a, b])
    for grads in ([1.0, -1.0], [0.5, 2.0]), ([-2.0, 0.0], [1.0, 1.0]):
      optimizer.apply_gradients(zip([tf.constant(g) for g in grads], [a, b]))
    return [v.numpy() for v in (a, b, *optimizer.variables)]
  for xla, graph in zip(train(True), train(False)):
    np.testing.assert_allclose(xla, graph, rtol=1e-6)
