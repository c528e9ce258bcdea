"""D4PG: where a run's CPU goes, the actors' env steps/s (README.md)."""
