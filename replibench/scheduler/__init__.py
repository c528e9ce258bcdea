"""Running a config on a cluster's own scheduler: SLURM jobs, Kubernetes manifests.

The cluster itself (which task this process is) stays in replibench/cluster.py;
this package writes what a scheduler needs to start the tasks.
"""
