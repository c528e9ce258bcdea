"""XLA's compilation is left out of the timed span and recorded (harness/timed_span.py
XlaCompilation, result.json xla_compile_s)."""

import time

from replibench import config, results
from replibench.harness.loop import run_experiment
from replibench.harness.timed_span import TimedSpan, XlaCompilation
from tests import helpers


class _Clock:
  def __init__(self):
    self.now = 0.0

  def __call__(self) -> float:
    return self.now


def _calls(compilation: XlaCompilation, span: TimedSpan, clock: _Clock, seconds, traced=()):
  for i, s in enumerate(seconds):
    clock.now += s
    compilation.call_ended(s, span, traced=i in traced)


def test_the_first_calls_excess_over_the_second_leaves_the_span():
  clock = _Clock()
  span, compilation = TimedSpan(10.0, clock=clock), XlaCompilation(True)
  _calls(compilation, span, clock, [7.0])
  assert compilation.seconds is None and span() == 17.0   # One call: nothing to compare yet.
  _calls(compilation, span, clock, [1.5, 2.0])
  assert compilation.seconds == 5.5
  assert span() == 10.0 + 1.5 + 1.5 + 2.0   # The first call counts as a compiled one.


def test_a_traced_second_call_is_skipped_and_graph_runs_are_unchanged():
  clock = _Clock()
  span, compilation = TimedSpan(clock=clock), XlaCompilation(True)
  _calls(compilation, span, clock, [7.0, 4.0, 1.0], traced={1})
  assert compilation.seconds == 6.0 and span() == 12.0 - 6.0
  graph_clock = _Clock()
  graph_span, graph = TimedSpan(clock=graph_clock), XlaCompilation(False)
  _calls(graph, graph_span, graph_clock, [7.0, 1.0])
  assert graph.seconds is None and graph_span() == 8.0


def test_a_compiled_run_records_its_compilation_outside_the_span(tmp_path):
  """A tiny compiled run (one replica, 3 calls of one step): xla_compile_s in
  result.json, below the first call's time, and the timed span within the session's
  wall time less init and the compilation (which holds only if the span leaves the
  compilation out: the rest of the session outside init and span is well under it)."""
  gin_file = "configs/resnet/fashion_mnist.gin"
  experiment = config.load_experiment(
      # Two blocks (test_compile's): what is checked is where the compilation is counted.
      [gin_file], [*helpers.TINY[gin_file], "small_resnet.widths = (4, 8)",
                   "small_resnet.blocks_per_stage = (1, 1)",
                   "Experiment.topology = @topology.Local()",
                   "topology.Local.num_replicas = 1", "topology.Local.device = 'cpu'",
                   "Experiment.jit_compile = True"])
  start = time.monotonic()
  result = run_experiment(experiment, str(tmp_path / "run"), max_steps=3)
  wall = time.monotonic() - start
  assert result.jit_compile is True and result.final_step == 3
  assert result.xla_compile_s is not None and 0 < result.xla_compile_s < result.first_call_s
  assert result.total_s <= wall - result.init_s - result.xla_compile_s
  assert results.read(str(tmp_path / "run")).xla_compile_s == result.xla_compile_s
