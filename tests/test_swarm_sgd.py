"""SwarmSGD as a composition: LocalSGD's average through a Gossip graph, with a
quantized exchange (Compressed bits), against sync and its parts."""

import numpy as np
import pytest

from replibench.engine import regimes
from replibench.engine.regimes.stragglers import Stragglers
from replibench.errors import UserError
from tests.regime_runs import (LOOSE_CLIP, Run, assert_replicas_equal, assert_same_training)


def swarm(sync_every, graph, bits=None, report_consensus=True):
  compression = None if bits is None else regimes.Compressed(bits=bits)
  return regimes.LocalSGD(sync_every=sync_every, average=regimes.Gossip(
      graph=graph, compression=compression, report_consensus=report_consensus))


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("bits", [None, 32], ids=["float32", "bits32"])
def test_h1_complete_lossless_swarm_equals_sync(n, bits):
  reference = Run(regimes.Sync(), n, LOOSE_CLIP)
  reference.run()
  run = Run(swarm(1, regimes.Complete(), bits), n, LOOSE_CLIP)
  metrics = run.run()
  assert all(np.isfinite(m["loss"]) for m in metrics)
  assert_replicas_equal(run)
  assert_same_training(run, reference, exact=False)


def _kernels(run):
  return run.copies(run.model.layers[-1].kernel)


def test_swarm_mixes_pairs_every_h_steps_only():
  run = Run(swarm(2, regimes.RandomMatching(seed=3), bits=8), 4)
  state = sum(v.numpy().size for v in run.model.trainable_variables) * 2   # + momenta
  sent = []
  for _ in range(4):
    metrics = run.train()
    sent.append(metrics["regime/bytes_communicated"])
    assert metrics["regime/consensus_distance"] > 0
  # Quantized copies: 8-bit levels packed 7 to an int64 word (9-bit fields) per
  # partner, plus a [2, T] float32 scale table; nothing between averages.
  tensors = 2 * len(run.model.trainable_variables)
  words = -(-state // 7)
  assert sent == [0, 8 * words + 8 * tensors, 0, 8 * words + 8 * tensors]
  assert sent[1] < 0.3 * 4 * state


def test_swarm_pairs_average_and_keep_the_mean_in_expectation():
  """After one averaging, partners hold (x_i + Q(x_j)) / 2: close to their pair mean,
  not to the others'; float32 copies make that exact and keep the mean."""
  exact = Run(swarm(1, regimes.RandomMatching(seed=5)), 4)
  quantized = Run(swarm(1, regimes.RandomMatching(seed=5), bits=8), 4)
  local = Run(regimes.LocalSGD(sync_every=1000), 4)   # The same local steps, no mixing.
  for run in (exact, quantized, local):
    run.train()
  before = np.array(_kernels(local))
  mixed, rounded = np.array(_kernels(exact)), np.array(_kernels(quantized))
  np.testing.assert_allclose(mixed.mean(0), before.mean(0), rtol=1e-5, atol=1e-6)
  partners = [int(np.argmin([np.abs(mixed[i] - (before[i] + before[j]) / 2).max()
                             for j in range(4)])) for i in range(4)]
  assert all(partners[partners[i]] == i != partners[i] for i in range(4)), partners
  np.testing.assert_allclose(mixed[0], mixed[partners[0]], rtol=1e-6)
  # 8 bits on a grid of the pair's max |x|: each entry within one grid step.
  grid = 2 * np.abs(before).max() / 255
  assert np.abs(rounded - mixed).max() <= grid / 2 + 1e-6
  assert np.abs(rounded - mixed).max() > 0


def test_swarm_settings_name_their_parts():
  regime = swarm(4, regimes.RandomMatching(), bits=8)
  assert regime.setting() == "local_sgd(sync_every=4, average=gossip(graph=RandomMatching, bits=8))"
  assert regime.hparams() == {"regime": "local_sgd", "sync_every": 4, "average": "gossip",
                              "graph": "RandomMatching", "gossip_seed": 0, "bits": 8}
  # Per step on average: a quantized copy to one partner every 4 steps.
  sizes = [1000, 10]
  per_copy = 8 * -(-1010 // 7) + 8 * 2
  assert regime.wire_bytes(sizes, 4) == pytest.approx(per_copy / 4)


@pytest.mark.parametrize("make", [
    lambda: regimes.LocalSGD(average=regimes.Ring()),
    lambda: regimes.Gossip(compression=regimes.Compressed(top_k=0.1)),
    lambda: swarm(2, regimes.Complete(), bits=8)])
def test_compositions_that_cannot_work_are_user_errors(make):
  with pytest.raises(UserError, match="regimes\\.(LocalSGD|Gossip)"):
    make()


def test_stragglers_slow_replicas_without_changing_the_math():
  """regimes.LocalSGD.stragglers: a slowed replica sleeps before it applies its step
  (engine/regimes/stragglers.py), so it reaches its pair exchange late; what it computes is
  unchanged: 3 steps of SwarmSGD with replica 1 slowed on every step match 3 steps
  without, bit for bit, and the setting names the slowdown."""
  slow = Stragglers(fraction=1.0, delay_ms=1.0, workers=(1,))
  slowed = regimes.LocalSGD(sync_every=2, stragglers=slow, average=regimes.Gossip(
      graph=regimes.RandomMatching(seed=3)))
  runs = [Run(slowed, 4), Run(swarm(2, regimes.RandomMatching(seed=3)), 4)]
  for run in runs:
    for _ in range(3):
      run.train()
  for v, ref in zip(runs[0].variables(), runs[1].variables()):
    np.testing.assert_array_equal(runs[0].copies(v), runs[1].copies(ref), err_msg=v.path)
  assert slowed.setting().endswith(", stragglers=1x1ms@1)")
  assert slowed.hparams()["straggler_workers"] == "1"
  with pytest.raises(UserError, match="regimes.LocalSGD.stragglers must be"):
    regimes.LocalSGD(stragglers="slow")
