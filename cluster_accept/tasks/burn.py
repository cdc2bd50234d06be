"""The burn stage: sustained load on every node still accepted, the silent-data-corruption check after it, and DCGM's
diagnostics where the node has DCGM; in the light suite a short burn and DCGM's level 1.

Runs after the short single-node probes (a node that already failed them is not burned) and before the multi-node
stage, on the nodes whose profile asks for any of it. Every node burns at once (up to the profile's
``max_parallel_nodes``): a burn is minutes, and a cluster burned a node at a time would take days. One
:class:`~tasks.probe_stage.ProbeStage` over the ``burn`` probes (the burn, ``sdc``, ``dcgm``), each run under its
own node-side limit; the burn's per-second series go to ``burn/<node>.parquet`` as each node is judged, and a
thinned copy to the report (the probe declares it: ``Probe.series``).
"""

from __future__ import annotations

from cluster_accept.inventory.model import Node
from cluster_accept.tasks.probe_stage import ProbeStage

NAME = "burn"


def burns(node: Node) -> bool:
    """Whether the node's profile asks the stage for anything: a burn, the silent-data check or DCGM."""
    return node.profile.burn.runs


STAGE = ProbeStage(
    NAME, suites=frozenset({"light", "full", "burn"}), tables=("checks", "measurements", "settings"), takes=burns
)
