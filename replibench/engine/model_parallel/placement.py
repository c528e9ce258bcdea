"""Where a pipeline's variables live: each stage's on its own device of every replica.

The pipeline's strategy mirrors each variable over the D replicas' first devices
(d, 0) (with worker processes, each worker's strategy over its own replica's first).
A stage's variables belong on (d, k): `StagePlacement` is a variable creator below
the strategy's own (the strategy places component d on (d, 0), then
this creator moves it to (d, k) while a stage is being placed), and `relocate` makes
each of a stage's variables again there, with its value, in place of the first:
layers and optimizers keep the same Keras variables (internals.rebind_keras_variable).
The optimizer's slots, made afterwards beside their variables, follow.
"""

import contextlib
import threading

import tensorflow as tf

from replibench import internals

_STAGE = threading.local()


class StagePlacement:
  """A creator below the strategy's: component on (d, 0) -> (d, stage) while placing."""

  def __init__(self, rows: list[tuple]):
    """rows: each replica's devices, its first (where the strategy puts it) first."""
    self._row = {internals.canonical_device(row[0]): row for row in rows}

  def __call__(self, next_creator, **kwargs):
    stage = getattr(_STAGE, "k", None)
    if not stage:
      return next_creator(**kwargs)
    row = self._row.get(internals.current_device())
    if row is None:
      return next_creator(**kwargs)
    with tf.device(row[stage]):
      return next_creator(**kwargs)


@contextlib.contextmanager
def _placing(stage: int):
  _STAGE.k = stage
  try:
    yield
  finally:
    _STAGE.k = None


def relocate(variables: list, stage: int) -> None:
  """Makes each Keras variable anew on its replicas' stage-`stage` devices, with its value.

  Call under the replicator's scope (its strategy and StagePlacement)."""
  for variable in variables:
    old = variable.value
    with _placing(stage):
      new = tf.Variable(old.read_value(), trainable=old.trainable, name=variable.name,
                        aggregation=old.aggregation, synchronization=old.synchronization)
    internals.rebind_keras_variable(variable, new)

