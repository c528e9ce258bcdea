"""Link rates in tc's units ('100mbit', '1gbit', '512kbit'; 'none' = unlimited).

One parser for the launcher (which hands the rate to tc), sweep files (which name
it per point), the suite's plots (which put it on an axis) and `predict` (which
models the launcher's token-bucket link).
"""

import math
import re

from replibench import inputs
from replibench.errors import UserError

_RATE = re.compile(r"^(?:none|(\d+(?:\.\d+)?)([kmg]?)bit)$")
_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9}
# The rates a link may have: tc's token bucket needs at least a byte a second and a
# burst (token_bucket_bytes) under 4 GiB, i.e. at most 3.4 Tbit/s; these bounds leave
# room on both sides and cover every link a prediction models (10 Gbit/s Ethernet to
# 400 Gbit/s InfiniBand).
LOWEST, HIGHEST = "1kbit", "1000gbit"


def is_rate(value) -> bool:
  return isinstance(value, str) and _RATE.match(value) is not None


def check(culprit: str, value) -> str:
  """value, checked to be 'none' (an unlimited link) or a rate in tc's units between
  LOWEST and HIGHEST; UserError naming the culprit (a flag or key) otherwise."""
  if value == "none" or (is_rate(value) and bits_per_second(LOWEST) <= bits_per_second(value)
                         <= bits_per_second(HIGHEST)):
    return value
  raise UserError(f"{inputs.binding(culprit, value)}: give 'none' (unlimited) or a rate in "
                  f"tc's units from {LOWEST} to {HIGHEST} (e.g. 100mbit, 1gbit, 25gbit).")


def bits_per_second(value: str) -> float:
  """The rate in bit/s (inf for 'none'); ValueError if value is not a rate."""
  match = _RATE.match(value or "")
  if match is None:
    raise ValueError(f"not a link rate: {value!r}")
  return math.inf if value == "none" else float(match[1]) * _UNITS[match[2]]


def token_bucket_bytes(value: str) -> int:
  """The size of the token bucket (tc tbf burst) `replibench launch --network=value`
  gives its link: it must hold a whole loopback packet (MTU 64 KiB) and ~10 ms of
  traffic. A link idle long enough to refill it passes that many bytes at once, so a
  transfer of B bytes takes at least (B - burst) * 8 / rate seconds."""
  return max(256 * 1024, int(bits_per_second(value) / 8 / 100))
