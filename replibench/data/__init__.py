"""Input pipelines: Fashion-MNIST from IDX files (or TFDS), and TFDS image datasets.

Every `dataset(...)` follows tf.distribute's input_fn contract: it is called once
per input pipeline with (input_pipeline_id, num_input_pipelines) and yields that
pipeline's per-replica batches.
"""
