"""tests/tiers.py names modules that exist (a renamed module would fall silently into
make test-quick)."""

import os

from tests import tiers


def test_every_full_module_exists():
  here = os.path.dirname(__file__)
  missing = [m for m in tiers.FULL if not os.path.isfile(os.path.join(here, m + ".py"))]
  assert not missing, f"tests/tiers.py names modules that do not exist: {missing}"
