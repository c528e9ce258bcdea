"""Where a resumed input pipeline starts: the batches it already fed to training."""


def batches_consumed(ctx) -> int:
  """Per-replica batches this input pipeline produced before ctx.start_step.

  Each global step takes one per-replica batch from every replica, and a
  pipeline serves num_replicas / num_input_pipelines of the replicas, so after
  start_step steps it has produced start_step * num_replicas /
  num_input_pipelines batches. A resumed run skips that many batches of the
  same seeded stream, so it trains on the data it would have seen without the
  interruption (file-shuffled TFDS pipelines cannot seek, so skipping is how
  they resume).

  Args:
    ctx: the engine's InputContext (start_step in global steps, num_replicas,
      num_input_pipelines).

  Returns:
    The number of per-replica batches (of ctx.per_replica_batch_size examples)
    to skip.
  """
  return ctx.start_step * ctx.num_replicas // ctx.num_input_pipelines
