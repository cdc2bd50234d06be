"""The training probe's node-side script: shipped to the node and run there with torch and the standard library only
(never imported by the controller)."""
