"""Every use of a private Keras, TensorFlow or gin name in replibench, in one place.

Where no public API does what the engine needs, it reaches into a library's
internals here and nowhere else, and `tests/test_internals.py` pins each touch:
it fails loudly, naming the attribute, on a Keras / TensorFlow / gin version
whose internals moved, instead of letting the math change silently.

  Keras optimizers  `_all_reduce_sum_gradients` (the engine all-reduces gradients
                    itself, before clipping), `_get_variable_index` and the slot
                    lists (`_momentums`, `_velocities`, `_velocity_hats`,
                    `momentums`), `_iterations`, `_learning_rate`.
  Keras BN          `_moments(inputs, mask)` and `_reduction_axes` (cross-replica
                    batch statistics).
  gin               `config._LOCATION_PREFIXES` (search path de-duplication),
                    `config._inverse_lookup` (a configurable's name, for messages).
  TensorFlow        `tensorflow.python.profiler` (FLOP counting of a graph:
                    tf.profiler.experimental has no FLOP counter; a trace's
                    op tables: `_pywrap_profiler_plugin.xspace_to_tools_data`);
                    `MirroredStrategy._collective_key_base` (a fresh key
                    range per strategy); `_pywrap_util_port.IsMklEnabled`
                    (whether oneDNN's CPU kernels are on: benchmarks);
                    `multi_device_iterator_ops._create_device_dataset` (the
                    per-device datasets' options: untuned_per_device_datasets);
                    `ops._gradient_registry` (tf.custom_gradient's entries, which
                    keep every graph traced through one alive:
                    forget_custom_gradients).
  Model parallelism `values.MirroredVariable` subclassed for a variable split over
                    a model group (its reads outside the group, its checkpoint),
                    `device_util` (canonical and current device names),
                    `cross_device_ops` (a reduction's destination devices),
                    `distribute_utils.regroup` (a Mirrored result), the
                    CrossDeviceOps hook `_gather_implementation`, a Keras
                    variable's `_value` (moved to another device), and Keras'
                    name-scope stack (the layer whose build makes a variable).
"""

import contextlib
from collections.abc import Iterable

import keras
import tensorflow as tf

# Versions on which every touch below was checked (tests/test_internals.py runs
# the same checks on whatever is installed).
CHECKED_WITH = {"keras": "3.15.1", "tensorflow": "2.21.0", "gin-config": "0.5.0"}


# -- Keras optimizers ---------------------------------------------------------------

def skip_optimizer_gradient_reduction(optimizer) -> None:
  """Makes a Keras 3 TF optimizer apply gradients as given, without its own
  cross-replica sum (`_all_reduce_sum_gradients`, which runs after clipping).

  A LossScaleOptimizer (mixed float16) applies through its public
  `inner_optimizer`, whose sum is switched off too.
  """
  inner = getattr(optimizer, "inner_optimizer", None)
  if inner is not None:
    skip_optimizer_gradient_reduction(inner)
  if not callable(getattr(optimizer, "_all_reduce_sum_gradients", None)):
    raise TypeError(
        f"{type(optimizer).__name__} has no _all_reduce_sum_gradients: not a Keras 3 "
        "TensorFlow optimizer (or Keras moved it), so the engine cannot take over its "
        "gradient reduction.")
  optimizer._all_reduce_sum_gradients = lambda grads_and_vars: grads_and_vars  # pylint: disable=protected-access


def optimizer_slot(optimizer, variable, slot_list: str):
  """The optimizer's slot for variable in its slot list (e.g. '_momentums' of Adam,
  'momentums' of SGD): a Keras variable."""
  index = optimizer._get_variable_index(variable)   # pylint: disable=protected-access
  return getattr(optimizer, slot_list)[index]


def optimizer_iterations(optimizer):
  """The optimizer's own iteration counter variable (not a read of it)."""
  return optimizer._iterations   # pylint: disable=protected-access


def optimizer_schedule(optimizer):
  """The learning rate as the optimizer keeps it: a float, variable or schedule object
  (the public `learning_rate` property evaluates a schedule at the current step)."""
  return optimizer._learning_rate   # pylint: disable=protected-access


# -- Keras BatchNormalization ------------------------------------------------------

def batch_norm_reduction_axes(layer: keras.layers.BatchNormalization) -> list[int]:
  """The axes BatchNormalization reduces over for its moments (all but the channels)."""
  return list(layer._reduction_axes)   # pylint: disable=protected-access


def replace_batch_norm_moments(cls: type, moments) -> None:
  """Makes cls (a BatchNormalization subclass) compute training moments with
  moments(layer, inputs, mask) -> (mean, variance); Keras' moving-average update
  and normalization then use them unchanged."""
  if not callable(getattr(keras.layers.BatchNormalization, "_moments", None)):
    raise ImportError("keras.layers.BatchNormalization._moments is gone: replibench's "
                      "cross-replica batch norm needs porting to this Keras version.")
  cls._moments = moments   # pylint: disable=protected-access


# -- TensorFlow's v1 profiler: FLOPs of a graph ---------------------------------------

def count_graph_flops(graph) -> int:
  """Float ops in a traced graph (tensorflow.python.profiler: no public FLOP counter)."""
  from tensorflow.python.profiler import model_analyzer, option_builder  # pylint: disable=g-direct-tensorflow-import,import-outside-toplevel
  options = option_builder.ProfileOptionBuilder(
      option_builder.ProfileOptionBuilder.float_operation()).with_empty_output().build()
  verbosity = tf.get_logger().level
  tf.get_logger().setLevel("ERROR")   # The v1 profiler logs deprecation warnings.
  try:
    return int(model_analyzer.profile(graph, options=options).total_float_ops)
  finally:
    tf.get_logger().setLevel(verbosity)


def op_flops(graph, op) -> int:
  """One op's float ops as the profiler counts them (its registered "flops" statistic;
  0 where none is registered or its shapes are unknown)."""
  from tensorflow.python.framework import ops  # pylint: disable=g-direct-tensorflow-import,import-outside-toplevel
  try:
    value = ops.get_stats_for_node_def(graph, op.node_def, "flops").value
  except (ValueError, TypeError):
    return 0
  return int(value or 0)


# -- TensorFlow's profiler: a trace's tables (what TensorBoard's profile plugin shows) --

def profile_tool_data(xplane_paths: list[str], tool: str) -> bytes:
  """One profile tool's data ('framework_op_stats', 'hlo_stats', ...: JSON DataTables)
  from .xplane.pb files, by the converter TensorFlow ships for the profile plugin
  (tf.profiler has no public reader); ValueError if TensorFlow lacks the tool."""
  from tensorflow.python.profiler.internal import _pywrap_profiler_plugin  # pylint: disable=g-direct-tensorflow-import,import-outside-toplevel
  data, ok = _pywrap_profiler_plugin.xspace_to_tools_data(list(xplane_paths), tool, {})
  if not ok:
    raise ValueError(f"TensorFlow's profiler converter has no tool {tool!r}: "
                     f"{bytes(data)[:200]!r}")
  return bytes(data)


# -- TensorFlow's gradient registry: what tf.custom_gradient leaves behind -----------

_CUSTOM_GRADIENT_PREFIX = "CustomGradient-"   # custom_gradient.generate_name()'s names.


def custom_gradient_names() -> frozenset[str]:
  """The gradient functions tf.custom_gradient has registered in this process so far."""
  from tensorflow.python.framework import ops  # pylint: disable=g-direct-tensorflow-import,import-outside-toplevel
  return frozenset(name for name in ops._gradient_registry._registry   # pylint: disable=protected-access
                   if name.startswith(_CUSTOM_GRADIENT_PREFIX))


def forget_custom_gradients(names: Iterable[str]) -> int:
  """Removes the named tf.custom_gradient functions from TensorFlow's global gradient
  registry; returns how many went.

  Each graph-mode call of a tf.custom_gradient function (the engine's collectives and
  model-parallel exchanges, once per trace) registers its gradient under a fresh name
  and never removes it, and that closure holds the traced tensors, so every graph
  ever traced through one stays alive (tensorflow/tensorflow#97697, #27492): each
  full-size plan kept 0.3 GiB (ResNet-50) or 1 GiB (SN-GAN 128) for good, and test
  workers grew to 3-5 GB. Forget a name once nothing will take a gradient through
  its graph again: the trace that registered it has finished.
  """
  from tensorflow.python.framework import ops  # pylint: disable=g-direct-tensorflow-import,import-outside-toplevel
  registry = ops._gradient_registry._registry   # pylint: disable=protected-access
  gone = [name for name in names if name in registry]
  for name in gone:
    del registry[name]
  return len(gone)


@contextlib.contextmanager
def custom_gradients_forgotten():
  """Forgets, on leaving, the custom gradients registered inside the block (traces
  that end with it: a plan's traced step, a test's runs)."""
  before = custom_gradient_names()
  try:
    yield
  finally:
    forget_custom_gradients(custom_gradient_names() - before)


# -- tf.distribute: collective keys ----------------------------------------------------

_KEY_RANGE = 100_000   # Collective group keys one strategy may use (TF's own tests use this).
_strategies_made = 0


def fresh_collective_keys() -> None:
  """Gives the next MirroredStrategy made in this process collective group keys
  no earlier strategy used.

  Every new strategy otherwise numbers its groups and instances from 1 again, and
  the runtime still holds the earlier strategy's resolved instances under the same
  keys: a second strategy over the same devices fails with "Shape mismatch in the
  collective instance 100" wherever one of its collectives meets an earlier one of
  another shape under the same keys (tensorflow/tensorflow#62790). TF's own
  tests work around it in the same way (distribute/strategy_combinations.py).
  MultiWorkerMirroredStrategy is left alone: its keys must agree between worker
  processes, and each process makes one.
  """
  global _strategies_made
  _strategies_made += 1
  base = _strategies_made * _KEY_RANGE
  tf.distribute.MirroredStrategy._collective_key_base = base   # pylint: disable=protected-access


def untuned_per_device_datasets() -> None:
  """Makes the per-device datasets of tf.distribute's MultiDeviceIterator untuned.

  tf.distribute feeds each replica's device through a dataset of its own (a generator
  over the host pipeline and a 1-element prefetch) built with default options, so each
  has tf.data's autotuning thread although nothing in it is tunable. Freeing such an
  iterator waits for that thread's timed sleep (up to a minute; ~IteratorResource ->
  ~RootDataset::Iterator -> ~LogicalThreadWrapper): 245 s in one test's teardown for the
  4 devices of a tensor-parallel ResNet, 20 s for a 4-replica run. Autotuning off there
  removes the thread; the input pipeline the workload builds keeps its own options.
  Idempotent.
  """
  from tensorflow.python.data.ops import multi_device_iterator_ops as mdi  # pylint: disable=import-outside-toplevel
  original = mdi._create_device_dataset   # pylint: disable=protected-access
  if getattr(original, "untuned", False):
    return

  def create_device_dataset(*args, **kwargs):
    options = tf.data.Options()
    options.autotune.enabled = False
    return original(*args, **kwargs).with_options(options)

  create_device_dataset.untuned = True
  mdi._create_device_dataset = create_device_dataset   # pylint: disable=protected-access


def onednn_enabled() -> bool:
  """Whether TensorFlow runs oneDNN's CPU kernels in this process (its build, and
  TF_ENABLE_ONEDNN_OPTS)."""
  from tensorflow.python.util import _pywrap_util_port  # pylint: disable=import-outside-toplevel
  return bool(_pywrap_util_port.IsMklEnabled())


# -- gin ---------------------------------------------------------------------------

def add_gin_search_path(path: str) -> None:
  """Adds path to gin's include search path once (gin appends duplicates)."""
  import gin  # pylint: disable=import-outside-toplevel
  if path not in gin.config._LOCATION_PREFIXES:  # pylint: disable=protected-access
    gin.add_config_file_search_path(path)


def gin_name(fn_or_cls) -> str | None:
  """The name a gin config uses for a configurable function or class ('small_resnet',
  'regimes.Compressed': the module only where one was given to gin); None if gin does
  not know it."""
  from gin import config  # pylint: disable=import-outside-toplevel
  try:
    info = config._inverse_lookup(fn_or_cls, allow_decorators=True)  # pylint: disable=protected-access
  except TypeError:   # Unhashable: not a function or class.
    return None
  if info is None:
    return None
  default_module = getattr(info.wrapped, "__module__", None)
  return info.name if info.module in (None, "", default_module) else info.selector


# -- tf.distribute and Keras variables: model parallelism ---------------------------------

def canonical_device(name: str) -> str:
  """A device name in TensorFlow's full form (/job:localhost/replica:0/task:0/device:CPU:0)."""
  from tensorflow.python.distribute import device_util  # pylint: disable=g-direct-tensorflow-import,import-outside-toplevel
  return device_util.canonicalize(name)


def current_device() -> str:
  """The device the enclosing tf.device scopes name, in full form."""
  from tensorflow.python.distribute import device_util  # pylint: disable=g-direct-tensorflow-import,import-outside-toplevel
  return device_util.canonicalize(device_util.current())


def destination_devices(destinations, per_replica_value) -> tuple:
  """The devices a CrossDeviceOps reduction goes to: those of `destinations`, or of the
  value itself where destinations names none."""
  from tensorflow.python.distribute import cross_device_ops  # pylint: disable=g-direct-tensorflow-import,import-outside-toplevel
  if cross_device_ops.check_destinations(destinations):
    return cross_device_ops.get_devices_from(destinations)
  return cross_device_ops.get_devices_from(per_replica_value)


def mirrored(per_device: list):
  """A tf.distribute Mirrored value from one tensor per device (a reduction's result)."""
  from tensorflow.python.distribute import distribute_utils, values  # pylint: disable=g-direct-tensorflow-import,import-outside-toplevel
  return distribute_utils.regroup(per_device, wrap_class=values.Mirrored, always_wrap=True)


def shard_variable(variable, axis: int, model: int) -> None:
  """Makes a MirroredVariable of a tensor-parallel mesh (component r on device
  (r // model, r % model)) hold a tensor split along axis over each model group:
  component r holds slot r % model's part. Inside a replicated step each device reads
  its part, as before; read anywhere else (the host, a checkpoint) the variable is
  the whole tensor, the parts of the first model group concatenated; a checkpoint
  restores each part from the whole."""
  from tensorflow.python.distribute import values  # pylint: disable=g-direct-tensorflow-import,import-outside-toplevel
  if type(variable) is not values.MirroredVariable:   # pylint: disable=unidiomatic-typecheck
    raise TypeError(f"only a MirroredVariable can be split, not {type(variable).__name__}.")
  variable.__class__ = _sharded_class()
  variable._shard_axis, variable._shard_model = axis, model   # pylint: disable=protected-access


def shard_axis(variable) -> int | None:
  """The axis a shard_variable variable is split along (None for any other)."""
  return getattr(variable, "_shard_axis", None)


_SHARDED = []


def _sharded_class():
  if _SHARDED:
    return _SHARDED[0]
  from tensorflow.python.distribute import values  # pylint: disable=g-direct-tensorflow-import,import-outside-toplevel

  class ShardedMirroredVariable(values.MirroredVariable):
    """See shard_variable."""

    def _whole(self):
      parts = []
      for v in self._values[:self._shard_model]:
        with tf.device(v.device):   # A resource is read where it lives.
          parts.append(v.read_value())
      return tf.concat(parts, axis=self._shard_axis)

    def _in_own_replica(self) -> bool:
      return (tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()
              and tf.distribute.get_strategy() is self._distribute_strategy)

    def _get(self):   # Reads, conversions and operators alike.
      return super()._get() if self._in_own_replica() else self._whole()

    def value(self):
      return super().value() if self._in_own_replica() else self._whole()

    def _serialize_to_tensors(self):
      return {"VARIABLE_VALUE": self._whole()}

    def _restore_from_tensors(self, restored_tensors):
      parts = tf.split(restored_tensors["VARIABLE_VALUE"], self._shard_model,
                       axis=self._shard_axis)
      return tf.group([v.assign(parts[r % self._shard_model])
                       for r, v in enumerate(self._values)])

  _SHARDED.append(ShardedMirroredVariable)
  return ShardedMirroredVariable


def rebind_keras_variable(variable: keras.Variable, tf_variable: tf.Variable) -> None:
  """Makes a Keras variable hold another TensorFlow variable (the same value, made on
  other devices); layers and optimizers keep the Keras variable itself."""
  if not isinstance(getattr(variable, "_value", None), tf.Variable):
    raise TypeError(f"{variable.path}: a Keras TensorFlow variable keeps its tf.Variable in "
                    f"_value; this Keras version does not.")
  variable._value = tf_variable   # pylint: disable=protected-access


def building_keras_layer():
  """The Keras layer whose build (or call) is running in this thread, or None: the
  caller of the innermost Keras name scope."""
  from keras.src.backend.common import global_state  # pylint: disable=import-outside-toplevel
  stack = global_state.get_global_attribute("name_scope_stack") or []
  for scope in reversed(stack):
    if isinstance(scope.caller, keras.layers.Layer):
      return scope.caller
  return None
