"""Workloads: the researcher's side of the programming model (input_fn, step_fn, eval).

Each workload joins plain model code from models/ to the engine's primitives.
The interface every workload implements is in `base.py`.
"""
