"""SLURM against the local launch (README.md)."""
