"""The parameter-server cluster's non-training tasks: workers and ps serve the chief.

`replibench run` on a 'worker' or 'ps' task of an AsyncPS cluster never reaches
the harness: the CLI asks `is_server_task` and, if so, `serve`s until the
launcher (or cluster manager) ends the process.
"""

import os

import tensorflow as tf
from absl import logging

from replibench import cluster
from replibench.errors import UserError


def check_cluster(topology) -> cluster.Cluster:
  """This process's cluster, checked for one chief, >= 1 worker, >= 1 ps and the
  topology's declared counts."""
  spec = cluster.current()
  counts = {job: spec.count(job) for job in ("chief", "worker", "ps")}
  if counts["chief"] != 1 or not counts["worker"] or not counts["ps"]:
    raise UserError(
        f"Experiment.regime = @regimes.AsyncPS() needs TF_CONFIG to list one 'chief', at "
        f"least one 'worker' and at least one 'ps' task; it lists {counts}. "
        f"`replibench launch --workers W --ps P -- run ...` sets that up on this machine.")
  for field, job in (("workers", "worker"), ("ps", "ps")):
    expected = getattr(topology, field)
    if expected and expected != counts[job]:
      raise UserError(f"topology.MultiWorker.{field} = {expected} but TF_CONFIG lists "
                        f"{counts[job]} {job!r} task(s).")
  return spec


def is_server_task(topology) -> bool:
  """True on a worker or ps task of an AsyncPS cluster (checked); False on the chief."""
  return check_cluster(topology).task_type != "chief"


def serve(topology) -> None:
  """Runs this task's tf.distribute.Server and never returns."""
  spec = check_cluster(topology)
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                task_index=resolver.task_id,
                                protocol=resolver.rpc_layer or "grpc", start=True)
  logging.info("AsyncPS: %s %d serving at %s (pid %d).", spec.task_type, spec.task_index,
               server.target, os.getpid())
  server.join()   # Never returns: the launcher (or cluster manager) ends this process.
