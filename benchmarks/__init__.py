"""The benchmark scripts (benchmarks/README.md): each is run as a file from the checkout,
`.venv/bin/python benchmarks/<concern>/<script>.py`, and puts the checkout on sys.path
first. A package only so that scripts and tests import one another by one name
(`from benchmarks.scaling import scaling`); never installed (pyproject's packages)."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
