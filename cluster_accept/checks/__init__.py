"""cluster-accept: checks."""
