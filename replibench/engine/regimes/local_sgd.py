"""Local SGD: replicas step alone and average their parameters every H steps.

Each replica applies its own batch's gradient to its own copy of the
parameters (and of the optimizer's slots); after every `sync_every`-th
optimizer step the copies are replaced by their mean with one all-reduce.
With sync_every = 1 and an optimizer linear in the gradient (SGD, with or
without momentum or Nesterov) this is synchronous training: the mean of the
replicas' local updates is the update of the mean gradient. With Adam (the
update is nonlinear in the gradient) or with clipping that binds (each local
step clips its own gradient) H = 1 is close to, not equal to, sync.

Checkpoints and evaluation between two averaging steps see replica 0's copy
(MirroredVariable reads in cross-replica context) and each replica's own copy
respectively.
"""

import gin
import tensorflow as tf

from replibench.engine import collectives
from replibench.engine.measure import communication
from replibench.engine.regimes import replica_state
from replibench.engine.regimes.gossip import Gossip
from replibench.engine.regimes.base import STATE, Regime
from replibench.engine.regimes.step_metrics import StepMetrics
from replibench.engine.regimes import stragglers as stragglers_lib
from replibench.engine.regimes.stragglers import Stragglers
from replibench.errors import UserError
from replibench.inputs import shown


@gin.configurable(module="regimes")
class LocalSGD(Regime):
  """Local steps on every replica; parameters and slots averaged every sync_every steps.

  average: None, the mean of all replicas in one all-reduce; or a
  @regimes.Gossip(), whose graph (and compression) mixes the copies instead:
  with @regimes.RandomMatching() and Compressed bits, SwarmSGD.
  stragglers: None, or @regimes.Stragglers(): slowed replica steps (engine/regimes/stragglers.py).
  """

  name = "local_sgd"
  exchanges = STATE

  def __init__(self, sync_every: int = 8, average: Gossip | None = None,
               stragglers: Stragglers | None = None):
    if not isinstance(sync_every, int) or isinstance(sync_every, bool) or sync_every < 1:
      raise UserError(
          f"regimes.LocalSGD.sync_every must be a positive integer (optimizer steps between "
          f"parameter averages; 1 is synchronous training), got {shown(sync_every)}.")
    if average is not None and not isinstance(average, Gossip):
      raise UserError(
          f"regimes.LocalSGD.average must be None (the mean of all replicas) or "
          f"@regimes.Gossip() (its graph and compression mix the copies), got {shown(average)}.")
    if average is not None:
      average.check_every(sync_every, "regimes.LocalSGD.average")
    stragglers = stragglers_lib.checked(stragglers, "regimes.LocalSGD.stragglers")
    self.sync_every, self.average, self.stragglers = sync_every, average, stragglers

  def check(self, topology):
    if self.stragglers is not None:
      self.stragglers.check_workers(topology.num_replicas)

  def apply_gradients(self, optimizer, grads, variables):
    if self.stragglers is not None:   # A slowed replica applies (and exchanges) late.
      grads = self.stragglers.delay(collectives.replica_id(), optimizer.iterations, grads)
    replica_state.apply_local(optimizer, grads, variables)
    params = [v for g, v in zip(grads, variables) if g is not None]
    state = params + replica_state.optimizer_slots(optimizer)
    # optimizer.iterations counts the step just applied (read after its update).
    averaging = tf.equal(optimizer.iterations % self.sync_every, 0)
    if self.average is None:
      with communication.every(self.sync_every):   # The account counts it 1/H a step.
        replica_state.average_when(averaging, state)
      mixing = StepMetrics()
    else:
      mixing = self.average.average(state, len(params), optimizer.iterations,
                                    every=self.sync_every)
    # What each replica contributes to the exchange when it happens.
    sent = float(self.sync_every * self.wire_bytes(replica_state.state_sizes(state),
                                                   collectives.num_replicas()))
    return StepMetrics({"regime/bytes_communicated": tf.where(averaging, sent, 0.0)}) + mixing

  def wire_bytes(self, sizes, num_replicas):
    """Parameters and slots (or the gossip's copies of them), once every sync_every
    steps: per step on average."""
    once = (4.0 * sum(sizes) if self.average is None
            else self.average.wire_bytes(sizes, num_replicas))
    return once / self.sync_every

  def setting(self):
    average = "" if self.average is None else f", average={self.average.setting()}"
    stragglers = f", {self.stragglers.setting()}" if self.stragglers else ""
    return f"{self.name}(sync_every={self.sync_every}{average}{stragglers})"

  def hparams(self):
    mixing = {} if self.average is None else {
        k: v for k, v in self.average.hparams().items() if k != "regime"}
    return {"regime": self.name, "sync_every": self.sync_every,
            "average": "all_reduce" if self.average is None else "gossip", **mixing,
            **(self.stragglers.hparams() if self.stragglers else {})}
