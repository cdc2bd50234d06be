"""What every probe shares: the probe shape, the node-side runs probes ship, and probe discovery.

A probe is one module in ``probes/`` (controller side) that defines:

- ``NAME``: the check name its rows carry (``gemm``, ``hbm``, ``allreduce`` …); ``CHECK`` when several
  probe modules speak for one check (the nccl-tests variant of ``allreduce``);
- ``SCRIPT``: the :class:`NodeScript` it runs on the node. Probes may share one: ``gemm``, ``hbm`` and
  ``host_bw`` read the one GPU-bench run, which loads every GPU at once as a training job does;
- ``METRICS``: the figures it judges, metric -> :class:`~cluster_accept.analysis.probe_verdicts.MetricRule`;
- ``REASONS``: its reason codes (:mod:`cluster_accept.checks.reasons`);
- ``parse(stdout) -> ProbeOutput``: pure; its figures from the run's output (other figures are left out);
- ``evaluate(figures, profiles) -> [(node, CheckRow)]``: pure, over the whole cluster's figures (thresholds
  from the profile, stragglers against the cluster's median);
- optionally ``inspect(output, profile) -> [CheckRow]``: per-node rows read off the output (the transport
  NCCL used, a skip);
- optionally ``report(view) -> ReportSection | None``: its chart and table in the report's measurements;
- optionally ``compare(outputs, profiles) -> [(node, CheckRow)]``: pure, over every node's output, for what is
  judged across nodes without being a figure (the silent-data-corruption digests);
- optionally ``ORDER`` (its place in the report) and ``STAGE`` (default ``single-node``; ``burn``).

Adding a probe is adding a module (and its node-side script under ``probes/node/`` when it needs a new
one): :func:`discover` finds it by walking the package, as checks are found. Third-party probes can be
added to ``cluster_accept.probes.__path__`` or published under the ``cluster_accept.probes`` entry point.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

import pandas as pd

from cluster_accept.analysis.probe_output import ProbeOutput, parse_json_lines
from cluster_accept.analysis.probe_verdicts import MetricRule, judge
from cluster_accept.checks.base import CheckRow
from cluster_accept.checks.reasons import Reason
from cluster_accept.inventory.model import Node, Profile

ENTRY_POINTS = "cluster_accept.probes"
SINGLE_NODE = "single-node"


@dataclass(frozen=True)
class NodeScript:
    """One node-side run: the files it ships (from ``probes/node/``) and its command line.

    ``command(node, quick)`` is the line run in the node's probe directory (``$CA_PROBE_DIR``), or None when
    this run is not for the node's profile (the nccl-tests variant runs only where a profile names it).
    ``owner`` is the check whose rows report the run itself failing (a timeout, a crash), once per run;
    ``timeout_s(node, quick)`` its node-side limit when it is not the profile's ``probes.timeout_s``."""

    name: str
    files: tuple[str, ...]
    owner: str
    command: Callable[[Node, bool], str | None]
    timeout_s: Callable[[Node, bool], float] | None = None  # default: the profile's probes.timeout_s

    def timeout_for(self, node: Node, quick: bool) -> float:
        """How long the run may take on ``node``: a burn lasts its minutes plus the usual margin."""
        return self.timeout_s(node, quick) if self.timeout_s else node.profile.probes.timeout_s


@dataclass(frozen=True)
class Probe:
    """A discovered probe module, typed."""

    name: str
    check: str
    stage: str
    order: int
    script: NodeScript
    metrics: Mapping[str, MetricRule]
    reasons: Mapping[str, Reason]
    parse: Callable[[str], ProbeOutput]
    evaluate: Callable[[pd.DataFrame, Mapping[str, Profile]], list[tuple[str, CheckRow]]]
    inspect: Callable[[ProbeOutput, Profile], list[CheckRow]] | None
    compare: Callable[[Mapping[str, ProbeOutput], Mapping[str, Profile]], list[tuple[str, CheckRow]]] | None
    report: Callable[[Any], Any] | None
    module: ModuleType

    def command(self, node: Node, quick: bool = False) -> str | None:
        return self.script.command(node, quick)


_REQUIRED = ("NAME", "SCRIPT", "METRICS", "REASONS", "parse", "evaluate")


def _as_probe(module: ModuleType) -> Probe | None:
    if not isinstance(getattr(module, "SCRIPT", None), NodeScript):
        return None
    missing = [a for a in _REQUIRED if not hasattr(module, a)]
    if missing:
        raise TypeError(f"probe module {module.__name__} lacks {', '.join(missing)}")
    return Probe(
        name=module.NAME,
        check=getattr(module, "CHECK", module.NAME),
        stage=getattr(module, "STAGE", SINGLE_NODE),
        order=int(getattr(module, "ORDER", 100)),
        script=module.SCRIPT,
        metrics=module.METRICS,
        reasons=module.REASONS,
        parse=module.parse,
        evaluate=module.evaluate,
        inspect=getattr(module, "inspect", None),
        compare=getattr(module, "compare", None),
        report=getattr(module, "report", None),
        module=module,
    )


def _modules(package: str) -> list[ModuleType]:
    root = importlib.import_module(package)
    found = []
    for info in pkgutil.iter_modules(root.__path__):
        if not info.name.startswith("_") and not info.ispkg:
            found.append(importlib.import_module(f"{package}.{info.name}"))
    found += [entry.load() for entry in entry_points(group=ENTRY_POINTS)]
    return found


def discover(package: str = "cluster_accept.probes", stage: str | None = None) -> list[Probe]:
    """Every probe module in ``package`` (and under the entry point), by report order then name; a name
    claimed twice is an error naming both modules."""
    probes: dict[str, Probe] = {}
    for module in _modules(package):
        probe = _as_probe(module)
        if probe is None:
            continue
        if probe.name in probes and probes[probe.name].module is not module:
            raise TypeError(
                f"probe {probe.name!r} defined by {probes[probe.name].module.__name__} and {module.__name__}"
            )
        probes[probe.name] = probe
    chosen = [p for p in probes.values() if stage is None or p.stage == stage]
    return sorted(chosen, key=lambda p: (p.order, p.name))


def scripts_for(node: Node, probes: Sequence[Probe], quick: bool = False) -> list[NodeScript]:
    """The node-side runs ``node`` needs for ``probes``, each once, in probe order."""
    found: dict[str, NodeScript] = {}
    for probe in probes:
        if probe.command(node, quick) is not None:
            found.setdefault(probe.script.name, probe.script)
    return list(found.values())


def own_figures(output: ProbeOutput, metrics: Mapping[str, MetricRule]) -> ProbeOutput:
    """The part of a shared run's output that is this probe's figures, with the run's info and errors (the
    stage reports errors once, under the run's owner)."""
    mine = [m for m in output.measurements if m.get("metric") in metrics]
    return ProbeOutput(measurements=mine, info=output.info, errors=output.errors)


def json_figures(metrics: Mapping[str, MetricRule]) -> Callable[[str], ProbeOutput]:
    """``parse`` for a probe whose node-side script prints JSON lines: its own figures of the run."""

    def parse(stdout: str) -> ProbeOutput:
        return own_figures(parse_json_lines(stdout), metrics)

    return parse


def cluster_judgement(
    metrics: Mapping[str, MetricRule],
) -> Callable[[pd.DataFrame, Mapping[str, Profile]], list[tuple[str, CheckRow]]]:
    """``evaluate`` for a probe judged the usual way: each figure against its profile threshold and against
    the cluster's median (per GPU or per node), as its rule says."""

    def evaluate(figures: pd.DataFrame, profiles: Mapping[str, Profile]) -> list[tuple[str, CheckRow]]:
        return judge(figures, metrics, {node: profile.thresholds for node, profile in profiles.items()})

    return evaluate
