"""NCCL's RAS diagnostics (2.31 on) in the watch: the report's lines as rows, their ranks on the job's nodes where
the communicator is the job's, asked once a watch of an NCCL that runs them, over the real fan-out and the node
reader against a listener answering as NCCL's RAS does (reports in NCCL 2.32.3's formats,
tests/data/watch/ras/diagnostics-2.32.3/README.md)."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import pytest

from cluster_accept.vocabulary.status import Status
from cluster_accept.watch import rounds
from cluster_accept.watch.node import ras_read
from cluster_accept.watch.ras import RasSeen, RasStatus
from cluster_accept.watch.ras_diagnostics import (
    DiagnosticsReport,
    parse_diagnostics,
    parse_diagnostics_answer,
    place_on_nodes,
    summary,
    with_diagnostics,
)
from cluster_accept.watch.read import NodeRead
from cluster_accept.watch.words import WatchFinding
from tests.ras_replay import answer
from tests.test_remote import local_node

DATA = Path(__file__).parent / "data" / "watch" / "ras" / "diagnostics-2.32.3"
COMM = "0x5e1d2c3b4a596877"
NODES = {0: "n0", 1: "n0", 2: "n1", 3: "n1"}


def report(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.unit
def test_a_healthy_report_is_every_check_ok_and_complete() -> None:
    parsed = parse_diagnostics(report("healthy.txt"), "j", "n0")
    assert [(r.check, r.ok, r.comm, r.comm_ranks) for r in parsed.rows] == [
        (check, True, COMM, 4)
        for check in ("GPU inventory", "CUDA driver version", "ECC", "NVLink", "NCCL environment")
    ]
    assert parsed.completed == "RAS diagnostics completed in 12.3 ms across 2 RAS peers"
    assert parsed.reporter == "node00:4242"
    assert summary(parsed) == "5 results, 0 to review"


@pytest.mark.unit
def test_each_line_to_review_names_its_ranks_and_those_of_the_jobs_communicator_their_nodes() -> None:
    parsed = parse_diagnostics(report("settings-differ.txt"), "j", "n0")
    rows = place_on_nodes(parsed.rows, NODES)
    review = [(r.check, r.ranks, r.ranks_cut, r.ranks_total, r.variable, r.value, r.comm, r.nodes)
              for r in rows if not r.ok]  # fmt: skip
    assert review == [
        ("ECC", "3", False, None, "", "", COMM, "n1"),
        ("NVLink", "2,3", False, None, "", "", COMM, "n1"),
        ("NCCL environment", "", False, None, "NCCL_SOCKET_IFNAME", "", COMM, ""),
        ("NCCL environment", "0,1", False, None, "NCCL_SOCKET_IFNAME", "eth0", COMM, "n0"),
        ("NCCL environment", "2,3", False, None, "NCCL_SOCKET_IFNAME", "eth1", COMM, "n1"),
        ("NCCL environment", "", False, None, "", "", COMM, ""),
        ("GPU inventory", "1", False, None, "", "", "0x77aa", ""),  # a communicator of 2: its ranks are its own
        ("ECC", "0,1,2", True, 4, "", "", COMM, "n0,n1"),
    ]
    assert summary(parsed).startswith("10 results, 8 to review: ECC: uncorrected volatile errors on rank(s) {3}")


@pytest.mark.unit
def test_a_named_nodes_evidence_carries_what_the_diagnostics_put_on_it_and_a_passing_one_nothing() -> None:
    rows = place_on_nodes(parse_diagnostics(report("settings-differ.txt"), "j", "n0").rows, NODES)
    named = WatchFinding("j", "comm_straggler", "n1", Status.FAIL, "slow_link", "80 ms", "< 5 ms", "ranks 2,3", "")
    passing = WatchFinding("j", "compute_straggler", "n0", Status.PASS, "", "", "", "nothing late", "")
    out = with_diagnostics([named, passing], rows)
    assert out[1] == passing  # n0 has rows to review (eth0, corrected ECC), but nothing is named on it
    assert out[0].evidence == (
        "ranks 2,3; RAS diagnostics on n1: ECC: uncorrected volatile errors on rank(s) {3} (worst=2) across 4 ranks "
        f"in comm {COMM}; NVLink: inactive link(s) on rank(s) {{2,3}} across 4 ranks in comm {COMM}; NCCL "
        "environment: NCCL_SOCKET_IFNAME=eth1 on rank(s) {2,3}; and 1 more"
    )


@pytest.mark.unit
def test_a_mismatch_names_both_sides_whichever_is_the_odd_one() -> None:
    """NCCL lists the ranks that differ from the communicator's first rank: where that rank is the odd one, every
    other rank is listed, so a mismatch concerns the reference rank's node too."""
    line = f"node00:1 NCCL DIAG [INFO] CUDA driver version: mismatch across 4 ranks in comm {COMM}, rank(s) {{1,2,3}} "
    (row,) = place_on_nodes(parse_diagnostics(line + "differ from rank 0 (12080)", "j", "n0").rows, NODES)
    assert (row.ranks, row.reference_rank, row.nodes) == ("1,2,3", 0, "n0,n1")


@pytest.mark.unit
def test_an_environment_value_is_the_users_and_only_the_lines_end_gives_its_ranks() -> None:
    text = (report("settings-differ.txt").splitlines()[5] + "\n"
            + "node00:4242 NCCL DIAG [INFO] NCCL environment: NCCL_SOCKET_IFNAME=x on rank(s) {2} across 4 ranks "
              "in comm 0xdead on rank(s) {0}")  # fmt: skip
    (_, row) = place_on_nodes(parse_diagnostics(text, "j", "n0").rows, NODES)
    assert (row.ranks, row.comm, row.nodes) == ("0", COMM, "n0")
    assert row.value == "x on rank(s) {2} across 4 ranks in comm 0xdead"


@pytest.mark.unit
def test_a_summary_that_failed_after_the_completion_line_is_said() -> None:
    text = report("healthy.txt") + "node00:4242 NCCL DIAG ERROR: diagnostics summary failed (3)\n"
    parsed = parse_diagnostics(text, "j", "n0")
    assert parsed.error == "ERROR: diagnostics summary failed (3)"
    assert summary(parsed) == "5 results, 0 to review (ERROR: diagnostics summary failed (3))"


@pytest.mark.unit
def test_a_line_without_ncclss_prefix_is_no_row_and_a_report_cut_short_says_so() -> None:
    text = "\n".join(report("healthy.txt").splitlines()[:3]) + "\nsomething else [INFO] ECC: forged\n"
    parsed = parse_diagnostics(text, "j", "n0")
    assert [r.check for r in parsed.rows] == ["GPU inventory", "CUDA driver version"]
    assert summary(parsed) == "2 results, 0 to review (the report did not complete)"


@pytest.mark.unit
def test_they_are_asked_once_a_watch_and_only_of_an_nccl_that_runs_them() -> None:
    state = rounds.WatchState(keep_s=60)
    ask = rounds.RasAsk("n0", "1000", 28028)
    assert state.diagnostics_ask(ask) is None  # no status yet: the NCCL is not known
    state.ras = RasSeen("n0", 1, RasStatus(True, form="json", nccl_version="2.28.9"))
    assert state.diagnostics_ask(ask) is None
    state.ras = RasSeen("n0", 2, RasStatus(True, form="json", nccl_version="2.31.2"))
    assert state.diagnostics_ask(ask) == ask
    assert state.diagnostics_ask(None) is None  # no node asked this round
    assert state.diagnostics_ask(rounds.RasAsk("n1", "1000", 28028)) is None  # n1's NCCL was not the one seen
    for tries in range(rounds.DIAGNOSTICS_TRIES):  # no report (a timeout, BUSY): asked again, a few times
        assert state.diagnostics_ask(ask) == ask, tries
        state.add([NodeRead("n0", node_ns=3 + tries, diagnostics=DiagnosticsReport(()))])
    assert state.diagnostics_ask(ask) is None
    state.diagnostics_asked = 0
    state.diagnostics = parse_diagnostics(report("healthy.txt"), "j", "n0").rows  # answered: once a watch
    assert state.diagnostics_ask(ask) is None


def serve(diagnostics: str | None, delay_s: float = 0.0) -> tuple[int, threading.Thread]:
    listener = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        with listener:
            answer(listener.accept()[0], "", diagnostics, delay_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


@pytest.mark.integration
def test_the_node_reader_says_why_an_nccl_before_2_31_gives_none() -> None:
    port, server = serve(None)
    said = ras_read.read_status("127.0.0.1", port, 5, False, False, os.getuid(), diagnostics=True)
    server.join(10)
    assert said["ras"] == "unavailable"
    assert said["detail"] == "RAS diagnostics not run: ERROR: Unknown command DIAGNOSTICS"
    parsed, why = parse_diagnostics_answer(json.dumps(said), "j", "n0")
    assert parsed is None and why == said["detail"]


@pytest.mark.integration
def test_a_report_that_comes_only_after_ras_gathered_every_process_is_waited_for() -> None:
    """NCCL writes nothing until its RAS has every process's data (up to its timeout when one is stuck): the
    reader waits for the first line as long as for the rest, not the 1 s it gives the connection."""
    port, server = serve(report("healthy.txt"), delay_s=1.5)
    said = ras_read.read_status("127.0.0.1", port, 5, False, False, os.getuid(), diagnostics=True)
    server.join(10)
    parsed, why = parse_diagnostics_answer(json.dumps(said), "j", "n0")
    assert why == "" and parsed is not None and len(parsed.rows) == 5


@pytest.mark.unit
def test_the_job_directorys_owner_is_forgotten_when_a_read_no_longer_finds_it() -> None:
    state = rounds.WatchState(keep_s=60)
    state.add([NodeRead("n0", node_ns=1, job_uid=1234)])
    assert state.ras_ask(["n0"], 28028) == rounds.RasAsk("n0", "1234", 28028)
    state.add([NodeRead("n0", node_ns=2)])  # a second user's directory appeared: none was read
    assert state.ras_ask(["n0"], 28028) is None


@pytest.mark.integration
def test_a_round_asks_them_on_the_chosen_node_and_the_state_keeps_them_on_the_jobs_nodes(tmp_path: Path) -> None:
    """Over the real fan-out (this machine as two nodes), n1's RAS listener answers the diagnostics: the round's
    read of n1 carries them and a coverage row naming what is to review; the state puts the ranks on nodes."""
    port, server = serve(report("settings-differ.txt"))
    ask = rounds.RasAsk("n1", str(os.getuid()), port)
    reads = rounds.read_round([local_node("n0"), local_node("n1")], "job1", str(tmp_path), {}, 10, 2,
                              asks=rounds.Asks(diagnostics=ask))  # fmt: skip
    server.join(10)
    n0, n1 = reads
    assert n0.diagnostics is None and n1.diagnostics is not None
    (row,) = [c for c in n1.coverage if c.signal == "ras_diagnostics"]
    assert row.available and row.detail.startswith("10 results, 8 to review: ECC: uncorrected volatile errors")
    state = rounds.WatchState(keep_s=60)
    state.add(reads)
    assert state.diagnosed and len(state.diagnostics) == 10
    assert [r.nodes for r in state.diagnostics if r.check == "ECC"] == ["", ""]  # no rank read: none placed
