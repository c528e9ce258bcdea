"""Reinforcement-learning plumbing for D4PG: dm_control environments, n-step
transitions, replay and multi-process actors.

Kept free of heavy imports at package level: actor processes import only the
modules they need (numpy, dm_control and the TF policy).
"""
