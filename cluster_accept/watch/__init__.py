"""Watching a running training job: arming it through its environment, and reading its signals from each node."""
