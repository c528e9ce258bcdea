"""Model parallelism: memory and step time against the devices a replica spans
(README.md)."""
