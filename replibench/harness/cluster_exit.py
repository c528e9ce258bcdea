"""A prompt exit for the tasks of a synchronous cluster once their run is done.

A MultiWorkerMirroredStrategy task that has finished its run (result.json, summaries,
checkpoints and logs written and closed) then spent seconds in TensorFlow's teardown:
destroying a distributed dataset's iterator waits for tf.data's autotuning thread to
end its current sleep (gdb: `Model::OptimizeLoop` in `CondVar::WaitCommon` under
`~MultiDeviceIterator`; the iterator's cancellation does not wake it), and that sleep
doubles as the run goes on, up to a minute. Measured on a 2-core Zen 4: 3 s after 40
ResNet steps, 8-10 s after 300, against 1 s for a one-process run. Every trial and test
of a workers=N config paid it, and the A/B tracker twice a pair.

So a task that succeeded waits at the coordination service's barrier until every task
of the cluster has succeeded too (then no task still needs this one's collectives or
its server), runs the interpreter's exit handlers (absl's and logging's flushes), and
ends with os._exit (after joining this process's non-daemon threads, as the
interpreter would). Everything else exits the ordinary way: a failure, a cluster with
parameter servers (they serve until stopped and never reach a barrier), a process with
no coordination service, or a barrier that fails because a peer failed.
"""

import atexit
import os
import sys
import threading

from absl import logging

from replibench import cluster as cluster_lib
from replibench.errors import UserError

BARRIER = "replibench_run_done"
# Tasks reach the end together (the last step and its evaluation are collective); the
# slack is for a chief that writes the report and the others that do not.
BARRIER_TIMEOUT_MS = 120_000
HAND_OVER_TIMEOUT_MS = 30_000   # A peer through the barrier says so within milliseconds.


def coordinated_context():
  """TensorFlow's eager context if this process is a task of a synchronous cluster
  (TF_CONFIG without 'ps') whose coordination service is configured, else None.
  TensorFlow is never imported for the question."""
  if "tensorflow" not in sys.modules or not cluster_lib.present():
    return None
  try:
    cluster = cluster_lib.current()
  except UserError:   # A bad TF_CONFIG: run has reported it.
    return None
  if cluster.count("ps"):
    return None
  from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel
  ctx = context.context()
  return ctx if ctx.coordination_service else None


def _leader(cluster) -> tuple[str, int]:
  """The task that hosts the coordination service (TensorFlow's rule: the chief, else
  worker 0)."""
  return ("chief", 0) if cluster.count("chief") else ("worker", 0)


def _hand_over(ctx, cluster) -> None:
  """The barrier's leader must outlive every other task's barrier reply: its process
  hosts the service, and an os._exit as soon as its own local reply came killed it
  before a peer's reply was sent (that peer then saw the barrier fail). So each other
  task, once through, says so in the service's key-value store, and the leader waits
  for all of them before it leaves."""
  me = (cluster.task_type, cluster.task_index)
  try:
    if me != _leader(cluster):
      ctx.set_config_key_value(f"{BARRIER}/{me[0]}/{me[1]}", "through")
      return
    for job, addresses in cluster.jobs.items():
      for index in range(len(addresses)):
        if (job, index) != me:
          ctx.get_config_key_value(f"{BARRIER}/{job}/{index}", HAND_OVER_TIMEOUT_MS)
  except Exception as e:  # pylint: disable=broad-except  (a peer vanished after the barrier)
    logging.warning("exit: the hand-over after the exit barrier failed (%s); leaving "
                    "anyway: every task had finished.", str(e).splitlines()[0][:200])


def leave(code: int) -> None:
  """Ends this process with code once every task has finished, skipping TensorFlow's
  teardown, when that is safe (above); otherwise returns and the caller exits."""
  if code != 0:
    return
  ctx = coordinated_context()
  if ctx is None:
    return
  for thread in threading.enumerate():   # As the interpreter's exit would, first.
    if thread is not threading.main_thread() and not thread.daemon:
      thread.join()
  try:
    ctx.wait_at_barrier(BARRIER, BARRIER_TIMEOUT_MS)
  except Exception as e:  # pylint: disable=broad-except  (a peer failed or vanished)
    logging.warning("exit: the cluster's exit barrier failed (%s); exiting through "
                    "TensorFlow's teardown.", str(e).splitlines()[0][:200])
    return
  _hand_over(ctx, cluster_lib.current())
  logging.info("exit: every task of the cluster has finished; leaving without "
               "TensorFlow's teardown (harness/cluster_exit.py).")
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  for stream in (sys.stdout, sys.stderr):
    stream.flush()
  os._exit(code)  # pylint: disable=protected-access
