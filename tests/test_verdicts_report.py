"""Verdicts from rows, folding, and the report: same facts in HTML and Markdown, node output escaped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cluster_accept.analysis.verdicts import Verdict, VerdictRow, differences, fold_by, node_verdict
from cluster_accept.checks.base import NodeRow, Status, discover
from cluster_accept.checks.reasons import catalog
from cluster_accept.reports.render import ReportData, build_context, render
from cluster_accept.tasks.stages import declared_links
from cluster_accept.vocabulary.rows import NodeValue

LINKS = declared_links()  # the cause links the stages' checks and probes declare


def row(node: str, check: str, status: str, reason: str, observed: str | None = None, **extra: Any) -> NodeRow:
    return NodeRow(
        run_id="r1",
        cluster="c",
        stage="preflight",
        node=node,
        check=check,
        item=extra.pop("item", "version"),
        status=Status(status),
        reason=reason,
        observed=observed,
        expected=extra.pop("expected", None),
        detail=extra.pop("detail", ""),
        gpu=extra.pop("gpu", None),
        raw_output=extra.pop("raw", ""),
    )


def test_node_verdicts() -> None:
    assert node_verdict("a", [row("a", "driver", "pass", "ok")], LINKS) == node_verdict("a", [], LINKS)
    assert node_verdict("a", [row("a", "driver", "warn", "drift")], LINKS).verdict == Verdict.ACCEPTED
    rejected = node_verdict(
        "a",
        [
            row("a", "driver", "fail", "version_mismatch"),
            row("a", "gpu_count", "error", "unparsable_output"),
            row("a", "driver", "fail", "version_mismatch"),
        ],
        LINKS,
    )
    assert rejected.verdict == Verdict.REJECTED
    assert rejected.reasons == ["driver:version_mismatch", "gpu_count:unparsable_output"]
    unreachable = node_verdict("a", [row("a", "ssh", "unreachable", "host-key")], LINKS)
    assert (unreachable.verdict, unreachable.reasons) == (Verdict.UNREACHABLE, ["ssh:host-key"])
    assert node_verdict("a", [row("a", "x", "timeout", "command_timeout")], LINKS).verdict == Verdict.REJECTED
    assert node_verdict("a", [], LINKS, excluded=True).verdict == Verdict.SKIPPED
    assert rejected.row("r1", "c", "p") == VerdictRow(
        "r1", "c", "a", "p", Verdict.REJECTED, ["driver:version_mismatch", "gpu_count:unparsable_output"]
    )


def test_verdict_row_record_holds_plain_values() -> None:
    record = VerdictRow("r1", "c", "n1", "p", Verdict.UNREACHABLE, ["ssh:refused"]).record()
    assert record == {
        "run_id": "r1",
        "cluster": "c",
        "node": "n1",
        "profile": "p",
        "verdict": "unreachable",
        "reasons": ["ssh:refused"],
        "cause": "",
    }
    assert type(record["verdict"]) is str
    assert [v.value for v in Verdict] == ["accepted", "rejected", "unreachable", "skipped", "tool_error"]


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
        VerdictRow("r1", "c", n, "p", v, r)
        for n, v, r in [
            ("n1", Verdict.ACCEPTED, []),
            ("n2", Verdict.REJECTED, ["driver:version_mismatch"]),
            ("n3", Verdict.REJECTED, ["gpu_count:model_mismatch"]),
            ("n4", Verdict.UNREACHABLE, ["ssh:refused"]),
            ("n5", Verdict.SKIPPED, ["excluded_in_inventory"]),
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
        NodeValue("r1", "c", "n1", "driver", "driver_version", "580.159.04"),
        NodeValue("r1", "c", "n2", "driver", "driver_version", "570.86.15"),
        NodeValue("r1", "c", "n3", "driver", "driver_version", "580.159.04"),
        NodeValue("r1", "c", "n1", "gpu_count", "gpu_count", "4"),
        NodeValue("r1", "c", "n3", "gpu_count", "gpu_count", "4"),
    ]
    reasons = catalog((c.name, c.reasons) for c in discover())
    context = build_context(run, verdicts, ReportData(links=LINKS, rows=rows, values=values, reasons=reasons))
    assert context["counts"] == {"accepted": 1, "rejected": 2, "unreachable": 1, "skipped": 1, "tool_error": 0}
    n2 = context["findings"]["n2"][0]
    assert (n2["status"], n2["action"]) == ("fail", "fix config")
    assert n2["why"] == reasons.lookup("driver", "version_mismatch").explanation
    assert (context["findings"]["n4"][0]["action"], context["node_rows"][0]["verdict"]) == ("check node", "rejected")
    records = ReportData(links=LINKS, rows=[r.record() for r in rows], values=values, reasons=reasons)
    assert build_context(run, verdicts, records)["findings"] == context["findings"]  # rows read back from Parquet
    assert context["rejected_nodes"] == "n[2-4]"
    assert context["differences"] == [("driver.driver_version", "580.159.04 on n[1,3]; 570.86.15 on n2")]
    assert context["unreachable_sets"] == [("refused", "n4")]
    html_path, md_path = render(context, tmp_path)
    html = html_path.read_text()
    assert hostile not in html and "&lt;script&gt;" in html
    assert "Not accepted:</span> n[2-4]" in html
    md = md_path.read_text()
    assert "**Not accepted:** n[2-4]" in md
    assert "| n2 | rejected |  | driver:version_mismatch |" in md
    assert "fix config: the driver differs from the version the profile pins" in md
    assert "Verdict." not in html + md and "Status." not in html + md and "Action." not in html + md
    assert "- refused on n4" in md
    assert hostile not in md and "&lt;script&gt;" in md


def test_a_figure_not_judged_accepts_its_node_and_is_listed_with_the_key_to_write(tmp_path: Path) -> None:
    """A ``not_judged`` figure rejects nothing and is no finding, but it is never said to have passed: the report
    lists it under "Not judged" with the key that would judge it, folded across nodes and GPUs."""
    said = "none: set thresholds.gemm_fp32_gflops_min"
    rows = [
        row(n, "gemm", "not_judged", "no_expectation", "41.5", item="gemm_fp32_gflops", gpu=0, expected=said)
        for n in ("n1", "n2")
    ] + [row("n1", "driver", "pass", "ok", "580.159.04")]
    verdict = node_verdict("n1", rows[::2], LINKS)
    assert (verdict.verdict, verdict.reasons) == (Verdict.ACCEPTED, [])
    verdicts = [VerdictRow("r1", "c", n, "p", Verdict.ACCEPTED, []) for n in ("n1", "n2")]
    run = {"run_id": "r1", "cluster": "c", "stages": ["single-node"], "started": "s", "ended": "e"}
    reasons = catalog((c.name, c.reasons) for c in discover())
    context = build_context(run, verdicts, ReportData(links=LINKS, rows=rows, reasons=reasons))
    assert context["findings"] == {} and context["skipped"] == []
    assert context["not_judged"] == [("gemm gemm_fp32_gflops", "set thresholds.gemm_fp32_gflops_min", "n[1-2]")]
    html_path, md_path = render(context, tmp_path)
    html, md = html_path.read_text(), md_path.read_text()
    assert "every check passed" not in html + md
    assert "figures not judged: 1 (below)" in html and "figures not judged: 1 (below)" in md
    assert "<li>gemm gemm_fp32_gflops on n[1-2]: set thresholds.gemm_fp32_gflops_min</li>" in html
    assert "## Not judged" in md and "- gemm gemm_fp32_gflops on n[1-2]: set thresholds.gemm_fp32_gflops_min" in md
