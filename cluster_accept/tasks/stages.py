"""The stages of a run, in the order a run takes them: what ``--stages`` and the suites choose from.

Configuration first (seconds per node, no GPU load), then each node alone, then the burn-in, then nodes together;
a stage is added by writing its module (a ``STAGE`` object, :class:`tasks.stage.Stage`) and naming it here.
What the stages' plug-ins declare (cause links, expectations, reasons, settings) is gathered here from them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cluster_accept.analysis import coverage
from cluster_accept.checks.declarations import Expectation, Link
from cluster_accept.checks.reasons import Reason, ReasonCatalog, catalog
from cluster_accept.tasks import burn, single_node
from cluster_accept.tasks.multi_node import stage as multi_node
from cluster_accept.tasks.preflight import stage as preflight
from cluster_accept.tasks.stage import Stage

STAGES: tuple[Stage, ...] = (preflight.STAGE, single_node.STAGE, burn.STAGE, multi_node.STAGE)
STAGE_NAMES = tuple(stage.name for stage in STAGES)
# Suites for scheduled checks: light is minutes (its stages with short probes and a short burn), full is every
# stage, burn is preflight and the burn (idle nodes burned in, DCGM's diagnostics run).
SUITES: dict[str, tuple[tuple[str, ...], bool]] = {
    "light": (tuple(s.name for s in STAGES if "light" in s.suites), True),
    "full": (tuple(s.name for s in STAGES if "full" in s.suites), False),
    "burn": (tuple(s.name for s in STAGES if "burn" in s.suites), False),
}


def resolve_stages(requested: list[str] | None) -> list[str]:
    """The requested stages in run order (default: all); an unknown name is a usage error."""
    if not requested:
        return list(STAGE_NAMES)
    for name in requested:
        if name not in STAGE_NAMES:
            raise ValueError(f"unknown stage {name!r}; stages are: {', '.join(STAGE_NAMES)}")
    return [s for s in STAGE_NAMES if s in requested]


def resolve_suite(suite: str | None, stages: list[str] | None) -> tuple[list[str], bool]:
    """(stages, short probes) of a suite, or of the requested stages when no suite is named."""
    if suite is None:
        return resolve_stages(stages), False
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; suites are: {', '.join(SUITES)}")
    if stages:
        raise ValueError("give a suite or stages, not both")
    suite_stages, quick = SUITES[suite]
    return list(suite_stages), quick


def declared_links() -> tuple[Link, ...]:
    """Every cause link the stages' checks and probes declare, each stage's in its priority order."""
    return tuple(link for stage in STAGES for link in stage.causes())


def declared_expectations() -> tuple[Expectation, ...]:
    """Every expectation of a profile the stages' checks and probes answer."""
    return tuple(e for stage in STAGES for e in stage.expectations())


def reason_catalog(extra: Sequence[tuple[str, Mapping[str, Reason]]] = ()) -> ReasonCatalog:
    """Every reason the stages and their checks and probes declare (and ``extra``, a sharded run's own): what
    the report's wording reads."""
    stages = [pair for stage in STAGES for pair in stage.reasons()]
    return catalog([*stages, (coverage.NAME, coverage.REASONS), *extra])
