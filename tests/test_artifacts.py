"""Prefect artifacts on a real flow run (Prefect's ephemeral API): the verdict table, the summary, the link."""

from __future__ import annotations

from pathlib import Path

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import Artifact
from prefect.runtime import flow_run

from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.flows.artifacts import artifact_key, publish, summary_markdown

VERDICTS = [
    VerdictRow("r-art-1", "Art Test", "node01", "h100", Verdict.ACCEPTED, []),
    VerdictRow("r-art-1", "Art Test", "node02", "h100", Verdict.REJECTED, ["gpu_count:count_low", "xid:xid_79"]),
    VerdictRow("r-art-1", "Art Test", "node03", "h100", Verdict.UNREACHABLE, ["ssh:refused"]),
]


def test_summary_markdown_says_the_verdicts_as_words(tmp_path: Path) -> None:
    text = summary_markdown({"run_id": "r-art-1", "cluster": "Art Test"}, VERDICTS, tmp_path / "report.html")
    assert "accepted **1** / rejected **1** / unreachable **1**" in text
    assert "| node02 | rejected | gpu_count:count_low, xid:xid_79 |  |" in text
    assert "Nodes: accepted node01; rejected node02; unreachable node03" in text
    assert "Verdict." not in text


def test_artifact_keys_are_what_prefect_accepts() -> None:
    assert artifact_key("Prod_H100 east", "verdicts") == "prod-h100-east-verdicts"
    assert artifact_key("___", "summary") == "cluster-summary"


@pytest.mark.integration
def test_publish_attaches_table_summary_and_link_to_the_flow_run(tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    report.write_text("<html></html>")
    run = {"run_id": "r-art-1", "cluster": "Art Test"}

    @flow(name="artifact-check")
    def publishing() -> tuple[bool, str]:
        return publish(run, VERDICTS, report), str(flow_run.id)

    published, run_id = publishing()
    assert published
    with get_client(sync_client=True) as client:
        # The raw filter call: the client's read_artifacts sends nulls that this Prefect server rejects, and
        # empty flow-run/task-run filters would join away artifacts that belong to no task run.
        response = client.request(
            "POST",
            "/artifacts/filter",
            json={"artifacts": {"flow_run_id": {"any_": [run_id]}}, "limit": 10, "offset": 0, "sort": "CREATED_DESC"},
        )
    found = [Artifact.model_validate(a) for a in response.json()]
    by_key = {a.key: a for a in found}
    assert sorted(by_key) == ["art-test-report", "art-test-summary", "art-test-verdicts"]
    table, summary, link = by_key["art-test-verdicts"], by_key["art-test-summary"], by_key["art-test-report"]
    assert (
        table.type == "table" and "node02" in str(table.data) and "gpu_count:count_low, xid:xid_79" in str(table.data)
    )
    assert summary.type == "markdown"
    text = str(summary.data)
    assert "accepted **1** / rejected **1** / unreachable **1**" in text
    assert "| node03 | unreachable | ssh:refused |" in text and report.resolve().as_uri() in text
    assert link.type == "markdown" and report.resolve().as_uri() in str(link.data)


def test_publish_outside_a_flow_run_is_refused_without_raising(tmp_path: Path) -> None:
    assert publish({"run_id": "r", "cluster": "c"}, VERDICTS, tmp_path / "report.html") in (True, False)
