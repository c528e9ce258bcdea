"""The machine's fingerprint, for the tracker: defined in replibench/machine.py, below
the harness (which records it in result.json) and the tracker alike."""

from replibench.machine import KERNEL_FLAGS, describe, fingerprint  # noqa: F401
