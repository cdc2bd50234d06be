"""Every discovered plug-in carries its samples, and they say what it does: a healthy node passes every check
and every probe, each fault and each dead tool yields the reasons its sample declares. The checks are judged as
preflight judges them (``parse`` then ``evaluate`` under the sample's profile), the probes as their stage judges a
node (:func:`tasks.probe_runs.judge_nodes`, the run's own rows included). A plug-in added with its
samples is held here with no line to add."""

from __future__ import annotations

import re
import runpy
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import cluster_accept.probes
from cluster_accept.checks.base import BAD_STATUSES, Check, CheckRow, ClusterView, NodeRow, Status
from cluster_accept.checks.base import discover as discover_checks
from cluster_accept.checks.samples import SAMPLES_DIR, Sample, SampleKind
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
# What a fault's rows must hold at least one of: a finding, not a skip.
FINDINGS = BAD_STATUSES | {Status.WARN}


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
    """A healthy sample's rows pass; a fault's or a dead tool's say so, a fault with a finding (a fail, a warning
    or an error, never only a skip); each carries the reasons it declares."""
    said = {row.reason for row in rows}
    assert sample.reasons <= said, f"declared {sorted(sample.reasons)}, rows say {sorted(said)}"
    if sample.kind is SampleKind.HEALTHY:
        loud = [(row.check, row.item, row.status.value, row.reason) for row in rows if row.status not in QUIET]
        assert not loud, loud
        assert any(row.status is Status.PASS for row in rows), "a healthy node with nothing passed"
    else:
        assert any(row.status is not Status.PASS for row in rows if row.reason in sample.reasons), rows
    if sample.kind is SampleKind.FAULT:
        assert any(row.status in FINDINGS for row in rows), f"a fault with no finding: {rows}"


def test_every_discovered_plugin_declares_a_healthy_a_faulty_and_a_dead_sample_that_exist() -> None:
    for plugin in [*CHECKS, *PROBES]:
        kinds = {sample.kind for sample in plugin.samples}
        assert kinds == set(SampleKind), plugin.name
        for sample in plugin.samples:
            assert sample.fixture is None or (SAMPLES_DIR / sample.fixture).is_file(), (plugin.name, sample.fixture)
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


# The machine whose healthy samples make up the one node: each check's sample of it, else its first healthy one.
MACHINE = "h200x4"


def _machine_sample(check: Check[Any]) -> Sample:
    healthy = [sample for sample in check.samples if sample.kind is SampleKind.HEALTHY]
    return next((sample for sample in healthy if sample.name == MACHINE), healthy[0])


def _merged(profiles: list[tuple[str, Any]]) -> dict[str, Any]:
    """One profile holding every sample's keys; a key two samples set apart fails, naming both."""
    merged: dict[str, Any] = {}
    for name, profile in profiles:
        for key, value in profile.items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = _merged([("", merged[key]), (name, value)])
            else:
                assert merged.get(key, value) == value, f"{name} sets {key}={value!r}, another {merged[key]!r}"
                merged[key] = value
    return merged


def test_one_healthy_machine_passes_every_check_as_one_node_of_preflight() -> None:
    """One node printing every check's healthy sample of one machine (h200x4 where a check has it), judged as
    preflight judges a node (its batch parsed, then evaluated under one profile merged from the samples'):
    every check speaks, and not one row is a finding."""
    from cluster_accept.tasks.preflight.check_batch import parse_node_result
    from cluster_accept.tasks.preflight.evaluate import evaluate_preflight

    samples = {check.name: _machine_sample(check) for check in CHECKS}
    profile = Profile.model_validate(_merged([(name, dict(s.profile)) for name, s in samples.items()]))
    node = Node(name="n1", ssh=DEFAULT_SSH, profile_name="p", profile=profile, address=LOCAL_ADDRESS)
    inventory = Inventory("c", [node], {"p": profile}, "inventory.yaml", "digest")
    runs = [CommandResult(name, sample.exit_code, sample.output(), "") for name, sample in samples.items()]
    outcome = parse_node_result(NodeResult("n1", NodeStatus.OK, commands=runs), list(CHECKS))
    rows = evaluate_preflight("r", inventory, [outcome], list(CHECKS))
    assert {row.check for row in rows} >= {check.name for check in CHECKS}
    loud = [(r.check, r.item, r.status.value, r.reason) for r in rows if r.status in BAD_STATUSES | {Status.WARN}]
    assert not loud, loud


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


Printed = tuple[str, str, set[str], str, dict[str, list[str]]]


def _printed_plugins(text: str) -> dict[str, Printed]:
    """The printed table read back: plug-in -> (kind, stage, reason codes, metrics cell, sample names by kind)."""
    read: dict[str, Printed] = {}
    for line in text.splitlines()[2:]:
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        name, kind, stage, _, reasons, metrics, samples = cells
        said = dict(part.split(": ", 1) for part in samples.split("; "))
        assert name.strip("`") not in read, f"{name} listed twice"
        read[name.strip("`")] = (
            kind,
            stage,
            set(re.findall(r"`([^`]+)`", reasons)),
            metrics,
            {k: [s for s in v.split(", ") if s] for k, v in said.items()},
        )
    return read


def test_the_plugin_list_the_documentation_points_to_names_every_discovered_plugin(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/stages.md and docs/data.md list no plug-in by hand: they point to the table printed from discovery,
    which names every check and probe once, with its kind, stage, reasons, samples of each kind and (a probe) the
    figures it judges with the key holding each minimum."""
    runpy.run_module("cluster_accept.probes.catalogue", run_name="__main__")
    printed = _printed_plugins(capsys.readouterr().out)
    wanted = {
        **{c.name: ("check", "preflight", c.reasons, c.samples, {}) for c in CHECKS},
        **{p.name: ("probe", p.stage, p.reasons, p.samples, p.metrics) for p in PROBES},
    }
    assert set(printed) == set(wanted)
    for name, (kind, stage, reasons, samples, metrics) in wanted.items():
        by_kind = {k.value: [s.name for s in samples if s.kind is k] for k in SampleKind}
        said_kind, said_stage, said_reasons, said_metrics, said_samples = printed[name]
        assert (said_kind, said_stage, said_reasons, said_samples) == (kind, stage, set(reasons), by_kind), name
        for metric, rule in metrics.items():  # each figure a probe judges, with the key holding its minimum
            assert (f"`{metric}` (min `{rule.threshold}`)" if rule.threshold else f"`{metric}`") in said_metrics, name
    docs = Path(__file__).resolve().parent.parent / "docs"
    for page in ("stages.md", "data.md", "layout.md"):
        assert "python -m cluster_accept.probes.catalogue" in (docs / page).read_text(), page
