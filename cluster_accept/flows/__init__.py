"""cluster-accept: flows."""
