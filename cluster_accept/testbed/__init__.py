"""cluster-accept test-bed: a simulated GPU cluster of real OpenSSH servers on this machine.

Each node is a network namespace on a bridge with its own sshd, serving real captured GPU-tool outputs
(``captures/``) with planted faults, so the whole tool runs end to end without GPUs or a cluster.

- :mod:`testbed.bed` — ``up``/``down``/``load`` and run-time changes (``kill_sshd``, ``set_rate``, ``set_fault``)
- :mod:`testbed.faults` — fault plans (YAML or Python)
- :mod:`testbed.nodedata` — captures + faults -> a node's data dir
- :mod:`testbed.standins` — node-side ``nvidia-smi`` and ``dmesg``
- :mod:`testbed.net`, :mod:`testbed.sshd`, :mod:`testbed.profile` — namespaces, sshd, the inventory written
- :mod:`testbed.claim`, :mod:`testbed.subnets` — which test-bed holds a name or state dir; a free subnet
"""
