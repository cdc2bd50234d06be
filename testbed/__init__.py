"""cluster-accept: testbed."""
