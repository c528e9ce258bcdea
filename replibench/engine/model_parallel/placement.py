"""Where a mesh's variables live: pipeline stages placed, every variable recorded.

The pipeline's strategy mirrors each variable over the D replicas' first devices
(d, 0). A stage's variables belong on (d, k): `StagePlacement` is a variable
creator below the strategy's own (the strategy places component d on (d, 0), then
this creator moves it to (d, k) while a stage is being placed), and `relocate` makes
each of a stage's variables again there, with its value, in place of the first:
layers and optimizers keep the same Keras variables (internals.rebind_keras_variable).
The optimizer's slots, made afterwards beside their variables, follow.

`Recorder` (a creator inside the strategy's scope) keeps a weak reference to every
variable a replicator's scope makes, so that each device's bytes are read from
where the variables are (`device_bytes`), split into parameters (trainable),
optimizer state (made beside a variable: Keras' slots) and other state.
"""

import collections
import contextlib
import threading
import weakref

import numpy as np
import tensorflow as tf

from replibench import internals

PARAMETERS, OPTIMIZER, OTHER = "parameters", "optimizer", "other"

_STAGE = threading.local()


class StagePlacement:
  """A creator below the strategy's: component on (d, 0) -> (d, stage) while placing."""

  def __init__(self, leads: list[str], grid: list[list[str]]):
    self._row = {internals.canonical_device(lead): row for lead, row in zip(leads, grid)}

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


class Recorder:
  """A creator inside the strategy's scope recording what each variable is."""

  def __init__(self):
    self._made: list = []   # [(weakref to the variable, category)]

  def __call__(self, next_creator, **kwargs):
    trainable = kwargs.get("trainable")
    if trainable is None:   # tf.Variable's default.
      trainable = kwargs.get("synchronization") != tf.VariableSynchronization.ON_READ
    if kwargs.get("colocate_with") is not None:
      category = OPTIMIZER
    else:
      category = PARAMETERS if trainable else OTHER
    variable = next_creator(**kwargs)
    self._made.append((weakref.ref(variable), category))
    return variable

  def device_bytes(self, strategy) -> dict[str, dict[str, int]]:
    """{device: {category: bytes}} of the live variables' components."""
    found: dict = collections.defaultdict(lambda: collections.Counter())
    for ref, category in self._made:
      variable = ref()
      if variable is None:
        continue
      for component in strategy.experimental_local_results(variable):
        size = int(np.prod(component.shape)) * component.dtype.size
        found[internals.canonical_device(component.device)][category] += size
    return {device: dict(counts) for device, counts in sorted(found.items())}
