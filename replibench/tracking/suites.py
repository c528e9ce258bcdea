"""The suites the tracker knows: `make bench`'s three, each a sweep file in the repo.

`rounds` is how many times an A/B runs each trial per side by default: one suite's
A/B must fit 15 minutes on a 2-core machine and `make bench-ab` 30
(results/tracking/README.md has the measured times).
"""

import dataclasses

from replibench.errors import UserError


@dataclasses.dataclass(frozen=True)
class Suite:
  name: str
  sweep: str           # relative to the repository root
  rounds: int = 1


SUITES = {s.name: s for s in (
    Suite("resnet", "configs/resnet/scaling.sweep", rounds=1),
    Suite("sngan", "configs/sngan/batch_scaling.sweep", rounds=1),
    Suite("d4pg", "configs/d4pg/learner_scaling.sweep", rounds=2),
)}


def parse(value: str, flag: str = "--suite") -> list[Suite]:
  """`resnet`, `resnet,sngan` or `all` -> the suites, in that order."""
  names = list(SUITES) if value == "all" else [v.strip() for v in value.split(",") if v.strip()]
  unknown = [n for n in names if n not in SUITES]
  if not names or unknown:
    raise UserError(f"{flag}={value}: choose from {', '.join(SUITES)} or all (a comma-"
                    f"separated list works too).")
  return [SUITES[n] for n in dict.fromkeys(names)]
