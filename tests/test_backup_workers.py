"""regimes.BackupPS (engine/regimes/backup_ps.py, run by engine/ps/backup.py): synchronous
training with backup workers on parameter servers, and regimes.Stragglers
(engine/regimes/stragglers.py), the injected
slowdowns that make its benefit measurable on one machine."""

import os

import numpy as np
import pytest
import tensorflow as tf

from replibench import engine
from replibench.config import load_experiment
from replibench.engine import ps, regimes
from replibench.engine.regimes import stragglers as stragglers_lib
from replibench.errors import UserError
from tests import helpers, inprocess_cli
from tests import test_async_ps as async_ps_test
from tests.test_async_ps import _assert_close_to_scale, _cluster, _flags, _variables

RESNET, GAN = "configs/resnet/fashion_mnist.gin", "configs/sngan/fashion_mnist.gin"
BACKUP = "configs/topology/backup.gin"
# Batch norm per replica on both sides of the equivalence: a worker slot's statistics
# are those of its shard, as a replica's are in a synchronous step on 2 replicas.
PER_REPLICA_BN = "small_resnet.norm_layer = @engine.per_replica_batch_norm"


def _launch(workers: int, flags: list[str], workdir) -> list[str]:
  return async_ps_test._launch(workers, flags, workdir, topology=BACKUP)


def _load(config: str, *bindings: str):
  return load_experiment([os.path.join(helpers.REPO, config), os.path.join(helpers.REPO, BACKUP)],
                         [*helpers.TINY[config], *bindings])


def _trainable_and_slots(workdir) -> dict:
  """The checkpoint's model and optimizer variables but batch norm's moving statistics
  (written by each worker slot's forward pass, in the order the workers run: they do
  not enter the gradients)."""
  return {k: v for k, v in _variables(workdir).items() if "moving_" not in k}


def test_no_backup_workers_trains_exactly_like_sync(tmp_path):
  """b = 0 of 2 workers is synchronous training: after two steps the variables and
  the optimizer's slots equal those of Sync on 2 replicas at the same global batch.

  Sync on 2 logical replicas, not on 1: both then train on the same per-replica
  batches (one pipeline's stream for 2 replicas, each batch augmented with its own
  seed) with batch statistics over each half, which is what slot k of a BackupPS
  step computes on shard k of the global batch, whichever worker runs it. The sum of
  the two slots' gradients is then Sync's all-reduced gradient, and b = 0 applies it
  unscaled. Tolerance: float32 round-off in different processes (as
  test_async_ps's W = 1 test: ~1e-6 of each tensor's scale after two steps)."""
  flags = _flags(RESNET, "ImageClassification.warmup_epochs = 0", PER_REPLICA_BN)
  sync, backup = async_ps_test._beside_sync(  # pylint: disable=protected-access
      tmp_path, flags, 2, "backup", local=["--gin_file=configs/topology/local2.gin"],
      topology=BACKUP)
  assert (backup.num_workers, backup.num_replicas) == (2, 2)
  assert sync.final_step == backup.final_step == 2
  assert backup.hparams["regime_setting"] == "backup_ps(backup_workers=0)"
  assert backup.hparams["backup_workers"] == 0
  _assert_close_to_scale(_trainable_and_slots(tmp_path / "backup"),
                         _trainable_and_slots(tmp_path / "sync"), rtol=2e-5)
  # One optimizer step per step, as Sync: the schedule and the slots see 2.
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path / "backup" /
                                                                   "checkpoints")))
  assert reader.get_tensor("optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE") == 2


def test_one_backup_of_two_drops_the_always_slow_worker(tmp_path):
  """b = 1 of 2 with worker 1 slowed on every update: each step takes the first
  gradient, worker 1's closures are dropped (stale, or late), and the run ends."""
  run = helpers.cli(*_launch(2, _flags(
      RESNET, "regimes.BackupPS.backup_workers = 1",
      "regimes.BackupPS.stragglers = @regimes.Stragglers()", "regimes.Stragglers.fraction = 1.0",
      "regimes.Stragglers.delay_ms = 200", "regimes.Stragglers.workers = (1,)"), tmp_path))
  assert run.returncode == 0, helpers.failure_report(run)
  result = helpers.result(tmp_path)
  assert result.status == "budget_exhausted" and result.final_step == 5
  assert np.isfinite(result.final_metric) and result.num_workers == 2
  assert result.hparams["regime_setting"] == "backup_ps(backup_workers=1, stragglers=1x200ms@1)"
  assert (result.hparams["backup_workers"], result.hparams["straggler_fraction"],
          result.hparams["straggler_workers"]) == (1, 1.0, "1")
  events = helpers.event_tags(tmp_path)
  values = lambda tag: [float(tf.make_ndarray(v)) for _, v in events[tag]]  # noqa: E731
  assert all(np.isfinite(values("train/loss")))
  # Counted as the dropped closures run, so a step's count may land in a later one;
  # over the run, at most one per step (b) and at least one.
  dropped, late = values("train/regime/dropped"), values("train/regime/late")
  assert len(dropped) == 5 and 1 <= sum(dropped) <= 5 and 0 <= sum(late) <= sum(dropped)
  # Per worker slot and step, the taken gradient and the late ones reach the ps: from
  # half Sync's per-replica payload (1 of 2 slots) to all of it.
  bytes_sent, late_ones = values("train/regime/bytes_communicated"), values("train/regime/late")
  half = [b / (1 + late) for b, late in zip(bytes_sent, late_ones)]
  assert half[0] > 0 and np.allclose(half, half[0])
  assert result.regime_metrics["regime/dropped"] > 0


@pytest.mark.parametrize("bindings,culprit", [
    (["regimes.BackupPS.backup_workers = 2"],
     r"regimes.BackupPS.backup_workers = 2 with 2 worker\(s\).*at most 1"),
    (["regimes.BackupPS.backup_workers = -1"], r"regimes.BackupPS.backup_workers must be"),
    (["regimes.BackupPS.stragglers = @regimes.Stragglers()", "regimes.Stragglers.fraction = -0.1"],
     r"regimes.Stragglers.fraction must be a probability in \[0, 1\]"),
    (["regimes.BackupPS.stragglers = @regimes.Stragglers()", "regimes.Stragglers.fraction = 1.5"],
     r"regimes.Stragglers.fraction"),
    (["regimes.BackupPS.stragglers = @regimes.Stragglers()", "regimes.Stragglers.delay_ms = -5"],
     r"regimes.Stragglers.delay_ms must be"),
    (["regimes.AsyncPS.stragglers = @regimes.Stragglers()", "Experiment.regime = @regimes.AsyncPS()",
      "regimes.Stragglers.workers = ('a',)"], r"regimes.Stragglers.workers must be"),
])
def test_bad_bindings_are_user_errors_naming_the_binding(bindings, culprit):
  with pytest.raises(UserError, match=culprit):
    _load(RESNET, *bindings)


def test_bad_bindings_exit_2_through_the_cli(tmp_path, capsys):
  for bindings, culprit in [
      (["regimes.BackupPS.backup_workers = 2"], "regimes.BackupPS.backup_workers = 2"),
      (["regimes.BackupPS.stragglers = @regimes.Stragglers()",
        "regimes.Stragglers.fraction = -0.1"], "regimes.Stragglers.fraction")]:
    run = inprocess_cli.cli(capsys, "run", *_flags(RESNET, *bindings), f"--gin_file={BACKUP}",
                            f"--workdir={tmp_path / 'run'}")
    assert run.returncode == 2 and culprit in run.stderr, run.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_two_optimizer_steps_a_step_are_refused(capsys):
  """The GAN's discriminator and generator steps: `plan` (and `run`) refuse them."""
  run = inprocess_cli.cli(capsys, "plan", *_flags(GAN), f"--gin_file={BACKUP}")
  assert run.returncode == 2, run.stderr[-2000:]
  assert "Experiment.regime = @regimes.BackupPS()" in run.stderr
  assert "more than one optimizer" in run.stderr


def test_d4pg_is_refused_like_under_async_ps():
  config = "configs/d4pg/cartpole_swingup.gin"
  with pytest.raises(UserError, match="replay buffer.*BackupPS"):
    _load(config)


def test_backups_are_checked_against_tf_config_before_connecting(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", _cluster(chief=1, worker=3, ps=1))
  with pytest.raises(UserError, match=r"backup_workers = 3 with 3 worker\(s\) \(in TF_CONFIG\)"):
    ps.BackupReplicator(engine.MultiWorker(ps=1), regimes.BackupPS(backup_workers=3))
  with pytest.raises(UserError, match=r"Stragglers.workers = \(5,\) names worker"):
    ps.BackupReplicator(engine.MultiWorker(ps=1), regimes.BackupPS(
        backup_workers=1, stragglers=regimes.Stragglers(fraction=0.5, delay_ms=10, workers=(5,))))


def test_a_local_topology_is_a_user_error():
  with pytest.raises(UserError, match=r"@regimes.BackupPS\(\) needs Experiment.topology"):
    load_experiment([os.path.join(helpers.REPO, RESNET)],
                    [*helpers.TINY[RESNET], "Experiment.regime = @regimes.BackupPS()"])


def test_straggler_draw_is_reproducible_and_has_the_requested_fraction():
  updates = tf.range(4000, dtype=tf.int64)
  draw = lambda seed, worker, fraction: tf.vectorized_map(  # noqa: E731
      lambda u: stragglers_lib.slowed(seed, worker, u, fraction), updates).numpy()
  first = draw(7, 1, 0.2)
  assert np.array_equal(first, draw(7, 1, 0.2))                 # Reproducible.
  assert abs(first.mean() - 0.2) < 0.03                         # The fraction (4000 draws).
  assert not np.array_equal(first, draw(8, 1, 0.2))             # The seed matters,
  assert not np.array_equal(first, draw(7, 2, 0.2))             # and the worker.
  assert not draw(7, 1, 0.0).any() and draw(7, 1, 1.0).all()
  # One draw at a time (in a graph or eagerly) is the same draw.
  assert bool(stragglers_lib.slowed(7, 1, tf.constant(5, tf.int64), 0.2)) == first[5]


def test_straggler_delay_is_drawn_per_worker_and_slept_in_the_graph():
  only_1 = regimes.Stragglers(fraction=1.0, delay_ms=2.5, workers=(1,))
  assert int(only_1.delay_us(1, 3)) == 2500 and int(only_1.delay_us(0, 3)) == 0
  assert int(regimes.Stragglers(fraction=0.0, delay_ms=100).delay_us(1, 3)) == 0
  assert not regimes.Stragglers(fraction=0.5).active          # delay_ms = 0: nothing to inject.

  @tf.function
  def slowed_identity(x):
    return only_1.delay(tf.constant(1, tf.int64), tf.constant(0, tf.int64), [x, None])

  x = tf.constant([1.0, 2.0])
  out = slowed_identity(x)
  assert out[1] is None and np.array_equal(out[0].numpy(), x.numpy())
  graph = slowed_identity.get_concrete_function(x).graph
  assert "SleepDataset" in {op.type for op in graph.get_operations()}


def test_settings_tell_the_regimes_apart():
  stragglers = regimes.Stragglers(fraction=0.25, delay_ms=150, seed=3)
  assert regimes.BackupPS(backup_workers=1).setting() == "backup_ps(backup_workers=1)"
  backup = regimes.BackupPS(backup_workers=1, stragglers=stragglers)
  assert backup.setting() == "backup_ps(backup_workers=1, stragglers=0.25x150ms@all)"
  assert backup.hparams() == {"regime": "backup_ps", "backup_workers": 1,
                              "straggler_fraction": 0.25, "straggler_delay_ms": 150.0,
                              "straggler_workers": "all", "straggler_seed": 3}
  assert regimes.AsyncPS(stragglers=stragglers).setting() == "async_ps(stragglers=0.25x150ms@all)"
  assert regimes.AsyncPS().hparams() == {"regime": "async_ps"}
  # Bytes per worker slot and step: N - b of N slots push their gradients.
  assert regimes.BackupPS(backup_workers=1).wire_bytes([100], 4) == 4.0 * 100 * 3 / 4
  assert regimes.BackupPS(backup_workers=0).wire_bytes([100], 4) == 400.0
