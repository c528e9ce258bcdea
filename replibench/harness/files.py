"""Writing run outputs so that a reader never sees half a file."""

import json
import os
import tempfile


def write_json_atomic(path: str, obj) -> None:
  """Writes obj as JSON to path via a temporary file and os.replace."""
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
  try:
    with os.fdopen(fd, "w") as f:
      json.dump(obj, f, indent=1, default=_jsonable)
      f.write("\n")
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def read_json(path: str, default=None):
  if not os.path.exists(path):
    return default
  with open(path) as f:
    return json.load(f)


def _jsonable(value):
  if hasattr(value, "item"):   # numpy scalars
    return value.item()
  if hasattr(value, "tolist"):
    return value.tolist()
  raise TypeError(f"{type(value).__name__} is not JSON serialisable")
