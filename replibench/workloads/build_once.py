"""One build of a workload's models per `replibench plan`.

The plan builds a workload's models for three readers: check_config (does the binding
build?), describe (parameters, FLOPs, tensor sizes) and the traced step (collectives).
Each reads the models' structure, never their weights, so inside `shared()` (make_plan)
the second and third get the first's models: a ResNet-50 is built once, not three
times (1.5 s a build). Outside the block, `built` builds every time, as training must.

Models are shared only between builds under the same precision policy and the same
model-parallel layout (a mesh's device share is another model), for the same workload.
"""

import contextlib
from typing import Callable, TypeVar

from replibench.engine.model_parallel import layout as layout_lib

T = TypeVar("T")

_SHARED: list[dict] = []   # The innermost shared() block's models, by key.


@contextlib.contextmanager
def shared():
  """Within the block, `built` returns the models it built before for the same key."""
  _SHARED.append({})
  try:
    yield
  finally:
    _SHARED.pop()


def built(workload, precision: str, make: Callable[[], T]) -> T:
  """make(), or inside shared() the models an earlier call made for this workload,
  precision policy (its name, e.g. 'float32') and active layout."""
  if not _SHARED:
    return make()
  layout = layout_lib.current()
  key = (id(workload), precision, id(layout))
  models = _SHARED[-1]
  if key not in models:
    # Stored only once built (a build that raises is retried), with the workload and
    # layout kept alive so that their ids are not reused within the block.
    models[key] = (workload, layout, make())
  return models[key][2]
