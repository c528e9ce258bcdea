"""`run --profile_steps=A,B` (Experiment.profile_steps): which calls are traced, the
profile TensorBoard's profile plugin reads, result.json's record of it, and bad
ranges refused as one paragraph with exit 2 and nothing written."""

import json
import os

import pytest

from replibench import inputs, results
from replibench.config import load_experiment
from replibench.errors import UserError
from replibench.harness import profiling, step_split
from replibench.harness.loop import run_experiment
from tests import helpers, inprocess_cli

CONFIG = "configs/resnet/fashion_mnist.gin"
TINY = helpers.TINY[CONFIG]
# The profiled run's model and evaluation: two blocks, 200 images (what the profile
# must show, the step's convolutions, needs no more).
SHORT = ["small_resnet.widths = (4, 8)", "small_resnet.blocks_per_stage = (1, 1)",
         "FashionMNIST.num_eval_examples = 200", "ImageClassification.eval_batch_size = 200"]


class _Recorder(profiling.StepProfiler):
  """The profiler's schedule alone: start/stop recorded, TensorFlow's profiler untouched."""

  def _start(self):
    self.active, self.events = True, [*getattr(self, "events", []), "start"]

  def stop(self):
    if self.active:
      self.active, self.events = False, [*self.events, "stop"]


@pytest.mark.parametrize("steps,steps_per_call,traced", [
    ((2, 3), 1, [[2], [3]]),             # One step a call: exactly A..B.
    ((15, 25), 10, [[11, 20], [21, 30]]),   # Whole calls: every call with a step in A..B.
    ((5, 5), 4, [[5, 8]]),
    ((1, 1), 3, [[1, 3]]),               # The first call (it also optimizes the graph).
])
def test_the_calls_that_train_any_step_of_the_range_are_traced(steps, steps_per_call, traced):
  profiler = _Recorder(steps, "/nonexistent", steps_per_call)
  calls, done = [], 0
  while done < 40:
    if profiler.before_call(done):
      calls.append([done + 1, done + steps_per_call] if steps_per_call > 1 else [done + 1])
    done += steps_per_call
    profiler.after_call(done)
  assert calls == traced and profiler.events == ["start", "stop"]
  assert profiler.traced == [traced[0][0], traced[-1][-1]]
  assert profiler.calls == len(traced)


def test_no_profile_asked_traces_nothing():
  profiler = profiling.StepProfiler(None, "/nonexistent", 1)
  assert not profiler.before_call(0) and profiler.record() is None


@pytest.mark.parametrize("value,culprit", [
    ((3, 2), "not a range"), ((0, 2), "not a range"), ((2,), "two integers"),
    (("a", "b"), "two integers"), ((1.5, 2), "two integers"), ((9, 9), "never runs")])
def test_bad_ranges_are_refused_naming_the_setting(value, culprit):
  with pytest.raises(UserError, match=culprit) as error:
    inputs.step_range("Experiment.profile_steps", value, total_steps=8)
  assert "Experiment.profile_steps" in str(error.value)


def test_a_few_step_cpu_run_writes_a_profile_tensorboard_reads(tmp_path):
  experiment = load_experiment([os.path.join(helpers.REPO, CONFIG)],
                               [*TINY, *SHORT, "Experiment.profile_steps = (2, 3)"])
  result = run_experiment(experiment, str(tmp_path), max_steps=4)
  assert result.profile == results.Profile(
      steps=[2, 3], traced_steps=[2, 3], calls=2, logdir=".",
      trace_dir=result.profile.trace_dir, overhead_s=result.profile.overhead_s)
  # Where TensorBoard's profile plugin looks: LOGDIR/plugins/profile/<run>/<host>.xplane.pb.
  assert result.profile.trace_dir.startswith(os.path.join("plugins", "profile") + os.sep)
  files = profiling.xplane_files(str(tmp_path / result.profile.trace_dir))
  assert len(files) == 1 and os.path.getsize(files[0]) > 0
  # The traced calls (2 and 3) count in no examples/s; call 4 does.
  assert result.examples_per_s is not None
  assert json.load(open(tmp_path / results.FILE))["profile"]["trace_dir"] == (
      result.profile.trace_dir)
  # What the trace says: the step's convolutions, by TensorFlow op type.
  found = profiling.top_ops(files, top=50)
  kinds = " ".join(r["name"] for rows in found["tf_op_types"].values() for r in rows)
  assert "Conv2D" in kinds, kinds
  assert "| # | name |" in profiling.format_top_ops(found, calls=2)
  # One replica exchanges nothing (tests/test_step_split.py: two do).
  calls = step_split.split_trace(step_split.trace_events(files))
  assert [c.step_num for c in calls] == [2, 3] and all(c.exchange_ms == 0 for c in calls)


@pytest.mark.parametrize("flags,culprit", [
    (["--profile_steps=3,2"], "--profile_steps=3,2"),
    (["--profile_steps=x,2"], "--profile_steps=x,2"),
    (["--profile_steps=5,6", "--max_steps=4"], "--max_steps=4"),
])
def test_the_flag_refuses_bad_ranges_with_exit_2_and_writes_nothing(tmp_path, capsys, flags,
                                                                   culprit):
  # In this process (tests/inprocess_cli.py): the refusal comes before anything runs,
  # and what is checked is what the command says, returns and writes.
  run = inprocess_cli.cli(capsys, "run", f"--gin_file={CONFIG}",
                          *(f"--gin_bindings={b}" for b in TINY), *flags,
                          f"--workdir={tmp_path / 'run'}")
  assert run.returncode == 2, run.stderr[-2000:]
  lines = [l for l in run.stderr.splitlines() if l.startswith("replibench run: error:")]
  assert len(lines) == 1 and culprit in lines[0], run.stderr[-2000:]
  assert "Traceback" not in run.stderr
  assert not (tmp_path / "run").exists()
