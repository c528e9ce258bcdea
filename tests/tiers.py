"""The test tiers: `make test` runs every test; `make test-quick` leaves out the modules
below (marker `full`), those that start a cluster (`launch`, a SLURM, a parameter-server
cluster), train a config to its end or compile every model, for an edit-test loop of
minutes on 2 cores.

A module belongs here when its tests cost more than ~8 s of a 2-core run in all (their
times: `pytest --durations=0`); a new module is quick until it does. Measured
2026-12-05 on the 2-core Zen 5 (docs/reference/tests-and-benchmarks.md).
"""

FULL = {
    # Clusters of processes: launch, multi-worker, parameter servers, SLURM, the wire.
    "test_async_ps": "parameter-server clusters",
    "test_backup_workers": "parameter-server clusters with stragglers",
    "test_compressed_wire": "worker clusters on the compressed wire",
    "test_launch": "launch's clusters",
    "test_multiworker": "worker clusters against one process",
    "test_network": "clusters in network namespaces",
    "test_regimes": "each regime's cluster",
    "test_reliability": "clusters that lose and restart tasks",
    "test_slurm_local": "a real one-node SLURM",
    "test_swarm_sgd": "decentralised clusters",
    # Full runs and every model compiled.
    "test_compile": "graph and XLA runs of every workload",
    "test_configs_end_to_end": "every config end to end",
    "test_gan_workload": "SN-GAN runs to their end",
    "test_harness_behaviour": "runs stopped, resumed and diverged",
    "test_model_parallel_runs": "model-parallel runs",
    "test_precision": "bfloat16 runs against float32",
    "test_predict": "runs whose times the predictor is fitted on",
    "test_profile_benchmarks": "profiled runs",
    "test_scaling_bench": "the scaling benchmark's runs",
    "test_synthetic": "full-size models on synthetic data",
    "test_tracking_ab": "A/B runs of two checkouts",
}
