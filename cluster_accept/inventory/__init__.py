"""cluster-accept: inventory."""
