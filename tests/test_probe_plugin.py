"""A probe is one module: a new one dropped next to the built-in probes (from the test's own temporary
package) is run by the real flow on two local nodes, and its measurements, verdict rows and report section
appear, with no other file edited."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

import cluster_accept.probes
from cluster_accept.probes.base import discover

pytestmark = pytest.mark.pure

PROBE_MODULE = '''
"""A trivial probe: a node-side script prints one figure; judged against the cluster; a table in the report."""

from pathlib import Path

from cluster_accept.analysis.probe_output import parse_json_lines
from cluster_accept.analysis.probe_verdicts import MetricRule, judge
from cluster_accept.checks.base import Status
from cluster_accept.checks.reasons import Action, Reason, declare
from cluster_accept.probes.base import NodeScript, own_figures
from cluster_accept.reports.figures import ReportSection, Table

NAME = "trivial"
ORDER = 90
METRIC = "trivial_rate_per_s"


def command(node, quick):
    return f'cd "$CA_PROBE_DIR" && exec {node.profile.probes.python} trivial_node.py'


SCRIPT = NodeScript("trivial", (str(Path(__file__).parent / "node" / "trivial_node.py"),), NAME, command)
METRICS = {METRIC: MetricRule(NAME, None, False)}
REASONS = declare(Reason("straggler", Status.FAIL, "far slower than its peers", Action.CHECK_NODE))


def parse(stdout):
    return own_figures(parse_json_lines(stdout), METRICS)


def evaluate(figures, profiles):
    return judge(figures, METRICS, {node: profile.thresholds for node, profile in profiles.items()})


def report(view):
    rows = tuple((m["node"], m["value"]) for m in view.measurements if m["metric"] == METRIC)
    table = Table("trivial rate per node", ("node", "rate/s"), rows, "trivial-table")
    return ReportSection("trivial", (), table) if rows else None
'''

NODE_SCRIPT = """
import json
print(json.dumps({"probe": "trivial", "metric": "trivial_rate_per_s", "value": 1234.5, "unit": "1/s"}))
"""


@pytest.fixture
def trivial_probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own package directory, added to the probes package's search path: "next to" the real ones."""
    package = tmp_path / "extra_probes"
    package.mkdir()
    (package / "trivial.py").write_text(textwrap.dedent(PROBE_MODULE))
    (package / "node").mkdir()  # node-side scripts beside the module, never imported by the controller
    (package / "node" / "trivial_node.py").write_text(NODE_SCRIPT)
    monkeypatch.setattr(cluster_accept.probes, "__path__", [*cluster_accept.probes.__path__, str(package)])
    yield package
    sys.modules.pop("cluster_accept.probes.trivial", None)


def test_discovery_finds_the_built_in_probes_in_report_order() -> None:
    found = [(p.name, p.check, p.script.name) for p in discover()]
    assert found == [
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


def test_a_dropped_in_probe_runs_end_to_end(trivial_probe: Path, tmp_path: Path) -> None:
    from cluster_accept.flows.acceptance import run_acceptance

    assert "trivial" in [p.name for p in discover()]
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
            """
        )
    )
    out = tmp_path / "runs"
    outcome = run_acceptance(inventory, out, stages=["single-node"], history="-", concurrency=4)
    run_dir = outcome.run_dir
    measurements = pd.read_parquet(run_dir / "measurements.parquet")
    mine = measurements[measurements.metric == "trivial_rate_per_s"]
    assert sorted(mine.node) == ["local1", "local2"] and set(mine.value) == {1234.5}
    checks = pd.read_parquet(run_dir / "checks.parquet")
    rows = checks[checks.check == "trivial"]
    assert sorted(zip(rows.node, rows.item, rows.status, rows.reason, strict=True)) == [
        ("local1", "trivial_rate_per_s_vs_cluster", "pass", "ok"),
        ("local2", "trivial_rate_per_s_vs_cluster", "pass", "ok"),
    ]
    assert all("trivial_node.py" in command for command in rows.command)
    html = (run_dir / "report.html").read_text()
    assert 'id="trivial-table"' in html and "trivial rate per node" in html and "1234" in html
    assert "## trivial rate per node" in (run_dir / "report.md").read_text()
    # The built-in probes ran beside it, untouched.
    assert {"gemm", "hbm", "allreduce"} <= set(checks.check)
