"""The scalars a regime reports for one training step: what apply_gradients returns.

A regime's apply_gradients returns a StepMetrics; the workload's step_fn returns
it among its outputs (`{"loss": loss, **metrics}`), and the replicator averages
it over replicas and steps with the other outputs. Nothing is left on the regime
for anyone to read back. A step that applies gradients several times (a GAN's
discriminator and generator updates) adds the calls' metrics: `d + g`.

Some metrics are derived from sums (a compression ratio from bytes, a distance
from its square): a StepMetrics keeps the sums and reports the derived values,
so that two calls add their sums, not their ratios.
"""

import tensorflow as tf


class StepMetrics(dict):
  """{name: float32 scalar tensor} a regime reports for a step (names 'regime/...').

  sums: {name: scalar} (or (name, scalar) pairs) that add up over a step's
  apply_gradients calls.
  derived: {name: (fn(sums) -> scalar, the names of the sums it replaces)}.
  The dict's own items are what the step reports: the sums, with the replaced
  ones given as their derived values.
  """

  def __init__(self, sums: dict | None = None, derived: dict | None = None):
    self.sums = {k: _float32(v) for k, v in dict(sums or {}).items()}
    self.derived = dict(derived or {})
    replaced = {n for _, names in self.derived.values() for n in names}
    super().__init__({k: v for k, v in self.sums.items() if k not in replaced})
    for name, (fn, names) in self.derived.items():
      if all(n in self.sums for n in names):
        self[name] = fn(self.sums)

  def __add__(self, other: "StepMetrics") -> "StepMetrics":
    if not isinstance(other, StepMetrics):
      return NotImplemented
    sums = dict(self.sums)
    for name, value in other.sums.items():
      sums[name] = sums[name] + value if name in sums else value
    return StepMetrics(sums, {**self.derived, **other.derived})

  def __radd__(self, other):
    return self if isinstance(other, int) and other == 0 else NotImplemented   # sum([...])


def _float32(value):
  """A scalar as a float32 tensor. Anything else is kept: tf.distribute and tf.nest
  rebuild a StepMetrics a replica step returns from other values (type(d)(items))."""
  return tf.cast(value, tf.float32) if isinstance(value, (int, float, tf.Tensor)) else value
