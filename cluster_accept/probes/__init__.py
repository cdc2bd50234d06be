"""cluster-accept: probes."""
