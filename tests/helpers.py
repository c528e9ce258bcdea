"""Shared helpers for the end-to-end tests: tiny overrides and reading run outputs."""

import functools
import glob
import json
import os
import re
import subprocess
import sys

from tensorboard.backend.event_processing import event_accumulator

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every workload config must appear here: its tiny override for the tests.
TINY = {
    "configs/resnet/fashion_mnist.gin": [
        "FashionMNIST.num_train_examples = 2560", "FashionMNIST.num_eval_examples = 1000",
        "Experiment.train_epochs = 0.5", "Experiment.eval_every_epochs = 0.25",
        "Experiment.log_every_steps = 1", "Experiment.steps_per_call = 1",
        "small_resnet.widths = (4, 8, 8)"],
    # 4 GAN steps at batch 8 (2 per call, an evaluation after each call), one-block
    # G and D, 100 samples scored by a tiny classifier (trained once into the cache).
    "configs/sngan/fashion_mnist.gin": [
        "Experiment.global_batch_size = 8", "Experiment.train_epochs = 0.0004",
        "Experiment.target = 0.0",   # FID never reaches 0: every eval runs
        "Experiment.eval_every_epochs = 0.00025", "Experiment.steps_per_call = 2",
        "Experiment.log_every_steps = 1", "ConditionalGAN.n_dis = 1",
        "ConditionalGAN.eval_num_samples = 100", "ConditionalGAN.eval_batch_size = 50",
        "ConditionalGAN.grid_samples_per_class = 2", "sngan_generator.ch = 4",
        "sngan_generator.widths = (1, 1)", "sngan_generator.bottom_width = 14",
        "sngan_discriminator.ch = 4", "sngan_discriminator.widths = (1,)",
        "sngan_discriminator.downsample = (True,)",
        "FashionMNISTScorer.num_reference = 500",
        "ClassifierConfig.conv_widths = (4,)", "ClassifierConfig.feature_dim = 8",
        "ClassifierConfig.epochs = 1", "ClassifierConfig.batch_size = 64",
        "ClassifierConfig.num_train_examples = 512"],
    # D4PG: real actor processes (2; 1 + the evaluator process for pixels), episodes
    # of a few steps, 8 learner steps of batch 16 (epoch = 4 steps), an evaluation
    # of one episode after each epoch.
    **{f"configs/d4pg/{name}.gin": [
        "Experiment.global_batch_size = 16", "D4PG.epoch_size = 64",
        "Experiment.train_epochs = 2", "Experiment.eval_every_epochs = 1",
        "Experiment.steps_per_call = 2", "Experiment.log_every_steps = 2",
        "UniformReplay.min_size = 16", "D4PG.eval_episodes = 1",
        "D4PGNetworks.policy_sizes = (8,)", "D4PGNetworks.critic_sizes = (8,)",
        *extra] for name, extra in [
            ("cartpole_swingup", ["EnvConfig.time_limit = 0.1"]),
            ("walker_walk", ["EnvConfig.time_limit = 0.1"]),
            ("cartpole_swingup_pixels", ["EnvConfig.time_limit = 0.16",
                                         "EnvConfig.image_size = 16",
                                         "D4PGNetworks.embed_dim = 4",
                                         "D4PG.num_actors = 1"])]},
}


# Every config on synthetic data (replibench/data/synthetic.py) must appear here: the
# overrides that shrink it to a few CPU steps (tests/test_synthetic.py runs each once;
# the model's structure stays, images, channels and batches shrink).
TINY_SYNTHETIC = {
    f"configs/{workload}/{name}.gin": [f"include 'configs/{workload}/synthetic_tiny.gin'"]
    for workload, name in (("resnet", "imagenet_synthetic"), ("sngan", "imagenet128_synthetic"),
                           ("d4pg", "cartpole_swingup_pixels_synthetic"))}


def benchmark_script(name: str):
  """benchmarks/<concern>/<script>.py imported by its path under benchmarks/:
  'tracking/noise_budget' is benchmarks.tracking.noise_budget (benchmarks/README.md)."""
  import importlib
  return importlib.import_module("benchmarks." + name.replace("/", "."))


def synthetic_configs() -> list[str]:
  """Every .gin under configs/ that binds a synthetic data source."""
  paths = sorted(glob.glob(os.path.join(REPO, "configs", "*", "*.gin")))
  return [os.path.relpath(p, REPO) for p in paths if "@Synthetic" in open(p).read()]


def workload_configs() -> list[str]:
  """Every .gin under configs/ that declares an experiment (not topology fragments)."""
  paths = sorted(glob.glob(os.path.join(REPO, "configs", "*", "*.gin")))
  return [os.path.relpath(p, REPO) for p in paths
          if "Experiment.workload" in open(p).read()]


def no_autotune():
  """tf.data options without the autotuning model thread.

  An iterator of an autotuned pipeline, freed in a test's teardown (conftest's
  gc.collect), waits for that thread's timed sleep to end: 4-20 s per test measured
  on test_regimes' equivalence runs. The toy pipelines of the tests gain nothing
  from autotuning.
  """
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  options = tf.data.Options()
  options.autotune.enabled = False
  return options


def without_autotuning(input_fn):
  """input_fn's pipelines without tf.data's autotuning thread (no_autotune: a freed
  autotuned iterator waits for it, seconds per test); its engine marks kept."""
  @functools.wraps(input_fn)
  def pipeline(ctx):
    return input_fn(ctx).with_options(no_autotune())
  return pipeline


def random_images(n: int) -> tuple:
  """(x float32 [n, 8, 8, 3], y int32 [n] in [0, 10)): fixed toy data for replication tests."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  return (rng.normal(size=(n, 8, 8, 3)).astype(np.float32),
          rng.integers(0, 10, size=(n,)).astype(np.int32))


def derived_configs() -> dict[str, str]:
  """{config: the workload config it includes} for configs that only change budgets
  or targets of another (e.g. the bench suites' short recipes); not those that swap in
  synthetic data (synthetic_configs: they never evaluate)."""
  bases, synthetic = set(workload_configs()), set(synthetic_configs())
  derived = {}
  for path in sorted(glob.glob(os.path.join(REPO, "configs", "*", "*.gin"))):
    config = os.path.relpath(path, REPO)
    included = re.findall(r"^include '([^']+)'", open(path).read(), flags=re.M)
    if config not in bases | synthetic and any(i in bases for i in included):
      derived[config] = next(i for i in included if i in bases)
  return derived


def runs_on_cpu(config: str) -> bool:
  """False for configs whose topology (included or not) needs a TPU."""
  from replibench.config import load_experiment  # pylint: disable=import-outside-toplevel
  return load_experiment([os.path.join(REPO, config)], []).topology.kind != "tpu"


def cli(*args, env=None, timeout=600) -> subprocess.CompletedProcess:
  """Runs `python -m replibench.cli ARGS` from the repo root."""
  return subprocess.run([sys.executable, "-m", "replibench.cli", *args], cwd=REPO,
                        capture_output=True, text=True, timeout=timeout,
                        env={**os.environ, **(env or {})})


def failure_report(run: subprocess.CompletedProcess, tail: int = 3000) -> str:
  """What a failed `cli` run said: its exit code, every fatal-error block (a crash's
  header, thread and stack, which a short tail cuts off) and the end of its output."""
  output = run.stdout + run.stderr
  lines = output.splitlines()
  crashes = [i for i, line in enumerate(lines) if "Fatal Python error" in line]
  blocks = ["\n".join(lines[i:i + 40]) for i in crashes[:2]]
  return "\n".join([f"exit code {run.returncode}", *blocks, "... " + output[-tail:]])


_LINK_TOTAL = re.compile(r"\[launch\] the cluster's link carried ([\d,]+) bytes in all")


def check_wire_account(launched: subprocess.CompletedProcess, workdir) -> dict:
  """Checks a launched run's `network` record: measured bytes per step within 10% of
  the communication account's, and init_bytes + bytes_on_wire the link's total but
  for the tasks' shutdown (the launcher's last line). Returns the record."""
  wire = result(workdir).network
  ratio = wire["bytes_on_wire_per_step"] / wire["expected_bytes_per_step"]
  assert 0.9 <= ratio <= 1.1, (ratio, wire, result(workdir).communication)
  total = int(_LINK_TOTAL.search(launched.stderr)[1].replace(",", ""))
  shutdown = total - wire["init_bytes"] - wire["bytes_on_wire"]
  assert 0 <= shutdown <= 0.05 * total, (total, wire)
  return wire


def checkpoint_variables(workdir) -> dict:
  """{name: value} of the models' and optimizers' variables in a run's last checkpoint."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(workdir / "checkpoints")))
  return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
          if k.startswith(("model/", "optimizer/"))}


def assert_same_training(reference, other) -> None:
  """Two runs (workdirs) trained alike: the same steps, the final metric within 1e-3 and
  every model and optimizer variable within rtol 1e-4 (a ring all-reduce across
  processes sums in another order than one process does)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  a, b = result(reference), result(other)
  assert a.final_step == b.final_step
  np.testing.assert_allclose(b.final_metric, a.final_metric, atol=1e-3)
  want, got = checkpoint_variables(reference), checkpoint_variables(other)
  assert want.keys() == got.keys() and len(want) > 10
  for name, value in want.items():
    np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


def assert_same_losses(reference, other) -> None:
  """Two runs (workdirs) logged the same training loss at every logged step (rtol 1e-4)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  from tensorboard.util import tensor_util  # pylint: disable=import-outside-toplevel
  want, got = event_tags(reference)["train/loss"], event_tags(other)["train/loss"]
  assert [s for s, _ in want] == [s for s, _ in got] and want
  for (step, a), (_, b) in zip(want, got):
    np.testing.assert_allclose(tensor_util.make_ndarray(b), tensor_util.make_ndarray(a),
                               rtol=1e-4, err_msg=f"train/loss at step {step}")


def result(workdir):
  """The run's result.json, read (and checked) as a replibench.results.RunResult."""
  from replibench import results  # pylint: disable=import-outside-toplevel
  return results.read(str(workdir))


def event_tags(workdir) -> dict:
  """{tag: [(step, value), ...]} for every summary in workdir, read by TensorBoard."""
  acc = event_accumulator.EventAccumulator(
      str(workdir), size_guidance={event_accumulator.TENSORS: 0})
  acc.Reload()
  out = {}
  for tag in acc.Tags()["tensors"]:
    out[tag] = [(e.step, e.tensor_proto) for e in acc.Tensors(tag)]
  return out


def replicated_calls(n: int, fn, values, calls: int = 1, device: str = "cpu") -> list:
  """fn(x) on n replicas of `device` (topology Local; logical CPUs by default), replica
  i's x = values[i], run `calls` times by one traced function: [per call: [per replica:
  numpy result]]."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  from replibench import engine  # pylint: disable=import-outside-toplevel
  replicator = engine.Replicator(engine.Local(num_replicas=n, device=device))
  inputs = replicator.strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.constant(values[ctx.replica_id_in_sync_group]))
  step = tf.function(lambda x: replicator.run(fn, x))
  return [[r.numpy() for r in replicator.strategy.experimental_local_results(step(inputs))]
          for _ in range(calls)]


def replicated(n: int, fn, values, device: str = "cpu") -> list:
  """fn(x) run once on n replicas of `device`: [per replica: numpy result]."""
  return replicated_calls(n, fn, values, device=device)[0]
