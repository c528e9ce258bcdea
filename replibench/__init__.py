"""replibench: the TF-Replicator scaling experiments as a config-compiled benchmark suite."""

__version__ = "0.1.0"
