"""The run's own state (eval curve, sessions, outcome), saved inside each checkpoint.

Everything result.json is made from that is not a model variable lives here,
and it is written in the same checkpoint as the weights, as one string
variable: a kill can never leave a checkpoint and its curve out of step (a
separate progress.json was), and a run killed after its final checkpoint but
before result.json finds its outcome in the checkpoint and only writes it out,
instead of training past its target.
"""

import dataclasses
import json

import tensorflow as tf


@dataclasses.dataclass
class RunState:
  """JSON-able. curve rows: [step, timed seconds, target metric]."""

  curve: list = dataclasses.field(default_factory=list)
  last_eval: dict | None = None
  at_target: dict | None = None
  regime_sums: dict = dataclasses.field(default_factory=dict)   # key -> [sum, count]
  eval_time: list = dataclasses.field(default_factory=lambda: [0.0, 0])   # [seconds, evaluations]
  sessions: list = dataclasses.field(default_factory=list)
  status: str | None = None        # Set once the run is over: reached / budget_exhausted / diverged.
  reached_at: int | None = None    # The step whose evaluation met the target.
  # The last session's examples_per_s, first_call_s and machine calibration: what
  # result.json reports, kept for a run that must write its result again.
  throughput: dict = dataclasses.field(default_factory=dict)

  def add_regime_metrics(self, outputs: dict) -> None:
    """Adds a call's 'regime/...' scalars to the run's running means."""
    for key, value in outputs.items():
      if key.startswith("regime/"):
        total, count = self.regime_sums.get(key, (0.0, 0))
        self.regime_sums[key] = [total + float(value), count + 1]

  def regime_means(self) -> dict:
    return {k: total / count for k, (total, count) in self.regime_sums.items() if count}

  def begin_session(self, step: int, init_s: float) -> None:
    """A new session (the first run or a resume) starts at step."""
    self.sessions.append({"start_step": step, "end_step": step, "init_s": round(init_s, 3),
                          "timed_s": 0.0})

  def update_session(self, step: int, timed_s: float) -> None:
    self.sessions[-1].update(end_step=step, timed_s=round(timed_s, 3))


class StateVariable:
  """A RunState kept in a tf.Variable (a JSON string) so a Checkpoint saves it."""

  def __init__(self):
    self.variable = tf.Variable("{}", dtype=tf.string, trainable=False, name="run_state")

  def store(self, state: RunState) -> None:
    self.variable.assign(json.dumps(dataclasses.asdict(state)))

  def load(self) -> RunState:
    """The restored state; an empty one if nothing was restored.

    Raises ValueError if the stored text is not a RunState (a corrupt checkpoint).
    """
    data = json.loads(self.variable.numpy().decode("utf-8"))
    if not isinstance(data, dict):
      raise ValueError(f"run state is a {type(data).__name__}, not an object")
    fields = {f.name for f in dataclasses.fields(RunState)}
    return RunState(**{k: v for k, v in data.items() if k in fields})
