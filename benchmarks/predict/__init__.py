"""Prediction: calibrating a machine, fitting steps against batch, checking predictions
(README.md)."""
