"""Every discovered plug-in carries its samples, and they say what it does: a healthy node passes every check
and every probe, each fault and each dead tool yields the reasons its sample declares. The checks are judged as
preflight judges them (``parse`` then ``evaluate`` under the sample's profile), the probes as their stage judges a
node (:func:`tasks.probe_runs.judge_nodes`, the run's own rows included). A plug-in added with its
samples is held here with no line to add."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import cluster_accept.probes
from cluster_accept.checks.base import BAD_STATUSES, Check, CheckRow, ClusterView, NodeRow, Status
from cluster_accept.checks.base import discover as discover_checks
from cluster_accept.checks.samples import REPOSITORY, Sample, SampleKind
from cluster_accept.inventory.model import DEFAULT_SSH, LOCAL_ADDRESS, Inventory, Node, Profile
from cluster_accept.probes.base import Probe
from cluster_accept.probes.base import discover as discover_probes
from cluster_accept.remote.result import CommandResult, NodeResult, NodeStatus

CHECKS = discover_checks()
PROBES = discover_probes()
CHECK_SAMPLES = [(check, sample) for check in CHECKS for sample in check.samples]
PROBE_SAMPLES = [(probe, sample) for probe in PROBES for sample in probe.samples]
# What a healthy node's rows may say beside a pass: a check or figure that does not apply, or has no minimum.
QUIET = frozenset({Status.PASS, Status.SKIP, Status.NOT_JUDGED})


def _ids(pairs: list[tuple[Any, Sample]]) -> list[str]:
    return [f"{plugin.name}:{sample.kind.value}:{sample.name}" for plugin, sample in pairs]


def check_rows(check: Check[Any], sample: Sample) -> list[CheckRow]:
    """The rows ``check`` writes for a node that printed ``sample``, as preflight judges it."""
    model = check.parse(sample.output(), sample.exit_code)
    view = ClusterView(dict(sample.majority), 3 if sample.majority else 0)
    return check.evaluate(model, Profile.model_validate(dict(sample.profile)), view)


def probe_rows(probe: Probe, sample: Sample) -> list[NodeRow]:
    """The rows its stage writes for a node whose run of ``probe`` printed ``sample`` (the probe judged alone)."""
    from cluster_accept.tasks.probe_runs import judge_nodes

    profile = Profile.model_validate(dict(sample.profile))
    node = Node(name="n1", ssh=DEFAULT_SSH, profile_name="p", profile=profile, address=LOCAL_ADDRESS)
    assert probe.command(node) is not None, f"{probe.name}: the sample's profile does not run it"
    inventory = Inventory("c", [node], {"p": profile}, "inventory.yaml", "digest")
    run = CommandResult(probe.script.name, sample.exit_code, sample.output(), "")
    outcome = NodeResult("n1", NodeStatus.OK, commands=[run])
    return judge_nodes("r", inventory, [outcome], probes=[probe], stage=probe.stage).rows


def assert_says(sample: Sample, rows: list[CheckRow] | list[NodeRow]) -> None:
    """A healthy sample's rows pass; a fault's or a dead tool's say so; each carries the reasons it declares."""
    said = {row.reason for row in rows}
    assert sample.reasons <= said, f"declared {sorted(sample.reasons)}, rows say {sorted(said)}"
    if sample.kind is SampleKind.HEALTHY:
        loud = [(row.check, row.item, row.status.value, row.reason) for row in rows if row.status not in QUIET]
        assert not loud, loud
        assert any(row.status is Status.PASS for row in rows), "a healthy node with nothing passed"
    else:
        assert any(row.status is not Status.PASS for row in rows if row.reason in sample.reasons), rows


def test_every_discovered_plugin_declares_a_healthy_a_faulty_and_a_dead_sample_that_exist() -> None:
    for plugin in [*CHECKS, *PROBES]:
        kinds = {sample.kind for sample in plugin.samples}
        assert kinds == set(SampleKind), plugin.name
        for sample in plugin.samples:
            assert sample.fixture is None or (REPOSITORY / sample.fixture).is_file(), (plugin.name, sample.fixture)
            assert sample.reasons, (plugin.name, sample.name)
        assert len({s.name for s in plugin.samples}) == len(plugin.samples), plugin.name


@pytest.mark.parametrize(("check", "sample"), CHECK_SAMPLES, ids=_ids(CHECK_SAMPLES))
def test_each_check_sample_yields_its_declared_reasons(check: Check[Any], sample: Sample) -> None:
    """A healthy node passes every check; each fault and dead tool yields the reasons its sample declares."""
    assert_says(sample, check_rows(check, sample))


@pytest.mark.parametrize(("probe", "sample"), PROBE_SAMPLES, ids=_ids(PROBE_SAMPLES))
def test_each_probe_sample_yields_its_declared_reasons(probe: Probe, sample: Sample) -> None:
    """A healthy node passes every probe; each fault and dead run yields the reasons its sample declares."""
    assert_says(sample, probe_rows(probe, sample))


def test_a_healthy_node_passes_every_check_at_once() -> None:
    """One node answering every check with its first healthy sample: not one row of the batch is a finding."""
    rows = [row for check in CHECKS for row in check_rows(check, _healthy(check.samples))]
    assert {row.check for row in rows} == {check.name for check in CHECKS}
    assert not [row for row in rows if row.status in BAD_STATUSES or row.status is Status.WARN]


def _healthy(samples: tuple[Sample, ...]) -> Sample:
    return next(sample for sample in samples if sample.kind is SampleKind.HEALTHY)


CHECK_WITHOUT_SAMPLES = """
from cluster_accept.checks.base import Check, CheckRow
from cluster_accept.checks.samples import healthy

CHECK = Check(
    name="bare",
    command="true",
    parse=lambda stdout, code: stdout,
    evaluate=lambda model, profile, cluster: [],
    reasons={},
    samples=(healthy("ok", {"ok"}, text=""),),
)
"""


def test_a_check_without_its_samples_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "bare_checks"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "bare.py").write_text(textwrap.dedent(CHECK_WITHOUT_SAMPLES))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(TypeError, match=r"check bare \(bare_checks\.bare\) declares no fault, dead sample"):
            discover_checks("bare_checks")
    finally:
        for name in ("bare_checks", "bare_checks.bare"):
            sys.modules.pop(name, None)


PROBE_WITHOUT_SAMPLES = """
from cluster_accept.analysis.probe_output import ProbeOutput
from cluster_accept.probes.base import NodeScript, Probe

PROBE = Probe(
    name="bare",
    script=NodeScript("bare", (), "bare", lambda node, quick: "true"),
    metrics={},
    reasons={},
    parse=lambda stdout: ProbeOutput(),
    evaluate=lambda figures, profiles: [],
)
"""


def test_a_probe_without_its_samples_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "extra_probes"
    (folder / "bare").mkdir(parents=True)
    (folder / "bare" / "__init__.py").write_text(textwrap.dedent(PROBE_WITHOUT_SAMPLES))
    monkeypatch.setattr(cluster_accept.probes, "__path__", [*cluster_accept.probes.__path__, str(folder)])
    try:
        with pytest.raises(TypeError, match=r"probe bare \(cluster_accept\.probes\.bare\) declares no healthy, fault"):
            discover_probes()
    finally:
        sys.modules.pop("cluster_accept.probes.bare", None)


def test_the_plugin_list_the_documentation_points_to_names_every_discovered_plugin() -> None:
    """docs/stages.md and docs/data.md list no plug-in by hand: they point to the table read from discovery,
    which names every check and probe with its stage, reasons, samples and (a probe) the figures it judges with the
    key holding each minimum."""
    from cluster_accept.reports.plugins import plugin_table

    table = plugin_table()
    for plugin in [*CHECKS, *PROBES]:
        line = next(line for line in table.splitlines() if line.startswith(f"| `{plugin.name}` |"))
        assert all(f"`{code}`" in line for code in plugin.reasons), plugin.name
        assert all(sample.name in line for sample in plugin.samples), plugin.name
    for probe in PROBES:  # each figure a probe judges, with the key holding its minimum
        line = next(line for line in table.splitlines() if line.startswith(f"| `{probe.name}` |"))
        for metric, rule in probe.metrics.items():
            assert f"`{metric}` (min `{rule.threshold}`)" in line if rule.threshold else f"`{metric}`" in line, metric
    docs = REPOSITORY / "docs"
    for page in ("stages.md", "data.md", "layout.md"):
        assert "python -m cluster_accept.reports.plugins" in (docs / page).read_text(), page
