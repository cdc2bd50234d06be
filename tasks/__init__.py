"""cluster-accept: tasks."""
