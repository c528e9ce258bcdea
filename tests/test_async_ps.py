"""regimes.AsyncPS (engine/ps): asynchronous parameter-server training through `replibench launch`."""

import contextlib
import json
import os
import re
import resource
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from replibench import engine
from replibench.config import load_experiment
from replibench.engine import regimes
from replibench.engine import ps
from replibench.engine.regimes import async_ps
from replibench.errors import UserError
from replibench.harness.loop import run_experiment
from tests import helpers, inprocess_cli

RESNET, GAN = "configs/resnet/fashion_mnist.gin", "configs/sngan/fashion_mnist.gin"
PS = "configs/topology/ps.gin"


def _flags(config: str, *bindings: str) -> list[str]:
  return [f"--gin_file={config}",
          *(f"--gin_bindings={b}" for b in [*helpers.TINY[config], *bindings])]


def _launch(workers: int, flags: list[str], workdir, topology: str = PS) -> list[str]:
  return ["launch", f"--workers={workers}", "--ps=1", "--timeout=400", "--", "run", *flags,
          f"--gin_file={topology}", f"--gin_bindings=topology.MultiWorker.workers = {workers}",
          f"--workdir={workdir}"]


def _run_here(flags: list[str], workdir, max_steps: int) -> None:
  """What `replibench run FLAGS` does, in this process (no TensorFlow import to pay for):
  the launched run is what these tests check; Sync's reference is any run of it."""
  files = [os.path.join(helpers.REPO, f.removeprefix("--gin_file=")) for f in flags
           if f.startswith("--gin_file=")]
  bindings = [f.removeprefix("--gin_bindings=") for f in flags
              if f.startswith("--gin_bindings=")]
  assert len(files) + len(bindings) == len(flags), flags
  run_experiment(load_experiment(files, bindings), str(workdir), max_steps=max_steps)


def _beside_sync(tmp_path, flags: list[str], workers: int, name: str, local=(),
                 topology: str = PS) -> tuple:
  """Two steps of flags in one process (Sync; `local`: its topology flags) and launched
  on `workers` parameter-server workers (topology): (their results), both succeeded."""
  _run_here([*flags, *local], tmp_path / "sync", max_steps=2)
  launched = helpers.cli(*_launch(workers, flags + ["--max_steps=2"], tmp_path / name,
                                  topology=topology))
  assert launched.returncode == 0, helpers.failure_report(launched)
  return helpers.result(tmp_path / "sync"), helpers.result(tmp_path / name)


def _variables(workdir) -> dict:
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(workdir / "checkpoints")))
  return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map()
          if k.startswith(("model/", "optimizer/"))}


def _assert_close_to_scale(actual: dict, expected: dict, rtol: float) -> None:
  """Every tensor equal to within rtol of its own largest magnitude (float32 round-off
  in a sum is relative to the sum's terms, not to an entry that cancelled to near 0)."""
  assert actual.keys() == expected.keys() and len(expected) > 10
  for name, value in expected.items():
    scale = float(np.max(np.abs(value))) if value.size else 0.0
    np.testing.assert_allclose(actual[name], value, rtol=0, atol=rtol * scale + 1e-12,
                               err_msg=name)


def test_one_worker_trains_exactly_like_sync(tmp_path):
  """W = 1: one update of the whole global batch per step, as one synchronous replica.

  Two steps at full learning rate (no warmup), so both updates move the weights and
  the second reads a non-zero momentum slot. Sync on one replica and on one
  MultiWorker process are bit-identical; the async path is not, because its
  updates are TF's locking training kernels run on the ps, a different sequence
  of float32 roundings (~1e-7 of each tensor's scale after one step). Training
  amplifies such differences about tenfold per step: after the five steps this
  test used to run, one momentum entry that had cancelled to 5e-4 differed by
  2% and the test failed at rtol 1e-4 on AVX-512 machines. A real defect (a lost
  or doubled update, a wrong learning rate) moves every tensor by O(1) of its scale.
  """
  flags = _flags(RESNET, "ImageClassification.warmup_epochs = 0")
  a, b = _beside_sync(tmp_path, flags, 1, "async")
  assert (b.num_workers, b.num_replicas) == (1, 1)
  assert a.final_step == b.final_step == 2
  _assert_close_to_scale(_variables(tmp_path / "async"), _variables(tmp_path / "sync"),
                         rtol=2e-5)


def _launch_watching(args: list[str], react) -> tuple[int, str]:
  """Runs `replibench launch ARGS`, calling react(line, pids) on each line of its output
  (pids: {'chief 0': pid, ...} of the tasks started so far); returns (exit code, output)."""
  # No core files from the tasks a test kills on purpose (the limit is inherited).
  no_core = lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # noqa: E731
  proc = subprocess.Popen([sys.executable, "-m", "replibench.cli", *args], cwd=helpers.REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          preexec_fn=no_core)
  pids, lines = {}, []
  try:
    for line in proc.stdout:
      lines.append(line)
      if started := re.search(r"\[launch\] started (\w+ \d) \(pid (\d+)\)", line):
        pids[started.group(1)] = int(started.group(2))
      react(line, pids)
    return proc.wait(timeout=60), "".join(lines)
  finally:
    if proc.poll() is None:   # A failed test: let the launcher stop its cluster (SIGINT).
      with contextlib.suppress(KeyError, ProcessLookupError):
        os.kill(pids["chief 0"], signal.SIGCONT)
      proc.send_signal(signal.SIGINT)
      proc.wait(timeout=60)


def _launch_killing_worker_1(args: list[str]) -> tuple[int, str]:
  """At step 3 kills worker 1 and pauses the chief until the launcher's replacement
  serves, so the restart lands mid-run at any machine speed."""
  state = ["training"]

  def react(line, pids):
    if state[0] == "training" and line.startswith("[chief 0]") and "step 3/" in line:
      os.kill(pids["chief 0"], signal.SIGSTOP)
      os.kill(pids["worker 1"], signal.SIGKILL)
      state[0] = "paused"
    elif state[0] == "paused" and line.startswith("[worker 1]") and " serving at " in line:
      os.kill(pids["chief 0"], signal.SIGCONT)
      state[0] = "resumed"

  return _launch_watching(args, react)


def test_two_workers_train_to_the_end_through_a_worker_restart(tmp_path):
  code, output = _launch_killing_worker_1(_launch(
      2, _flags(RESNET, "Experiment.train_epochs = 1", "Experiment.eval_every_epochs = 0.5"),
      tmp_path))
  assert code == 0, output[-5000:]
  assert "[launch] worker 1 exited with code -9; restarting it (restart 1 of 3)" in output
  assert "Worker /job:worker/replica:0/task:1 has been recovered" in output, output[-5000:]
  result = helpers.result(tmp_path)
  assert result.status == "budget_exhausted"
  assert result.final_step == result.budget["total_steps"] == 10
  assert (result.num_workers, result.num_replicas) == (2, 2)
  assert result.scaling_kind == "worker_processes" and np.isfinite(result.final_metric)
  staleness = helpers.event_tags(tmp_path)["train/regime/staleness"]
  assert len(staleness) == 10
  # Per call, 2 updates: each sees at most the other (and a rerun of a killed one).
  assert all(0.0 <= float(tf.make_ndarray(v)) <= 2.0 for _, v in staleness)


def test_gan_trains_on_two_workers(tmp_path):
  run = helpers.cli(*_launch(2, _flags(GAN), tmp_path))
  assert run.returncode == 0, helpers.failure_report(run)
  result = helpers.result(tmp_path)
  assert result.status == "budget_exhausted" and result.final_step == 4
  assert np.isfinite(result.final_metric) and result.num_workers == 2
  events = helpers.event_tags(tmp_path)
  assert "train/regime/staleness" in events
  # It learns: the losses are live and the chief's evaluations see a moving generator.
  for tag in ("train/d_loss", "train/g_loss"):
    assert all(np.isfinite(tf.make_ndarray(v)) and tf.make_ndarray(v) != 0 for _, v in events[tag])
  fids = [float(tf.make_ndarray(v)) for _, v in events["eval/fid"]]
  assert len(fids) == 2 and fids[0] != fids[1]
  # Every worker update is counted (2 workers x 4 steps, n_dis = 1): Keras' own
  # read-then-assign increment lost counts between concurrent workers.
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path / "checkpoints")))
  for name in ("g_optimizer", "d_optimizer"):
    assert reader.get_tensor(f"{name}/_iterations/.ATTRIBUTES/VARIABLE_VALUE") == 8


def test_async_ps_on_a_local_topology_is_a_user_error(tmp_path, capsys):
  run = inprocess_cli.cli(capsys, "run", *_flags(RESNET, "Experiment.regime = @regimes.AsyncPS()"),
                          f"--workdir={tmp_path}")
  assert run.returncode == 2, run.stderr[-3000:]
  assert "Experiment.regime = @regimes.AsyncPS() needs Experiment.topology" in run.stderr
  assert not (tmp_path / "result.json").exists()


def test_d4pg_cannot_train_on_parameter_server_workers(tmp_path, capsys):
  # Refused when the config is loaded, so `plan` refuses it too and `run` writes nothing.
  config = "configs/d4pg/cartpole_swingup.gin"
  with pytest.raises(UserError, match="replay buffer.*AsyncPS"):
    load_experiment([os.path.join(helpers.REPO, config), os.path.join(helpers.REPO, PS)],
                    helpers.TINY[config])
  run = inprocess_cli.cli(capsys, "run", f"--gin_file={config}", f"--gin_file={PS}",
                          *(f"--gin_bindings={b}" for b in helpers.TINY[config]),
                          f"--workdir={tmp_path / 'run'}")
  assert run.returncode == 2 and "replay buffer" in run.stderr, run.stderr[-2000:]
  assert not (tmp_path / "run").exists()


def _cluster(**jobs) -> str:
  cluster = {job: [f"127.0.0.1:{1000 + i}" for i in range(n)] for job, n in jobs.items()}
  return json.dumps({"cluster": cluster, "task": {"type": "chief" if "chief" in jobs
                                                  else "worker", "index": 0}})


@pytest.mark.parametrize("tf_config,topology,culprit", [
    (_cluster(chief=1, worker=2), engine.MultiWorker(workers=2, ps=1), "one 'chief'.*'ps'"),
    (_cluster(worker=2, ps=1), engine.MultiWorker(workers=2, ps=1), "one 'chief'"),
    (_cluster(chief=1, worker=3, ps=1), engine.MultiWorker(workers=2, ps=1),
     "MultiWorker.workers = 2 but TF_CONFIG lists 3"),
    (_cluster(chief=1, worker=2, ps=1), engine.MultiWorker(workers=2, replicas_per_worker=2),
     "one replica per worker"),
])
def test_async_ps_checks_the_cluster_before_connecting(monkeypatch, tf_config, topology,
                                                        culprit):
  monkeypatch.setenv("TF_CONFIG", tf_config)
  with pytest.raises(UserError, match=culprit):
    ps.AsyncReplicator(topology, regimes.AsyncPS())


def test_synchronous_multiworker_rejects_parameter_servers(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", _cluster(chief=1, worker=2, ps=1))
  with pytest.raises(UserError, match="regimes.AsyncPS"):
    engine.MultiWorker().make_strategy()


def test_schedule_steps_are_harness_steps_of_w_updates():
  schedule = keras.optimizers.schedules.PiecewiseConstantDecay([0, 1], [1.0, 0.5, 0.25])
  per_step = async_ps._StepsOfUpdates(schedule, 2)   # pylint: disable=protected-access
  lrs = [float(per_step(tf.constant(u, tf.int64))) for u in range(6)]
  assert lrs == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]


def test_a_crashed_chief_restarts_the_cluster_and_resumes_from_its_checkpoint(tmp_path):
  """The coordinator failure of TF's parameter-server training: a chief that dies of a
  signal (here a SIGSEGV at step 7, after the step-5 checkpoint) is restarted with the
  whole cluster, and the run resumes from the checkpoint and ends exactly."""
  crashed = []

  def react(line, pids):
    if not crashed and line.startswith("[chief 0]") and "step 7/" in line:
      os.kill(pids["chief 0"], signal.SIGSEGV)
      crashed.append(pids["chief 0"])

  flags = _flags(RESNET, "Experiment.train_epochs = 1", "Experiment.eval_every_epochs = 0.5",
                 "Experiment.checkpoint_every_epochs = 0.5")
  code, output = _launch_watching(_launch(2, flags, tmp_path), react)
  assert code == 0 and crashed, output[-5000:]
  assert ("[launch] chief 0 crashed (SIGSEGV, code -11); restarting the cluster, the run "
          "resumes from its last checkpoint if any (restart 1 of 3)") in output
  result = helpers.result(tmp_path)
  assert result.status == "budget_exhausted" and result.final_step == 10
  assert result.resumed == 1 and [s["start_step"] for s in result.sessions] == [0, 5]
  assert [step for step, _, _ in result.curve] == [5, 10]
  # The restored counter went on from the checkpoint: 2 workers x 10 steps, none lost.
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path / "checkpoints")))
  assert reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE") == 20
