"""Atomic file writes, so a reader never sees half a result, report or manifest."""

import contextlib
import json
import os
import uuid
from typing import Any, Callable, IO, Iterator


@contextlib.contextmanager
def atomic_path(path: str, suffix: str = "") -> Iterator[str]:
  """Yields a fresh temp path beside path; renames the file there over path on success.

  For writers that take a file name rather than a file object: suffix ends the
  temp name, for writers that check it (Keras' save_weights wants
  '.weights.h5'). If the block raises, the temp file is removed and path is
  left as it was.
  """
  directory = os.path.dirname(os.path.abspath(path))
  os.makedirs(directory, exist_ok=True)
  # The name carries no part of path, so TensorBoard never mistakes it for an
  # event file; a fresh uuid keeps concurrent writers of one path apart.
  tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}{suffix}")
  try:
    yield tmp
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def write_atomic(path: str, write: Callable[[IO[bytes]], None]) -> None:
  """Calls write(f) on a temp file beside path, then renames it over path."""
  # open() rather than mkstemp so the file gets the usual umask permissions.
  with atomic_path(path) as tmp, open(tmp, "xb") as f:
    write(f)


def write_text(path: str, text: str) -> None:
  write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def write_json(path: str, data: Any) -> None:
  write_text(path, json.dumps(data, indent=2, sort_keys=False, default=_jsonable) + "\n")


def read_json(path: str, default: Any = None) -> Any:
  if not os.path.exists(path):
    return default
  with open(path) as f:
    return json.load(f)


def _jsonable(value):
  if hasattr(value, "tolist"):   # numpy scalars and arrays
    return value.tolist()
  raise TypeError(f"{type(value).__name__} is not JSON serialisable")
