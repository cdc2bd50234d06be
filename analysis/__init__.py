"""cluster-accept: analysis."""
