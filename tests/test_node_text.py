"""Node text on a terminal or a page: control characters shown as escapes, never raw, and evidence that was cut
says so, with how much was kept of how much."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster_accept.analysis.verdicts import Verdict, VerdictRow
from cluster_accept.checks.base import ERROR_DETAIL_CHARS, CheckRow, Status, discover, error_row
from cluster_accept.checks.reasons import catalog
from cluster_accept.flows.artifacts import summary_markdown
from cluster_accept.reports.render import EXCERPT_CHARS, ReportData, build_context, render
from cluster_accept.tasks.rows import FIELD_LIMIT, RAW_OUTPUT_LIMIT, node_row
from cluster_accept.tasks.stages import declared_links
from cluster_accept.vocabulary.text import keep_head, keep_tail, visible
from tests.processes import run_cli
from tests.test_verdicts_report import row

LINKS = declared_links()  # the cause links the stages' checks and probes declare

RUN = {"run_id": "r1", "cluster": "c", "stages": ["preflight"], "started": "s", "ended": "e", "inventory": "inv.yaml"}
COLOUR = "\x1b[31mred\x1b[0m"
TITLE = "\x1b]0;title\x07"
PROGRESS = "progress 10%\rprogress 100%"
RAW = ("\x1b", "\x07", "\x00", "\r", "\u202e", "\x9b")


def test_visible_shows_control_characters_as_escapes_and_keeps_layout() -> None:
    shown = visible(f"{COLOUR} {TITLE} bell\x07 nul\x00 {PROGRESS} \u202eevil csi\x9b\tcol\nline")
    assert shown == (
        "\\x1b[31mred\\x1b[0m \\x1b]0;title\\x07 bell\\x07 nul\\x00 progress 10%\\rprogress 100% "
        "\\u202eevil csi\\x9b\tcol\nline"
    )
    assert visible(shown) == shown
    assert visible("plain text, ünïcode, 日本") == "plain text, ünïcode, 日本"


def test_cut_text_says_what_was_kept() -> None:
    assert keep_head("abc", 3) == "abc" and keep_tail("abc", 3) == "abc"
    assert keep_head("x" * 123_456, 4000) == "x" * 4000 + "\n… [truncated: kept the first 4,000 of 123,456 characters]"
    assert keep_tail("y" * 123_456, 4000) == "[truncated: kept the last 4,000 of 123,456 characters] …\n" + "y" * 4000


def _report(tmp_path: Path, rows: list, cause: str = "") -> tuple[dict, str, str]:
    verdicts = [VerdictRow("r1", "c", "n1", "p", Verdict.REJECTED, ["gpu_count:model_mismatch"], cause)]
    reasons = catalog((c.name, c.reasons) for c in discover())
    context = build_context(RUN, verdicts, ReportData(links=LINKS, rows=rows, reasons=reasons))
    html_path, md_path = render(context, tmp_path)
    # Bytes: reading text would turn a raw CR into a newline and hide it.
    return context, html_path.read_bytes().decode(), md_path.read_bytes().decode()


def test_report_shows_control_characters_from_nodes_as_escapes(tmp_path: Path) -> None:
    hostile = f"{COLOUR} {TITLE} bell\x07 nul\x00 {PROGRESS} \u202eevil csi\x9b"
    rows = [
        row(
            "n1",
            "gpu_count",
            "fail",
            "model_mismatch",
            hostile,
            item=f"model {TITLE}",
            gpu=0,
            expected=COLOUR,
            detail=f"detail {PROGRESS}",
            raw=f"{COLOUR}\n{PROGRESS}\n{TITLE}\x00\x07",
        )
    ]
    _, html, md = _report(tmp_path, rows, cause=f"GPU model {COLOUR} {PROGRESS}")
    for page, text in (("report.html", html), ("report.md", md)):
        for raw in RAW:
            assert raw not in text, f"{raw!r} reached {page} raw"
        assert "\\x1b[31mred\\x1b[0m" in text, page
        assert "\\x1b]0;title\\x07" in text, page
        assert "progress 10%\\rprogress 100%" in text, page
        assert "bell\\x07 nul\\x00" in text and "\\u202eevil csi\\x9b" in text, page
    assert "detail progress 10%\\rprogress 100%" in html  # the detail column, the evidence block
    assert "\\x1b]0;title\\x07\\x00\\x07</pre>" in html


def test_report_excerpt_and_stored_evidence_say_they_were_cut(tmp_path: Path) -> None:
    raw = "".join(f"line {i:05d}\n" for i in range(500))  # 5,500 characters
    rows = [row("n1", "gpu_count", "fail", "model_mismatch", "x", item="model", raw=raw)]
    context, html, _ = _report(tmp_path, rows)
    excerpt = context["findings"]["n1"][0]["excerpt"]
    note = f"[truncated: kept the first {EXCERPT_CHARS:,} of 5,500 characters]"
    assert excerpt == raw[:EXCERPT_CHARS] + "\n… " + note
    assert note in html

    long = "z" * (RAW_OUTPUT_LIMIT + 1000)
    stored = node_row("r1", "c", "preflight", "n1", CheckRow("x", "y", Status.FAIL, "r"), raw=long).raw_output
    assert stored.endswith(f"\n… [truncated: kept the first {RAW_OUTPUT_LIMIT:,} of {len(long):,} characters]")
    assert stored.startswith("z" * RAW_OUTPUT_LIMIT)

    unreadable = error_row("x", "unparsable_output", "no header", "w" * 10_000)
    assert unreadable.detail.endswith(f"[truncated: kept the first {ERROR_DETAIL_CHARS:,} of 10,010 characters]")


def test_run_rows_keep_the_end_of_a_failed_run_and_say_so() -> None:
    from types import SimpleNamespace

    from cluster_accept.analysis.probe_output import ProbeOutput
    from cluster_accept.remote.result import CommandResult
    from cluster_accept.tasks.probe_runs import run_rows

    stderr = "".join(f"frame {i:05d}\n" for i in range(1000))  # 12,000 characters
    result = CommandResult("gpu_bench", 1, "", stderr)
    node, script = SimpleNamespace(), SimpleNamespace(owner="gemm")
    (failed,) = run_rows(node, script, result, ProbeOutput())  # type: ignore[arg-type]
    assert failed.detail.startswith("[truncated: kept the last 2,000 of 12,000 characters] …\n")
    assert failed.detail.endswith(stderr[-2000:])


def test_prefect_summary_shows_control_characters_as_escapes(tmp_path: Path) -> None:
    verdicts = [VerdictRow("r1", "c", "n1", "p", Verdict.REJECTED, ["gpu_count:model_mismatch"], f"{COLOUR} {TITLE}")]
    text = summary_markdown({"run_id": "r1", "cluster": "c"}, verdicts, tmp_path / "report.html")
    assert not any(raw in text for raw in RAW)
    assert "\\\\x1b\\[31mred" in text  # the backslash and bracket escaped for Markdown


@pytest.mark.integration
def test_terminal_shows_control_characters_as_escapes(tmp_path: Path) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        'cluster: "\\e[31mred\\a\\u202e"\nnodes: [{hosts: "a1", address: local}]\nprofiles: {p: {}}\n'
        "defaults: {profile: p}\n"
    )
    proc = run_cli("inventory", "check", str(inventory))
    assert proc.returncode == 2, proc.stderr  # a cluster's name is a folder's name: refused, and said safely
    assert not any(raw in proc.stdout + proc.stderr for raw in RAW)
    assert "\\x1b[31mred\\x07\\u202e" in proc.stderr and "cluster" in proc.stderr


def test_a_file_read_whole_into_a_rows_observed_is_cut_saying_so() -> None:
    """A node's 30 MB sysfs file read as a value: the row keeps its head and says how much there was."""
    sysfs = "0123456789abcdef\n" * 1_800_000
    checked = CheckRow("pcie", "gpu0", Status.FAIL, "width_low", sysfs, "x16", "detail " + sysfs)
    stored = node_row("r1", "c", "preflight", "n1", checked)
    note = f"\n… [truncated: kept the first {FIELD_LIMIT:,} of {len(sysfs):,} characters]"
    assert stored.observed == sysfs[:FIELD_LIMIT] + note
    assert (
        stored.detail
        == ("detail " + sysfs)[:FIELD_LIMIT]
        + f"\n… [truncated: kept the first {FIELD_LIMIT:,} of {len(sysfs) + 7:,} characters]"
    )
    assert stored.expected == "x16"
