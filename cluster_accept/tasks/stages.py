"""The stages of a run, in the order a run takes them: what ``--stages`` and the suites choose from.

Configuration first (seconds per node, no GPU load), then each node alone, then the burn-in, then nodes together;
a stage is added by writing its module (a ``STAGE`` object, :class:`tasks.stage.Stage`) and naming it here."""

from __future__ import annotations

from cluster_accept.tasks import burn, multi_node, preflight, single_node
from cluster_accept.tasks.stage import Stage

STAGES: tuple[Stage, ...] = (preflight.STAGE, single_node.STAGE, burn.STAGE, multi_node.STAGE)
