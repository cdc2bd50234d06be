"""Verdicts from rows, folding, and the report: same facts in HTML and Markdown, node output escaped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cluster_accept.analysis.verdicts import Verdict, differences, fold_by, node_verdict
from cluster_accept.reports.render import ReportData, build_context, render

pytestmark = pytest.mark.pure


def row(node: str, check: str, status: str, reason: str, observed: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "node": node,
        "check": check,
        "item": extra.pop("item", "version"),
        "status": status,
        "reason": reason,
        "observed": observed,
        "expected": extra.pop("expected", None),
        "detail": extra.pop("detail", ""),
        "gpu": extra.pop("gpu", None),
        "raw_output": extra.pop("raw", ""),
    }


def test_node_verdicts() -> None:
    assert node_verdict("a", [row("a", "driver", "pass", "ok")]) == node_verdict("a", [])
    assert node_verdict("a", [row("a", "driver", "warn", "differs_from_majority")]).verdict == Verdict.ACCEPTED
    rejected = node_verdict(
        "a",
        [
            row("a", "driver", "fail", "version_mismatch"),
            row("a", "gpu_count", "error", "unparsable_output"),
            row("a", "driver", "fail", "version_mismatch"),
        ],
    )
    assert rejected.verdict == Verdict.REJECTED
    assert rejected.reasons == ["driver:version_mismatch", "gpu_count:unparsable_output"]
    unreachable = node_verdict("a", [row("a", "ssh", "unreachable", "host-key")])
    assert (unreachable.verdict, unreachable.reasons) == (Verdict.UNREACHABLE, ["ssh:host-key"])
    assert node_verdict("a", [row("a", "x", "timeout", "command_timeout")]).verdict == Verdict.REJECTED
    assert node_verdict("a", [], excluded=True).verdict == Verdict.SKIPPED


def test_differences_fold_into_node_sets() -> None:
    per_node = {f"node{i:03d}": {"driver.version": "580.159.04", "gpu_count.count": "8"} for i in range(1, 8)}
    per_node["node010"] = {"driver.version": "570.86.15", "gpu_count.count": "8"}
    assert differences(per_node) == [("driver.version", "580.159.04 on node[001-007]; 570.86.15 on node010")]
    assert fold_by({"n1": "accepted", "n2": "rejected", "n3": "accepted"}) == [
        ("accepted", "n[1,3]"),
        ("rejected", "n2"),
    ]


def test_report_escapes_node_output_and_names_faulty_nodes(tmp_path: Path) -> None:
    hostile = '<script>alert("x")</script>'
    rows = [
        row("n1", "driver", "pass", "ok", "580.159.04"),
        row("n2", "driver", "fail", "version_mismatch", "570.86.15", expected="580.159.04"),
        row("n3", "gpu_count", "fail", "model_mismatch", hostile, item="model", gpu=0, raw=hostile),
        row("n4", "ssh", "unreachable", "refused", "refused", item="connect"),
    ]
    verdicts = [
        {"node": n, "profile": "p", "verdict": v, "reasons": r}
        for n, v, r in [
            ("n1", "accepted", []),
            ("n2", "rejected", ["driver:version_mismatch"]),
            ("n3", "rejected", ["gpu_count:model_mismatch"]),
            ("n4", "unreachable", ["ssh:refused"]),
            ("n5", "skipped", ["excluded_in_inventory"]),
        ]
    ]
    run = {
        "run_id": "r1",
        "cluster": "c",
        "stages": ["preflight"],
        "started": "s",
        "ended": "e",
        "inventory": "inv.yaml",
        "inventory_digest": "abc",
    }
    values = [
        {"node": "n1", "check": "driver", "key": "driver_version", "value": "580.159.04"},
        {"node": "n2", "check": "driver", "key": "driver_version", "value": "570.86.15"},
        {"node": "n3", "check": "driver", "key": "driver_version", "value": "580.159.04"},
        {"node": "n1", "check": "gpu_count", "key": "gpu_count", "value": "4"},
        {"node": "n3", "check": "gpu_count", "key": "gpu_count", "value": "4"},
    ]
    context = build_context(run, verdicts, ReportData(rows=rows, values=values))
    assert context["counts"] == {"accepted": 1, "rejected": 2, "unreachable": 1, "skipped": 1}
    assert context["rejected_nodes"] == "n[2-4]"
    assert context["differences"] == [("driver.driver_version", "580.159.04 on n[1,3]; 570.86.15 on n2")]
    assert context["unreachable_sets"] == [("refused", "n4")]
    html_path, md_path = render(context, tmp_path)
    html = html_path.read_text()
    assert hostile not in html and "&lt;script&gt;" in html
    assert "Not accepted:</span> n[2-4]" in html
    md = md_path.read_text()
    assert "**Not accepted:** n[2-4]" in md
    assert "| n2 | rejected | driver:version_mismatch |" in md
    assert "- refused on n4" in md
    assert hostile not in md and "&lt;script&gt;" in md
