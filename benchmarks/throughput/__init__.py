"""Full-size throughput on synthetic data, Keras' peer, a profile's top ops and the GPU
goals (README.md)."""
