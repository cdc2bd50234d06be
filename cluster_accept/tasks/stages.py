"""The stages of a run, in the order a run takes them: what ``--stages`` and the suites choose from.

Configuration first (seconds per node, no GPU load), then each node alone, then the burn-in, then nodes together;
a stage is added by writing its module (a ``STAGE`` object, :class:`tasks.stage.Stage`) and naming it here.
What the stages' plug-ins declare (cause links, expectations, settings) is gathered here from them."""

from __future__ import annotations

from cluster_accept.checks.declarations import Expectation, Link
from cluster_accept.tasks import burn, single_node
from cluster_accept.tasks.multi_node import stage as multi_node
from cluster_accept.tasks.preflight import stage as preflight
from cluster_accept.tasks.stage import Stage

STAGES: tuple[Stage, ...] = (preflight.STAGE, single_node.STAGE, burn.STAGE, multi_node.STAGE)


def declared_links() -> tuple[Link, ...]:
    """Every cause link the stages' checks and probes declare, each stage's in its priority order."""
    return tuple(link for stage in STAGES for link in stage.causes())


def declared_expectations() -> tuple[Expectation, ...]:
    """Every expectation of a profile the stages' checks and probes answer."""
    return tuple(e for stage in STAGES for e in stage.expectations())
