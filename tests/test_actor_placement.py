"""D4PG.actor_cores: the actor processes and the learner on cores of their own
(replibench/rl/placement.py); too many actor cores is bad input (exit 2: test_bad_inputs)."""

import os

import pytest

from replibench.config import load_experiment
from replibench.errors import UserError
from replibench.harness.loop import run_experiment
from replibench.rl import placement
from replibench.workloads.d4pg import D4PG
from tests import helpers

CONFIG = "configs/d4pg/cartpole_swingup.gin"


def test_actors_take_the_last_cores_and_the_learner_keeps_the_rest():
  assert placement.split_cores(1, {0, 1, 2, 3}) == ({0, 1, 2}, {3})
  assert placement.split_cores(2, {4, 6, 8}) == ({4}, {6, 8})
  assert placement.split_cores(0, {0, 1}) == ({0, 1}, set())


@pytest.mark.parametrize("actor_cores", [2, 3, -1, 1.5])
def test_actor_cores_leave_the_learner_one_core(actor_cores):
  with pytest.raises(UserError, match=r"D4PG\.actor_cores"):
    placement.check_actor_cores(actor_cores, {0, 1})


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_a_run_with_actors_on_their_own_core(tmp_path, monkeypatch):
  """A tiny run with D4PG.actor_cores = 1: at every evaluation the actor processes are
  on the last core and the learner on the others; afterwards this process has its cores
  back."""
  before = os.sched_getaffinity(0)
  learner, actors = placement.split_cores(1, before)
  seen = []
  evaluate = D4PG.evaluate

  def watched(self, replicator):
    seen.append((os.sched_getaffinity(0),
                 [os.sched_getaffinity(a["pid"]) for a in self.pool.stats()["actors"]]))
    return evaluate(self, replicator)

  monkeypatch.setattr(D4PG, "evaluate", watched)
  experiment = load_experiment([os.path.join(helpers.REPO, CONFIG)],
                               [*helpers.TINY[CONFIG], "D4PG.actor_cores = 1"])
  result = run_experiment(experiment, str(tmp_path))
  assert result.status in ("reached", "budget_exhausted") and result.final_step == 8
  assert seen and all(here == learner and theirs == [actors] * 2 for here, theirs in seen)
  assert os.sched_getaffinity(0) == before
