"""benchmarks/scaling/overlap.py's report: the profiled split beside the step time (--profile)
and the check that gradient buckets leave the bytes on the wire unchanged."""

import pytest


@pytest.fixture(name="overlap")
def _overlap():
  from benchmarks.scaling import overlap   # pylint: disable=import-outside-toplevel
  return overlap


def _figures(step_ms, wire, profile_ms=None):
  f = {"step_ms": step_ms, "examples_per_s": 256e3 / step_ms, "bytes_on_wire_per_step": wire,
       "gradient_collectives": 1, "exchange_alone_ms": 1.0, "exchange_share": 1.0 / step_ms}
  if profile_ms:
    compute, exchange, wait = profile_ms
    f.update(profile_wall_ms=compute + exchange + wait, profile_compute_ms=compute,
             profile_exchange_ms=exchange, profile_wait_ms=wait, profile_exchange_hidden_ms=0.5,
             profile_exchange_share=exchange / (compute + exchange + wait))
  return f


def test_profile_traces_steps_after_the_timed_ones(overlap):
  w = overlap.scaling.WORKLOADS["resnet"]
  plain = overlap.command(w, "1gbit", 0)
  traced = overlap.command(w, "1gbit", 0, 2, profile_steps=10)
  assert f"--max_steps={w.steps}" in plain and not any("profile_steps" in a for a in plain)
  assert f"--max_steps={w.steps + 10}" in traced and "--network=1gbit" in traced
  assert (f"--gin_bindings=Experiment.profile_steps = ({w.steps + 1}, {w.steps + 10})"
          in traced)


def test_the_table_shows_the_traced_split_and_the_wire_against_one_all_reduce(overlap):
  trials = {("none", 0): [_figures(30, 1000, (25, 2, 3)), _figures(32, 1000, (25, 4, 3))],
            ("none", 4096): [_figures(31, 1010, (26, 1, 3))] * 2}
  lines = overlap.table(trials, ["none"], [0, 4096])
  assert "exch share" in lines[0] and "traced ms" in lines[0]
  assert lines[1].split()[:3] == ["none", "0", "31.00"]
  assert "1.010" in lines[2].split()   # The wire against one all-reduce.
  assert lines[1].split("|")[1].split()[:3] == ["31.00", "25.00", "3.00"]  # Medians.
  ok, verdict = overlap.wire_check(trials, ["none"], [0, 4096])
  assert ok and "unchanged" in verdict and "+1.0%" in verdict


def test_more_bytes_on_the_wire_with_buckets_fails_the_check(overlap):
  trials = {("1gbit", 0): [_figures(30, 1000)], ("1gbit", 4096): [_figures(30, 1200)]}
  ok, verdict = overlap.wire_check(trials, ["1gbit"], [0, 4096])
  assert not ok and "CHANGED" in verdict and "1gbit bucket=4096: +20.0%" in verdict
  # Unprofiled trials: no split columns.
  assert "traced ms" not in overlap.table(trials, ["1gbit"], [0, 4096])[0]
