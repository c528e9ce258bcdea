"""Trustworthy results: kills at the end of a run, the workdir lock, corrupt state,
garbage files, and nothing written by a run stopped by bad input."""

import fcntl
import glob
import json
import os
import shutil

import pytest

from replibench import results
from replibench.config import load_experiment
from replibench.errors import UserError
from replibench.harness import workdir as workdir_lib
from replibench.harness.loop import run_experiment
from tests import helpers

CONFIG = "configs/resnet/fashion_mnist.gin"
# Reaches its (zero) target at the first evaluation, step 3 of 5.
REACHING = [*helpers.TINY[CONFIG], "Experiment.target = 0.0", "Experiment.eval_every_epochs = 0.3"]


def _run(workdir, bindings=(), max_steps=None):
  experiment = load_experiment([os.path.join(helpers.REPO, CONFIG)],
                               [*helpers.TINY[CONFIG], *bindings])
  return run_experiment(experiment, str(workdir), max_steps=max_steps)


def _checkpoints(workdir) -> list[str]:
  return sorted(glob.glob(os.path.join(workdir, "checkpoints", "ckpt-*.index")))


EVERY_STEP = ["Experiment.checkpoint_every_epochs = 0.1"]   # One checkpoint per step.


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
  """Workdirs left by short runs, each made once for the tests that damage or resume a
  copy of it (a run is mostly tracing, the same in each test):
  'steps_2': 2 of 5 steps; 'every_step_2', 'every_step_3': 2, then 3 steps, with a
  checkpoint every step (ckpt-1, ckpt-2; then ckpt-2, ckpt-3: the manager keeps two)."""
  made = {name: tmp_path_factory.mktemp(name)
          for name in ("steps_2", "every_step_2", "every_step_3")}
  _run(made["steps_2"], max_steps=2)
  _run(made["every_step_2"], EVERY_STEP, max_steps=2)
  shutil.copytree(made["every_step_2"], made["every_step_3"], dirs_exist_ok=True)
  _run(made["every_step_3"], EVERY_STEP, max_steps=3)
  return made


def _copy(workdirs, name: str, to):
  """A copy of the module's workdir `name` at `to` (checkpoint state paths are relative)."""
  shutil.copytree(workdirs[name], to, dirs_exist_ok=True)
  return to


def test_a_run_killed_after_its_final_checkpoint_only_writes_its_result(tmp_path):
  first = _run(tmp_path, REACHING[len(helpers.TINY[CONFIG]):])
  assert first.status == "reached" and first.steps_to_target == 3
  # The kill window: the final checkpoint is saved, result.json is not.
  os.remove(tmp_path / "result.json")
  again = _run(tmp_path, REACHING[len(helpers.TINY[CONFIG]):])
  assert (again.status, again.steps_to_target, again.final_step) == ("reached", 3, 3)
  assert again.time_to_target_s == first.time_to_target_s and again.curve == first.curve
  # A result.json that says failed (close() raised after the last save) is the same case.
  results.write(str(tmp_path), results.RunResult.from_dict(
      {**again.to_dict(), "status": "failed", "error": "OSError: in close()"}))
  third = _run(tmp_path, REACHING[len(helpers.TINY[CONFIG]):])
  assert (third.status, third.steps_to_target, third.final_step) == ("reached", 3, 3)


def test_a_resumed_run_records_its_sessions(tmp_path, workdirs):
  result = _run(_copy(workdirs, "steps_2", tmp_path))
  assert result.resumed == 1 and [s["start_step"] for s in result.sessions] == [0, 2]
  assert result.sessions[0]["end_step"] == 2 and result.sessions[1]["end_step"] == 5
  assert all(s["timed_s"] > 0 for s in result.sessions)
  assert abs(sum(s["timed_s"] for s in result.sessions) - result.total_s) < 0.01


def test_a_second_run_on_a_locked_workdir_is_refused_and_a_stale_lock_is_not(tmp_path):
  tmp_path.mkdir(exist_ok=True)
  with open(tmp_path / workdir_lib.LOCK_FILE, "w") as holder:
    holder.write("pid 424242")
    holder.flush()
    fcntl.flock(holder, fcntl.LOCK_EX)
    with pytest.raises(UserError, match="in use by a run that is still going.*424242"):
      _run(tmp_path, max_steps=1)
  assert not (tmp_path / "result.json").exists()
  # The holder is gone (as after a SIGKILL): its lock file stays but no longer blocks.
  assert _run(tmp_path, max_steps=1).final_step == 1


def _truncate(path: str, keep: int = 10) -> None:
  with open(path, "r+b") as f:
    f.truncate(keep)


def _flip_bytes(path: str) -> None:
  with open(path, "r+b") as f:
    data = bytearray(f.read())
    for i in range(len(data) // 2, min(len(data), len(data) // 2 + 64)):
      data[i] ^= 0xFF
    f.seek(0)
    f.write(data)


@pytest.mark.parametrize("damage", [
    lambda prefix: _truncate(glob.glob(prefix + ".data-*")[0]),
    lambda prefix: _truncate(prefix + ".index"),
    lambda prefix: _flip_bytes(glob.glob(prefix + ".data-*")[0]),
])
def test_a_corrupt_checkpoint_falls_back_to_the_previous_one(tmp_path, workdirs, damage):
  _copy(workdirs, "every_step_3", tmp_path)   # Runs of 2, then 3 steps.
  assert [os.path.basename(p) for p in _checkpoints(tmp_path)] == ["ckpt-2.index", "ckpt-3.index"]
  damage(_checkpoints(tmp_path)[-1][:-len(".index")])
  result = _run(tmp_path, EVERY_STEP, max_steps=4)
  assert result.final_step == 4
  assert result.sessions[-1]["start_step"] == 2            # Resumed from the older one.
  assert os.listdir(tmp_path / "checkpoints" / "corrupt")  # The bad one set aside.


def test_when_every_checkpoint_is_corrupt_the_error_names_them(tmp_path, workdirs):
  _copy(workdirs, "every_step_2", tmp_path)
  for index in _checkpoints(tmp_path):
    _truncate(index)
  with pytest.raises(UserError, match=r"Every checkpoint in .*checkpoints is unreadable: .*ckpt-2"):
    _run(tmp_path)


def test_a_config_change_is_not_blamed_on_corruption(tmp_path, workdirs):
  _copy(workdirs, "steps_2", tmp_path)
  with pytest.raises(UserError, match="does not match this config"):
    _run(tmp_path, ["small_resnet.widths = (4, 8, 16)"])


@pytest.mark.parametrize("name,content", [
    ("checkpoints/checkpoint", b"\x00\xffnot a checkpoint state\x01"),
    ("result.json", b"\x89PNG garbage"),
    ("result.json", b"[1, 2, 3]"),
])
def test_garbage_state_files_are_survived(tmp_path, workdirs, name, content):
  _copy(workdirs, "steps_2", tmp_path)
  with open(tmp_path / name, "wb") as f:
    f.write(content)
  assert _run(tmp_path, max_steps=3).final_step == 3


def test_report_names_a_garbage_result_file(tmp_path):
  trial = tmp_path / "sweep" / "a" / "seed=1"
  trial.mkdir(parents=True)
  (trial / "result.json").write_text('{"status": "reached"')
  from replibench.suite import build_report   # pylint: disable=import-outside-toplevel
  with pytest.raises(UserError, match=r"result\.json is not valid JSON"):
    build_report(str(tmp_path / "sweep"))


@pytest.mark.parametrize("bindings,culprit", [
    (["Experiment.target = 1.5"], "Experiment.target"),
    (["Experiment.target = -1.0"], "Experiment.target"),
    (["Experiment.target = 1e999"], "Experiment.target"),
    (["Experiment.checkpoint_every_epochs = 0"], "checkpoint_every_epochs"),
    (["Experiment.checkpoint_every_epochs = -1.0"], "checkpoint_every_epochs"),
    (["Experiment.steps_per_call = 0"], "steps_per_call"),
    (["Experiment.log_every_steps = 0"], "log_every_steps"),
    (["Experiment.intra_op_threads = -1"], "intra_op_threads"),
    (["Experiment.inter_op_threads = 1.5"], "inter_op_threads"),
    (["FashionMNIST.num_train_examples = -5"], "num_train_examples"),
    (["small_resnet.widths = 'abc'"], "does not build"),
])
def test_plan_and_run_reject_the_same_bad_values(bindings, culprit, tmp_path):
  from replibench.config.plan import make_plan  # pylint: disable=import-outside-toplevel
  files = [os.path.join(helpers.REPO, CONFIG)]
  with pytest.raises(UserError, match=culprit):
    make_plan(load_experiment(files, [*helpers.TINY[CONFIG], *bindings]))
  with pytest.raises(UserError, match=culprit):
    _run(tmp_path / "run", bindings)
  assert not (tmp_path / "run").exists()   # Nothing written, not even the directory.


def test_a_user_error_in_an_existing_workdir_leaves_its_files_alone(tmp_path, workdirs):
  first = results.read(str(_copy(workdirs, "steps_2", tmp_path)))
  before = sorted(os.listdir(tmp_path))
  with pytest.raises(UserError):
    _run(tmp_path, ["small_resnet.widths = (4, 8, 16)"])
  assert sorted(os.listdir(tmp_path)) == before
  assert results.read(str(tmp_path)).to_dict() == json.loads(json.dumps(first.to_dict()))


def test_workdir_that_is_a_file_or_cannot_be_made_is_a_user_error(tmp_path):
  (tmp_path / "file").write_text("x")
  with pytest.raises(UserError, match="is a file"):
    _run(tmp_path / "file")
  with pytest.raises(UserError, match="workdir"):
    _run("/proc/replibench-cannot-exist/run")
