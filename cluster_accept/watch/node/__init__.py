"""Node-side scripts of the watcher: the shim armed jobs load, and the readers the watcher runs over SSH."""
