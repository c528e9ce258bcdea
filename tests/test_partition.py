"""Decentralised data (data/partition.py): disjoint shards whose union is the split, and
each replica's batches drawn from its own shard only."""

import numpy as np
import pytest

from replibench import engine
from replibench.data import fashion_mnist, partition
from replibench.data.sources import FashionMNIST
from replibench.errors import UserError

LABELS = np.repeat(np.arange(10), 50)[np.random.default_rng(0).permutation(500)]


@pytest.mark.parametrize("scheme", partition.SCHEMES)
@pytest.mark.parametrize("num_shards", [1, 2, 4, 7])
def test_shards_are_disjoint_and_cover_the_split(scheme, num_shards):
  parts = partition.shards(LABELS, num_shards, scheme, alpha=0.1, seed=3)
  assert len(parts) == num_shards and all(len(p) > 0 for p in parts)
  joined = np.concatenate(parts)
  assert len(joined) == len(LABELS) and set(joined) == set(range(len(LABELS)))
  again = partition.shards(LABELS, num_shards, scheme, alpha=0.1, seed=3)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def _dominant_share(parts) -> float:
  """Mean over shards of the fraction of its examples in its most common class."""
  return float(np.mean([np.bincount(LABELS[p]).max() / len(p) for p in parts]))


def test_schemes_differ_in_how_skewed_the_shards_are():
  iid, skewed, by_class = (partition.shards(LABELS, 4, s, alpha=0.1, seed=0)
                           for s in ("iid", "dirichlet", "by_class"))
  assert _dominant_share(iid) < 0.2
  assert _dominant_share(skewed) > 0.4
  assert all(len(np.unique(LABELS[p])) <= 4 for p in by_class)   # 10 classes / 4, cut twice


def _ctx(num_replicas, pipelines=1, pipeline=0, batch=8, start_step=0):
  return engine.InputContext(batch, pipeline, pipelines, num_replicas, start_step)


@pytest.mark.parametrize("pipelines", [1, 2])
def test_each_replica_reads_only_its_own_shard(pipelines):
  labels = fashion_mnist.load("train")[1][:600]
  parts = partition.shards(labels, 4, "by_class", seed=0)
  for pipeline in range(pipelines):
    ctx = _ctx(4, pipelines, pipeline)
    ds = partition.pipeline_streams(labels, ctx, "by_class", 0.1, seed=0, skip_batches=0)
    replicas = range(pipeline * 4 // pipelines, (pipeline + 1) * 4 // pipelines)
    for i, (idx, _, replica) in enumerate(ds.take(4 * len(replicas) * 10)):
      assert int(replica) == replicas[i % len(replicas)]
      assert set(idx.numpy()) <= set(parts[int(replica)])


def test_a_resumed_stream_continues_where_it_stopped():
  labels = fashion_mnist.load("train")[1][:600]
  whole = partition.pipeline_streams(labels, _ctx(2), "iid", 0.1, seed=1, skip_batches=0)
  resumed = partition.pipeline_streams(labels, _ctx(2), "iid", 0.1, seed=1, skip_batches=5)
  tail = [idx.numpy() for idx, _, _ in whole.take(2 * 5 + 6)][2 * 5:]
  for want, (got, _, _) in zip(tail, resumed.take(6)):
    np.testing.assert_array_equal(got, want)


def test_replicas_of_a_strategy_get_their_shards():
  """Through MirroredStrategy: the pipeline's batches reach replicas in turn."""
  source = FashionMNIST(partition="by_class", num_train_examples=600)
  replicator = engine.Replicator(engine.Local(num_replicas=4, device="cpu"))
  dataset = replicator.distribute(lambda ctx: source.train(ctx, seed=0), 32)
  labels = fashion_mnist.load("train")[1][:600]
  parts = partition.shards(labels, 4, "by_class", seed=0)
  batch = next(iter(dataset))
  for replica, (_, y) in enumerate(zip(*map(replicator.strategy.experimental_local_results,
                                              batch))):
    assert set(y.numpy()) <= set(labels[parts[replica]]), replica


@pytest.mark.parametrize("kwargs,binding", [
    ({"partition": "non_iid"}, "FashionMNIST.partition"),
    ({"partition": "dirichlet", "dirichlet_alpha": 0}, "FashionMNIST.dirichlet_alpha")])
def test_bad_partitions_name_their_binding(kwargs, binding):
  with pytest.raises(UserError, match=binding.replace(".", "\\.")):
    FashionMNIST(**kwargs)
