"""Where the actors and the learner run: cores of their own (D4PG.actor_cores).

    learner, actors = split_cores(actor_cores=1, allowed=os.sched_getaffinity(0))
    pool = ActorPool(..., cores=actors)      # each actor process pinned to `actors`
    with pinned(learner):                    # every thread of this (learner) process
      train()

By default (actor_cores 0) the actor processes and the learner share every core
this process may use, as the paper's actors never do: there the learner has an
accelerator of its own. With actor_cores = N the actors get the last N of this
process's cores and the learner the others, so neither takes the other's time
slices. In a worker that `replibench launch --cpus_per_worker K` pinned, the
split is of its K cores. Linux only (sched_setaffinity).
"""

from __future__ import annotations

import contextlib
import os

from replibench.errors import UserError


def allowed_cores() -> set[int]:
  """The cores this process may run on (its affinity, e.g. a launched worker's share)."""
  return set(os.sched_getaffinity(0))


def check_actor_cores(actor_cores: int, allowed: set[int]) -> None:
  """Raises UserError unless 0 <= actor_cores < len(allowed) (the learner keeps one)."""
  if not isinstance(actor_cores, int) or isinstance(actor_cores, bool) or actor_cores < 0:
    raise UserError(f"D4PG.actor_cores = {actor_cores!r}: give a whole number of cores, 0 "
                    f"(the actors share the learner's cores) or more.")
  if actor_cores >= len(allowed):
    raise UserError(
        f"D4PG.actor_cores = {actor_cores}: this process may use {len(allowed)} core(s) "
        f"({sorted(allowed)}), and the learner needs at least one of its own, so at most "
        f"{len(allowed) - 1} can go to the actors. Use D4PG.actor_cores = 0 to let the "
        f"actors share every core with the learner, or run on a machine (or a `replibench "
        f"launch --cpus_per_worker` share) with more cores.")


def split_cores(actor_cores: int, allowed: set[int]) -> tuple[set[int], set[int]]:
  """(learner cores, actor cores): the actors take the last actor_cores of allowed."""
  check_actor_cores(actor_cores, allowed)
  cores = sorted(allowed)
  cut = len(cores) - actor_cores
  return set(cores[:cut]), set(cores[cut:])


def _threads() -> list[int]:
  return [int(t) for t in os.listdir("/proc/self/task")]


def pin_threads(cores: set[int]) -> dict[int, set[int]]:
  """Pins every thread of this process (TensorFlow's pools were started before) to
  cores; returns each thread's previous cores, for restore_threads."""
  previous = {}
  for tid in _threads():
    with contextlib.suppress(ProcessLookupError):   # A thread that ended meanwhile.
      previous[tid] = set(os.sched_getaffinity(tid))
      os.sched_setaffinity(tid, cores)
  return previous


def restore_threads(previous: dict[int, set[int]], default: set[int]) -> None:
  """Gives each thread its cores back (threads started since: default)."""
  for tid in _threads():
    with contextlib.suppress(ProcessLookupError):
      os.sched_setaffinity(tid, previous.get(tid, default))
