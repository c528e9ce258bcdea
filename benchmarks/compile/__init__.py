"""Graph against XLA, paired (README.md)."""
