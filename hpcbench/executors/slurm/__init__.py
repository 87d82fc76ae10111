"""The Slurm executor: submission through submitit (executor.py), what a job runs on its
nodes (job.py), and the sbatch option vocabulary a spec may set (options.py)."""

from hpcbench.executors.slurm.executor import SlurmExecutor

__all__ = ["SlurmExecutor"]
