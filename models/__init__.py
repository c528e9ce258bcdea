"""Plain model code (Keras). Nothing here imports the replibench engine."""
