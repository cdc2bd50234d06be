"""Node-side readers of a watched job's signals: standard library only, shipped to the node and run there over SSH."""
