"""The run directory: checkpoints, the run's files and tables, written as a run goes."""
