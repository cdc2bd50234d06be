"""A probe is one sub-package: a new one dropped next to the built-in probes (from the test's own temporary
folder) brings its node-side script, a threshold of its own settings, a coverage expectation and a cause link,
and the real flow runs it on two local nodes, judges it, explains it cause first and reports it, with no other
file edited."""

from __future__ import annotations

import importlib
import pkgutil
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

import cluster_accept.probes
from cluster_accept.inventory.load import InventoryError, load_inventory
from cluster_accept.probes.base import NOT_PROBES, discover, plugin_settings

PROBE_PACKAGE = '''
"""A rate probe: its node-side script prints one figure and the CPU frequency governor it ran under; the figure
is judged against its own minimum and its peers, and a power-saving governor explains a slow rate."""

from pathlib import Path

from pydantic import BaseModel, Field

from cluster_accept.analysis.probe_output import ProbeOutput, parse_json_lines
from cluster_accept.analysis.probe_verdicts import MetricRule
from cluster_accept.checks.base import CheckRow, Status
from cluster_accept.checks.declarations import Expectation, Link
from cluster_accept.checks.reasons import Action, FindingKind, Reason, declare
from cluster_accept.checks.samples import dead, fault, healthy
from cluster_accept.probes.base import NodeScript, Probe, cluster_judgement, own_figures, own_settings
from cluster_accept.reports.figures import ReportSection, Table

NAME = "trivial"
METRIC = "trivial_rate_per_s"


class Settings(BaseModel):
    model_config = {"extra": "forbid"}
    trivial_rate_per_s_min: float | None = Field(default=None, ge=0)


def command(node, quick):
    return f'cd "$CA_PROBE_DIR" && exec {node.profile.probes.python} trivial_node.py {node.name}'


SCRIPT = NodeScript("trivial", (str(Path(__file__).parent / "node" / "trivial_node.py"),), NAME, command)
METRICS = {METRIC: MetricRule(NAME, "trivial_rate_per_s_min", False)}
REASONS = declare(
    Reason("below_threshold", Status.FAIL, "below the profile's minimum", Action.CHECK_NODE, kind=FindingKind.RELATIVE),
    Reason("straggler", Status.FAIL, "far slower than its peers", Action.CHECK_NODE, kind=FindingKind.RELATIVE),
    Reason("powersave", Status.WARN, "the CPU ran under a power-saving governor", Action.FIX_CONFIG),
)


def parse(stdout):
    return own_figures(parse_json_lines(stdout), METRICS)


def inspect(output, profile):
    governor = next((i.get("governor") for i in output.info if i.get("governor")), None)
    if governor != "powersave":
        return []
    return [CheckRow(NAME, "governor", Status.WARN, "powersave", governor, "performance")]


def report(view):
    rows = tuple((m.node, m.value) for m in view.measurements if m.metric == METRIC)
    table = Table("trivial rate per node", ("node", "rate/s"), rows, "trivial-table")
    return ReportSection("trivial", (), table) if rows else None


SLOW = frozenset({"below_threshold"})
# What its node-side script prints: the governor it ran under, then its figure; the minimum its samples are held to.
GOVERNOR = '{"info": "cpu", "governor": "powersave"}\\n'
FIGURE = '{{"probe": "trivial", "metric": "trivial_rate_per_s", "value": {}, "unit": "1/s"}}\\n'
MINIMUM = {"plugins": {NAME: {"trivial_rate_per_s_min": 2000}}}


def _minimum_set(profile):
    return own_settings(NAME, Settings, profile).trivial_rate_per_s_min is not None


PROBE = Probe(
    name=NAME,
    script=SCRIPT,
    metrics=METRICS,
    reasons=REASONS,
    parse=parse,
    evaluate=cluster_judgement(METRICS, (NAME, Settings)),
    order=90,
    inspect=inspect,
    report=report,
    settings=Settings,
    causes=(
        Link(NAME, frozenset({NAME}), "single-node", frozenset({"powersave"}), symptom_reasons=SLOW),
    ),
    expectations=(
        Expectation(f"plugins.{NAME}.trivial_rate_per_s_min", "single-node", NAME, _minimum_set, METRIC),
    ),
    samples=(
        healthy("fast", {"ok"}, text=FIGURE.format(2500.0), profile=MINIMUM),
        fault("powersave", {"powersave", "below_threshold"}, text=GOVERNOR + FIGURE.format(1234.5), profile=MINIMUM),
        dead("python_missing", {"probe_failed"}, text="sh: 1: python3: not found\\n", exit_code=127),
    ),
)
'''

NODE_SCRIPT = """
import json
import sys

print(json.dumps({"info": "cpu", "governor": "powersave"}))
if sys.argv[1] != "local2":  # the second node's run prints no figure: what coverage is for
    print(json.dumps({"probe": "trivial", "metric": "trivial_rate_per_s", "value": 1234.5, "unit": "1/s"}))
"""


@pytest.fixture
def trivial_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own folder, added to the probes package's search path: a sub-package "next to" the real ones,
    its node-side script inside it."""
    folder = tmp_path / "extra_probes"
    package = folder / "trivial"
    (package / "node").mkdir(parents=True)  # node-side scripts beside the probe, never imported by the controller
    (package / "__init__.py").write_text(textwrap.dedent(PROBE_PACKAGE))
    (package / "node" / "trivial_node.py").write_text(NODE_SCRIPT)
    monkeypatch.setattr(cluster_accept.probes, "__path__", [*cluster_accept.probes.__path__, str(folder)])
    yield package
    sys.modules.pop("cluster_accept.probes.trivial", None)


def _inventory(tmp_path: Path, plugins: str) -> Path:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        textwrap.dedent(
            f"""
            cluster: plugin
            defaults: {{profile: cpu}}
            nodes:
              - {{hosts: local1, address: local}}
              - {{hosts: local2, address: local}}
            profiles:
              cpu:
                # the plugin is under test: the built-in probes that take longest on CPU stay out of the way
                probes: {{python: {sys.executable}, device: cpu, max_parallel_nodes: 1, collectives: []}}
                training: {{enabled: false}}
                thresholds: {{relative_verdict: warn, straggler_pct: 90}}
                plugins: {plugins}
            """
        )
    )
    return inventory


def test_discovery_finds_every_probe_module_in_report_order() -> None:
    """Every module or sub-package of the package that declares a ``PROBE`` is found, once, in report order;
    each speaks for a discovered check, and a run's failures are reported under one that runs it."""
    found = discover()
    assert found == sorted(found, key=lambda p: (p.order, p.name))
    declared = [
        getattr(importlib.import_module(f"cluster_accept.probes.{info.name}"), "PROBE", None)
        for info in pkgutil.iter_modules(cluster_accept.probes.__path__)
        if not info.name.startswith("_") and info.name not in NOT_PROBES
    ]
    assert {id(p) for p in found} == {id(p) for p in declared if p is not None}
    assert len({p.name for p in found}) == len(found)
    names = {p.name for p in found}
    assert all(p.check in names for p in found)
    for probe in found:
        assert probe.script.owner in {p.check for p in found if p.script.name == probe.script.name}
    # The built-in ones keep their order and their shared runs (the GPU bench's three, the all-reduce's
    # variants: nccl-tests speaks for it); a probe added beside them changes neither.
    built_in = [
        ("gemm", "gemm", "gpu_bench"),
        ("hbm", "hbm", "gpu_bench"),
        ("host_bw", "host_bw", "gpu_bench"),
        ("allreduce", "allreduce", "allreduce"),
        ("collectives", "collectives", "allreduce"),
        ("nccl_tests", "allreduce", "allreduce"),
        ("gpu_pairs", "gpu_pairs", "gpu_pairs"),
        ("training", "training", "training"),
        ("burn", "burn", "burn"),
        ("sdc", "sdc", "burn"),
        ("dcgm", "dcgm", "dcgm"),
    ]
    rows = [(p.name, p.check, p.script.name) for p in found]
    assert [row for row in rows if row[0] in {name for name, _, _ in built_in}] == built_in


@pytest.mark.integration
def test_a_dropped_in_probe_is_judged_against_its_own_threshold_and_explained(
    trivial_probe: Path, tmp_path: Path
) -> None:
    from cluster_accept.flows.acceptance import run_acceptance

    assert "trivial" in [p.name for p in discover()]
    inventory = _inventory(tmp_path, "{trivial: {trivial_rate_per_s_min: 2000}}")
    outcome = run_acceptance(inventory, tmp_path / "runs", stages=["single-node"], history="-", concurrency=4)
    run_dir = outcome.run_dir
    measurements = pd.read_parquet(run_dir / "measurements.parquet")
    # the stage's own figure (a failed one may be measured again without its suspects, under a stage of its own)
    mine = measurements[(measurements.metric == "trivial_rate_per_s") & (measurements.stage == "single-node")]
    assert list(mine.node) == ["local1"] and list(mine.value) == [1234.5]
    checks = pd.read_parquet(run_dir / "checks.parquet")
    rows = checks[checks.check.isin(["trivial", "coverage"])]
    assert sorted(zip(rows.node, rows.check, rows.item, rows.status, rows.reason, rows.expected, strict=True)) == [
        ("local1", "trivial", "governor", "warn", "powersave", "performance"),
        ("local1", "trivial", "trivial_rate_per_s", "fail", "below_threshold", ">= 2000.0 1/s"),
        ("local2", "coverage", "plugins.trivial.trivial_rate_per_s_min", "error", "no_row", "trivial row for "
         "trivial_rate_per_s"),
        ("local2", "trivial", "governor", "warn", "powersave", "performance"),
    ]  # fmt: skip
    assert all("trivial_node.py" in command for command in checks[checks.check == "trivial"].command)
    verdicts = pd.read_parquet(run_dir / "verdicts.parquet").set_index("node")
    # The cause first: the governor the probe read explains its slow figure, and is named although a warning.
    assert list(verdicts.loc["local1", "reasons"])[:2] == ["trivial:powersave", "trivial:below_threshold"]
    assert verdicts.loc["local1", "cause"].startswith("trivial trivial_rate_per_s 1234.5 (expected >= 2000.0 1/s): ")
    assert "trivial:powersave performance" not in verdicts.loc["local1", "cause"]
    assert (
        "because" not in verdicts.loc["local1", "cause"]
        and "trivial:powersave powersave" in verdicts.loc["local1", "cause"]
    )
    assert "coverage:no_row" in list(verdicts.loc["local2", "reasons"])
    html = (run_dir / "report.html").read_text()
    assert 'id="trivial-table"' in html and "trivial rate per node" in html and "1234" in html
    assert "explained by trivial:powersave" in html
    assert "## trivial rate per node" in (run_dir / "report.md").read_text()
    # The built-in probes ran beside it, untouched.
    assert {"gemm", "hbm", "allreduce"} <= set(checks.check)


def test_a_dropped_in_probes_settings_are_checked_when_the_inventory_loads(trivial_probe: Path, tmp_path: Path) -> None:
    settings = plugin_settings()
    assert settings == {p.name: p.settings for p in discover() if p.settings is not None}
    assert settings["trivial"] is sys.modules["cluster_accept.probes.trivial"].Settings
    takers = ", ".join(sorted(settings))
    assert load_inventory(_inventory(tmp_path, "{trivial: {trivial_rate_per_s_min: 5}}"), plugins=settings)
    with pytest.raises(InventoryError) as refused:
        load_inventory(_inventory(tmp_path, "{trivial: {trivial_rate_min: 5}, trivail: {}}"), plugins=settings)
    assert refused.value.problems == [
        "profiles.cpu.plugins.trivial.trivial_rate_min: Extra inputs are not permitted",
        f"profiles.cpu.plugins.trivail: no check or probe of that name takes settings (those that do: {takers})",
    ]
    with pytest.raises(InventoryError, match="trivial_rate_per_s_min: Input should be greater than or equal to 0"):
        load_inventory(_inventory(tmp_path, "{trivial: {trivial_rate_per_s_min: -1}}"), plugins=settings)


def test_a_dropped_in_probes_samples_are_judged_as_the_built_in_ones(trivial_probe: Path) -> None:
    from tests.test_plugin_samples import assert_says, probe_rows

    probe = next(p for p in discover() if p.name == "trivial")
    assert {s.kind.value for s in probe.samples} == {"healthy", "fault", "dead"}
    for sample in probe.samples:
        assert_says(sample, probe_rows(probe, sample))
