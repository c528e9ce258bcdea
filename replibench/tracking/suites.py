"""The suites the tracker knows: `make bench`'s three, each a sweep file in the repo.

Each suite's default A/B design (which configurations, seeds and rounds an A/B runs
unless --configs, --seeds or --rounds say otherwise) is chosen for power within the
time: one suite's A/B must fit 15 minutes on a 2-core machine and `make bench-ab` 30.
At the paired noise measured on a 2-core VM (ResNet's examples/s ~12% a pair) a 10%
loss needs about 20 pairs to be seen 9 times in 10; results/tracking/README.md has
the noise, the power and the measured times.

A suite may also run the A/B's throughput probe (replibench/tracking/probe.py): after
its time-to-target pairs, `processes` short processes per side and configuration,
interleaved ABBA, each `steps` training steps in windows of `window_steps`; the
probe's examples/s row then replaces the trials' own examples/s row (whose noise
is the trials' start-up, ~12% a pair on ResNet).
"""

import dataclasses

from replibench.errors import UserError


@dataclasses.dataclass(frozen=True)
class ProbeDesign:
  """The throughput probe's numbers (probe.Design adds the estimator it judges).

  processes: per side and configuration (the probe's pairs: processes x configs)
  steps: training steps per process, in windows of window_steps, the first
    warmup_windows left out (so steps // window_steps - warmup_windows steady ones)
  configs: the configurations probed (None: the suite's A/B configurations)
  """
  processes: int = 4
  steps: int = 300
  window_steps: int = 20
  warmup_windows: int = 3
  seed: int = 1
  configs: tuple[str, ...] | None = None

  def check(self) -> None:
    steady = self.steps // self.window_steps - self.warmup_windows
    if self.processes < 2 or steady < 2:
      raise ValueError(f"probe design {self}: needs >= 2 processes and >= 2 steady windows "
                       f"(steps // window_steps - warmup_windows)")


@dataclasses.dataclass(frozen=True)
class Suite:
  name: str
  sweep: str           # relative to the repository root
  rounds: int = 1
  configs: tuple[str, ...] | None = None   # None: every configuration of the sweep
  seeds: tuple[int, ...] | None = None     # None: the sweep file's seeds
  probe: ProbeDesign | None = None         # None: no throughput probe


SUITES = {s.name: s for s in (
    # One process, logical replicas and worker processes (--configs=all adds the
    # sweep's replicas=4 and workers=1). Time to target and steps to target from 3 seeds
    # x 3 configurations = 9 pairs (time to target moves ~9-12% a pair; steps are exact
    # for a seed); examples/s from the probe: replicas=1 and workers=2, 4 processes a
    # side each of 300 steps (15 windows of 20, 3 of warm-up) = 8 pairs.
    # Timed (2026-11-27, Zen 4, A/A): with 4 seeds (12 pairs) 15.7 min, the 24 trials
    # 8.5 min and the probe's 16 processes 7.2: over the 15. 3 seeds drop 6 trials
    # (~2.1 min): ~13.6 min. results/tracking/README.md: the design and its power.
    Suite("resnet", "configs/resnet/scaling.sweep", rounds=1,
          configs=("replicas=1", "replicas=2", "workers=2"), seeds=tuple(range(1, 4)),
          probe=ProbeDesign(processes=4, steps=300, configs=("replicas=1", "workers=2"))),
    # 6 pairs, ~9 min: time to target moves ~5% a pair (examples/s ~9%).
    Suite("sngan", "configs/sngan/batch_scaling.sweep", rounds=1),
    # Time and learner steps to return 500 on cartpole-balance, and learner examples/s
    # (the sweep's judge list). 4 pairs (one process and two worker processes, seeds 1
    # and 2): 5.7-6.2 min measured (2026-11-27). Time to target moves ~0.5 a pair on
    # the log scale (a seed's runs need 1,500-4,000 learner steps: the actors are
    # asynchronous), so it catches only large losses; examples/s (0.044 a pair) is the
    # sensitive row: a 10% loss caught in ~50% of runs at 4 pairs, 92% at 6
    # (--configs=all adds replicas=2). results/tracking/README.md, "D4PG judged on
    # time to target".
    Suite("d4pg", "configs/d4pg/learner_scaling.sweep", rounds=1,
          configs=("replicas=1", "workers=2")),
)}
ALL_CONFIGS = "all"   # --configs=all: every configuration of the sweep


def parse(value: str, flag: str = "--suite") -> list[Suite]:
  """`resnet`, `resnet,sngan` or `all` -> the suites, in that order."""
  names = list(SUITES) if value == "all" else [v.strip() for v in value.split(",") if v.strip()]
  unknown = [n for n in names if n not in SUITES]
  if not names or unknown:
    raise UserError(f"{flag}={value}: choose from {', '.join(SUITES)} or all (a comma-"
                    f"separated list works too).")
  return [SUITES[n] for n in dict.fromkeys(names)]
