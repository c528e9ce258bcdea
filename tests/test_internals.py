"""Every private Keras / TensorFlow / gin name replibench uses (replibench/internals.py)
still exists and still does what the engine relies on, on the installed versions.

When a release moves one of them, the failing test names it; the fix belongs in
internals.py alone.
"""

import gc
import inspect
import json
import os
import platform
import weakref

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

from replibench import internals


def test_optimizer_reduction_hook_exists_and_is_what_keras_calls():
  optimizer = keras.optimizers.SGD(0.1)
  assert callable(getattr(optimizer, "_all_reduce_sum_gradients", None)), (
      "keras TF optimizer._all_reduce_sum_gradients moved")
  source = inspect.getsource(type(optimizer)._backend_update_step)
  assert "_all_reduce_sum_gradients" in source, "Keras no longer reduces gradients there"


def test_skipping_the_optimizer_reduction_applies_each_replicas_own_gradient():
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  finals = {}
  for skip in (False, True):
    with strategy.scope():
      w = keras.Variable(np.zeros(2, np.float32))
      optimizer = keras.optimizers.SGD(1.0)
      optimizer.build([w])
    if skip:
      internals.skip_optimizer_gradient_reduction(optimizer)

    _replica_step(strategy, optimizer, w)()
    finals[skip] = [c.numpy() for c in strategy.experimental_local_results(w.value)]
  np.testing.assert_array_equal(finals[False], [[-3.0, -3.0]] * 2)   # Keras summed 1 + 2.
  np.testing.assert_array_equal(finals[True], [[-1.0, -1.0], [-2.0, -2.0]])   # Each its own.


def _replica_step(strategy, optimizer, w):
  """A tf.function in which replica r applies the gradient [r + 1, r + 1] to w."""
  def fn():
    replica = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)
    optimizer.apply_gradients([(tf.fill([2], replica + 1.0), w)])
  return tf.function(lambda: strategy.run(fn))


@pytest.mark.parametrize("make,slot_lists", [
    (lambda: keras.optimizers.SGD(0.1, momentum=0.9), ["momentums"]),
    (lambda: keras.optimizers.Adam(), ["_momentums", "_velocities"]),
    (lambda: keras.optimizers.Adam(amsgrad=True), ["_momentums", "_velocities", "_velocity_hats"]),
])
def test_optimizer_slots_iterations_and_schedule_are_where_internals_looks(make, slot_lists):
  variables = [keras.Variable(np.ones(3, np.float32)), keras.Variable(np.ones(2, np.float32))]
  optimizer = make()
  optimizer.build(variables)
  for name in slot_lists:
    slot = internals.optimizer_slot(optimizer, variables[1], name)
    assert tuple(slot.shape) == (2,), name
  assert internals.optimizer_iterations(optimizer) is optimizer.iterations
  schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
  optimizer.learning_rate = schedule
  assert internals.optimizer_schedule(optimizer) is schedule


def test_batch_norm_moments_hook_and_reduction_axes():
  signature = inspect.signature(keras.layers.BatchNormalization._moments)
  assert list(signature.parameters) == ["self", "inputs", "mask"], signature
  calls = []

  class Recording(keras.layers.BatchNormalization):
    pass

  def moments(layer, inputs, mask):
    calls.append(internals.batch_norm_reduction_axes(layer))
    return tf.zeros(inputs.shape[-1]), tf.ones(inputs.shape[-1])

  internals.replace_batch_norm_moments(Recording, moments)
  layer = Recording(epsilon=0.0)
  out = layer(tf.fill([2, 3, 3, 4], 5.0), training=True)
  assert calls == [[0, 1, 2]]
  np.testing.assert_allclose(out.numpy(), 5.0)   # (x - 0) / sqrt(1): our moments were used.


def test_gin_search_path_is_added_once(tmp_path):
  before = list(gin.config._LOCATION_PREFIXES)  # pylint: disable=protected-access
  try:
    internals.add_gin_search_path(str(tmp_path))
    internals.add_gin_search_path(str(tmp_path))
    prefixes = gin.config._LOCATION_PREFIXES  # pylint: disable=protected-access
    assert prefixes.count(str(tmp_path)) == 1
  finally:
    gin.config._LOCATION_PREFIXES[:] = before  # pylint: disable=protected-access


def test_gin_names_a_configurable_as_a_config_writes_it():
  """gin's inverse registry (config._inverse_lookup): a module given to gin is kept
  (regimes.Compressed), a default one dropped (small_resnet), an unknown is None."""
  from replibench.config import registry  # pylint: disable=import-outside-toplevel
  from replibench.engine.regimes.compressed import Compressed  # pylint: disable=import-outside-toplevel
  from models import resnet  # pylint: disable=import-outside-toplevel
  registry.register_all()
  assert internals.gin_name(Compressed) == "regimes.Compressed"
  assert internals.gin_name(resnet.small_resnet) == "small_resnet"
  assert internals.gin_name(dict) is None


def test_graph_flops_counts_a_matmul():
  graph = tf.function(lambda a, b: tf.matmul(a, b)).get_concrete_function(
      tf.TensorSpec([4, 5]), tf.TensorSpec([5, 6])).graph
  assert internals.count_graph_flops(graph) == 2 * 4 * 5 * 6


def test_the_profile_plugins_converter_tabulates_a_trace(tmp_path):
  """internals.profile_tool_data: the op table TensorBoard's profile plugin shows, from
  a trace's .xplane.pb files (harness/profiling.py's top ops read its columns)."""
  step = tf.function(lambda a: tf.matmul(a, a))
  step(tf.ones([64, 64]))
  tf.profiler.experimental.start(str(tmp_path))
  step(tf.ones([64, 64])).numpy()
  tf.profiler.experimental.stop()
  paths = [os.path.join(root, f) for root, _, files in os.walk(tmp_path) for f in files
           if f.endswith(".xplane.pb")]
  tables = json.loads(internals.profile_tool_data(paths, "framework_op_stats"))
  columns = {c["id"] for c in tables[-1]["cols"]}
  assert {"host_or_device", "type", "operation", "occurrences", "total_self_time"} <= columns
  assert any("MatMul" in str(row["c"]) for row in tables[-1]["rows"])
  with pytest.raises(ValueError, match="no tool"):
    internals.profile_tool_data(paths, "no_such_tool")


def test_the_versions_checked_are_recorded():
  assert set(internals.CHECKED_WITH) == {"keras", "tensorflow", "gin-config"}


def test_strategies_made_one_after_another_use_their_own_collective_keys():
  """tensorflow/tensorflow#62790: a second MirroredStrategy over the same devices
  reuses the first one's collective keys, and its all-reduce of another shape then
  fails with "Shape mismatch in the collective instance"."""
  assert hasattr(tf.distribute.MirroredStrategy, "_collective_key_base")
  for shapes in ([2, 3], [5]):
    internals.fresh_collective_keys()   # What topology.Local.make_strategy does first.
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])   # Collective ops.
    step = tf.function(lambda: strategy.run(lambda: [
        tf.distribute.get_replica_context().all_reduce("sum", tf.ones([n])) for n in shapes]))
    sums = strategy.experimental_local_results(step())
    np.testing.assert_array_equal(sums[0][0], np.full(shapes[0], 2.0))


def test_forgetting_custom_gradients_frees_the_graphs_that_registered_them():
  """tensorflow/tensorflow#97697: each trace through a tf.custom_gradient function
  registers its gradient for good, and with it every tensor of the traced graph.
  internals.forget_custom_gradients is what frees them (custom_gradients_forgotten:
  tests/conftest.py around each test, config/plan.py around its trace)."""
  @tf.custom_gradient
  def doubles_its_gradient(x):
    return tf.identity(x), lambda dy: 2.0 * dy

  @tf.function
  def gradient(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = doubles_its_gradient(x)
    return tape.gradient(y, x)

  before = internals.custom_gradient_names()
  assert gradient(tf.constant(1.0)).numpy() == 2.0
  assert len(internals.custom_gradient_names() - before) == 1
  graph = weakref.ref(gradient.get_concrete_function(tf.constant(1.0)).graph)
  del gradient
  gc.collect()
  assert graph() is not None, (
      "TensorFlow no longer keeps a custom gradient's graph alive: "
      "internals.forget_custom_gradients may be unneeded on this version")
  assert internals.forget_custom_gradients(internals.custom_gradient_names() - before) == 1
  gc.collect()
  assert graph() is None
  assert internals.custom_gradient_names() == before


def test_onednn_flag_is_readable():
  enabled = internals.onednn_enabled()
  assert isinstance(enabled, bool)
  if platform.machine() == "x86_64" and os.environ.get("TF_ENABLE_ONEDNN_OPTS") != "0":
    assert enabled   # TensorFlow's x86 Linux wheels run oneDNN by default.


def test_a_split_mirrored_variable_is_its_part_inside_a_step_and_whole_outside():
  internals.fresh_collective_keys()
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])   # One model group of 2.
  with strategy.scope():
    variable = tf.Variable(tf.zeros([2, 2]))
  for r, component in enumerate(strategy.experimental_local_results(variable)):
    component.assign(tf.fill([2, 2], float(r)))
  internals.shard_variable(variable, axis=1, model=2)
  assert internals.shard_axis(variable) == 1
  whole = np.array([[0.0, 0.0, 1.0, 1.0]] * 2)
  np.testing.assert_array_equal(variable.numpy(), whole)                  # Host read.
  np.testing.assert_array_equal(tf.function(lambda: variable + 0.0)(), whole)   # No strategy.
  parts = strategy.run(tf.function(lambda: tf.identity(variable.value())))
  assert [p.numpy()[0, 0] for p in strategy.experimental_local_results(parts)] == [0.0, 1.0]
  saved = variable._serialize_to_tensors()["VARIABLE_VALUE"]  # pylint: disable=protected-access
  np.testing.assert_array_equal(saved, whole)
  variable._restore_from_tensors({"VARIABLE_VALUE": tf.constant(whole[:, ::-1], tf.float32)})  # pylint: disable=protected-access
  assert [c.numpy()[0, 0] for c in strategy.experimental_local_results(variable)] == [1.0, 0.0]


def test_keras_delegates_checkpoints_to_the_tf_variable_it_holds():
  source = inspect.getsource(type(keras.Variable(1.0))._serialize_to_tensors)  # pylint: disable=protected-access
  assert "self.value._serialize_to_tensors" in source
  variable = keras.Variable(np.ones(2, np.float32))
  replacement = tf.Variable(np.full(2, 3.0, np.float32))
  internals.rebind_keras_variable(variable, replacement)
  assert variable.value is replacement and float(variable.numpy()[0]) == 3.0


def test_tensorflow_names_and_hooks_the_mesh_uses():
  from tensorflow.python.distribute import cross_device_ops  # pylint: disable=g-direct-tensorflow-import
  assert "_gather_implementation" in inspect.getsource(cross_device_ops.CrossDeviceOps._gather)  # pylint: disable=protected-access
  assert internals.canonical_device("/cpu:1") == "/job:localhost/replica:0/task:0/device:CPU:1"
  with tf.device("/cpu:1"):
    assert internals.current_device().endswith("CPU:1")
  one = tf.constant(1.0)
  assert internals.destination_devices("/cpu:1", None) == (internals.canonical_device("/cpu:1"),)
  assert internals.mirrored([one, one]).values == (one, one)
  graph = tf.function(lambda a, b: tf.matmul(a, b)).get_concrete_function(
      tf.TensorSpec([4, 5]), tf.TensorSpec([5, 6])).graph
  matmul = next(op for op in graph.get_operations() if op.type == "MatMul")
  assert internals.op_flops(graph, matmul) == 2 * 4 * 5 * 6


def test_the_layer_being_built_is_found_from_keras_name_scopes():
  seen = []

  class Probe(keras.layers.Layer):
    def build(self, input_shape):
      seen.append(internals.building_keras_layer())

    def call(self, x):
      return x

  layer = Probe()
  layer.build((1,))
  layer(tf.zeros([1, 1]))
  assert internals.building_keras_layer() is None and layer in seen


def test_per_device_datasets_of_a_distributed_dataset_are_untuned():
  """The engine's import makes tf.distribute's per-device datasets without autotuning
  (freeing their iterators no longer waits for its thread: internals.py)."""
  from tensorflow.python.data.ops import multi_device_iterator_ops as mdi  # pylint: disable=import-outside-toplevel
  import replibench.engine  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  assert getattr(mdi._create_device_dataset, "untuned", False)   # pylint: disable=protected-access
  iterator = mdi.OwnedMultiDeviceIterator(tf.data.Dataset.range(4), ["/cpu:0"])
  device_dataset = iterator._device_iterators[0]._dataset   # pylint: disable=protected-access
  assert device_dataset.options().autotune.enabled is False
  assert int(next(iterator)[0]) == 0
