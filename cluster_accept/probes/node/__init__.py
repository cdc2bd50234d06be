"""Node-side probe scripts: shipped to a node's private probe directory and run there.

They need only torch and the standard library (a node has no cluster-accept installed), and the controller
never imports them: each probe module in :mod:`cluster_accept.probes` names the script it ships.
"""
