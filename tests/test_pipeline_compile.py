"""A compiled pipeline step (topology.Mesh parallelism 'pipeline', Experiment.jit_compile)
trains as the uncompiled one.

A pipeline's pass spans its stages' devices, and an XLA cluster is one device's program,
so the step is compiled per device: each stage's forward pass one cluster on its device
(engine/model_parallel/pipeline.py, compilation.per_device_pieces), its backward pass the
gradient of that function there, and the optimizer's update per variable, where the
variable lives. ImageClassification's own step, tests/test_model_parallel.py's plain
ResNet (no batch norm) on 1 x 2 logical CPU devices over 2 micro-batches, 3 steps.

Tolerance: rtol 1e-5, atol 1e-6 (as tests/test_model_parallel.py). XLA's CPU
convolutions are Eigen's where the graph's are oneDNN's: the same sums in another
order; measured, the variables after 3 steps differed by at most 1.2e-7 (3e-6 relative
to a value's size plus 1e-3) and the losses not at all. A wrong step (a stage skipped,
or its gradient lost) moves the weights by an update (~1e-2).
"""

import functools

import numpy as np

from models.resnet import resnet_pieces
from replibench import engine
from replibench.engine import compilation, model_parallel
from replibench.engine.regimes import Sync
from replibench.workloads.classification import ImageClassification
from tests.test_model_parallel import GLOBAL_BATCH, STEPS, _Images, _plain_resnet

TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def _train(jit: bool) -> tuple[list, list]:
  """(losses per step, every model and optimizer variable after STEPS steps)."""
  mesh = model_parallel.Mesh(data=1, model=2, parallelism="pipeline", micro_batches=2,
                             device="cpu")
  replicator = engine.make_replicator(mesh, Sync())
  workload = ImageClassification(
      model=functools.partial(model_parallel.pipelined, builder=_plain_resnet,
                              split=resnet_pieces),
      data=_Images(), base_lr_per_256=3.2, warmup_epochs=0.0, weight_decay=5e-4)
  spec = engine.TrainSpec(GLOBAL_BATCH, replicator.num_replicas, seed=0, steps_per_epoch=STEPS,
                          total_steps=STEPS, regime=replicator.regime, steps_per_call=1,
                          jit_compile=jit)
  with replicator.scope():
    workload.build(spec)
  train = replicator.compile(workload.step_fn, workload.input_fn, spec)
  losses = [float(train()["loss"]) for _ in range(STEPS)]
  variables = [np.array(v.numpy()) for v in workload.model.variables
               + workload.optimizer.variables]
  return losses, variables


def test_compiled_pipeline_matches_the_uncompiled_one(monkeypatch):
  graph_losses, graph = _train(False)
  compiled = []   # What was made an XLA cluster of its own.
  device_piece = compilation.device_piece
  monkeypatch.setattr(compilation, "device_piece",
                      lambda fn, what: compiled.append(what) or device_piece(fn, what))
  xla_losses, xla = _train(True)
  # Each stage's forward pass, once per micro-batch (2 x 2), is a cluster.
  assert compiled.count("a pipeline stage's forward pass") == 4
  np.testing.assert_allclose(xla_losses, graph_losses, **TOLERANCE)
  assert len(xla) == len(graph) > 10
  worst = max(float(np.max(np.abs(a - b))) for a, b in zip(xla, graph))
  for a, b in zip(xla, graph):
    np.testing.assert_allclose(a, b, **TOLERANCE, err_msg=f"worst |xla - graph| {worst:.2e}")
