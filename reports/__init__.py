"""cluster-accept: reports."""
