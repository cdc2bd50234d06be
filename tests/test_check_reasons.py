"""Reason declarations: every check module declares the reasons it emits, every emitted reason is declared with
the severity its rows carry (or a documented exception), and XIDs are judged from the one table in checks/xid.py.

The fuzz tests (tests/test_fuzz_parsers.py) run :func:`assert_declared` on every row they make, on the real
captures and on the mutated ones.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

import cluster_accept.checks.xid as xid
import cluster_accept.reports.actions as actions
from cluster_accept.checks.base import Check, CheckRow, NodeRow, Status, discover
from cluster_accept.checks.declarations import Expectation, always
from cluster_accept.checks.reasons import COMMON, SSH_REASONS, UNDECLARED, Action, Reason, catalog, declare
from cluster_accept.inventory.model import Profile
from cluster_accept.remote.result import UnreachableCause
from tests.capture import NO_CLUSTER

CHECKS = discover()
REASONS = catalog((check.name, check.reasons) for check in CHECKS)

# Rows whose status differs from their reason's declared severity, each documented where it is emitted:
# (check, reason) -> the other statuses it may carry.
EXCEPTIONS: dict[tuple[str, str], frozenset[Status]] = {
    # a node that meets the driver version the profile pins only warns when the cluster majority differs
    ("driver", "drift"): frozenset({Status.WARN}),
    # the same for the CUDA version; the NCCL version's drift always warns (jobs may bring their own NCCL)
    ("cuda", "drift"): frozenset({Status.WARN}),
}


def assert_declared(row: CheckRow) -> None:
    """``row``'s reason is declared for its check, and it carries the declared severity or a documented one."""
    declared = REASONS.lookup(row.check, row.reason)
    assert declared is not UNDECLARED, f"{row.check}:{row.reason} is emitted but not declared"
    allowed = {declared.severity} | EXCEPTIONS.get((row.check, row.reason), frozenset())
    assert row.status in allowed, f"{row.check}:{row.reason} is {row.status.value}, declared {declared.severity.value}"


def test_every_check_module_declares_its_reasons() -> None:
    assert len(CHECKS) >= 12
    for check in CHECKS:
        assert check.reasons is check.module.REASONS, check.name
        assert check.reasons, f"{check.name} declares no reason of its own"
        for code, reason in check.reasons.items():
            assert isinstance(reason, Reason) and reason.code == code
            assert isinstance(reason.severity, Status) and isinstance(reason.action, Action)
            assert reason.explanation.strip() and "\n" not in reason.explanation, f"{check.name}:{code}"


def test_a_check_module_without_its_declaration_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module of the checks package that declares no ``CHECK`` (here: the constants of one, without it) is
    an error naming it, not a check silently left out."""
    package = tmp_path / "undeclared_checks"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "lonely.py").write_text(
        textwrap.dedent(
            """
            NAME = "lonely"
            COMMAND = "true"

            def parse(stdout, exit_code=0):
                return stdout

            def evaluate(model, profile, cluster):
                return []
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(TypeError, match=r"check module undeclared_checks\.lonely declares no CHECK"):
            discover("undeclared_checks")
    finally:
        for name in [m for m in sys.modules if m.startswith("undeclared_checks")]:
            del sys.modules[name]


def test_a_check_whose_reasons_are_not_under_their_codes_is_refused() -> None:
    wrong = declare(Reason("stale", Status.WARN, "old"))
    with pytest.raises(TypeError, match=r"check lonely: REASONS entries \['fresh'\]"):
        Check("lonely", "true", lambda out, code: out, lambda m, p, c: [], {"fresh": wrong["stale"]})
    with pytest.raises(TypeError, match=r"check lonely: expectations \['driver_version'\] are judged by another"):
        stray = Expectation("driver_version", "preflight", "driver", always)
        Check("lonely", "true", lambda out, code: out, lambda m, p, c: [], wrong, expectations=(stray,))


def test_common_reasons_cover_the_outcomes_of_running_any_check() -> None:
    """What the preflight stage emits for any check (no output, a timeout, a parser crash, unreadable output)."""
    expected = {
        "no_output": Status.ERROR,
        "command_timeout": Status.TIMEOUT,
        "parser_crashed": Status.ERROR,
        "unparsable_output": Status.ERROR,
        "session_failed": Status.ERROR,
        "drift": Status.FAIL,
    }
    for code, severity in expected.items():
        assert COMMON[code].severity == severity
        for check in CHECKS:
            assert REASONS.declared(check.name, code)


def test_every_unreachable_cause_is_declared_for_ssh() -> None:
    causes = {cause.value for cause in UnreachableCause} | {"unknown"}
    assert causes <= set(SSH_REASONS)
    for cause in causes:
        assert REASONS.lookup("ssh", cause).severity == Status.UNREACHABLE
    assert REASONS.lookup("ssh", "session_failed").severity == Status.ERROR
    assert catalog([]).lookup("ssh", "host-key") is SSH_REASONS["host-key"]  # in every catalogue


def _xid_rows(*codes: int) -> list[CheckRow]:
    lines = "".join(f"[ {i}.5] NVRM: Xid (PCI:0000:18:00): {code}, pid=1, name=x\n" for i, code in enumerate(codes))
    body = f"[    0.000000] Linux version 6.8.0\n{lines}"
    stdout = f"### source=dmesg\n{body}### rc=0\n### lines={len(codes) + 1} xid={len(codes)}\n### done\n"
    return xid.evaluate(xid.parse(stdout, 0), Profile(), NO_CLUSTER)


def test_xid_severity_meaning_and_action_come_from_the_one_table() -> None:
    # the application's XIDs logged apart from the hardware ones: beside them they fail as part of the fault
    rows = _xid_rows(*(code for code in xid.XIDS if code not in xid.APPLICATION)) + _xid_rows(*xid.APPLICATION)
    rows.sort(key=lambda row: int(row.reason.removeprefix("xid_")))
    assert [row.reason for row in rows] == [f"xid_{code}" for code in sorted(xid.XIDS)]
    for row in rows:
        code = int(row.reason.removeprefix("xid_"))
        kind = xid.XIDS[code]
        assert row.status == kind.severity and row.detail.startswith(f"XID {code}: {kind.meaning}; ")
        declared = REASONS.lookup("xid", row.reason)
        assert (declared.severity, declared.action) == (kind.severity, kind.action)
        node_row = NodeRow("r", "c", "preflight", "n1", row.check, row.item, row.status, row.reason)
        assert actions.suggest(node_row, REASONS) == actions.Suggestion(kind.action, declared.explanation)
    by_severity = {code: kind.severity for code, kind in xid.XIDS.items()}
    assert [code for code, severity in by_severity.items() if severity == Status.WARN] == [13, 31, 43, 45, 92, 109]
    assert xid.APPLICATION == {13, 31, 43, 45, 109}  # NVIDIA's catalogue: restart the job; they warn on their own
    # NVIDIA's catalogue: the GPU left the bus or did not initialize: reboot; memory, NVLink and GSP faults: reset
    assert {code for code, kind in xid.XIDS.items() if kind.action == Action.REBOOT_NODE} == {79, 143}
    reset = {48, 61, 62, 63, 64, 74, 94, 95, 119, 120, 121, 136, 140, 154}
    assert {code for code, kind in xid.XIDS.items() if kind.action == Action.RESET_GPU} == reset
    assert all(xid.XIDS[code].severity == Status.FAIL for code in reset | {79, 143})
    assert {code for code, kind in xid.XIDS.items() if kind.action == Action.RESTART_JOB} == {13, 31, 43, 45, 109}


def test_an_unlisted_xid_fails_with_a_declared_reason() -> None:
    (row,) = _xid_rows(157)
    assert (row.item, row.status, row.reason) == ("xid_157", Status.FAIL, "xid_unlisted")
    declared = REASONS.lookup("xid", "xid_unlisted")
    assert (declared.severity, declared.action) == (xid.UNLISTED.severity, Action.CHECK_NODE)
    assert_declared(row)


def test_the_report_knows_nothing_about_xids_or_reason_spellings() -> None:
    """The report's actions come from the declarations alone: no table of its own, no pattern on a code."""
    source = Path(actions.__file__).read_text()
    assert "xid" not in source.lower() and "import re" not in source
    assert not any(hasattr(actions, name) for name in ("_BY_REASON", "_BY_CHECK", "_HARDWARE_XIDS"))
