"""D4PG's time to a return: evaluation episodes are kept out of the timed span
(harness/timed_span.py), in every session of a resumed run."""

import os
import types

import pytest

from replibench.config import load_experiment
from replibench.harness import loop
from replibench.harness.loop import run_experiment
from replibench.harness.timed_span import TimedSpan
from replibench.rl import evaluation
from replibench.workloads.base import Workload
from replibench.workloads.d4pg import D4PG
from tests import helpers

CONFIG = "configs/d4pg/cartpole_swingup.gin"   # Target return 800.
EVAL_S = 1000.0   # What each evaluation costs on the fake clock: far above a tiny run's time.


class FakeClock:
  """A settable monotonic clock: seconds."""

  def __init__(self):
    self.now = 0.0

  def __call__(self) -> float:
    return self.now


def test_timed_span_stops_while_untimed_and_reads_the_pause():
  clock = FakeClock()
  span = TimedSpan(base=5.0, clock=clock)
  clock.now = 2.0
  assert span() == 7.0
  with span.untimed():
    clock.now = 30.0
    assert span() == 7.0                 # frozen at the pause
    with span.untimed():                 # nested: counted once
      clock.now = 40.0
  assert span() == 7.0 and span.untimed_s == 38.0
  clock.now = 41.0
  assert span() == 8.0                   # runs again after it


def test_only_reinforcement_learning_leaves_its_evaluation_untimed():
  assert Workload.timed_evaluation and not D4PG.timed_evaluation


@pytest.fixture
def slow_scripted_evaluation(monkeypatch):
  """Each evaluation takes EVAL_S on the harness's clock and returns the next scripted
  return (0, then 900: the target of 800 is met at the second evaluation)."""
  offset = [0.0]
  real = loop.time
  monkeypatch.setattr(loop, "time", types.SimpleNamespace(
      monotonic=lambda: real.monotonic() + offset[0], sleep=real.sleep,
      process_time=real.process_time))
  script = iter([0.0, 900.0])

  def returns(self, networks):
    del networks
    offset[0] += EVAL_S
    return [next(script)] * self.episodes

  monkeypatch.setattr(evaluation.Evaluator, "returns", returns)


def test_evaluation_is_not_timed_and_a_resume_keeps_it_out(tmp_path, slow_scripted_evaluation):
  """Session 1 trains 4 steps and evaluates (return 0); session 2 resumes, trains 4 more
  and evaluates (return 900 >= 800): two evaluations of EVAL_S each, none in the span."""
  def run(max_steps=None):
    experiment = load_experiment([os.path.join(helpers.REPO, CONFIG)], helpers.TINY[CONFIG])
    return run_experiment(experiment, str(tmp_path), max_steps=max_steps)

  first = run(max_steps=4)
  assert first.status == "budget_exhausted" and first.curve[0][0] == 4
  assert first.eval_s >= EVAL_S            # the evaluation did take EVAL_S on the clock
  assert first.total_s < EVAL_S            # ... and none of it was timed
  second = run()
  assert second.status == "reached" and second.steps_to_target == 8
  assert second.resumed == 1 and second.curve[0] == first.curve[0]
  assert first.total_s <= second.time_to_target_s < EVAL_S   # carried over, evals left out
  assert all(t < EVAL_S for _, t, _ in second.curve)
