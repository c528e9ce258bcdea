"""Scaling: worker processes, logical replicas, gradient buckets on a link, the engine's
overhead, a step's compute/exchange split (README.md)."""
