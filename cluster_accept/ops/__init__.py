"""What a run does to the cluster's operations once its verdicts are known: Slurm's drain and resume, the Prometheus
text file, the summary."""
