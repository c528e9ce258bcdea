"""A model as a sequence of pieces: the points where it may be cut into pipeline stages.

A piece is a callable carry -> carry (carry: a tensor or a tuple of tensors, batch
first) together with the layers whose variables it uses. Running a model's pieces
one after another computes exactly its forward pass; where consecutive pieces are
grouped into stages, and on which devices those run, is for whoever runs them
(the models know nothing of devices). Only the carry crosses a cut, so a cut lies
where the forward pass narrows to it: after a residual block, not inside one.
"""

import dataclasses
from typing import Callable, Sequence

import keras


@dataclasses.dataclass(frozen=True)
class Piece:
  """fn(carry, training) -> carry, using the variables of `layers` only."""

  name: str
  fn: Callable
  layers: tuple

  def __call__(self, carry, training=None):
    return self.fn(carry, training)

  @property
  def variables(self) -> list:
    seen, out = set(), []
    for layer in self.layers:
      for v in layer.variables:
        if id(v) not in seen:
          seen.add(id(v))
          out.append(v)
    return out


def run(pieces: Sequence[Piece], carry, training=None):
  """The pieces applied in order: the model's forward pass."""
  for piece in pieces:
    carry = piece(carry, training)
  return carry


def functional_pieces(model: keras.Model, cuts: Sequence[str]) -> list[Piece]:
  """A single-input, single-output functional model cut after each named layer.

  Each piece is a functional sub-model from the previous cut's output to the next
  one's, sharing the model's layers (and so its variables). cuts: layer names in
  forward order, each an output through which all of the forward pass flows.
  """
  if len(model.inputs) != 1 or len(model.outputs) != 1:
    raise ValueError(f"functional_pieces: {model.name} has {len(model.inputs)} inputs and "
                     f"{len(model.outputs)} outputs; it cuts single-input, single-output models.")
  pieces, start = [], model.inputs[0]
  for i, cut in enumerate(list(cuts) + [None]):
    end = model.outputs[0] if cut is None else model.get_layer(cut).output
    sub = keras.Model(start, end, name=f"{model.name}_piece{i}")
    pieces.append(Piece(name=cut or "head", fn=_call_functional(sub), layers=(sub,)))
    start = end
  return pieces


def _call_functional(sub: keras.Model) -> Callable:
  return lambda carry, training: sub(carry, training=training)
