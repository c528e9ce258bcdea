"""The regression tracker's noise and power (README.md)."""
