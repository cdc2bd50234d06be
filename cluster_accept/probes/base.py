"""What every probe shares: the probe shape, the node-side runs probes ship, and probe discovery.

A probe is one module in ``probes/`` (controller side; a big probe: one sub-package, its node-side script
beside it) that declares ``PROBE = Probe(...)``:

- ``name``: the check name its rows carry (``gemm``, ``hbm``, ``allreduce`` …); ``check`` when several
  probes speak for one check (the nccl-tests variant of ``allreduce``);
- ``script``: the :class:`NodeScript` it runs on the node. Probes may share one: ``gemm``, ``hbm`` and
  ``host_bw`` read the one GPU-bench run, which loads every GPU at once as a training job does;
- ``metrics``: the figures it judges, metric -> :class:`~cluster_accept.analysis.probe_verdicts.MetricRule`,
  whose threshold is a key of the profile's ``thresholds`` or of the probe's own ``settings``, and whose
  ``default`` derives the minimum from the node's GPU where the profile sets none (a figure with no minimum and
  no peer is ``not_judged``, never a pass);
- ``reasons``: its reason codes (:mod:`cluster_accept.checks.reasons`);
- ``parse(stdout) -> ProbeOutput``: pure; its figures from the run's output (other figures are left out);
- ``evaluate(figures, profiles) -> [(node, CheckRow)]``: pure, over the whole cluster's figures (thresholds
  from the profile, stragglers against the cluster's median);
- optionally ``inspect(output, profile) -> [CheckRow]``: per-node rows read off the output (the transport
  NCCL used, a skip); ``compare(outputs, profiles)``: pure, over every node's output, for what is judged
  across nodes without being a figure (the silent-data-corruption digests); ``report(view)``: its chart and
  table in the report's measurements;
- optionally ``causes`` (the findings that can explain its own), ``expectations`` (the profile's keys its rows
  answer), ``settings`` (a pydantic model of its own keys, read from the profile's ``plugins: {name: …}``),
  ``order`` (its place in the report), ``stage`` (default ``single-node``; ``burn``) and ``series`` (a per-node
  series too long for the run's tables, :class:`~cluster_accept.probes.series.NodeSeries`: the burn's);
- ``samples``: what its node-side run prints on a healthy node, on a faulty one and where its tool is missing or
  dead, each with the reasons the node's rows must carry and the profile they are judged under
  (:class:`~cluster_accept.checks.samples.Sample`): the tests judge each through the stage, and a probe
  without them is refused by :func:`discover`.

Adding a probe is adding a module or a sub-package: :func:`discover` finds it by walking the package, as checks
are found, and the stages gather its causes, expectations and settings from it. Third-party probes can be
added to ``cluster_accept.probes.__path__`` or published under the ``cluster_accept.probes`` entry point.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from cluster_accept.analysis.probe_output import ProbeOutput, parse_json_lines
from cluster_accept.analysis.probe_verdicts import MetricRule, judge
from cluster_accept.checks.base import CheckRow, own_settings
from cluster_accept.checks.base import discover as discover_checks
from cluster_accept.checks.declarations import Expectation, Link
from cluster_accept.checks.reasons import Reason
from cluster_accept.checks.samples import Sample, missing_kinds
from cluster_accept.inventory.load import load_inventory
from cluster_accept.inventory.model import Inventory, Node, Profile, Thresholds
from cluster_accept.inventory.node_part import WantedNode
from cluster_accept.probes.series import NodeSeries
from cluster_accept.vocabulary.figures import NOTHING_UNKEPT
from cluster_accept.vocabulary.rows import Record

if TYPE_CHECKING:  # a figure frame's type only: a node's own check (check --local) loads no pandas
    import pandas as pd

ENTRY_POINTS = "cluster_accept.probes"
SINGLE_NODE = "single-node"
NOT_PROBES = frozenset({"base", "catalogue", "contract", "scripts", "series", "node"})  # shared, node-side


@dataclass(frozen=True)
class NodeScript:
    """One node-side run: the files it ships (from ``probes/node/``) and its command line.

    ``command(node, quick)`` is the line run in the node's probe directory (``$CA_PROBE_DIR``), or None when
    this run is not for the node's profile (the nccl-tests variant runs only where a profile names it).
    ``owner`` is the check whose rows report the run itself failing (a timeout, a crash), once per run;
    ``timeout_s(node, quick)`` its node-side limit when it is not the profile's ``probes.timeout_s``;
    ``unkept`` what it prints beside a figure for a reader of its raw output that the controller does not keep
    (the key and the types it may hold): declared here, by the run that prints it, so that any other key is an
    error where its line is read."""

    name: str
    files: tuple[str, ...]
    owner: str
    command: Callable[[Node, bool], str | None]
    timeout_s: Callable[[Node, bool], float] | None = None  # default: the profile's probes.timeout_s
    says_settings: bool = True  # the settings it runs with are read first (what a slow figure is checked against)
    unkept: Mapping[str, tuple[type, ...]] = field(default_factory=dict)

    def timeout_for(self, node: Node, quick: bool) -> float:
        """How long the run may take on ``node``: a burn lasts its minutes plus the usual margin."""
        return self.timeout_s(node, quick) if self.timeout_s else node.profile.probes.timeout_s


@dataclass(frozen=True, eq=False)  # one object per probe: compared and hashed by identity
class Probe:
    """A probe, declared once as ``PROBE = Probe(...)`` in its module (a big probe: its sub-package's
    ``__init__``)."""

    name: str
    script: NodeScript
    metrics: Mapping[str, MetricRule]
    reasons: Mapping[str, Reason]
    parse: Callable[[str], ProbeOutput]
    evaluate: Callable[[pd.DataFrame, Mapping[str, Profile]], list[tuple[str, CheckRow]]]
    check: str = ""  # the check its rows carry: its name unless it speaks for another (nccl-tests: allreduce)
    stage: str = SINGLE_NODE
    order: int = 100  # its place in the report
    inspect: Callable[[ProbeOutput, Profile], list[CheckRow]] | None = None
    compare: Callable[[Mapping[str, ProbeOutput], Mapping[str, Profile]], list[tuple[str, CheckRow]]] | None = None
    report: Callable[[Any], Any] | None = None
    causes: tuple[Link, ...] = ()  # what can explain its findings (cause first)
    expectations: tuple[Expectation, ...] = ()  # the keys of a profile its rows judge (no silent pass)
    settings: type[BaseModel] | None = None  # its own keys under the profile's ``plugins: {name: …}``
    other_reasons: Mapping[str, Mapping[str, Reason]] = field(default_factory=dict)  # rows under other checks
    series: NodeSeries[Record] | None = None  # a per-node series kept beside its figures (the burn's), typed
    # What its run prints on a healthy node, a faulty one and with its tool missing or dead (its reasons).
    samples: tuple[Sample, ...] = ()

    def __post_init__(self) -> None:
        if not self.check:
            object.__setattr__(self, "check", self.name)
        unknown = [
            f"{metric}: {rule.threshold}"
            for metric, rule in self.metrics.items()
            if rule.threshold and rule.threshold not in Thresholds.model_fields and not self._own_key(rule.threshold)
        ]
        if unknown:
            raise TypeError(f"probe {self.name}: thresholds {unknown} are neither a profile threshold nor its setting")
        keyless = [metric for metric, rule in self.metrics.items() if rule.default is not None and not rule.threshold]
        if keyless:
            raise TypeError(f"probe {self.name}: {keyless} derive a default minimum but name no key that changes it")

    def _own_key(self, key: str) -> bool:
        return self.settings is not None and key in self.settings.model_fields

    def command(self, node: Node, quick: bool = False) -> str | None:
        return self.script.command(node, quick)


def _modules(package: str) -> list[ModuleType]:
    """The package's public modules and sub-packages (a big probe is one), then those published under the
    entry point."""
    root = importlib.import_module(package)
    found = []
    for info in pkgutil.iter_modules(root.__path__):
        if not info.name.startswith("_") and info.name not in NOT_PROBES:
            found.append(importlib.import_module(f"{package}.{info.name}"))
    found += [entry.load() for entry in _published(ENTRY_POINTS, tuple(sys.path))]
    return found


@functools.cache
def _published(group: str, path: tuple[str, ...]) -> tuple[EntryPoint, ...]:
    """The entry points of ``group`` among the distributions on ``path``, read once per path: the read opens
    every installed distribution's metadata (tens of milliseconds on a node with hundreds), and a command
    discovers the probes more than once."""
    del path  # the key: what is installed is read again when the path changes
    return tuple(entry_points(group=group))


def discover(package: str = "cluster_accept.probes", stage: str | None = None) -> list[Probe]:
    """Every probe (each module's or sub-package's ``PROBE``) in ``package`` and under the entry point, by
    report order then name; a name claimed twice, or a probe without its samples (healthy, a fault, its tool
    dead), is an error naming its module."""
    probes: dict[str, tuple[Probe, str]] = {}
    for module in _modules(package):
        probe = getattr(module, "PROBE", None)
        if not isinstance(probe, Probe):
            continue
        if probe.name in probes and probes[probe.name][1] != module.__name__:
            raise TypeError(f"probe {probe.name!r} defined by {probes[probe.name][1]} and {module.__name__}")
        lacking = missing_kinds(probe.samples)
        if lacking:
            raise TypeError(
                f"probe {probe.name} ({module.__name__}) declares no {', '.join(lacking)} sample: give it "
                "samples=(healthy(…), fault(…), dead(…)) (cluster_accept.checks.samples)"
            )
        probes[probe.name] = (probe, module.__name__)
    chosen = [p for p, _ in probes.values() if stage is None or p.stage == stage]
    return sorted(chosen, key=lambda p: (p.order, p.name))


def plugin_settings(probes: Sequence[Probe] | None = None) -> dict[str, type[BaseModel]]:
    """The settings each check and probe (every discovered one by default; ``probes`` given: those, and no
    check) reads from a profile's ``plugins:``, by name: what the inventory is validated against when it loads."""
    checks = discover_checks() if probes is None else []
    chosen = discover() if probes is None else probes
    found = {check.name: check.settings for check in checks if check.settings is not None}
    return found | {probe.name: probe.settings for probe in chosen if probe.settings is not None}


class _SettingsWhenAsked(Mapping[str, type[BaseModel]]):
    """:func:`plugin_settings`, discovered when the inventory first asks: one without ``plugins:`` never does, so
    loading it imports no probe (a node's own check then starts its commands first, and imports the probes while
    they run)."""

    def __init__(self) -> None:
        self._found: dict[str, type[BaseModel]] | None = None

    def _models(self) -> dict[str, type[BaseModel]]:
        if self._found is None:
            self._found = plugin_settings()
        return self._found

    def __getitem__(self, name: str) -> type[BaseModel]:
        return self._models()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._models())

    def __len__(self) -> int:
        return len(self._models())


def load_checked_inventory(path: str | Path, node: WantedNode | None = None) -> Inventory:
    """The inventory at ``path``, each added probe's ``plugins:`` settings checked against its model on load
    (the inventory cannot see the probes: it lies below them); raises
    :class:`~inventory.load.InventoryError`, naming what is wrong. ``node``: only that node's part of the
    file (a node's own check: :mod:`inventory.node_part`)."""
    return load_inventory(path, plugins=_SettingsWhenAsked(), node=node)


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
    mine = [m for m in output.measurements if m.metric in metrics]
    return ProbeOutput(measurements=mine, info=output.info, errors=output.errors)


def json_figures(metrics: Mapping[str, MetricRule], script: NodeScript | None = None) -> Callable[[str], ProbeOutput]:
    """``parse`` for a probe whose node-side script prints JSON lines: its own figures of the run (``script``: the
    run, where it declares keys it prints beside its figures)."""
    unkept = script.unkept if script is not None else NOTHING_UNKEPT

    def parse(stdout: str) -> ProbeOutput:
        return own_figures(parse_json_lines(stdout, unkept), metrics)

    return parse


def unkept_by_any(probes: Sequence[Probe] | None = None) -> dict[str, tuple[type, ...]]:
    """Every key some probe's run declares beside its figures (every discovered probe by default): how a group run,
    which is no one probe's, reads its ranks' lines (the all-reduce sweep, the training step)."""
    found: dict[str, tuple[type, ...]] = {}
    for probe in discover() if probes is None else probes:
        for key, kinds in probe.script.unkept.items():
            found[key] = tuple(dict.fromkeys((*found.get(key, ()), *kinds)))
    return found


def cluster_judgement(
    metrics: Mapping[str, MetricRule], settings: tuple[str, type[BaseModel]] | None = None
) -> Callable[[pd.DataFrame, Mapping[str, Profile]], list[tuple[str, CheckRow]]]:
    """``evaluate`` for a probe judged the usual way: each figure against its minimum (the profile's, or its
    rule's default for the node's GPU) and against the cluster's median (per GPU or per node), as its rule says;
    a figure with neither is not judged. ``settings``: the probe's name and settings model, where its
    thresholds are its own keys (``plugins: {name: {...}}``)."""

    def evaluate(figures: pd.DataFrame, profiles: Mapping[str, Profile]) -> list[tuple[str, CheckRow]]:
        if settings is None:
            return judge(figures, metrics, profiles)
        name, model = settings
        own = {node: own_settings(name, model, profile) for node, profile in profiles.items()}
        return judge(figures, metrics, profiles, own)

    return evaluate
