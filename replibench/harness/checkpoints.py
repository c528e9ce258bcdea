"""Checkpoints of a run: save, and restore falling back past corrupt ones.

A checkpoint that cannot be read (truncated .index or .data, flipped bytes: a
checksum or read error) is moved to checkpoints/corrupt/ with a warning and the
next older one is tried (CheckpointManager keeps two). A checkpoint that reads
but does not fit the model (missing objects, other shapes) is a config change:
a UserError, never a silent fresh start. Leftovers of a save that was killed
(`*_temp` directories) and of dead non-chief workers' scratch directories are
removed.

Non-chief workers of a MultiWorkerMirroredStrategy run must take part in every
save; they write to a scratch directory of their own and delete it.
"""

import glob
import os
import re
import shutil

import tensorflow as tf
from absl import logging

from replibench.errors import UserError

KEEP = 2
_NUMBER = re.compile(r"ckpt-(\d+)$")


class Checkpoints:
  """The run's checkpoints in workdir/checkpoints (scratch on non-chief workers)."""

  def __init__(self, checkpoint: tf.train.Checkpoint, workdir: str, chief: bool):
    self.checkpoint, self.chief = checkpoint, chief
    self.directory = os.path.join(workdir, "checkpoints")
    self._write_dir = (self.directory if chief
                       else os.path.join(workdir, f".scratch-{os.getpid()}"))
    if chief:
      _remove_leftovers(workdir, self.directory)
    self.manager = self._manager(checkpoint)

  def _manager(self, checkpoint) -> tf.train.CheckpointManager:
    try:
      return tf.train.CheckpointManager(checkpoint, self._write_dir, max_to_keep=KEEP)
    except Exception as e:  # pylint: disable=broad-except  (a garbled state file)
      state = os.path.join(self._write_dir, "checkpoint")
      if not (self.chief and os.path.isfile(state)):
        raise
      logging.warning("%s is unreadable (%s); set aside, the checkpoints are found on disk.",
                      state, type(e).__name__)
      os.replace(state, state + ".corrupt")
      return tf.train.CheckpointManager(checkpoint, self._write_dir, max_to_keep=KEEP)

  def save(self, step: int) -> None:
    self.manager.save(checkpoint_number=step)
    if not self.chief:
      shutil.rmtree(self._write_dir, ignore_errors=True)

  def restore(self) -> str | None:
    """Restores the newest readable checkpoint; returns its path (None: none exists)."""
    corrupt = []
    for prefix in _candidates(self.directory):
      error = _unreadable(prefix)
      if error is not None:
        corrupt.append((prefix, error))
        continue
      try:
        self.checkpoint.read(prefix).assert_existing_objects_matched()
      except (AssertionError, ValueError) as e:   # Readable, but another model's.
        raise _mismatch(prefix, e) from None
      self._set_aside(corrupt)
      return prefix
    if corrupt:
      names = ", ".join(f"{p} ({type(e).__name__})" for p, e in corrupt)
      raise UserError(
          f"Every checkpoint in {self.directory} is unreadable: {names}. They are corrupt "
          f"(truncated or changed on disk); move {self.directory} away to start the run "
          f"over, or restore it from a backup.")
    return None

  def _set_aside(self, corrupt: list) -> None:
    for prefix, error in corrupt:
      logging.warning("Checkpoint %s is unreadable (%s: %s); resuming from an older one.",
                      prefix, type(error).__name__, " ".join(str(error).split())[:300])
      if self.chief:
        aside = os.path.join(self.directory, "corrupt")
        os.makedirs(aside, exist_ok=True)
        for path in glob.glob(glob.escape(prefix) + ".*"):
          shutil.move(path, os.path.join(aside, os.path.basename(path)))


def _candidates(directory: str) -> list[str]:
  """Checkpoint prefixes in directory, newest first: those the state file lists and
  those on disk (the state file itself may be garbage)."""
  prefixes = set()
  try:
    state = tf.train.get_checkpoint_state(directory)
    if state is not None:
      prefixes.update(os.path.join(directory, os.path.basename(p))
                      for p in state.all_model_checkpoint_paths)
  except Exception as e:  # pylint: disable=broad-except  (text_format errors of a garbled file)
    logging.warning("%s/checkpoint is unreadable (%s); looking for checkpoints on disk.",
                    directory, type(e).__name__)
  prefixes.update(p[:-len(".index")] for p in glob.glob(os.path.join(directory, "ckpt-*.index")))
  numbered = [(int(m.group(1)), p) for p in prefixes if (m := _NUMBER.search(p))]
  return [p for _, p in sorted(numbered, reverse=True)]


def _unreadable(prefix: str) -> Exception | None:
  """Why the checkpoint's index or one of its tensors cannot be read back (checksums
  included), or None if every tensor reads."""
  try:
    reader = tf.train.load_checkpoint(prefix)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
  except Exception as e:  # pylint: disable=broad-except  (DataLoss, IndexError, ValueError...)
    return e
  return None


def _mismatch(prefix: str, error: Exception) -> UserError:
  return UserError(
      f"The checkpoint {prefix} does not match this config (was the model or optimizer "
      f"changed?): {' '.join(str(error).split())[:400]} Use a new --workdir for a new "
      f"config.")


def _remove_leftovers(workdir: str, directory: str) -> None:
  """Temp directories of a killed save, and scratch directories of dead workers."""
  for path in glob.glob(os.path.join(directory, "*_temp*")):
    shutil.rmtree(path, ignore_errors=True)
  for path in glob.glob(os.path.join(workdir, ".scratch-*")):
    pid = path.rsplit("-", 1)[-1]
    if pid.isdigit() and not _alive(int(pid)):
      shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True
