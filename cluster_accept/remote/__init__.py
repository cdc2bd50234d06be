"""cluster-accept: remote."""
