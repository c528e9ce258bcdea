"""Harness behaviour: resume, divergence, and bad input failing cleanly."""

import os

import numpy as np
import pytest
import tensorflow as tf

from replibench.config import load_experiment
from replibench.errors import UserError
from replibench.harness.loop import run_experiment
from tests import helpers, inprocess_cli

CONFIG = "configs/resnet/fashion_mnist.gin"
TINY = helpers.TINY[CONFIG]


def _run(workdir, bindings=(), max_steps=None):
  experiment = load_experiment([os.path.join(helpers.REPO, CONFIG)], [*TINY, *bindings])
  return run_experiment(experiment, str(workdir), max_steps=max_steps)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The same tiny run made straight through and stopped after 3 steps then resumed to
  its end, made once for the resume tests: {'straight': workdir, 'resumed': workdir,
  'first': the stopped session's result, 'second': the resumed one's}."""
  made = {name: tmp_path_factory.mktemp(name) for name in ("straight", "resumed")}
  _run(made["straight"])
  made["first"] = _run(made["resumed"], max_steps=3)
  made["second"] = _run(made["resumed"])
  return made


def test_resume_continues_step_count_elapsed_time_and_curve(runs):
  first, second = runs["first"], runs["second"]
  assert first.final_step == 3 and first.status == "budget_exhausted"
  budget = second.budget["total_steps"]
  assert second.final_step == budget > 3
  assert second.total_s > first.total_s          # the timed span carried over
  assert second.curve[: len(first.curve)] == first.curve
  third = _run(runs["resumed"])                         # complete: nothing more to do
  assert third == second


def _checkpoint(workdir) -> dict:
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(workdir / "checkpoints")))
  return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
          if k.startswith(("model/", "optimizer/"))}


def test_resume_is_exact_for_weights_optimizer_state_and_data(runs):
  """3 steps + the resumed rest == the run straight through: same data, same
  augmentation, same slots."""
  straight, resumed = _checkpoint(runs["straight"]), _checkpoint(runs["resumed"])
  assert straight.keys() == resumed.keys()
  # Keras 3 checkpoints the optimizer's iteration count and momentum slots by index.
  assert sum(k.startswith("optimizer/_variables/") for k in straight) > 2
  for name, value in straight.items():
    np.testing.assert_allclose(resumed[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("bindings,culprit", [
    (["Experiment.no_such_field = 1"], "no_such_field"),
    (["NoSuchThing.x = 1"], "NoSuchThing"),
    (["Experiment.global_batch_size = 'big'"], "Experiment.global_batch_size"),
    (["Experiment.global_batch_size = 255", "topology.Local.num_replicas = 2"],
     "global_batch_size"),
    (["FashionMNIST.data_dir = '/nonexistent/fmnist'"], "/nonexistent/fmnist"),
])
def test_bad_input_names_the_culprit_and_writes_nothing(bindings, culprit, tmp_path):
  with pytest.raises(UserError, match=culprit.replace(".", r"\.")):
    _run(tmp_path, bindings)
  assert not (tmp_path / "result.json").exists()


def test_missing_gin_file_is_named():
  with pytest.raises(UserError, match="nope.gin"):
    load_experiment(["nope.gin"], [])


def test_cli_exit_codes(tmp_path, capsys):
  """`replibench run`'s exit codes: user error exits 2 (one paragraph, no result); a NaN
  loss ends the run as diverged, with no time or steps to target, and exits 3.

  In this process (inprocess_cli): the codes are what cli.main returns, and that the
  entry point exits a real process with main's code is test_cli's (its real-process
  cases, e.g. test_broken_gin_files_exit_2_with_one_paragraph[0-...], a `run` whose
  config fails the same way as the bad binding here)."""
  bad = inprocess_cli.cli(capsys, "run", f"--gin_file={CONFIG}",
                          "--gin_bindings=Experiment.seed = 'x'", f"--workdir={tmp_path / 'bad'}")
  assert bad.returncode == 2, bad.stderr[-2000:]
  assert "Experiment.seed" in bad.stderr and "Traceback" not in bad.stderr
  assert not (tmp_path / "bad" / "result.json").exists()

  diverged = inprocess_cli.cli(capsys, "run", f"--gin_file={CONFIG}",
                               *(f"--gin_bindings={b}" for b in TINY),
                               "--gin_bindings=ImageClassification.base_lr_per_256 = 1e30",
                               "--gin_bindings=ImageClassification.warmup_epochs = 0",
                               f"--workdir={tmp_path / 'nan'}")
  assert diverged.returncode == 3, diverged.stderr[-2000:]
  result = helpers.result(tmp_path / "nan")
  assert result.status == "diverged"
  assert result.time_to_target_s is None and result.steps_to_target is None
