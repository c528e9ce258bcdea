"""The harness: drives the engine through a compiled experiment and measures it."""
